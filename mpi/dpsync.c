/* Data-parallel synchronisation (see dpsync.h): the choice of strategy and
 * the part every strategy shares (the gradient norm's pieces, the end of
 * a backward). The strategies are dpsync_replicated.c and
 * dpsync_zero{1,2,3}.c. */
#include "mpi/dpsync.h"

#include <stdlib.h>
#include <string.h>

#include "mpi/dpsync_impl.h"

const dpsync_ops_t *dpsync_pick(int zero_stage)
{
    static const dpsync_ops_t *const by_stage[] = {&dpsync_replicated, &dpsync_zero1, &dpsync_zero2, &dpsync_zero3};
    return zero_stage >= 0 && zero_stage < 4 ? by_stage[zero_stage] : NULL;
}

int dpsync_fail(dpsync_t *s, const char *what, const comm_t *c)
{
    snprintf(s->err, sizeof s->err, "%s: %.400s", what, c ? c->err : "");
    return -1;
}

/* The norm's pieces never move: the gradients and shards are allocated
 * once for the run. */
static int norm_pieces(dpsync_t *s, const dpsync_config_t *c)
{
    const size_t nt = (size_t)c->n_tensors + 1;
    s->norm_x = malloc(nt * sizeof *s->norm_x);
    s->norm_n = malloc(nt * sizeof *s->norm_n);
    s->norm_ss = malloc(nt * sizeof *s->norm_ss);
    if (!s->norm_x || !s->norm_n || !s->norm_ss)
        return -1;
    for (int i = 0; i < c->n_tensors; i++) {
        const size_t off = c->tensor_start[i];
        if (c->tensor_norm[i] &&
            s->ops->norm_piece(s, off, c->tensor_start[i + 1] - off, &s->norm_x[s->n_norm], &s->norm_n[s->n_norm]))
            s->n_norm++;
    }
    return 0;
}

int dpsync_create(dpsync_t *s, const dpsync_ops_t *ops, const dpsync_config_t *c)
{
    memset(s, 0, sizeof *s);
    s->ops = ops;
    s->mem = c->ops;
    s->dp = c->dp;
    s->params = c->params;
    s->grads = c->grads;
    s->n = c->n;
    s->hook.ctx = s;
    int rc = ops->create(s, c);
    if (rc == 0 && norm_pieces(s, c) != 0) {
        snprintf(s->err, sizeof s->err, "out of memory");
        rc = -1;
    }
    if (rc != 0) {
        char why[sizeof s->err];
        memcpy(why, s->err, sizeof why);
        dpsync_destroy(s);
        memcpy(s->err, why, sizeof why);
    }
    return rc;
}

void dpsync_destroy(dpsync_t *s)
{
    /* both engines are safe to destroy zeroed or after a failed create */
    ddp_destroy(&s->ddp);
    zero_destroy(&s->zero);
    free(s->pieces);
    free(s->norm_x);
    free(s->norm_n);
    free(s->norm_ss);
    memset(s, 0, sizeof *s);
}

int dpsync_backward_end(dpsync_t *s)
{
    s->active = 0;
    return s->failed ? -1 : 0;
}

double dpsync_grad_sumsq(dpsync_t *s)
{
    s->mem->sumsq(s->mem->ctx, s->norm_ss, s->norm_x, s->norm_n, s->n_norm);
    double local = 0.0;
    for (int i = 0; i < s->n_norm; i++)
        local += s->norm_ss[i];
    return local;
}

int dpsync_params_from_host_none(dpsync_t *s, const float *host)
{
    (void)s;
    (void)host;
    return 0;
}

int dpsync_params_to_host_none(dpsync_t *s, float *host)
{
    (void)s;
    (void)host;
    return 0;
}
