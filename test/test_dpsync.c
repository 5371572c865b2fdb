/* The data-parallel strategies (mpi/dpsync.h) on a synthetic stage: two
 * non-block tensors below two blocks of three tensors and two above, as
 * the model lays them out. For ZeRO 0..3 one step of two microbatches is
 * driven as the trainer and model_backward drive it (backward_begin, the
 * hook from the top down, lent block gradients where the strategy lends
 * them, backward_end, grads_finish), and on every rank of the world:
 *   - the optimizer view's gradients are the exact DP average (the
 *     gradients are multiples of 1/4 whose sums are exact in fp32);
 *   - the view's pieces cover every element once over the shard group;
 *   - after a fake update of the view's parameters and after_update, the
 *     parameters (model buffer plus params_to_host) are the updated ones;
 *   - a state buffer indexed like the moments goes to the host whole;
 *   - the global norm's part, summed over norm_group, is the norm of the
 *     average;
 *   - dpsync_on_final tells every gradient of the view, none in the first
 *     microbatch, each holding the average when told (ZeRO-2/3 and one
 *     rank: some during the last microbatch's backward).
 * And, on a fake group of two whose every operation fails: a failure in
 * the model's hook (which returns nothing) is held by the strategy and
 * handed, with the group's message, to dpsync_backward_end's and
 * grads_finish's callers (replicated and ZeRO-2).
 * Prints one line per check; exits 1 on every rank if any failed. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/comm.h"
#include "mpi/dpsync.h"
#include "mpi/launch.h"
#include "src/backend/ops_cpu.h"

#define NT 10
static const size_t numel[NT] = {7, 5, 4, 6, 3, 4, 6, 3, 2, 9};
static const int block[NT] = {-1, -1, 0, 0, 0, 1, 1, 1, -1, -1};
#define MICRO 2

static int fails;

static void check(int ok, int rank, const char *what, int stage)
{
    int all = 0, mine = !ok;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s: zero %d: %s\n", all ? "FAIL" : "ok", stage, what);
    fails += all > 0;
}

/* rank r's gradient of element i in microbatch k */
static float grad_of(size_t i, int r, int k) { return 0.25f * (float)((i % 7) + (size_t)r + (size_t)k); }

/* One microbatch's backward over the synthetic stage, as model_backward
 * calls the hook: the top tensors, each block from the last down, the
 * bottom ones. grads: the model's buffer (compact without the blocks when
 * they are lent). */
static int backward(dpsync_t *s, float *grads, const size_t *start, size_t blo, size_t bhi, int lent, int r, int k,
                    int accum)
{
    const dpsync_hook_t *h = &s->hook;
    for (int t = NT - 1; t >= 0; t--) {
        float *dst;
        if (block[t] >= 0 && lent) {
            const int b = block[t];
            float *w = h->block_grads(h->ctx, b);
            if (!w)
                return -1;
            size_t first = start[t];
            for (int u = t; u >= 0 && block[u] == b; u--)
                first = start[u];
            dst = w + (start[t] - first);
        } else {
            dst = grads + (start[t] >= bhi && lent ? start[t] - (bhi - blo) : start[t]);
        }
        for (size_t j = 0; j < numel[t]; j++)
            dst[j] = (accum ? dst[j] : 0.0f) + grad_of(start[t] + j, r, k);
        /* a block's gradients are final when its first tensor is done */
        if (h->grads_ready && (block[t] < 0 || t == 0 || block[t - 1] != block[t]))
            h->grads_ready(h->ctx, start[t]);
    }
    return dpsync_backward_end(s, NULL, 0);
}

/* The strategy's configuration over the NT tensors (start[NT + 1],
 * norm[NT]): bucketed, 40-byte buckets, fp32. */
static dpsync_config_t config_of(const ops_t *cpu, comm_t *dp, float *params, float *grads, size_t n,
                                 const size_t *start, const unsigned char *norm)
{
    return (dpsync_config_t){.ops = cpu,
                             .dp = dp,
                             .params = params,
                             .grads = grads,
                             .n = n,
                             .n_tensors = NT,
                             .tensor_start = start,
                             .tensor_block = block,
                             .tensor_norm = norm,
                             .mode = DDP_BUCKETED,
                             .bucket_bytes = 40,
                             .dtype = COMM_FP32};
}

