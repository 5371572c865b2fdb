/* ZeRO sharding (see zero.h). Every buffer holding tensor data is the
 * backend's and is touched only through z->ops (zero.h, "Memory"). */
#include "mpi/zero.h"

#include <stdlib.h>
#include <string.h>

#include <mpi.h>

/* Whether reductions over c send bf16: asked for, and c has more than one
 * rank (a group of one reduces nothing and keeps fp32). */
static int bf16_on(const zero_t *z, const comm_t *c) { return z->dtype == COMM_BF16 && c && c->size > 1; }

/* Backend memory, zero-filled (the shards' and windows' padding must read
 * as zero, and not every backend's alloc fills), counted in cat. */
static void *buf_alloc(const zero_t *z, mem_category_t cat, size_t bytes)
{
    void *p = z->ops->alloc(z->ops->ctx, bytes);
    if (p) {
        z->ops->zero(z->ops->ctx, p, bytes);
        mem_tracker_count(&z->mem, cat, (long long)bytes);
    }
    return p;
}

static void buf_free(const zero_t *z, mem_category_t cat, void *p, size_t bytes)
{
    if (p) {
        z->ops->free(z->ops->ctx, p);
        mem_tracker_count(&z->mem, cat, -(long long)bytes);
    }
}

void zero_cut_units(zero_units_t *u, size_t n, int n_tensors, const size_t *tensor_start, const int *tensor_block,
                    size_t *unit_start)
{
    *u = (zero_units_t){.block0 = -1};
    int k = 0;
    for (int i = 0; i < n_tensors; i++) {
        const int blk = tensor_block[i];
        if (i == 0 || blk < 0 || tensor_block[i - 1] != blk) {
            if (blk >= 0 && u->block0 < 0)
                u->block0 = k;
            u->n_blocks += blk >= 0;
            unit_start[k++] = tensor_start[i];
        }
    }
    unit_start[k] = n;
    u->n_units = k;
    for (int b = u->block0; b >= 0 && b < u->block0 + u->n_blocks; b++)
        if (unit_start[b + 1] - unit_start[b] > u->window)
            u->window = unit_start[b + 1] - unit_start[b];
}

void zero_pieces(const size_t *unit_start, int n_units, size_t S, size_t *chunk, size_t *shard_start, size_t *shard_n,
                 size_t *stage_n)
{
    size_t off = 0, max_c = 0;
    if (shard_start)
        shard_start[0] = 0;
    for (int u = 0; u < n_units; u++) {
        const size_t c = (unit_start[u + 1] - unit_start[u] + S - 1) / S;
        if (chunk)
            chunk[u] = c;
        off += c;
        if (shard_start)
            shard_start[u + 1] = off;
        if (c > max_c)
            max_c = c;
    }
    *shard_n = off;
    *stage_n = S * max_c;
}

/* Each buffer carries one float (or bf16) of padding beyond its content
 * (stage: at least one element), so that none is empty. */
void zero_sizes(zero_sizes_t *s, int stage, size_t S, size_t shard_n, size_t stage_n, size_t window_units,
                comm_dtype_t dtype, int replica_size)
{
    *s = (zero_sizes_t){.stage = stage_n ? stage_n : 1};
    if (stage < 2)
        return;
    const size_t c = (window_units + S - 1) / S;
    s->window_n = S * c;
    s->grad_shard = shard_n + 1;
    s->window = s->window_n + 1;
    s->recv = c + 1;
    /* bf16 only where a reduction happens: a group of one keeps fp32 */
    if (dtype == COMM_BF16 && S > 1) {
        s->hstage = stage_n + 1;
        s->hwin = s->window_n + 1;
        s->hrecv = c + 1;
    }
    if (dtype == COMM_BF16 && replica_size > 1)
        s->hshard = shard_n + 1;
    if (stage >= 3) {
        s->param_shard = shard_n + 1;
        s->pwin = s->window_n + 1;
    }
}

void zero_buffer_bytes(const zero_sizes_t *s, double bytes[MEM_N_CATEGORIES])
{
    const double f = sizeof(float), h = sizeof(uint16_t);
    bytes[MEM_COMM] += f * (double)s->stage + 2.0 * f * (double)s->recv;
    bytes[MEM_COMM] += h * ((double)s->hstage + 2.0 * (double)(s->hwin + s->hrecv) + (double)s->hshard);
    bytes[MEM_GRADS] += f * ((double)s->grad_shard + 2.0 * (double)s->window);
    bytes[MEM_PARAMS] += f * ((double)s->param_shard + 2.0 * (double)s->pwin);
}

