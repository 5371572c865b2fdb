/* What the ZeRO strategies (dpsync_zero1.c, 2, 3) share: the units the
 * shards are cut by, the optimizer's pieces, the moments to and from the
 * host, the parameters' gather after an update, the banner line. The shard
 * engine itself is mpi/zero.c. */
#include <stdlib.h>
#include <string.h>

#include "mpi/clock.h"
#include "mpi/dpsync_impl.h"

/* The units (zero_cut_units: the planner cuts with it too) and, under
 * --ep, where each one's expert tail begins: start and expert_from
 * [n_tensors+1]. */
static status_t cut_units(dpsync_t *s, const dpsync_config_t *c, zero_units_t *u, size_t *start, size_t *expert_from,
                          char *err, size_t errlen)
{
    if (zero_cut_units(u, c->n, c->n_tensors, c->tensor_start, c->tensor_block, c->edp ? c->tensor_expert : NULL,
                       start, expert_from) != 0)
        return status_set(STATUS_FAIL, err, errlen,
                          "ZeRO with --ep: a block lists a dense tensor after its expert tensors");
    s->unit0 = u->block0;
    s->n_blocks = u->n_blocks;
    if (s->unit0 >= 0) {
        s->block_lo = start[s->unit0];
        s->block_hi = start[s->unit0 + s->n_blocks];
    }
    return STATUS_OK;
}

/* This rank's piece of every part, as AdamW sees it: moments in the
 * shard; gradients in the shard from stage 2 (else the model's flat
 * buffer), parameters from stage 3. */
static int make_view(dpsync_t *s, const dpsync_config_t *c, int stage)
{
    const zero_t *z = &s->zero;
    const int np = 2 * z->n_units;
    if (!(s->pieces = malloc(((size_t)np + 1) * sizeof *s->pieces)))
        return -1;
    for (int p = 0; p < np; p++) {
        size_t lo, hi, skip;
        zero_piece(z, p, &lo, &hi, &skip);
        const size_t soff = z->shard_start[p] + skip;
        s->pieces[p] = (dpsync_piece_t){
            .lo = lo, .n = hi - lo, .param = stage >= 3 ? soff : lo, .grad = stage >= 2 ? soff : lo, .state = soff};
    }
    s->view = (dpsync_optim_view_t){.params = stage >= 3 ? z->param_shard : c->params,
                                    .grads = stage >= 2 ? z->grad_shard : c->grads,
                                    .n = z->shard_n,
                                    .pieces = s->pieces,
                                    .n_pieces = np,
                                    .whole = 0};
    return 0;
}

status_t shard_create(dpsync_t *s, const dpsync_config_t *c, int stage, char *err, size_t errlen)
{
    size_t *start = malloc(((size_t)c->n_tensors + 1) * sizeof *start);
    size_t *expert_from = malloc(((size_t)c->n_tensors + 1) * sizeof *expert_from);
    zero_units_t u;
    status_t rc = start && expert_from ? STATUS_OK : status_set(STATUS_FAIL, err, errlen, "out of memory");
    if (rc == STATUS_OK)
        rc = cut_units(s, c, &u, start, expert_from, err, errlen);
    /* --ep: the experts' parts over the expert-DP group, the rest over the
     * shard group (the DP group without --hybrid-shard) */
    if (rc == STATUS_OK)
        rc = zero_create(&s->zero, c->ops, &c->mem, stage, c->shard ? c->shard : c->dp, c->eshard ? c->eshard : c->edp,
                         c->n, &u, start,
                         c->edp ? expert_from : NULL, c->replica, c->dtype, err, errlen);
    free(start);
    free(expert_from);
    CHECK(rc);
    if (make_view(s, c, stage) != 0)
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the ZeRO buffers");
    return STATUS_OK;
}

int shard_is_block(const dpsync_t *s, int u) { return u >= s->unit0 && u < s->unit0 + s->n_blocks; }

float *shard_outside_at(const dpsync_t *s, float *compact, int u)
{
    const size_t off = s->zero.unit_start[u];
    return compact + (off >= s->block_hi ? off - (s->block_hi - s->block_lo) : off);
}

status_t shard_state_to_host(dpsync_t *s, const float *state, float *host, char *err, size_t errlen)
{
    memset(host, 0, s->n * sizeof(float));
    zero_shard_to_host(&s->zero, state, host);
    return zero_allgather_host(&s->zero, host, err, errlen);
}

void shard_state_from_host(dpsync_t *s, const float *host, float *state)
{
    zero_shard_from_host(&s->zero, host, state);
}

status_t shard_gather_all(dpsync_t *s, char *err, size_t errlen)
{
    const double t0 = now_s();
    status_t rc = zero_allgather(&s->zero, s->params, err, errlen);
    s->update_s = now_s() - t0;
    return rc == STATUS_OK ? STATUS_OK : dpsync_fail(err, errlen, "ZeRO parameter all-gather failed");
}

void shard_banner(const dpsync_t *s, FILE *out, const char *what)
{
    fprintf(out, "ZeRO-%d: %s sharded over %d ranks", s->zero.stage, what, s->zero.group->size);
    if (s->zero.egroup)
        fprintf(out, ", the routed experts' over the %d expert-data-parallel ranks (--ep)", s->zero.egroup->size);
    if (s->zero.replica)
        fprintf(out, ", replicated over %d shard groups (--hybrid-shard)", s->zero.replica->size);
    fprintf(out, "\n");
}