/* dpsync_on_final's listener: what it was told, when, and whether each
 * told gradient held its final value then (the CPU ops are synchronous,
 * so the value is readable at once). */
typedef struct told {
    const dpsync_t *s;
    const float *expect; /* [n] the flat average */
    long *flat_of;       /* [view gradients] the flat element, or -1 (padding) */
    unsigned char *told; /* [view gradients] */
    int phase;           /* 0 first microbatch, 1 last, 2 grads_finish */
    long early, wrong, during;
} told_t;

static void on_final(void *ctx, size_t lo, size_t n)
{
    told_t *t = ctx;
    for (size_t i = lo; i < lo + n; i++) {
        if (t->flat_of[i] < 0)
            continue;
        t->told[i] = 1;
        t->early += t->phase == 0;
        t->during += t->phase == 1;
        t->wrong += t->s->view.grads[i] != t->expect[t->flat_of[i]];
    }
}

static void run_stage(comm_t *world, int stage, int rank)
{
    const dpsync_ops_t *kind = dpsync_pick(stage);
    size_t start[NT + 1] = {0};
    unsigned char norm[NT];
    for (int t = 0; t < NT; t++) {
        start[t + 1] = start[t] + numel[t];
        norm[t] = t != NT - 1 || stage % 2 == 0; /* leave one tensor out of the norm sometimes */
    }
    const size_t n = start[NT], blo = start[2], bhi = start[8];
    const int lent_g = kind->lends_block_grads, lent_p = kind->lends_block_params;
    float *params = calloc(n, sizeof(float)), *grads = calloc(n, sizeof(float)), *host = calloc(n, sizeof(float));
    float *expect = calloc(n, sizeof(float));
    const int S = world->size;
    for (size_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int r = 0; r < S; r++)
            for (int k = 0; k < MICRO; k++)
                sum += grad_of(i, r, k);
        expect[i] = S > 1 ? sum * (1.0f / (float)S) : sum;
        host[i] = 0.5f * (float)i;
    }
    const ops_t *cpu = ops_cpu_create();
    const dpsync_config_t c = config_of(cpu, world, params, grads, n, start, norm);
    dpsync_t s;
    char err[COMM_ERR_MAX] = ""; /* a failed call's message, printed at the end */
    int ok = cpu && kind && dpsync_create(&s, kind, &c, err, sizeof err) == 0;
    check(ok, rank, "dpsync_create", stage);
    if (!ok)
        goto out;
    /* the model's part of the parameters: everything, or the compact outside of the blocks */
    for (size_t i = 0; i < n; i++)
        if (!lent_p || i < blo || i >= bhi)
            params[lent_p && i >= bhi ? i - (bhi - blo) : i] = host[i];
    ok = s.ops->params_from_host(&s, host, err, sizeof err) == 0;
    /* the gradients told final as they become so (--offload's copies) */
    const size_t vg = stage >= 2 ? s.zero.shard_n : n;
    told_t tl = {.s = &s, .expect = expect, .flat_of = malloc((vg + 1) * sizeof(long)), .told = calloc(vg + 1, 1)};
    ok = ok && tl.flat_of && tl.told && dpsync_on_final(&s, on_final, &tl, err, sizeof err) == 0;
    for (size_t i = 0; ok && i < vg; i++)
        tl.flat_of[i] = -1;
    for (int p = 0; ok && p < s.view.n_pieces; p++)
        for (size_t j = 0; j < s.view.pieces[p].n; j++)
            tl.flat_of[s.view.pieces[p].grad + j] = (long)(s.view.pieces[p].lo + j);
    s.ops->step_begin(&s);
    for (int k = 0; k < MICRO && ok; k++) {
        int accum, last;
        tl.phase = k == MICRO - 1;
        s.ops->backward_begin(&s, k, MICRO, s.n, &accum, &last);
        ok = backward(&s, grads, start, blo, bhi, lent_g, rank, k, accum) == 0;
    }
    tl.phase = 2;
    ok = ok && s.ops->grads_finish(&s, err, sizeof err) == 0;
    check(ok, rank, "a step's backward and grads_finish", stage);
    long untold = 0;
    for (size_t i = 0; ok && i < vg; i++)
        untold += tl.flat_of[i] >= 0 && !tl.told[i];
    check(ok && untold == 0 && tl.wrong == 0 && tl.early == 0, rank,
          "dpsync_on_final: every gradient of the view told, each holding the average when told, none in the first "
          "microbatch",
          stage);
    /* ZeRO-2/3 bank the units outside the blocks in the hook (blocking
     * reduce-scatters); one rank's buckets are final once passed */
    if (stage >= 2 || world->size == 1)
        check(tl.during > 0, rank, "dpsync_on_final: gradients told during the last microbatch's backward", stage);
    free(tl.flat_of);
    free(tl.told);
    const dpsync_optim_view_t *v = &s.view;
    size_t covered = 0;
    int exact = ok;
    for (int p = 0; p < v->n_pieces && exact; p++)
        for (size_t j = 0; j < v->pieces[p].n; j++) {
            exact = exact && v->grads[v->pieces[p].grad + j] == expect[v->pieces[p].lo + j];
            covered++;
        }
    check(exact, rank, "the view's gradients are the exact DP average", stage);
    long long cov = (long long)covered, all = 0;
    MPI_Allreduce(&cov, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    const long long want = (long long)n * (stage > 0 ? 1 : S);
    check(all == want, rank, "the view's pieces cover every element once per shard group", stage);
    /* the global norm */
    double part = dpsync_grad_sumsq(&s, NULL), ref = 0.0;
    if (s.norm_group) {
        float f = (float)part;
        s.norm_group->ops->allreduce(s.norm_group, &f, 1, COMM_FP32, COMM_SUM, err, sizeof err);
        part = f;
    }
    for (int t = 0; t < NT; t++)
        for (size_t j = 0; norm[t] && j < numel[t]; j++)
            ref += (double)expect[start[t] + j] * expect[start[t] + j];
    check(fabs(part - ref) <= 1e-6 * ref, rank, "the norm's parts add up to the average's", stage);
    /* a fake update, then the gather */
    for (int p = 0; p < v->n_pieces; p++)
        for (size_t j = 0; j < v->pieces[p].n; j++)
            v->params[v->pieces[p].param + j] += 1.0f;
    ok = s.ops->after_update(&s, err, sizeof err) == 0;
    float *back = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        if (!lent_p || i < blo || i >= bhi)
            back[i] = params[lent_p && i >= bhi ? i - (bhi - blo) : i];
    ok = ok && s.ops->params_to_host(&s, back, err, sizeof err) == 0;
    for (size_t i = 0; i < n && ok; i++)
        ok = back[i] == host[i] + 1.0f;
    check(ok, rank, "after_update: every rank holds the updated parameters", stage);
    if (lent_p) {
        /* the lent windows hold the gathered blocks, the prefetch included */
        const float *b1 = s.hook.block_params(s.hook.ctx, 1, 0), *b0 = s.hook.block_params(s.hook.ctx, 0, -1);
        ok = b1 && b0;
        for (size_t i = blo; i < bhi && ok; i++)
            ok = (i < start[5] ? b0[i - blo] : b1[i - start[5]]) == host[i] + 1.0f;
        check(ok, rank, "block_params lends the gathered blocks", stage);
    }
    /* moments: a state buffer indexed like the view, to a whole host copy */
    float *state = calloc(v->n + 1, sizeof(float));
    for (int p = 0; p < v->n_pieces; p++)
        for (size_t j = 0; j < v->pieces[p].n; j++)
            state[v->pieces[p].state + j] = (float)(v->pieces[p].lo + j);
    ok = s.ops->state_to_host(&s, state, back, err, sizeof err) == 0;
    for (size_t i = 0; i < n && ok; i++)
        ok = back[i] == (float)i;
    check(ok, rank, "state_to_host gathers every piece", stage);
    free(state);
    free(back);
    dpsync_destroy(&s);
out:
    if (err[0])
        fprintf(stderr, "test_dpsync: rank %d, zero %d: %s\n", rank, stage, err);
    ops_release(cpu);
    free(params);
    free(grads);
    free(host);
    free(expect);
}

