/* ZeRO sharding (see zero.h). Every buffer holding tensor data is the
 * backend's and is touched only through z->ops (zero.h, "Memory"). */
#include "mpi/zero.h"

#include <stdint.h>
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

int zero_cut_units(zero_units_t *u, size_t n, int n_tensors, const size_t *tensor_start, const int *tensor_block,
                   const unsigned char *tensor_expert, size_t *unit_start, size_t *expert_from)
{
    *u = (zero_units_t){.block0 = -1};
    int k = 0, bad = 0;
    for (int i = 0; i < n_tensors; i++) {
        const int blk = tensor_block[i];
        const int ex = tensor_expert && tensor_expert[i];
        if (i == 0 || blk < 0 || tensor_block[i - 1] != blk) {
            if (blk >= 0 && u->block0 < 0)
                u->block0 = k;
            u->n_blocks += blk >= 0;
            if (expert_from && k > 0 && expert_from[k - 1] == SIZE_MAX)
                expert_from[k - 1] = tensor_start[i]; /* no experts: the unit's end */
            unit_start[k++] = tensor_start[i];
            if (expert_from)
                expert_from[k - 1] = SIZE_MAX;
        } else if (!ex && tensor_expert && tensor_expert[i - 1]) {
            bad = 1; /* a dense tensor after an expert one in its unit */
        }
        if (ex && expert_from && expert_from[k - 1] == SIZE_MAX)
            expert_from[k - 1] = tensor_start[i];
    }
    unit_start[k] = n;
    if (expert_from && k > 0 && expert_from[k - 1] == SIZE_MAX)
        expert_from[k - 1] = n;
    u->n_units = k;
    for (int b = u->block0; b >= 0 && b < u->block0 + u->n_blocks; b++)
        if (unit_start[b + 1] - unit_start[b] > u->window)
            u->window = unit_start[b + 1] - unit_start[b];
    return bad ? -1 : 0;
}

/* Part p's start and length (expert_from NULL: no expert parts). */
static void part_span(const size_t *unit_start, const size_t *expert_from, int p, size_t *start, size_t *len)
{
    const int u = p / 2;
    const size_t mid = expert_from ? expert_from[u] : unit_start[u + 1];
    *start = p & 1 ? mid : unit_start[u];
    *len = p & 1 ? unit_start[u + 1] - mid : mid - unit_start[u];
}

void zero_pieces(const zero_units_t *u, const size_t *unit_start, const size_t *expert_from, size_t S, size_t Se,
                 size_t *chunk, size_t *shard_start, zero_shape_t *shape)
{
    *shape = (zero_shape_t){0};
    if (shard_start)
        shard_start[0] = 0;
    for (int p = 0; p < 2 * u->n_units; p++) {
        size_t start, len;
        part_span(unit_start, expert_from, p, &start, &len);
        const size_t G = p & 1 ? Se : S, c = (len + G - 1) / G;
        if (chunk)
            chunk[p] = c;
        shape->shard_n += c;
        if (shard_start)
            shard_start[p + 1] = shape->shard_n;
        if (G * c > shape->stage_n)
            shape->stage_n = G * c;
    }
    for (int b = u->block0; b >= 0 && b < u->block0 + u->n_blocks; b++) {
        size_t s0, l0, s1, l1;
        part_span(unit_start, expert_from, 2 * b, &s0, &l0);
        part_span(unit_start, expert_from, 2 * b + 1, &s1, &l1);
        const size_t c0 = (l0 + S - 1) / S, c1 = (l1 + Se - 1) / Se;
        if (S * c0 + Se * c1 > shape->window_n)
            shape->window_n = S * c0 + Se * c1;
        if (c0 + c1 > shape->window_c)
            shape->window_c = c0 + c1;
    }
}

/* Each buffer carries one float (or bf16) of padding beyond its content
 * (stage: at least one element), so that none is empty. */
