#include "src/serve/result.h"

#include <stdlib.h>
#include <string.h>

void serve_out_free(serve_out_t *o)
{
    free(o->plp);
    free(o->ptop_id);
    free(o->ptop_lp);
    free(o->gen_n);
    free(o->gen);
    free(o->glp);
    free(o->gtop_id);
    free(o->gtop_lp);
    free(o->stop_at);
    memset(o, 0, sizeof *o);
}

int serve_out_alloc(serve_out_t *o, const serve_req_t *r)
{
    memset(o, 0, sizeof *o);
    const size_t total = (size_t)r->off[r->n], n = (size_t)r->n, g = n * (size_t)r->max_tokens;
    const size_t k = r->logprobs > 0 ? (size_t)r->logprobs : 0, scored = r->echo && r->logprobs >= 0 ? total : 0;
    o->k = (int)k;
    o->plp = malloc(scored * sizeof *o->plp + 1);
    o->ptop_id = malloc(scored * k * sizeof *o->ptop_id + 1);
    o->ptop_lp = malloc(scored * k * sizeof *o->ptop_lp + 1);
    o->gen_n = calloc(n, sizeof *o->gen_n);
    o->gen = malloc(g * sizeof *o->gen + 1);
    o->glp = malloc(g * sizeof *o->glp + 1);
    o->gtop_id = malloc(g * k * sizeof *o->gtop_id + 1);
    o->gtop_lp = malloc(g * k * sizeof *o->gtop_lp + 1);
    o->stop_at = malloc(n * sizeof *o->stop_at);
    if (!o->plp || !o->ptop_id || !o->ptop_lp || !o->gen_n || !o->gen || !o->glp || !o->gtop_id || !o->gtop_lp ||
        !o->stop_at) {
        serve_out_free(o);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        o->stop_at[i] = -1;
    return 0;
}

