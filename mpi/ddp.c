/* Data-parallel gradient averaging on one flat buffer (see ddp.h).
 *
 * Buckets (bucketed mode only; naive and flat have none): tensors are taken
 * from the highest offset down, the order backward finishes them, and added
 * to the current bucket; a bucket is closed before a tensor that would push
 * it past bucket_bytes, and as soon as it reaches bucket_bytes. So every
 * bucket holds whole tensors, is at most bucket_bytes unless it is a
 * single larger tensor, and buckets[0] ends at the top of the buffer.
 * Empty tensors never start a bucket.
 *
 * Averaging: every mode sums with the communicator's allreduce and then
 * multiplies each element by (float)(1/dp) in one pass per communicated
 * range, so the scaling step is the same arithmetic in all modes. Whether
 * the sums themselves are bit-identical across modes depends on the MPI
 * library's reduction order for each message size (doc/design.md). With a
 * DP group of one there is nothing to do: no communication, no scaling.
 *
 * comm_wait_s counts the time ddp_finish spends in communication calls
 * (posting the last buckets and waiting; for naive/flat, all of it), not
 * the scaling.
 *
 * Every cast and scaling is an op of d->ops: the gradients and the staging
 * are backend memory (ddp.h).
 *
 * bf16 (ddp.h): a range is cast into half[start..] just before its
 * all-reduce is posted and widened back in the same pass that finds it
 * finished, right before its scaling; every bucket has its own part of
 * half, so buckets in flight together never share staging. comm_wait_s
 * counts the rounding to bf16 as part of posting (where ddp_finish posts)
 * and the widening back as part of the scaling (not at all).
 *
 * A bucket's `launched` is 0 before its allreduce starts, 1 while it is in
 * flight and 2 once it is reduced and scaled (in ddp_grads_ready when a
 * test finds it done, else in ddp_finish). */
#include "mpi/ddp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/clock.h"

/* bucket->launched: 0 not yet, 1 in flight, BUCKET_DONE reduced and scaled */
enum { BUCKET_IN_FLIGHT = 1, BUCKET_DONE = 2 };

static float inv_dp(const ddp_t *d) { return 1.0f / (float)d->dp->size; }

/* Something to sum: more than one DP rank, or (--etp 1 at dp 1) more than
 * one expert-DP rank. */
static int ddp_idle(const ddp_t *d) { return d->dp->size == 1 && (!d->edp || d->edp->size == 1); }

/* The bf16 staging buffer for d's ranks (ddp_staging_bytes of the larger
 * group), allocated once. */
static status_t alloc_half(ddp_t *d, int ranks)
{
    const size_t bytes = ddp_staging_bytes(d->n, ranks, d->dtype);
    if (bytes == 0 || d->half)
        return STATUS_OK;
    /* no fill needed: a range is cast into it before it is sent */
    if (!(d->half = d->ops->alloc(d->ops->ctx, bytes)))
        return STATUS_FAIL;
    d->half_bytes = bytes;
    mem_tracker_count(&d->mem, MEM_COMM, (long long)bytes);
    return STATUS_OK;
}

/* The all-reduce of [start, start+n) of the gradients: blocking (req NULL)
 * or posted. bf16: rounded into the staging buffer first, reduced there. */
static status_t reduce_range(ddp_t *d, comm_t *c, size_t start, size_t n, comm_req_t *req, char *err, size_t errlen)
{
    if (d->dtype == COMM_BF16) {
        d->ops->cast_f32_to_bf16(d->ops->ctx, d->half + start, d->grads + start, n);
        return req ? c->ops->iallreduce(c, d->half + start, n, COMM_BF16, COMM_SUM, req, err, errlen)
                   : c->ops->allreduce(c, d->half + start, n, COMM_BF16, COMM_SUM, err, errlen);
    }
    return req ? c->ops->iallreduce(c, d->grads + start, n, COMM_FP32, COMM_SUM, req, err, errlen)
               : c->ops->allreduce(c, d->grads + start, n, COMM_FP32, COMM_SUM, err, errlen);
}