/* ---- a group of two whose every operation fails (local: no MPI) ---- */

#define INJECTED "injected: the peer is gone"

static status_t fk_fail(char *err, size_t errlen) { return status_set(STATUS_FAIL, err, errlen, INJECTED); }

static status_t fk_allreduce(comm_t *c, void *b, size_t n, comm_dtype_t dt, comm_op_t op, char *err, size_t errlen)
{
    (void)c, (void)b, (void)n, (void)dt, (void)op;
    return fk_fail(err, errlen);
}

static status_t fk_iallreduce(comm_t *c, void *b, size_t n, comm_dtype_t dt, comm_op_t op, comm_req_t *q, char *err,
                              size_t errlen)
{
    (void)q;
    return fk_allreduce(c, b, n, dt, op, err, errlen);
}

static status_t fk_reduce_scatter(comm_t *c, const void *s, void *r, size_t n, comm_dtype_t dt, char *err,
                                  size_t errlen)
{
    (void)c, (void)s, (void)r, (void)n, (void)dt;
    return fk_fail(err, errlen);
}

static status_t fk_ireduce_scatter(comm_t *c, const void *s, void *r, size_t n, comm_dtype_t dt, comm_req_t *q,
                                   char *err, size_t errlen)
{
    (void)q;
    return fk_reduce_scatter(c, s, r, n, dt, err, errlen);
}