/* The buffers of z->sizes, in the order they were always allocated.
 * Returns 0 or -1 (out of memory; zero_destroy frees what was taken). */
static int alloc_buffers(zero_t *z)
{
    const zero_sizes_t *s = &z->sizes;
    if (!(z->stage_buf = buf_alloc(z, MEM_COMM, s->stage * sizeof(float))))
        return -1;
    if (s->grad_shard) {
        z->grad_shard = buf_alloc(z, MEM_GRADS, s->grad_shard * sizeof(float));
        for (int k = 0; k < 2; k++) {
            z->window[k] = buf_alloc(z, MEM_GRADS, s->window * sizeof(float));
            z->recv[k] = buf_alloc(z, MEM_COMM, s->recv * sizeof(float));
        }
        if (!z->grad_shard || !z->window[0] || !z->window[1] || !z->recv[0] || !z->recv[1])
            return -1;
    }
    if (s->hstage) {
        z->hstage = buf_alloc(z, MEM_COMM, s->hstage * sizeof(uint16_t));
        for (int k = 0; k < 2; k++) {
            z->hwin[k] = buf_alloc(z, MEM_COMM, s->hwin * sizeof(uint16_t));
            z->hrecv[k] = buf_alloc(z, MEM_COMM, s->hrecv * sizeof(uint16_t));
        }
        if (!z->hstage || !z->hwin[0] || !z->hwin[1] || !z->hrecv[0] || !z->hrecv[1])
            return -1;
    }
    if (s->hshard && !(z->hshard = buf_alloc(z, MEM_COMM, s->hshard * sizeof(uint16_t))))
        return -1;
    if (s->param_shard) {
        z->param_shard = buf_alloc(z, MEM_PARAMS, s->param_shard * sizeof(float));
        for (int k = 0; k < 2; k++)
            z->pwin[k] = buf_alloc(z, MEM_PARAMS, s->pwin * sizeof(float));
        if (!z->param_shard || !z->pwin[0] || !z->pwin[1])
            return -1;
    }
    return 0;
}

status_t zero_create(zero_t *z, const ops_t *ops, const mem_tracker_t *mem, int stage, comm_t *group, size_t n,
                     const size_t *unit_start, int n_units, size_t window_units, comm_t *replica, comm_dtype_t dtype,
                     char *err, size_t errlen)
{
    memset(z, 0, sizeof *z);
    z->ops = ops;
    if (mem)
        z->mem = *mem;
    z->stage = stage;
    z->group = group;
    z->replica = replica;
    z->dtype = dtype;
    z->n = n;
    z->n_units = n_units;
    z->unit_start = malloc(((size_t)n_units + 1) * sizeof *z->unit_start);
    z->chunk = malloc(((size_t)n_units + 1) * sizeof *z->chunk);
    z->shard_start = malloc(((size_t)n_units + 1) * sizeof *z->shard_start);
    if (!z->unit_start || !z->chunk || !z->shard_start) {
        zero_destroy(z);
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the ZeRO units");
    }
    memcpy(z->unit_start, unit_start, (size_t)n_units * sizeof *z->unit_start);
    z->unit_start[n_units] = n;
    const size_t S = (size_t)group->size;
    zero_pieces(z->unit_start, n_units, S, z->chunk, z->shard_start, &z->shard_n, &z->stage_n);
    zero_sizes(&z->sizes, stage, S, z->shard_n, z->stage_n, window_units, dtype, replica ? replica->size : 0);
    z->window_n = z->sizes.window_n;
    z->window_unit[0] = z->window_unit[1] = -1;
    z->pwin_unit[0] = z->pwin_unit[1] = -1;
    if (alloc_buffers(z) != 0) {
        zero_destroy(z);
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the ZeRO buffers");
    }
    return STATUS_OK;
}