/* [start, start+n) is reduced: widened back from bf16 (bf16 mode), then
 * the average's 1/dp in fp32. */
static void range_done(ddp_t *d, size_t start, size_t n, float s)
{
    if (d->dtype == COMM_BF16)
        d->ops->cast_bf16_to_f32(d->ops->ctx, d->grads + start, d->half + start, n);
    d->ops->scale(d->ops->ctx, d->grads + start, s, n);
}

static status_t set_err(char *err, size_t errlen, const char *msg)
{
    return status_set(STATUS_FAIL, err, errlen, "ddp: %s", msg);
}

const char *const ddp_mode_names[] = {[DDP_NAIVE] = "naive", [DDP_FLAT] = "flat", [DDP_BUCKETED] = "bucketed", NULL};

int ddp_mode_parse(const char *s, ddp_mode_t *mode)
{
    for (int i = 0; ddp_mode_names[i]; i++)
        if (s && strcmp(s, ddp_mode_names[i]) == 0) {
            *mode = (ddp_mode_t)i;
            return 0;
        }
    return -1;
}

/* The group tensor t's gradients are summed over (ddp_set_experts). */
static comm_t *tensor_comm(const ddp_t *d, int t)
{
    return d->tensor_expert && d->tensor_expert[t] ? d->edp : d->dp;
}

/* Greedy buckets from the top of the buffer down (see the file comment);
 * a bucket also closes where the tensors' group changes. Called twice:
 * count (out NULL), then fill. */
static int make_buckets(const ddp_t *d, size_t cap_floats, ddp_bucket_t *out)
{
    int nb = 0;
    size_t lo = d->n, hi = d->n; /* current bucket [lo, hi) */
    comm_t *cur = NULL;          /* its group */
    for (int t = d->n_tensors - 1; t >= 0; t--) {
        size_t ts = d->tensor_start[t], tn = d->tensor_start[t + 1] - ts;
        if (tn == 0)
            continue;
        comm_t *c = tensor_comm(d, t);
        if (hi > lo && ((hi - lo) + tn > cap_floats || c != cur)) { /* close before overflowing or mixing */
            if (out)
                out[nb] = (ddp_bucket_t){.start = lo, .n = hi - lo, .comm = cur};
            nb++;
            hi = lo;
        }
        lo = ts;
        cur = c;
        if (hi - lo >= cap_floats) { /* full (or a single large tensor) */
            if (out)
                out[nb] = (ddp_bucket_t){.start = lo, .n = hi - lo, .comm = cur};
            nb++;
            hi = lo;
        }
    }
    if (hi > lo) {
        if (out)
            out[nb] = (ddp_bucket_t){.start = lo, .n = hi - lo, .comm = cur};
        nb++;
    }
    return nb;
}

/* The bucket table for mode and bucket_bytes (bucketed mode only). */
static status_t build_buckets(ddp_t *d, size_t bucket_bytes, char *err, size_t errlen)
{
    free(d->buckets);
    d->buckets = NULL;
    d->n_buckets = 0;
    if (d->mode != DDP_BUCKETED)
        return STATUS_OK;
    size_t cap = bucket_bytes / sizeof(float);
    int nb = make_buckets(d, cap, NULL);
    if (nb > 0) {
        d->buckets = calloc((size_t)nb, sizeof *d->buckets);
        if (!d->buckets)
            return set_err(err, errlen, "out of memory");
        make_buckets(d, cap, d->buckets);
    }
    d->n_buckets = nb;
    return STATUS_OK;
}

size_t ddp_staging_bytes(size_t n, int dp_size, comm_dtype_t dtype)
{
    return dtype == COMM_BF16 && dp_size > 1 ? n * sizeof(uint16_t) : 0;
}