static const comm_ops_t failing_ops = {.name = "failing",
                                       .allreduce = fk_allreduce,
                                       .iallreduce = fk_iallreduce,
                                       .reduce_scatter = fk_reduce_scatter,
                                       .ireduce_scatter = fk_ireduce_scatter,
                                       .allgather = fk_reduce_scatter,
                                       .iallgather = fk_ireduce_scatter};

/* One last backward whose hook finds every gradient final at once. */
static void run_failing(int stage, int rank)
{
    comm_t dp = {.ops = &failing_ops, .rank = 0, .size = 2, .name = "dp"};
    size_t start[NT + 1] = {0};
    unsigned char norm[NT];
    for (int t = 0; t < NT; t++) {
        start[t + 1] = start[t] + numel[t];
        norm[t] = 1;
    }
    const size_t n = start[NT];
    float *params = calloc(n, sizeof(float)), *grads = calloc(n, sizeof(float));
    const ops_t *cpu = ops_cpu_create();
    const dpsync_config_t c = config_of(cpu, &dp, params, grads, n, start, norm);
    dpsync_t s;
    char err[COMM_ERR_MAX] = "", fin[COMM_ERR_MAX] = "";
    const char *want = stage ? "gradient reduce-scatter failed: " INJECTED : "gradient all-reduce failed: " INJECTED;
    int ok = params && grads && cpu && dpsync_create(&s, dpsync_pick(stage), &c, err, sizeof err) == STATUS_OK;
    if (ok) {
        int accum, last;
        s.ops->backward_begin(&s, 0, 1, s.n, &accum, &last);
        s.hook.grads_ready(s.hook.ctx, 0); /* returns nothing: the failure is held */
        ok = dpsync_backward_end(&s, err, sizeof err) == STATUS_FAIL && strcmp(err, want) == 0 &&
             s.ops->grads_finish(&s, fin, sizeof fin) == STATUS_FAIL && strcmp(fin, want) == 0;
        dpsync_destroy(&s);
    }
    if (!ok)
        fprintf(stderr, "test_dpsync: zero %d: backward_end '%s', grads_finish '%s', want '%s'\n", stage, err, fin,
                want);
    check(ok, rank, "a failing group: the hook's failure reaches backward_end and grads_finish", stage);
    ops_release(cpu);
    free(params);
    free(grads);
}

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    MPI_Comm w = MPI_COMM_WORLD;
    comm_t *world = comm_mpi_create(&w);
    if (!world)
        launch_exit(&env, 1);
    for (int stage = 0; stage <= 3; stage++)
        run_stage(world, stage, env.world_rank);
    run_failing(0, env.world_rank);
    run_failing(2, env.world_rank);
    if (env.world_rank == 0)
        printf("%s: dpsync at np %d: %d failure(s)\n", fails ? "FAIL" : "ok", env.world_size, fails);
    world->ops->destroy(world);
    launch_exit(&env, fails ? 1 : 0);
    return 0;
}
