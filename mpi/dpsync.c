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

status_t dpsync_fail(char *err, size_t errlen, const char *what)
{
    char msg[COMM_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", err && errlen ? err : "");
    return status_set(STATUS_FAIL, err, errlen, "%s: %.400s", what, msg);
}

void dpsync_hold(dpsync_t *s, const char *what, const char *msg)
{
    if (s->hook_st != STATUS_OK)
        return; /* keep the first */
    s->hook_st = status_set(STATUS_FAIL, s->hook_err, sizeof s->hook_err, "%s: %.400s", what, msg);
}

/* The norm's pieces never move: the gradients and shards are allocated
 * once for the run. */
static int norm_pieces(dpsync_t *s, const dpsync_config_t *c)
{
    const size_t nt = (size_t)c->n_tensors + 1;
    s->norm_x = malloc(nt * sizeof *s->norm_x);
    s->norm_n = malloc(nt * sizeof *s->norm_n);
    s->norm_ss = malloc(nt * sizeof *s->norm_ss);
    s->norm_expert = calloc(nt, 1);
    if (!s->norm_x || !s->norm_n || !s->norm_ss || !s->norm_expert)
        return -1;
    for (int i = 0; i < c->n_tensors; i++) {
        const size_t off = c->tensor_start[i];
        if (c->tensor_norm[i] &&
            s->ops->norm_piece(s, off, c->tensor_start[i + 1] - off, &s->norm_x[s->n_norm], &s->norm_n[s->n_norm]))
            s->norm_expert[s->n_norm++] = c->tensor_expert && c->tensor_expert[i];
    }
    return 0;
}

status_t dpsync_create(dpsync_t *s, const dpsync_ops_t *ops, const dpsync_config_t *c, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->ops = ops;
    s->mem = c->ops;
    s->dp = c->dp;
    s->params = c->params;
    s->grads = c->grads;
    s->n = c->n;
    s->hook.ctx = s;
    status_t rc = ops->create(s, c, err, errlen);
    if (rc == STATUS_OK && norm_pieces(s, c) != 0)
        rc = status_set(STATUS_FAIL, err, errlen, "out of memory");
    if (rc != STATUS_OK)
        dpsync_destroy(s);
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
    free(s->norm_expert);
    memset(s, 0, sizeof *s);
}

status_t dpsync_on_final(dpsync_t *s, dpsync_final_fn fn, void *ctx, char *err, size_t errlen)
{
    s->final = fn;
    s->final_ctx = ctx;
    return s->ops->watch_final(s, err, errlen);
}

status_t dpsync_backward_end(dpsync_t *s, char *err, size_t errlen)
{
    s->active = 0;
    const status_t st = s->hook_st;
    if (st != STATUS_OK)
        status_set(st, err, errlen, "%s", s->hook_err);
    return st;
}

double dpsync_grad_sumsq(dpsync_t *s, double *expert)
{
    s->mem->sumsq(s->mem->ctx, s->norm_ss, s->norm_x, s->norm_n, s->n_norm);
    double local = 0.0, ex = 0.0;
    for (int i = 0; i < s->n_norm; i++) {
        if (expert && s->norm_expert[i])
            ex += s->norm_ss[i];
        else
            local += s->norm_ss[i];
    }
    if (expert)
        *expert = ex;
    return local;
}

status_t dpsync_params_from_host_none(dpsync_t *s, const float *host, char *err, size_t errlen)
{
    (void)s;
    (void)host;
    (void)err;
    (void)errlen;
    return STATUS_OK;
}

status_t dpsync_params_to_host_none(dpsync_t *s, float *host, char *err, size_t errlen)
{
    (void)s;
    (void)host;
    (void)err;
    (void)errlen;
    return STATUS_OK;
}