void zero_destroy(zero_t *z)
{
    const zero_sizes_t *s = &z->sizes;
    buf_free(z, MEM_COMM, z->stage_buf, s->stage * sizeof(float));
    buf_free(z, MEM_GRADS, z->grad_shard, s->grad_shard * sizeof(float));
    for (int k = 0; k < 2; k++) {
        buf_free(z, MEM_GRADS, z->window[k], s->window * sizeof(float));
        buf_free(z, MEM_COMM, z->recv[k], s->recv * sizeof(float));
        buf_free(z, MEM_COMM, z->hwin[k], s->hwin * sizeof(uint16_t));
        buf_free(z, MEM_COMM, z->hrecv[k], s->hrecv * sizeof(uint16_t));
    }
    buf_free(z, MEM_COMM, z->hstage, s->hstage * sizeof(uint16_t));
    buf_free(z, MEM_COMM, z->hshard, s->hshard * sizeof(uint16_t));
    buf_free(z, MEM_PARAMS, z->param_shard, s->param_shard * sizeof(float));
    for (int k = 0; k < 2; k++)
        buf_free(z, MEM_PARAMS, z->pwin[k], s->pwin * sizeof(float));
    free(z->unit_start);
    free(z->chunk);
    free(z->shard_start);
    memset(z, 0, sizeof *z);
}

void zero_piece(const zero_t *z, int u, size_t *lo, size_t *hi)
{
    const size_t len = z->unit_start[u + 1] - z->unit_start[u];
    size_t a = (size_t)z->group->rank * z->chunk[u], b = a + z->chunk[u];
    if (a > len)
        a = len;
    if (b > len)
        b = len;
    *lo = z->unit_start[u] + a;
    *hi = z->unit_start[u] + b;
}

/* zero_allgather (buf in backend memory) and zero_allgather_host (buf in
 * host memory): the same gathers through stage_buf, which is the
 * backend's, with the copies in and out chosen by where buf lives. */
static status_t allgather_units(zero_t *z, float *buf, int host, char *err, size_t errlen)
{
    const ops_t *o = z->ops;
    comm_t *c = z->group;
    for (int u = 0; u < z->n_units; u++) {
        const size_t cu = z->chunk[u], len = z->unit_start[u + 1] - z->unit_start[u];
        if (cu == 0)
            continue;
        size_t lo, hi;
        zero_piece(z, u, &lo, &hi);
        /* the send piece is padded to c with zeros so every rank sends c */
        float *mine = z->stage_buf + (size_t)c->rank * cu;
        if (host)
            o->from_host(o->ctx, mine, buf + lo, (hi - lo) * sizeof(float));
        else
            o->copy(o->ctx, mine, buf + lo, (hi - lo) * sizeof(float));
        o->zero(o->ctx, mine + (hi - lo), (cu - (hi - lo)) * sizeof(float));
        /* send == recv + rank*c: the communicator's in-place form */
        CHECK(c->ops->allgather(c, mine, z->stage_buf, cu, COMM_FP32, err, errlen));
        if (host)
            o->to_host(o->ctx, buf + z->unit_start[u], z->stage_buf, len * sizeof(float));
        else
            o->copy(o->ctx, buf + z->unit_start[u], z->stage_buf, len * sizeof(float));
    }
    return 0;
}

status_t zero_allgather(zero_t *z, float *buf, char *err, size_t errlen)
{
    return allgather_units(z, buf, 0, err, errlen);
}

status_t zero_allgather_host(zero_t *z, float *host, char *err, size_t errlen)
{
    return allgather_units(z, host, 1, err, errlen);
}

void zero_shard_from_host(const zero_t *z, const float *host, float *shard)
{
    for (int u = 0; u < z->n_units; u++) {
        size_t lo, hi;
        zero_piece(z, u, &lo, &hi);
        float *dst = shard + z->shard_start[u];
        z->ops->from_host(z->ops->ctx, dst, host + lo, (hi - lo) * sizeof(float));
        z->ops->zero(z->ops->ctx, dst + (hi - lo), (z->chunk[u] - (hi - lo)) * sizeof(float));
    }
}

void zero_shard_to_host(const zero_t *z, const float *shard, float *host)
{
    for (int u = 0; u < z->n_units; u++) {
        size_t lo, hi;
        zero_piece(z, u, &lo, &hi);
        z->ops->to_host(z->ops->ctx, host + lo, shard + z->shard_start[u], (hi - lo) * sizeof(float));
    }
}