status_t ddp_create(ddp_t *d, const ops_t *ops, const mem_tracker_t *mem, ddp_mode_t mode, comm_t *dp, float *grads,
                    size_t n, const size_t *tensor_start, int n_tensors, size_t bucket_bytes, comm_dtype_t dtype,
                    char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->ops = ops;
    if (mem)
        d->mem = *mem;
    d->mode = mode;
    d->dp = dp;
    d->grads = grads;
    d->n = n;
    d->dtype = dtype;
    if (!dp)
        return set_err(err, errlen, "no data-parallel group");
    if (mode != DDP_NAIVE && mode != DDP_FLAT && mode != DDP_BUCKETED)
        return set_err(err, errlen, "unknown mode");
    if (dtype != COMM_FP32 && dtype != COMM_BF16)
        return set_err(err, errlen, "unknown reduction dtype");
    if (!ops || n_tensors < 0 || (n_tensors > 0 && !tensor_start) || (n > 0 && !grads))
        return set_err(err, errlen, "invalid arguments");
    d->tensor_start = malloc(((size_t)n_tensors + 1) * sizeof *d->tensor_start);
    if (!d->tensor_start)
        return set_err(err, errlen, "out of memory");
    for (int t = 0; t < n_tensors; t++) {
        d->tensor_start[t] = tensor_start[t];
        size_t prev = t ? tensor_start[t - 1] : 0;
        if ((t == 0 && tensor_start[0] != 0) || tensor_start[t] < prev || tensor_start[t] > n) {
            char msg[160];
            snprintf(msg, sizeof msg, "tensor %d starts at %zu: offsets must ascend from 0 and stay within %zu", t,
                     tensor_start[t], n);
            ddp_destroy(d);
            return set_err(err, errlen, msg);
        }
    }
    d->tensor_start[n_tensors] = n;
    d->n_tensors = n_tensors;
    if (n_tensors == 0 && n > 0) {
        ddp_destroy(d);
        return set_err(err, errlen, "a non-empty buffer needs at least one tensor");
    }
    if (build_buckets(d, bucket_bytes, err, errlen) != STATUS_OK) {
        ddp_destroy(d);
        return STATUS_FAIL;
    }
    if (alloc_half(d, dp->size) != STATUS_OK) {
        ddp_destroy(d);
        return set_err(err, errlen, "out of memory for the bf16 staging buffer");
    }
    return 0;
}

void ddp_destroy(ddp_t *d)
{
    /* A bucket still in flight here means a failed step: the job is ending
     * and its request is left to MPI. */
    free(d->buckets);
    free(d->tensor_start);
    free(d->tensor_expert);
    d->tensor_expert = NULL;
    if (d->half) {
        d->ops->free(d->ops->ctx, d->half);
        mem_tracker_count(&d->mem, MEM_COMM, -(long long)d->half_bytes);
    }
    d->half = NULL;
    d->half_bytes = 0;
    d->buckets = NULL;
    d->tensor_start = NULL;
    d->n_buckets = 0;
    d->n_tensors = 0;
}

status_t ddp_set_experts(ddp_t *d, const unsigned char *expert, comm_t *edp, size_t bucket_bytes, char *err,
                         size_t errlen)
{
    if (!edp)
        return set_err(err, errlen, "no expert-data-parallel group");
    if (!(d->tensor_expert = malloc((size_t)d->n_tensors + 1)))
        return set_err(err, errlen, "out of memory");
    memcpy(d->tensor_expert, expert, (size_t)d->n_tensors);
    d->edp = edp;
    if (alloc_half(d, edp->size) != STATUS_OK)
        return set_err(err, errlen, "out of memory for the bf16 staging buffer");
    return build_buckets(d, bucket_bytes, err, errlen);
}

void ddp_begin(ddp_t *d)
{
    d->next_bucket = 0;
    d->comm_wait_s = 0.0;
    for (int b = 0; b < d->n_buckets; b++)
        d->buckets[b].launched = 0;
}

void ddp_on_done(ddp_t *d, void (*done)(void *ctx, size_t start, size_t n), void *ctx)
{
    d->done = done;
    d->done_ctx = ctx;
}

/* Bucket k is the step's final average: marked, and its listener told. */
static void bucket_final(ddp_t *d, ddp_bucket_t *k)
{
    k->launched = BUCKET_DONE;
    if (d->done)
        d->done(d->done_ctx, k->start, k->n);
}