void zero_sizes(zero_sizes_t *s, int stage, size_t S, const zero_shape_t *shape, comm_dtype_t dtype,
                int replica_size)
{
    *s = (zero_sizes_t){.stage = shape->stage_n ? shape->stage_n : 1};
    if (stage < 2)
        return;
    s->window_n = shape->window_n;
    s->grad_shard = shape->shard_n + 1;
    s->window = s->window_n + 1;
    s->recv = shape->window_c + 1;
    /* bf16 only where a reduction happens: a group of one keeps fp32 (the
     * expert group is no larger than the group) */
    if (dtype == COMM_BF16 && S > 1) {
        s->hstage = shape->stage_n + 1;
        s->hwin = s->window_n + 1;
        s->hrecv = shape->window_c + 1;
    }
    if (dtype == COMM_BF16 && replica_size > 1)
        s->hshard = shape->shard_n + 1;
    if (stage >= 3) {
        s->param_shard = shape->shard_n + 1;
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

status_t zero_create(zero_t *z, const ops_t *ops, const mem_tracker_t *mem, int stage, comm_t *group, comm_t *egroup,
                     size_t n, const zero_units_t *units, const size_t *unit_start, const size_t *expert_from,
                     comm_t *replica, comm_dtype_t dtype, char *err, size_t errlen)
{
    memset(z, 0, sizeof *z);
    z->ops = ops;
    if (mem)
        z->mem = *mem;
    z->stage = stage;
    z->group = group;
    z->egroup = expert_from ? egroup : NULL;
    z->replica = replica;
    z->dtype = dtype;
    z->n = n;
    const int nu = units->n_units;
    z->n_units = nu;
    z->unit_start = malloc(((size_t)nu + 1) * sizeof *z->unit_start);
    z->expert_from = malloc(((size_t)nu + 1) * sizeof *z->expert_from);
    z->chunk = malloc((2 * (size_t)nu + 1) * sizeof *z->chunk);
    z->shard_start = malloc((2 * (size_t)nu + 1) * sizeof *z->shard_start);
    if (!z->unit_start || !z->expert_from || !z->chunk || !z->shard_start) {
        zero_destroy(z);
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the ZeRO units");
    }
    memcpy(z->unit_start, unit_start, (size_t)nu * sizeof *z->unit_start);
    z->unit_start[nu] = n;
    for (int u = 0; u < nu; u++)
        z->expert_from[u] = z->egroup ? expert_from[u] : z->unit_start[u + 1];
    const size_t S = (size_t)group->size, Se = z->egroup ? (size_t)z->egroup->size : 1;
    zero_shape_t shape;
    zero_pieces(units, z->unit_start, z->expert_from, S, Se, z->chunk, z->shard_start, &shape);
    z->shard_n = shape.shard_n;
    z->stage_n = shape.stage_n;
    zero_sizes(&z->sizes, stage, S, &shape, dtype, replica ? replica->size : 0);
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
    free(z->expert_from);
    free(z->chunk);
    free(z->shard_start);
    free(z->unit_final);
    memset(z, 0, sizeof *z);
}

/* Part p's group, start and length. */
static comm_t *part_group(const zero_t *z, int p) { return p & 1 ? z->egroup : z->group; }

static void part_of(const zero_t *z, int p, size_t *start, size_t *len)
{
    const int u = p / 2;
    const size_t mid = z->expert_from[u];
    *start = p & 1 ? mid : z->unit_start[u];
    *len = p & 1 ? z->unit_start[u + 1] - mid : mid - z->unit_start[u];
}

/* The padding in front of part p's S_g c floats: only a dense part with
 * an expert part after it (zero_window). */
static size_t part_front(const zero_t *z, int p)
{
    if ((p & 1) || z->chunk[p + 1] == 0)
        return 0;
    size_t start, len;
    part_of(z, p, &start, &len);
    return (size_t)z->group->size * z->chunk[p] - len;
}

void zero_window(const zero_t *z, int u, size_t *front, size_t at[2])
{
    *front = part_front(z, 2 * u);
    at[0] = 0;
    at[1] = (size_t)z->group->size * z->chunk[2 * u];
}

void zero_piece(const zero_t *z, int p, size_t *lo, size_t *hi, size_t *skip)
{
    size_t start, len;
    part_of(z, p, &start, &len);
    const comm_t *g = part_group(z, p);
    const size_t f = part_front(z, p), c = z->chunk[p];
    /* the rank's c floats of the padded part: [r c, (r+1) c) less f */
    size_t a = g ? (size_t)g->rank * c : 0, b = a + c;
    *skip = a < f ? (f - a < c ? f - a : c) : 0;
    a = a < f ? 0 : a - f;
    b = b < f ? 0 : b - f;
    if (a > len)
        a = len;
    if (b > len)
        b = len;
    *lo = start + a;
    *hi = start + b;
}

/* zero_allgather (buf in backend memory) and zero_allgather_host (buf in
 * host memory): the same gathers through stage_buf, which is the
 * backend's, with the copies in and out chosen by where buf lives. */
static status_t allgather_units(zero_t *z, float *buf, int host, char *err, size_t errlen)
{
    const ops_t *o = z->ops;
    for (int p = 0; p < 2 * z->n_units; p++) {
        const size_t cu = z->chunk[p];
        if (cu == 0)
            continue;
        comm_t *c = part_group(z, p);
        size_t lo, hi, skip, start, len;
        zero_piece(z, p, &lo, &hi, &skip);
        part_of(z, p, &start, &len);
        /* the send piece is padded to c with zeros so every rank sends c */
        float *mine = z->stage_buf + (size_t)c->rank * cu;
        o->zero(o->ctx, mine, cu * sizeof(float));
        if (host)
            o->from_host(o->ctx, mine + skip, buf + lo, (hi - lo) * sizeof(float));
        else
            o->copy(o->ctx, mine + skip, buf + lo, (hi - lo) * sizeof(float));
        /* send == recv + rank*c: the communicator's in-place form */
        CHECK(c->ops->allgather(c, mine, z->stage_buf, cu, COMM_FP32, err, errlen));
        const float *from = z->stage_buf + part_front(z, p);
        if (host)
            o->to_host(o->ctx, buf + start, from, len * sizeof(float));
        else
            o->copy(o->ctx, buf + start, from, len * sizeof(float));
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
    for (int p = 0; p < 2 * z->n_units; p++) {
        size_t lo, hi, skip;
        zero_piece(z, p, &lo, &hi, &skip);
        float *dst = shard + z->shard_start[p];
        z->ops->zero(z->ops->ctx, dst, z->chunk[p] * sizeof(float));
        z->ops->from_host(z->ops->ctx, dst + skip, host + lo, (hi - lo) * sizeof(float));
    }
}

void zero_shard_to_host(const zero_t *z, const float *shard, float *host)
{
    for (int p = 0; p < 2 * z->n_units; p++) {
        size_t lo, hi, skip;
        zero_piece(z, p, &lo, &hi, &skip);
        z->ops->to_host(z->ops->ctx, host + lo, shard + z->shard_start[p] + skip, (hi - lo) * sizeof(float));
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

int zero_part_of(const zero_t *z, size_t off)
{
    const int u = zero_unit_of(z, off);
    return 2 * u + (off >= z->expert_from[u]);
}

void zero_grads_begin(zero_t *z)
{
    if (z->unit_final)
        memset(z->unit_final, 0, (size_t)z->n_units);
    z->ops->zero(z->ops->ctx, z->grad_shard, z->shard_n * sizeof(float));
    z->wait_s = 0.0;
    z->gather_s = 0.0;
}

/* The unit's pieces in the shard, both parts: [shard_start[2u], +n). */
static size_t unit_pieces(const zero_t *z, int u) { return z->shard_start[2 * u + 2] - z->shard_start[2 * u]; }

status_t zero_grads_early(zero_t *z, float scale, void (*done)(void *ctx, size_t lo, size_t n), void *ctx,
                          char *err, size_t errlen)
{
    free(z->unit_final);
    if (!(z->unit_final = calloc((size_t)z->n_units + 1, 1)))
        return status_set(STATUS_FAIL, err, errlen, "out of memory");
    z->final_scale = scale;
    z->done = done;
    z->done_ctx = ctx;
    return STATUS_OK;
}

void zero_grads_last(zero_t *z, int u)
{
    if (z->unit_final)
        z->unit_final[u] = 1;
}

/* Unit u's reduce-scatter is banked in the shard: when it was the step's
 * last, its pieces are scaled to the average and the listener told. */
static void unit_banked(zero_t *z, int u)
{
    if (!z->unit_final || z->unit_final[u] != 1)
        return;
    const size_t lo = z->shard_start[2 * u], n = unit_pieces(z, u);
    z->ops->scale(z->ops->ctx, z->grad_shard + lo, z->final_scale, n);
    z->unit_final[u] = 2;
    z->done(z->done_ctx, lo, n);
}

/* Window k's reduce-scatters finished: its pieces (widened from bf16
 * where reduced in bf16) added to the shard, where the unit's pieces lie
 * in the same order as in recv; the window is free. */
static void window_done(zero_t *z, int k)
{
    const int u = z->window_unit[k];
    for (int g = 0; g < 2; g++) {
        const int p = 2 * u + g;
        const size_t r = z->shard_start[p] - z->shard_start[2 * u];
        if (z->chunk[p] && bf16_on(z, part_group(z, p)))
            z->ops->cast_bf16_to_f32(z->ops->ctx, z->recv[k] + r, z->hrecv[k] + r, z->chunk[p]);
    }
    float *dst = z->grad_shard + z->shard_start[2 * u];
    z->ops->add(z->ops->ctx, dst, dst, z->recv[k], unit_pieces(z, u));
    z->window_unit[k] = -1;
    unit_banked(z, u);
}

static status_t window_drain(zero_t *z, int k, char *err, size_t errlen)
{
    if (z->window_unit[k] < 0)
        return 0;
    z->ops->sync(z->ops->ctx); /* running kernels are compute, not communication wait */
    double t0 = MPI_Wtime();
    status_t rc = STATUS_OK;
    for (int g = 0; g < 2; g++)
        if (z->req_busy[k][g]) {
            /* both requests are completed; the first failure's message stays */
            if (part_group(z, 2 * z->window_unit[k] + g)
                    ->ops->wait(&z->req[k][g], rc == STATUS_OK ? err : NULL, errlen) != STATUS_OK)
                rc = STATUS_FAIL;
            z->req_busy[k][g] = 0;
        }
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
        for (int g = 0; g < 2; g++) {
            if (!z->req_busy[k][g])
                continue;
            int done = 0;
            CHECK(part_group(z, 2 * z->window_unit[k] + g)->ops->test(&z->req[k][g], &done, err, errlen));
            if (done)
                z->req_busy[k][g] = 0;
        }
        if (!z->req_busy[k][0] && !z->req_busy[k][1])
            window_done(z, k);
    }
    return 0;
}

/* Zeroes window w's padding for unit u (in front of its dense part and
 * behind each part): the stretches the reduce-scatters and gathers send
 * beyond the unit's floats, which an earlier unit's may have filled. */
static void window_pads(const zero_t *z, float *w, int u)
{
    size_t f, at[2];
    zero_window(z, u, &f, at);
    const ops_t *o = z->ops;
    if (f)
        o->zero(o->ctx, w, f * sizeof(float));
    for (int g = 0; g < 2; g++) {
        const int p = 2 * u + g;
        size_t start, len;
        part_of(z, p, &start, &len);
        const size_t padded = (size_t)(g ? z->egroup ? z->egroup->size : 1 : z->group->size) * z->chunk[p];
        const size_t used = (g ? 0 : f) + len;
        if (padded > used)
            o->zero(o->ctx, w + at[g] + used, (padded - used) * sizeof(float));
    }
}

float *zero_grads_window(zero_t *z, int u, char *err, size_t errlen)
{
    const int k = u & 1;
    if (window_drain(z, k, err, errlen) != STATUS_OK)
        return NULL;
    size_t f, at[2];
    zero_window(z, u, &f, at);
    if (z->egroup) /* without experts every unit pads behind, where nothing else writes (as always) */
        window_pads(z, z->window[k], u);
    return z->window[k] + f;
}

status_t zero_grads_reduce_window(zero_t *z, int u, char *err, size_t errlen)
{
    const int k = u & 1;
    size_t f, at[2];
    zero_window(z, u, &f, at);
    z->window_unit[k] = u;
    for (int g = 0; g < 2; g++) {
        const int p = 2 * u + g;
        if (z->chunk[p] == 0)
            continue;
        comm_t *c = part_group(z, p);
        const size_t r = z->shard_start[p] - z->shard_start[2 * u], cu = z->chunk[p];
        status_t rc;
        if (bf16_on(z, c)) {
            /* the part's whole send, padding included (zero in both types) */
            z->ops->cast_f32_to_bf16(z->ops->ctx, z->hwin[k] + at[g], z->window[k] + at[g], (size_t)c->size * cu);
            rc = c->ops->ireduce_scatter(c, z->hwin[k] + at[g], z->hrecv[k] + r, cu, COMM_BF16, &z->req[k][g], err,
                                         errlen);
        } else {
            rc = c->ops->ireduce_scatter(c, z->window[k] + at[g], z->recv[k] + r, cu, COMM_FP32, &z->req[k][g], err,
                                         errlen);
        }
        if (rc != STATUS_OK) {
            z->window_unit[k] = -1;
            return rc;
        }
        z->req_busy[k][g] = 1;
    }
    return STATUS_OK;
}

status_t zero_grads_reduce(zero_t *z, int u, const float *src, char *err, size_t errlen)
{
    const ops_t *o = z->ops;
    for (int g = 0; g < 2; g++) {
        const int p = 2 * u + g;
        comm_t *c = part_group(z, p);
        const size_t cu = z->chunk[p], f = part_front(z, p);
        size_t start, len;
        part_of(z, p, &start, &len);
        if (cu == 0)
            continue;
        const float *from = src + (start - z->unit_start[u]);
        const size_t tail = (size_t)c->size * cu - f - len;
        /* stage_buf [S_g c] (hstage in bf16): the send, padded; in place,
         * the rank's piece lands at its start */
        const int bf16 = bf16_on(z, c);
        if (bf16) {
            o->zero(o->ctx, z->hstage, f * sizeof(uint16_t));
            o->cast_f32_to_bf16(o->ctx, z->hstage + f, from, len);
            o->zero(o->ctx, z->hstage + f + len, tail * sizeof(uint16_t));
        } else {
            o->zero(o->ctx, z->stage_buf, f * sizeof(float));
            o->copy(o->ctx, z->stage_buf + f, from, len * sizeof(float));
            o->zero(o->ctx, z->stage_buf + f + len, tail * sizeof(float));
        }
        o->sync(o->ctx); /* running kernels are compute, not communication wait */
        double t0 = MPI_Wtime();
        status_t rc = bf16 ? c->ops->reduce_scatter(c, z->hstage, z->hstage, cu, COMM_BF16, err, errlen)
                           : c->ops->reduce_scatter(c, z->stage_buf, z->stage_buf, cu, COMM_FP32, err, errlen);
        z->wait_s += MPI_Wtime() - t0;
        CHECK(rc);
        if (bf16)
            o->cast_bf16_to_f32(o->ctx, z->stage_buf, z->hstage, cu);
        float *dst = z->grad_shard + z->shard_start[p];
        o->add(o->ctx, dst, dst, z->stage_buf, cu);
    }
    unit_banked(z, u);
    return 0;
}

status_t zero_grads_finish(zero_t *z, float scale, char *err, size_t errlen)
{
    CHECK(window_drain(z, 0, err, errlen));
    CHECK(window_drain(z, 1, err, errlen));
    if (!z->unit_final) {
        z->ops->scale(z->ops->ctx, z->grad_shard, scale, z->shard_n);
        return 0;
    }
    /* the runs of units not scaled as they were banked */
    for (int u = 0; u < z->n_units;) {
        if (z->unit_final[u] == 2) {
            u++;
            continue;
        }
        int e = u;
        while (e < z->n_units && z->unit_final[e] != 2)
            e++;
        const size_t lo = z->shard_start[2 * u];
        z->ops->scale(z->ops->ctx, z->grad_shard + lo, scale, z->shard_start[2 * e] - lo);
        u = e;
    }
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
    if (!z->pwin_busy[k][0] && !z->pwin_busy[k][1])
        return 0;
    z->ops->sync(z->ops->ctx); /* running kernels are compute, not communication wait */
    double t0 = MPI_Wtime();
    status_t rc = STATUS_OK;
    for (int g = 0; g < 2; g++)
        if (z->pwin_busy[k][g]) {
            /* both requests are completed; the first failure's message stays */
            if (part_group(z, 2 * z->pwin_unit[k] + g)
                    ->ops->wait(&z->preq[k][g], rc == STATUS_OK ? err : NULL, errlen) != STATUS_OK)
                rc = STATUS_FAIL;
            z->pwin_busy[k][g] = 0;
        }
    z->gather_s += MPI_Wtime() - t0;
    if (rc != 0)
        z->pwin_unit[k] = -1;
    return rc;
}

/* Starts gathering unit u into window k: for each part every rank sends
 * its c-float piece (padded with zeros in the shard), the part's stretch
 * of the window (zero_window) receives S_g c floats in rank order, which
 * is the part's flat layout with its padding. */
static status_t pwin_start(zero_t *z, int k, int u, char *err, size_t errlen)
{
    size_t f, at[2];
    zero_window(z, u, &f, at);
    z->pwin_unit[k] = u;
    z->gathers++;
    for (int g = 0; g < 2; g++) {
        const int p = 2 * u + g;
        if (z->chunk[p] == 0)
            continue;
        comm_t *c = part_group(z, p);
        if (c->ops->iallgather(c, z->param_shard + z->shard_start[p], z->pwin[k] + at[g], z->chunk[p], COMM_FP32,
                               &z->preq[k][g], err, errlen) != STATUS_OK) {
            /* a part already posted is completed before the window is given up */
            (void)pwin_wait(z, k, NULL, 0);
            z->pwin_unit[k] = -1;
            return STATUS_FAIL;
        }
        z->pwin_busy[k][g] = 1;
    }
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
    size_t f, at[2];
    zero_window(z, u, &f, at);
    return z->pwin[k] + f;
}

status_t zero_params_progress(zero_t *z, char *err, size_t errlen)
{
    for (int k = 0; k < 2; k++)
        for (int g = 0; g < 2; g++) {
            if (!z->pwin_busy[k][g])
                continue;
            int done = 0;
            if (part_group(z, 2 * z->pwin_unit[k] + g)->ops->test(&z->preq[k][g], &done, err, errlen) != STATUS_OK) {
                z->pwin_busy[k][g] = 0;
                (void)pwin_wait(z, k, NULL, 0);
                z->pwin_unit[k] = -1;
                return STATUS_FAIL;
            }
            if (done)
                z->pwin_busy[k][g] = 0;
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
    for (int g = 0; g < 2; g++) {
        const int p = 2 * u + g;
        comm_t *c = part_group(z, p);
        const size_t cu = z->chunk[p];
        size_t start, len;
        part_of(z, p, &start, &len);
        if (cu == 0)
            continue;
        CHECK(c->ops->allgather(c, z->param_shard + z->shard_start[p], z->stage_buf, cu, COMM_FP32, err, errlen));
        z->ops->copy(z->ops->ctx, dst + (start - z->unit_start[u]), z->stage_buf + part_front(z, p),
                     len * sizeof(float));
    }
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