int zero_unit_of(const zero_t *z, size_t off)
{
    int lo = 0, hi = z->n_units - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (z->unit_start[mid] <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void zero_grads_begin(zero_t *z)
{
    z->ops->zero(z->ops->ctx, z->grad_shard, z->shard_n * sizeof(float));
    z->wait_s = 0.0;
    z->gather_s = 0.0;
}

/* Adds a finished reduce-scatter's piece of unit u to the shard. */
static void add_piece(zero_t *z, int u, const float *piece)
{
    float *dst = z->grad_shard + z->shard_start[u];
    z->ops->add(z->ops->ctx, dst, dst, piece, z->chunk[u]);
}

/* Window k's reduce-scatter finished: its piece (widened from bf16 when
 * reduced in bf16) added to the shard; the window is free. */
static void window_done(zero_t *z, int k)
{
    const int u = z->window_unit[k];
    if (bf16_on(z, z->group))
        z->ops->cast_bf16_to_f32(z->ops->ctx, z->recv[k], z->hrecv[k], z->chunk[u]);
    add_piece(z, u, z->recv[k]);
    z->window_unit[k] = -1;
}

static status_t window_drain(zero_t *z, int k, char *err, size_t errlen)
{
    if (z->window_unit[k] < 0)
        return 0;
    z->ops->sync(z->ops->ctx); /* running kernels are compute, not communication wait */
    double t0 = MPI_Wtime();
    status_t rc = z->group->ops->wait(&z->req[k], err, errlen);
    z->wait_s += MPI_Wtime() - t0;
    CHECK(rc);
    window_done(z, k);
    return STATUS_OK;
}

status_t zero_grads_progress(zero_t *z, char *err, size_t errlen)
{
    for (int k = 0; k < 2; k++) {
        if (z->window_unit[k] < 0)
            continue;
        int done = 0;
        CHECK(z->group->ops->test(&z->req[k], &done, err, errlen));
        if (done)
            window_done(z, k);
    }
    return 0;
}

float *zero_grads_window(zero_t *z, int u, char *err, size_t errlen)
{
    const int k = u & 1;
    return window_drain(z, k, err, errlen) == STATUS_OK ? z->window[k] : NULL;
}

status_t zero_grads_reduce_window(zero_t *z, int u, char *err, size_t errlen)
{
    const int k = u & 1;
    comm_t *c = z->group;
    status_t rc;
    if (bf16_on(z, c)) {
        /* the whole send, padding included (zero in both types) */
        z->ops->cast_f32_to_bf16(z->ops->ctx, z->hwin[k], z->window[k], (size_t)c->size * z->chunk[u]);
        rc = c->ops->ireduce_scatter(c, z->hwin[k], z->hrecv[k], z->chunk[u], COMM_BF16, &z->req[k], err, errlen);
    } else {
        rc = c->ops->ireduce_scatter(c, z->window[k], z->recv[k], z->chunk[u], COMM_FP32, &z->req[k], err, errlen);
    }
    CHECK(rc);
    z->window_unit[k] = u;
    return STATUS_OK;
}

status_t zero_grads_reduce(zero_t *z, int u, const float *src, char *err, size_t errlen)
{
    comm_t *c = z->group;
    const size_t cu = z->chunk[u], len = z->unit_start[u + 1] - z->unit_start[u];
    if (cu == 0)
        return 0;
    /* stage_buf [S*c] (hstage in bf16): the send, padded; in place, the
     * rank's piece lands at its start */
    const int bf16 = bf16_on(z, c);
    const ops_t *o = z->ops;
    if (bf16) {
        o->cast_f32_to_bf16(o->ctx, z->hstage, src, len);
        o->zero(o->ctx, z->hstage + len, ((size_t)c->size * cu - len) * sizeof(uint16_t));
    } else {
        o->copy(o->ctx, z->stage_buf, src, len * sizeof(float));
        o->zero(o->ctx, z->stage_buf + len, ((size_t)c->size * cu - len) * sizeof(float));
    }
    z->ops->sync(z->ops->ctx); /* running kernels are compute, not communication wait */
    double t0 = MPI_Wtime();
    status_t rc = bf16 ? c->ops->reduce_scatter(c, z->hstage, z->hstage, cu, COMM_BF16, err, errlen)
                       : c->ops->reduce_scatter(c, z->stage_buf, z->stage_buf, cu, COMM_FP32, err, errlen);
    z->wait_s += MPI_Wtime() - t0;
    CHECK(rc);
    if (bf16)
        o->cast_bf16_to_f32(o->ctx, z->stage_buf, z->hstage, cu);
    add_piece(z, u, z->stage_buf);
    return 0;
}

status_t zero_grads_finish(zero_t *z, float scale, char *err, size_t errlen)
{
    CHECK(window_drain(z, 0, err, errlen));
    CHECK(window_drain(z, 1, err, errlen));
    z->ops->scale(z->ops->ctx, z->grad_shard, scale, z->shard_n);
    return 0;
}

status_t zero_grads_replicas(zero_t *z, char *err, size_t errlen)
{
    comm_t *r = z->replica;
    if (!r || z->stage < 2)
        return 0;
    if (!bf16_on(z, r))
        return r->ops->allreduce(r, z->grad_shard, z->shard_n, COMM_FP32, COMM_SUM, err, errlen);
    z->ops->cast_f32_to_bf16(z->ops->ctx, z->hshard, z->grad_shard, z->shard_n);
    CHECK(r->ops->allreduce(r, z->hshard, z->shard_n, COMM_BF16, COMM_SUM, err, errlen));
    z->ops->cast_bf16_to_f32(z->ops->ctx, z->grad_shard, z->hshard, z->shard_n);
    return 0;
}

/* ---- stage 3: parameter windows ---- */

static status_t pwin_wait(zero_t *z, int k, char *err, size_t errlen)
{
    if (!z->pwin_busy[k])
        return 0;
    z->ops->sync(z->ops->ctx); /* running kernels are compute, not communication wait */
    double t0 = MPI_Wtime();
    status_t rc = z->group->ops->wait(&z->preq[k], err, errlen);
    z->gather_s += MPI_Wtime() - t0;
    z->pwin_busy[k] = 0;
    if (rc != 0)
        z->pwin_unit[k] = -1;
    return rc;
}

/* Starts gathering unit u into window k: every rank sends its c-float
 * piece (padded with zeros in the shard), the window receives S*c floats
 * in rank order, which is the unit's flat layout followed by padding. */
static status_t pwin_start(zero_t *z, int k, int u, char *err, size_t errlen)
{
    comm_t *c = z->group;
    z->pwin_unit[k] = u;
    z->gathers++;
    if (c->ops->iallgather(c, z->param_shard + z->shard_start[u], z->pwin[k], z->chunk[u], COMM_FP32, &z->preq[k], err,
                           errlen) != STATUS_OK) {
        z->pwin_unit[k] = -1;
        return STATUS_FAIL;
    }
    z->pwin_busy[k] = 1;
    return 0;
}

float *zero_params_window(zero_t *z, int u, int next, char *err, size_t errlen)
{
    const int k = u & 1;
    if (z->pwin_unit[k] != u) {
        if (pwin_wait(z, k, err, errlen) != 0 || pwin_start(z, k, u, err, errlen) != 0)
            return NULL;
    }
    if (pwin_wait(z, k, err, errlen) != 0)
        return NULL;
    if (next >= 0 && (next & 1) != k && z->pwin_unit[next & 1] != next) {
        const int o = next & 1;
        if (pwin_wait(z, o, err, errlen) != 0 || pwin_start(z, o, next, err, errlen) != 0)
            return NULL;
    }
    return z->pwin[k];
}

status_t zero_params_progress(zero_t *z, char *err, size_t errlen)
{
    for (int k = 0; k < 2; k++) {
        if (!z->pwin_busy[k])
            continue;
        int done = 0;
        if (z->group->ops->test(&z->preq[k], &done, err, errlen) != STATUS_OK) {
            z->pwin_busy[k] = 0;
            z->pwin_unit[k] = -1;
            return STATUS_FAIL;
        }
        if (done)
            z->pwin_busy[k] = 0;
    }
    return 0;
}

status_t zero_params_invalidate(zero_t *z, char *err, size_t errlen)
{
    status_t rc = STATUS_OK;
    for (int k = 0; k < 2; k++) {
        /* both windows are forgotten; the first failure's message stays */
        if (pwin_wait(z, k, rc == STATUS_OK ? err : NULL, errlen) != STATUS_OK)
            rc = STATUS_FAIL;
        z->pwin_unit[k] = -1;
    }
    return rc;
}

status_t zero_params_gather_unit(zero_t *z, int u, float *dst, char *err, size_t errlen)
{
    comm_t *c = z->group;
    const size_t cu = z->chunk[u], len = z->unit_start[u + 1] - z->unit_start[u];
    if (cu == 0)
        return 0;
    CHECK(c->ops->allgather(c, z->param_shard + z->shard_start[u], z->stage_buf, cu, COMM_FP32, err, errlen));
    z->ops->copy(z->ops->ctx, dst, z->stage_buf, len * sizeof(float));
    return 0;
}

int zero_fsdp_stage(const char *mode)
{
    if (strcmp(mode, "full_shard") == 0)
        return 3;
    if (strcmp(mode, "shard_grad_op") == 0)
        return 2;
    if (strcmp(mode, "no_shard") == 0)
        return 0;
    return -1;
}