/* Tests the launched buckets oldest first, scaling each one that has
 * finished; stops at the first still in flight (they finish in order, and
 * one MPI_Test progresses all of them). */
static status_t progress(ddp_t *d, char *err, size_t errlen)
{
    for (int b = 0; b < d->next_bucket; b++) {
        ddp_bucket_t *k = &d->buckets[b];
        if (k->launched == BUCKET_DONE)
            continue;
        int done = 0;
        CHECK(k->comm->ops->test(&k->req, &done, err, errlen));
        if (!done)
            break;
        range_done(d, k->start, k->n, inv_dp(d));
        bucket_final(d, k);
    }
    return 0;
}

static status_t launch_ready(ddp_t *d, size_t ready_from, char *err, size_t errlen)
{
    while (d->next_bucket < d->n_buckets && d->buckets[d->next_bucket].start >= ready_from) {
        ddp_bucket_t *k = &d->buckets[d->next_bucket];
        CHECK(reduce_range(d, k->comm, k->start, k->n, &k->req, err, errlen));
        k->launched = BUCKET_IN_FLIGHT;
        d->next_bucket++;
    }
    return 0;
}

status_t ddp_grads_ready(ddp_t *d, size_t ready_from, char *err, size_t errlen)
{
    if (d->mode != DDP_BUCKETED)
        return STATUS_OK;
    if (ddp_idle(d)) { /* nothing to sum: a bucket is final once the backward has passed it */
        while (d->done && d->next_bucket < d->n_buckets && d->buckets[d->next_bucket].start >= ready_from)
            bucket_final(d, &d->buckets[d->next_bucket++]);
        return STATUS_OK;
    }
    CHECK(launch_ready(d, ready_from, err, errlen));
    return progress(d, err, errlen);
}

status_t ddp_finish(ddp_t *d, char *err, size_t errlen)
{
    if (ddp_idle(d))
        return 0;
    const float s = inv_dp(d);
    d->ops->sync(d->ops->ctx); /* backward's last kernels are compute, not communication wait */
    double t0 = now_s(), blocked = 0.0;
    status_t rc = STATUS_OK;
    switch (d->mode) {
    case DDP_NAIVE:
        for (int t = d->n_tensors - 1; t >= 0 && rc == 0; t--) {
            size_t ts = d->tensor_start[t], tn = d->tensor_start[t + 1] - ts;
            if (tn == 0)
                continue;
            double t1 = now_s();
            rc = reduce_range(d, tensor_comm(d, t), ts, tn, NULL, err, errlen);
            blocked += now_s() - t1;
            if (rc == 0)
                range_done(d, ts, tn, s);
        }
        break;
    case DDP_FLAT:
        /* the whole buffer in one call; under --ep one per run of tensors
         * of one group, from the top */
        for (int t = d->n_tensors - 1; t >= 0 && rc == 0;) {
            int lo = t;
            while (lo > 0 && tensor_comm(d, lo - 1) == tensor_comm(d, t))
                lo--;
            const size_t ts = d->tensor_start[lo], tn = d->tensor_start[t + 1] - ts;
            if (tn > 0) {
                double t1 = now_s();
                rc = reduce_range(d, tensor_comm(d, t), ts, tn, NULL, err, errlen);
                blocked += now_s() - t1;
                if (rc == 0)
                    range_done(d, ts, tn, s);
            }
            t = lo - 1;
        }
        break;
    case DDP_BUCKETED:
        rc = launch_ready(d, 0, err, errlen);
        blocked = now_s() - t0;
        for (int b = 0; b < d->n_buckets && rc == 0; b++) {
            ddp_bucket_t *k = &d->buckets[b];
            if (k->launched == BUCKET_DONE)
                continue; /* finished and scaled during backward */
            double t1 = now_s();
            rc = k->comm->ops->wait(&k->req, err, errlen);
            blocked += now_s() - t1;
            if (rc == 0) {
                range_done(d, k->start, k->n, s);
                bucket_final(d, k);
            }
        }
        break;
    }
    d->comm_wait_s += blocked;
    return rc;
}
