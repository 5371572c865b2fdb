/* The deferred ops table (DTRAIN_DEFER_OPS=1): the CPU backend run the way
 * a GPU runs it at its most asynchronous, to check on the CPU that the
 * trainer synchronises where a GPU needs it.
 *
 * On CUDA an op only enqueues work on the compute stream; the host learns
 * nothing of its results until it waits (ops->sync, to_host, sumsq, free).
 * Host code that reads backend memory without waiting sees stale data, and
 * host code that writes it (an MPI receive) can overwrite what a pending
 * kernel has not read yet. On a GPU those races show up as rare wrong
 * numbers; here every op is queued and runs only when the host waits, so
 * the same mistakes give wrong numbers every time, and a run that is
 * bit-identical to the plain CPU backend's proves the waits are in place.
 *
 * What waits: sync, to_host, sumsq (its result is a host value) and free
 * (a pending op may use the memory) run the queue first, as their CUDA
 * versions synchronise the stream. alloc returns zeroed memory at once, as
 * CUDA's does after its memset. from_host copies the source when called
 * (cudaMemcpyAsync from pageable memory stages the source before it
 * returns), and the copy into backend memory waits in the queue in order.
 * to_host_begin's copies (CUDA: a side stream) are made only at
 * to_host_end, the latest moment a GPU could make them, and their
 * sources checked unchanged since the moment the copy would start.
 *
 * The queue is one growing byte arena of records {run, size, arguments};
 * when it cannot grow, the op runs at once after the queue (correct, only
 * less deferred). Results are those of the CPU table underneath, bit for
 * bit, whenever the trainer's waits are right. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/backend/ops_cpu.h"

/* A record's runner: calls the base table's op with the record's arguments. */
typedef void (*run_fn)(const ops_t *base, const void *args);

typedef struct record {
    run_fn run;
    size_t size; /* bytes of the record, header and arguments, rounded up to 16 */
} record_t;

#define REC_ALIGN 16
#define ARGS_OFF ((sizeof(record_t) + REC_ALIGN - 1) & ~(size_t)(REC_ALIGN - 1))

/* The deferred table's state, every method's ctx; the table is its first
 * member, so ops_release frees both. */
typedef struct defer_ctx {
    ops_t ops;
    const ops_t *base;
    unsigned char *buf;
    size_t len, cap;
    long ops_run, waits; /* ops_defer_counts */
    long casts16;        /* cast_f32_to_bf16 calls queued (ops_defer_counts) */
    /* to_host_begin's copies, made only at to_host_end: [n_late] of [cap_late] */
    struct late_copy *late;
    size_t n_late, cap_late;
    /* from_host_begin's copies, queued at from_host_end: [n_up] of [cap_up] */
    struct up_copy *up;
    size_t n_up, cap_up;
    size_t n_queued; /* records in buf */
    int borrowed;    /* release leaves base alone (ops_graph_create's own_base 0) */
    /* ops_graph_create: the segments seen, and what became of them */
    int graphs;
    struct segment *seg; /* [GRAPH_SEGMENTS] */
    unsigned long clock; /* for the least recently used segment */
    ops_graph_counts_t gc;
} defer_t;

/* A segment of the queue (the ops between two drains) as seen before:
 * its records' bytes are its key, the run functions, pointers and
 * scalars of every op in order, so a graph is launched only for exactly
 * the ops it was captured from. */
typedef struct segment {
    uint64_t hash;
    size_t len;           /* bytes of records (0: a free slot) */
    size_t n_ops;
    unsigned char *bytes; /* the records */
    void *graph;          /* executable (the base's; emulated: bytes), or NULL */
    unsigned long epoch;  /* the base's graph_epoch when captured, or when last run plainly */
    int ran;              /* ran plainly at `epoch` (the next time it is captured) */
    int refused;          /* its capture failed: plain from now on */
    unsigned long used;   /* clock of its last use */
} segment_t;

/* The records' argument structs below are compared as bytes (a segment's
 * key), and the bytes a compiler leaves in hidden padding are whatever
 * the stack held: every struct from here on spells its padding out as
 * pad_ members, which initializers leave zero. */
#pragma GCC diagnostic error "-Wpadded"

/* Runs the records of buf[0, len) on the base table. */
static void run_records(const ops_t *base, const unsigned char *buf, size_t len)
{
    /* a record's run never enqueues (it calls the base table), so buf is stable */
    for (size_t off = 0; off < len;) {
        const record_t *r = (const record_t *)(buf + off);
        r->run(base, buf + off + ARGS_OFF);
        off += r->size;
    }
}

static void graph_drain(defer_t *q);

/* Runs the queue (graphs: issues it as segments). */
static void issue(defer_t *q)
{
    if (q->graphs && q->len > 0)
        graph_drain(q);
    else
        run_records(q->base, q->buf, q->len);
    q->ops_run += (long)q->n_queued;
    q->len = 0;
    q->n_queued = 0;
}

/* The host waits here: the queue runs first. */
static void drain(defer_t *q)
{
    q->waits++;
    issue(q);
}

/* Space for a record with args_bytes of arguments, or NULL when the arena
 * cannot grow (the caller then drains and runs the op at once). */
static void *push(defer_t *q, run_fn run, size_t args_bytes)
{
    size_t size = (ARGS_OFF + args_bytes + REC_ALIGN - 1) & ~(size_t)(REC_ALIGN - 1);
    if (q->len + size > q->cap) {
        size_t cap = q->cap ? q->cap : (size_t)1 << 16;
        while (cap < q->len + size)
            cap *= 2;
        unsigned char *nb = realloc(q->buf, cap);
        if (!nb)
            return NULL;
        q->buf = nb;
        q->cap = cap;
    }
    record_t *r = (record_t *)(q->buf + q->len);
    memset(r, 0, size); /* the gaps too: records are compared as bytes (graphs) */
    r->run = run;
    r->size = size;
    q->len += size;
    q->n_queued++;
    return (unsigned char *)r + ARGS_OFF;
}

/* Queues the op whose arguments are *args (args_bytes) and whose runner is
 * run; runs it now, after the queue, when the arena cannot grow. */
static void defer(defer_t *q, run_fn run, const void *args, size_t args_bytes)
{
    void *dst = push(q, run, args_bytes);
    if (dst) {
        memcpy(dst, args, args_bytes);
        return;
    }
    drain(q);
    run(q->base, args);
    q->ops_run++;
}

/* ---- graphs (ops_graph_create) ------------------------------------------------ */

/* A segment shorter than this runs plainly: a graph launch costs about
 * what a few kernel launches do. */
#define GRAPH_MIN_OPS 8
/* Segments remembered; the least recently used gives way. A step has a
 * few (forward, loss, backward, per microbatch flags), plus those that
 * never repeat (the optimizer's, whose learning rate changes). */
#define GRAPH_SEGMENTS 64

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

static unsigned long base_epoch(const defer_t *q)
{
    return q->base->graph_epoch ? q->base->graph_epoch(q->base->ctx) : 0;
}

/* Ends e's graph (an emulated one is its bytes: nothing to end). */
static void segment_free_graph(defer_t *q, segment_t *e)
{
    if (e->graph && e->graph != e->bytes && q->base->graph_free)
        q->base->graph_free(q->base->ctx, e->graph);
    e->graph = NULL;
}

static void segment_drop(defer_t *q, segment_t *e)
{
    segment_free_graph(q, e);
    free(e->bytes);
    memset(e, 0, sizeof *e);
}

/* The slot holding this queue's key, or NULL. */
static segment_t *segment_find(defer_t *q, uint64_t h)
{
    for (int i = 0; i < GRAPH_SEGMENTS; i++) {
        segment_t *e = &q->seg[i];
        if (e->len == q->len && e->hash == h && memcmp(e->bytes, q->buf, q->len) == 0)
            return e;
    }
    return NULL;
}

/* Remembers the queue as a segment (ran plainly at this epoch), in a free
 * slot or the least recently used one; nothing when out of memory. */
static void segment_note(defer_t *q, uint64_t h, unsigned long epoch)
{
    segment_t *v = &q->seg[0];
    for (int i = 0; i < GRAPH_SEGMENTS && v->len; i++)
        if (!q->seg[i].len || q->seg[i].used < v->used)
            v = &q->seg[i];
    segment_drop(q, v);
    unsigned char *bytes = malloc(q->len);
    if (!bytes)
        return;
    memcpy(bytes, q->buf, q->len);
    *v = (segment_t){.hash = h, .len = q->len, .n_ops = q->n_queued, .bytes = bytes, .epoch = epoch, .ran = 1,
                     .used = q->clock};
}

/* Captures the segment e (the queue's ops, seen run before at this
 * epoch, so every workspace they need has its size) and launches it.
 * Emulated where the base has no graphs: the segment's stored records
 * are the graph. 0, or -1 when the capture failed (nothing ran). */
static int segment_capture(defer_t *q, segment_t *e, unsigned long epoch)
{
    if (!q->base->graph_begin) {
        e->graph = e->bytes;
    } else {
        q->base->graph_begin(q->base->ctx);
        run_records(q->base, e->bytes, e->len);
        e->graph = q->base->graph_end(q->base->ctx);
        if (!e->graph)
            return -1;
    }
    e->epoch = epoch;
    q->gc.captures++;
    return 0;
}

static void segment_launch(defer_t *q, segment_t *e)
{
    if (q->base->graph_launch)
        q->base->graph_launch(q->base->ctx, e->graph);
    else
        run_records(q->base, e->bytes, e->len); /* the stored records, not the queue's: a stale key shows */
    q->gc.launches++;
    q->gc.graph_ops += (long)e->n_ops;
}

/* Issues the queue as a graph where it has run before: the first time a
 * segment is seen it runs plainly (its ops size the workspace), the
 * second it is captured, from then on launched; a graph captured before
 * the workspace moved is dropped and the segment starts over. */
static void graph_drain(defer_t *q)
{
    q->gc.segments++;
    const unsigned long epoch = base_epoch(q);
    const int long_enough = q->n_queued >= GRAPH_MIN_OPS;
    const uint64_t h = long_enough ? fnv1a(q->buf, q->len) : 0;
    segment_t *e = long_enough ? segment_find(q, h) : NULL;
    q->clock++;
    if (e && e->graph && e->epoch != epoch) { /* stale: its workspace pointers moved */
        segment_free_graph(q, e);
        e->ran = 0;
        q->gc.stale++;
    }
    if (e && !e->refused && (e->graph || (e->ran && e->epoch == epoch))) {
        e->used = q->clock;
        if (e->graph || segment_capture(q, e, epoch) == 0) {
            segment_launch(q, e);
            return;
        }
        e->refused = 1;
        q->gc.refused++;
    }
    run_records(q->base, q->buf, q->len);
    q->gc.plain_ops += (long)q->n_queued;
    if (!e && long_enough)
        segment_note(q, h, epoch);
    else if (e && !e->refused) {
        e->ran = 1;
        e->epoch = epoch;
    }
}

/* ---- memory ------------------------------------------------------------------ */

static void d_sync(void *ctx) { drain(ctx); }

static void *d_alloc(void *ctx, size_t bytes)
{
    const defer_t *q = ctx;
    return q->base->alloc(q->base->ctx, bytes);
}

static void d_free(void *ctx, void *p)
{
    defer_t *q = ctx;
    drain(q);
    q->base->free(q->base->ctx, p);
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_args_t;
static void r_copy(const ops_t *b, const void *a_)
{
    const copy_args_t *a = a_;
    b->copy(b->ctx, a->dst, a->src, a->bytes);
}
static void d_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    defer(ctx, r_copy, &(copy_args_t){dst, src, bytes}, sizeof(copy_args_t));
}

static void d_to_host(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    defer_t *q = ctx;
    drain(q);
    q->base->to_host(q->base->ctx, host_dst, src, bytes);
}

/* to_host_begin: a copy on CUDA's side stream starts after the ops issued
 * before it and may finish as late as the wait for it; here it is made at
 * that latest moment, in to_host_end, so that a reader of the host memory
 * that does not wait gets the wrong bytes every time. Its source must
 * hold still from the start to the wait (a GPU copy may read it at any
 * moment between): a record queued in order notes a checksum of the
 * source when the copy would start (after the ops issued before it), and
 * to_host_end compares it with the source it copies; a source changed in
 * between (a gradient copied before its reduction completed, or written
 * again before the wait) ends the run with one line. Queued, not drained,
 * so that beginning a copy hides no missing wait elsewhere. */
struct late_copy {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t sum; /* the source's checksum when the copy starts */
};

/* 64-bit checksum of n bytes: a word at a time, multiplied and folded,
 * so that a changed float changes it */
static uint64_t checksum(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0x9e3779b97f4a7c15u ^ n, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3u;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3u;
    return h;
}

typedef struct {
    defer_t *q;
    size_t i; /* into q->late */
} late_start_args_t;
static void r_late_start(const ops_t *b, const void *a_)
{
    const late_start_args_t *a = a_;
    struct late_copy *c = &a->q->late[a->i];
    (void)b;
    c->sum = checksum(c->src, c->bytes);
}
static void d_to_host_begin(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    defer_t *q = ctx;
    if (q->n_late == q->cap_late) {
        size_t cap = q->cap_late ? 2 * q->cap_late : 8;
        struct late_copy *nl = realloc(q->late, cap * sizeof *nl);
        if (!nl) { /* made now: correct, only less late */
            drain(q);
            q->base->to_host(q->base->ctx, host_dst, src, bytes);
            return;
        }
        q->late = nl;
        q->cap_late = cap;
    }
    q->late[q->n_late] = (struct late_copy){host_dst, src, bytes, 0};
    /* the side stream starts after the compute stream's ops so far */
    defer(q, r_late_start, &(late_start_args_t){q, q->n_late}, sizeof(late_start_args_t));
    q->n_late++;
}
static void d_to_host_end(void *ctx)
{
    defer_t *q = ctx;
    if (q->n_late == 0)
        return;
    drain(q); /* every copy has started */
    for (size_t i = 0; i < q->n_late; i++) {
        const struct late_copy *c = &q->late[i];
        if (checksum(c->src, c->bytes) != c->sum) {
            fprintf(stderr,
                    "dtrain: deferred ops: the source of a to_host_begin copy (%zu bytes) changed before "
                    "to_host_end; on a GPU the copy could read either value\n",
                    c->bytes);
            abort();
        }
        q->base->to_host(q->base->ctx, c->dst, c->src, c->bytes);
    }
    q->n_late = 0;
}

/* from_host_begin: a copy on CUDA's side stream after the ops issued
 * before it, which the compute stream waits for at from_host_end; here
 * queued at from_host_end (the latest place the compute stream can take
 * it) and reading its host source only when the queue runs, so a host
 * write of the source before the copy is made gives wrong bytes; the
 * source's checksum at the begin is compared there too, and a change
 * ends the run with one line. */
struct up_copy {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t sum; /* the source's checksum at from_host_begin */
};
static void r_up_copy(const ops_t *b, const void *a_)
{
    const struct up_copy *a = a_;
    if (checksum(a->src, a->bytes) != a->sum) {
        fprintf(stderr,
                "dtrain: deferred ops: the source of a from_host_begin copy (%zu bytes) changed before the copy "
                "was made; keep it until to_host_end or sync returns\n",
                a->bytes);
        abort();
    }
    b->from_host(b->ctx, a->dst, a->src, a->bytes);
}
static void d_from_host_begin(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    defer_t *q = ctx;
    if (q->n_up == q->cap_up) {
        size_t cap = q->cap_up ? 2 * q->cap_up : 8;
        struct up_copy *nu = realloc(q->up, cap * sizeof *nu);
        if (!nu) { /* made in order now: correct, only less late */
            defer(q, r_up_copy, &(struct up_copy){dst, host_src, bytes, checksum(host_src, bytes)},
                  sizeof(struct up_copy));
            return;
        }
        q->up = nu;
        q->cap_up = cap;
    }
    q->up[q->n_up++] = (struct up_copy){dst, host_src, bytes, checksum(host_src, bytes)};
}
static void d_from_host_end(void *ctx)
{
    defer_t *q = ctx;
    for (size_t i = 0; i < q->n_up; i++)
        defer(q, r_up_copy, &q->up[i], sizeof q->up[i]);
    q->n_up = 0;
}

/* from_host: the source bytes travel in the record, after the arguments */
typedef struct {
    void *dst;
    size_t bytes;
} from_host_args_t;
static void r_from_host(const ops_t *b, const void *a_)
{
    const from_host_args_t *a = a_;
    b->from_host(b->ctx, a->dst, (const unsigned char *)a_ + sizeof *a, a->bytes);
}
static void d_from_host(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    defer_t *q = ctx;
    unsigned char *rec = push(q, r_from_host, sizeof(from_host_args_t) + bytes);
    if (!rec) {
        drain(q);
        q->base->from_host(q->base->ctx, dst, host_src, bytes);
        q->ops_run++;
        return;
    }
    memcpy(rec, &(from_host_args_t){dst, bytes}, sizeof(from_host_args_t));
    memcpy(rec + sizeof(from_host_args_t), host_src, bytes);
}

typedef struct {
    void *dst;
    size_t bytes;
} zero_args_t;
static void r_zero(const ops_t *b, const void *a_)
{
    const zero_args_t *a = a_;
    b->zero(b->ctx, a->dst, a->bytes);
}
static void d_zero(void *ctx, void *dst, size_t bytes)
{
    defer(ctx, r_zero, &(zero_args_t){dst, bytes}, sizeof(zero_args_t));
}

/* ---- matmuls ----------------------------------------------------------------- */

typedef struct {
    float *out;
    const float *in, *w, *b;
    int N, IC, OC;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} mm_fwd_args_t;
static void r_matmul_fwd(const ops_t *b, const void *a_)
{
    const mm_fwd_args_t *a = a_;
    b->matmul_fwd(b->ctx, a->out, a->in, a->w, a->b, a->N, a->IC, a->OC);
}
static void d_matmul_fwd(void *ctx, float *out, const float *in, const float *w, const float *b, int N, int IC, int OC)
{
    defer(ctx, r_matmul_fwd, &(mm_fwd_args_t){out, in, w, b, N, IC, OC, 0}, sizeof(mm_fwd_args_t));
}

typedef struct {
    float *din, *dw, *db;
    const float *dout, *in, *w;
    int N, IC, OC, accum_din, accum_dw;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} mm_bwd_args_t;
static void r_matmul_bwd(const ops_t *b, const void *a_)
{
    const mm_bwd_args_t *a = a_;
    b->matmul_bwd(b->ctx, a->din, a->dw, a->db, a->dout, a->in, a->w, a->N, a->IC, a->OC, a->accum_din, a->accum_dw);
}
static void d_matmul_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                         const float *w, int N, int IC, int OC, int accum_din, int accum_dw)
{
    defer(ctx, r_matmul_bwd, &(mm_bwd_args_t){din, dw, db, dout, in, w, N, IC, OC, accum_din, accum_dw, 0},
          sizeof(mm_bwd_args_t));
}

typedef struct {
    float *out;
    const uint16_t *in, *w;
    const float *b;
    int N, IC, OC;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} mm_fwd16_args_t;
static void r_matmul_fwd_bf16(const ops_t *b, const void *a_)
{
    const mm_fwd16_args_t *a = a_;
    b->matmul_fwd_bf16(b->ctx, a->out, a->in, a->w, a->b, a->N, a->IC, a->OC);
}
static void d_matmul_fwd_bf16(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b, int N,
                              int IC, int OC)
{
    defer(ctx, r_matmul_fwd_bf16, &(mm_fwd16_args_t){out, in, w, b, N, IC, OC, 0}, sizeof(mm_fwd16_args_t));
}

typedef struct {
    float *out, *pre;
    const float *in, *w, *b;
    int N, IC, OC;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} mm_gelu_fwd_args_t;
static void r_matmul_gelu_fwd(const ops_t *b, const void *a_)
{
    const mm_gelu_fwd_args_t *a = a_;
    b->matmul_gelu_fwd(b->ctx, a->out, a->pre, a->in, a->w, a->b, a->N, a->IC, a->OC);
}
static void d_matmul_gelu_fwd(void *ctx, float *out, float *pre, const float *in, const float *w, const float *b, int N,
                              int IC, int OC)
{
    defer(ctx, r_matmul_gelu_fwd, &(mm_gelu_fwd_args_t){out, pre, in, w, b, N, IC, OC, 0}, sizeof(mm_gelu_fwd_args_t));
}

typedef struct {
    float *out;
    uint16_t *out16;
    float *pre;
    const uint16_t *in, *w;
    const float *b;
    int N, IC, OC;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} mm_gelu_fwd16_args_t;
static void r_matmul_gelu_fwd_bf16(const ops_t *b, const void *a_)
{
    const mm_gelu_fwd16_args_t *a = a_;
    b->matmul_gelu_fwd_bf16(b->ctx, a->out, a->out16, a->pre, a->in, a->w, a->b, a->N, a->IC, a->OC);
}
static void d_matmul_gelu_fwd_bf16(void *ctx, float *out, uint16_t *out16, float *pre, const uint16_t *in,
                                   const uint16_t *w, const float *b, int N, int IC, int OC)
{
    defer(ctx, r_matmul_gelu_fwd_bf16, &(mm_gelu_fwd16_args_t){out, out16, pre, in, w, b, N, IC, OC, 0},
          sizeof(mm_gelu_fwd16_args_t));
}

typedef struct {
    float *din, *dw, *db;
    const float *dout, *in, *pre, *w;
    int N, IC, OC, accum_dw;
} mm_dgelu_bwd_args_t;
static void r_matmul_dgelu_bwd(const ops_t *b, const void *a_)
{
    const mm_dgelu_bwd_args_t *a = a_;
    b->matmul_dgelu_bwd(b->ctx, a->din, a->dw, a->db, a->dout, a->in, a->pre, a->w, a->N, a->IC, a->OC, a->accum_dw);
}
static void d_matmul_dgelu_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                               const float *pre, const float *w, int N, int IC, int OC, int accum_dw)
{
    defer(ctx, r_matmul_dgelu_bwd, &(mm_dgelu_bwd_args_t){din, dw, db, dout, in, pre, w, N, IC, OC, accum_dw},
          sizeof(mm_dgelu_bwd_args_t));
}

typedef struct {
    float *din;
    uint16_t *din16;
    float *dw, *db;
    const uint16_t *dout16;
    const float *dout;
    const uint16_t *in;
    const float *pre;
    const uint16_t *w;
    int N, IC, OC, accum_dw;
} mm_dgelu_bwd16_args_t;
static void r_matmul_dgelu_bwd_bf16(const ops_t *b, const void *a_)
{
    const mm_dgelu_bwd16_args_t *a = a_;
    b->matmul_dgelu_bwd_bf16(b->ctx, a->din, a->din16, a->dw, a->db, a->dout16, a->dout, a->in, a->pre, a->w, a->N,
                             a->IC, a->OC, a->accum_dw);
}
static void d_matmul_dgelu_bwd_bf16(void *ctx, float *din, uint16_t *din16, float *dw, float *db,
                                    const uint16_t *dout16, const float *dout, const uint16_t *in, const float *pre,
                                    const uint16_t *w, int N, int IC, int OC, int accum_dw)
{
    defer(ctx, r_matmul_dgelu_bwd_bf16,
          &(mm_dgelu_bwd16_args_t){din, din16, dw, db, dout16, dout, in, pre, w, N, IC, OC, accum_dw},
          sizeof(mm_dgelu_bwd16_args_t));
}

typedef struct {
    float *din, *dw, *db;
    const uint16_t *dout16;
    const float *dout;
    const uint16_t *in, *w;
    int N, IC, OC, accum_din, accum_dw;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} mm_bwd16_args_t;
static void r_matmul_bwd_bf16(const ops_t *b, const void *a_)
{
    const mm_bwd16_args_t *a = a_;
    b->matmul_bwd_bf16(b->ctx, a->din, a->dw, a->db, a->dout16, a->dout, a->in, a->w, a->N, a->IC, a->OC, a->accum_din,
                       a->accum_dw);
}
static void d_matmul_bwd_bf16(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                              const uint16_t *in, const uint16_t *w, int N, int IC, int OC, int accum_din, int accum_dw)
{
    defer(ctx, r_matmul_bwd_bf16, &(mm_bwd16_args_t){din, dw, db, dout16, dout, in, w, N, IC, OC, accum_din, accum_dw, 0},
          sizeof(mm_bwd16_args_t));
}

/* ---- grouped GEMMs ------------------------------------------------------------ */

/* Queues run with the record *args (args_bytes, a multiple of 4) followed
 * by a copy of the host array ints[n] (the grouped GEMMs' row offsets,
 * which the caller may change as soon as the op returns, as a GPU's
 * would have been read into the launch). 0, or -1 when the arena cannot
 * grow: the queue has then run, and the caller runs the op at once. */
static int defer_ints(defer_t *q, run_fn run, const void *args, size_t args_bytes, const int32_t *ints, size_t n)
{
    /* graphs: CUDA's grouped GEMMs stage pointer tables from host memory
     * when they run, which a graph cannot replay: they run outside, now */
    unsigned char *dst = q->graphs ? NULL : push(q, run, args_bytes + n * sizeof(int32_t));
    if (!dst) {
        drain(q);
        q->ops_run++;
        return -1;
    }
    memcpy(dst, args, args_bytes);
    memcpy(dst + args_bytes, ints, n * sizeof(int32_t));
    return 0;
}
/* the offsets a record carries after its arguments */
#define REC_OFFS(a) ((const int32_t *)((const unsigned char *)(a) + sizeof *(a)))

typedef struct {
    float *out;
    const float *in, *w, *b;
    int G, IC, OC, pad_;
} gmm_fwd_args_t;
static void r_gmm_fwd(const ops_t *b, const void *a_)
{
    const gmm_fwd_args_t *a = a_;
    b->gmm_fwd(b->ctx, a->out, a->in, a->w, a->b, REC_OFFS(a), a->G, a->IC, a->OC);
}
static void d_gmm_fwd(void *ctx, float *out, const float *in, const float *w, const float *b, const int32_t *offs,
                      int G, int IC, int OC)
{
    defer_t *q = ctx;
    if (defer_ints(q, r_gmm_fwd, &(gmm_fwd_args_t){out, in, w, b, G, IC, OC, 0}, sizeof(gmm_fwd_args_t), offs,
                   (size_t)G + 1) != 0)
        q->base->gmm_fwd(q->base->ctx, out, in, w, b, offs, G, IC, OC);
}

typedef struct {
    float *out;
    const uint16_t *in, *w;
    const float *b;
    int G, IC, OC, pad_;
} gmm_fwd16_args_t;
static void r_gmm_fwd_bf16(const ops_t *b, const void *a_)
{
    const gmm_fwd16_args_t *a = a_;
    b->gmm_fwd_bf16(b->ctx, a->out, a->in, a->w, a->b, REC_OFFS(a), a->G, a->IC, a->OC);
}
static void d_gmm_fwd_bf16(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b,
                           const int32_t *offs, int G, int IC, int OC)
{
    defer_t *q = ctx;
    if (defer_ints(q, r_gmm_fwd_bf16, &(gmm_fwd16_args_t){out, in, w, b, G, IC, OC, 0}, sizeof(gmm_fwd16_args_t), offs,
                   (size_t)G + 1) != 0)
        q->base->gmm_fwd_bf16(q->base->ctx, out, in, w, b, offs, G, IC, OC);
}

typedef struct {
    float *din, *dw, *db;
    const float *dout, *in, *pre, *w;
    int G, IC, OC, accum_din, accum_dw, pad_;
} gmm_bwd_args_t;
static void r_gmm_bwd(const ops_t *b, const void *a_)
{
    const gmm_bwd_args_t *a = a_;
    b->gmm_bwd(b->ctx, a->din, a->dw, a->db, a->dout, a->in, a->pre, a->w, REC_OFFS(a), a->G, a->IC, a->OC,
               a->accum_din, a->accum_dw);
}
static void d_gmm_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                      const float *w, const int32_t *offs, int G, int IC, int OC, int accum_din, int accum_dw)
{
    defer_t *q = ctx;
    if (defer_ints(q, r_gmm_bwd, &(gmm_bwd_args_t){din, dw, db, dout, in, pre, w, G, IC, OC, accum_din, accum_dw, 0},
                   sizeof(gmm_bwd_args_t), offs, (size_t)G + 1) != 0)
        q->base->gmm_bwd(q->base->ctx, din, dw, db, dout, in, pre, w, offs, G, IC, OC, accum_din, accum_dw);
}

typedef struct {
    float *din, *dw, *db;
    const uint16_t *dout16;
    const float *dout;
    const uint16_t *in;
    const float *pre;
    const uint16_t *w;
    int G, IC, OC, accum_din, accum_dw, pad_;
} gmm_bwd16_args_t;
static void r_gmm_bwd_bf16(const ops_t *b, const void *a_)
{
    const gmm_bwd16_args_t *a = a_;
    b->gmm_bwd_bf16(b->ctx, a->din, a->dw, a->db, a->dout16, a->dout, a->in, a->pre, a->w, REC_OFFS(a), a->G, a->IC,
                    a->OC, a->accum_din, a->accum_dw);
}
static void d_gmm_bwd_bf16(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                           const uint16_t *in, const float *pre, const uint16_t *w, const int32_t *offs, int G, int IC,
                           int OC, int accum_din, int accum_dw)
{
    defer_t *q = ctx;
    if (defer_ints(q, r_gmm_bwd_bf16,
                   &(gmm_bwd16_args_t){din, dw, db, dout16, dout, in, pre, w, G, IC, OC, accum_din, accum_dw, 0},
                   sizeof(gmm_bwd16_args_t), offs, (size_t)G + 1) != 0)
        q->base->gmm_bwd_bf16(q->base->ctx, din, dw, db, dout16, dout, in, pre, w, offs, G, IC, OC, accum_din,
                              accum_dw);
}

/* ---- norms ------------------------------------------------------------------- */

typedef struct {
    float *out;
    uint16_t *out16;
    float *mean, *rstd;
    const float *x, *w, *b;
    int N, C;
    float eps;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} ln_fwd_args_t;
static void r_layernorm_fwd(const ops_t *b, const void *a_)
{
    const ln_fwd_args_t *a = a_;
    b->layernorm_fwd(b->ctx, a->out, a->out16, a->mean, a->rstd, a->x, a->w, a->b, a->N, a->C, a->eps);
}
static void d_layernorm_fwd(void *ctx, float *out, uint16_t *out16, float *mean, float *rstd, const float *x,
                            const float *w, const float *b, int N, int C, float eps)
{
    defer(ctx, r_layernorm_fwd, &(ln_fwd_args_t){out, out16, mean, rstd, x, w, b, N, C, eps, 0}, sizeof(ln_fwd_args_t));
}

typedef struct {
    float *din;
    uint16_t *din16;
    float *dw, *db;
    const float *dout, *x, *w, *mean, *rstd;
    int N, C, accum_dw;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} ln_bwd_args_t;
static void r_layernorm_bwd(const ops_t *b, const void *a_)
{
    const ln_bwd_args_t *a = a_;
    b->layernorm_bwd(b->ctx, a->din, a->din16, a->dw, a->db, a->dout, a->x, a->w, a->mean, a->rstd, a->N, a->C,
                     a->accum_dw);
}
static void d_layernorm_bwd(void *ctx, float *din, uint16_t *din16, float *dw, float *db, const float *dout,
                            const float *x, const float *w, const float *mean, const float *rstd, int N, int C,
                            int accum_dw)
{
    defer(ctx, r_layernorm_bwd, &(ln_bwd_args_t){din, din16, dw, db, dout, x, w, mean, rstd, N, C, accum_dw, 0},
          sizeof(ln_bwd_args_t));
}

typedef struct {
    float *out;
    uint16_t *out16;
    float *rstd;
    const float *x, *w;
    int N, C;
    float eps;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} rms_fwd_args_t;
static void r_rmsnorm_fwd(const ops_t *b, const void *a_)
{
    const rms_fwd_args_t *a = a_;
    b->rmsnorm_fwd(b->ctx, a->out, a->out16, a->rstd, a->x, a->w, a->N, a->C, a->eps);
}
static void d_rmsnorm_fwd(void *ctx, float *out, uint16_t *out16, float *rstd, const float *x, const float *w, int N,
                          int C, float eps)
{
    defer(ctx, r_rmsnorm_fwd, &(rms_fwd_args_t){out, out16, rstd, x, w, N, C, eps, 0}, sizeof(rms_fwd_args_t));
}

typedef struct {
    float *din;
    uint16_t *din16;
    float *dw;
    const float *dout, *x, *w, *rstd;
    int N, C, accum_dw;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} rms_bwd_args_t;
static void r_rmsnorm_bwd(const ops_t *b, const void *a_)
{
    const rms_bwd_args_t *a = a_;
    b->rmsnorm_bwd(b->ctx, a->din, a->din16, a->dw, a->dout, a->x, a->w, a->rstd, a->N, a->C, a->accum_dw);
}
static void d_rmsnorm_bwd(void *ctx, float *din, uint16_t *din16, float *dw, const float *dout, const float *x,
                          const float *w, const float *rstd, int N, int C, int accum_dw)
{
    defer(ctx, r_rmsnorm_bwd, &(rms_bwd_args_t){din, din16, dw, dout, x, w, rstd, N, C, accum_dw, 0},
          sizeof(rms_bwd_args_t));
}

/* ---- rope and attention -------------------------------------------------------- */

typedef struct {
    float *qkv;
    const int32_t *pos;
    const float *inv_freq;
    int B, T, NH, NKV, HS, pad_;
} rope_args_t;
static void r_rope_fwd(const ops_t *b, const void *a_)
{
    const rope_args_t *a = a_;
    b->rope_fwd(b->ctx, a->qkv, a->pos, a->B, a->T, a->NH, a->NKV, a->HS, a->inv_freq);
}
static void d_rope_fwd(void *ctx, float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int HS,
                       const float *inv_freq)
{
    defer(ctx, r_rope_fwd, &(rope_args_t){qkv, pos, inv_freq, B, T, NH, NKV, HS, 0}, sizeof(rope_args_t));
}
typedef struct {
    rope_args_t r;
    uint16_t *dqkv16;
} rope_bwd_args_t;
static void r_rope_bwd(const ops_t *b, const void *a_)
{
    const rope_bwd_args_t *a = a_;
    b->rope_bwd(b->ctx, a->r.qkv, a->dqkv16, a->r.pos, a->r.B, a->r.T, a->r.NH, a->r.NKV, a->r.HS, a->r.inv_freq);
}
static void d_rope_bwd(void *ctx, float *dqkv, uint16_t *dqkv16, const int32_t *pos, int B, int T, int NH, int NKV,
                       int HS, const float *inv_freq)
{
    defer(ctx, r_rope_bwd, &(rope_bwd_args_t){{dqkv, pos, inv_freq, B, T, NH, NKV, HS, 0}, dqkv16},
          sizeof(rope_bwd_args_t));
}

typedef struct {
    float *qkv, *xin, *rstd;
    const float *wq, *wk;
    int N, NH, NKV, HS;
    float eps;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} qkn_fwd_args_t;
static void r_qknorm_fwd(const ops_t *b, const void *a_)
{
    const qkn_fwd_args_t *a = a_;
    b->qknorm_fwd(b->ctx, a->qkv, a->xin, a->rstd, a->wq, a->wk, a->N, a->NH, a->NKV, a->HS, a->eps);
}
static void d_qknorm_fwd(void *ctx, float *qkv, float *xin, float *rstd, const float *wq, const float *wk, int N,
                         int NH, int NKV, int HS, float eps)
{
    defer(ctx, r_qknorm_fwd, &(qkn_fwd_args_t){qkv, xin, rstd, wq, wk, N, NH, NKV, HS, eps, 0}, sizeof(qkn_fwd_args_t));
}
typedef struct {
    float *dqkv, *dwq, *dwk;
    const float *xin, *wq, *wk, *rstd;
    int N, NH, NKV, HS, accum_dw;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} qkn_bwd_args_t;
static void r_qknorm_bwd(const ops_t *b, const void *a_)
{
    const qkn_bwd_args_t *a = a_;
    b->qknorm_bwd(b->ctx, a->dqkv, a->dwq, a->dwk, a->xin, a->wq, a->wk, a->rstd, a->N, a->NH, a->NKV, a->HS,
                  a->accum_dw);
}
static void d_qknorm_bwd(void *ctx, float *dqkv, float *dwq, float *dwk, const float *xin, const float *wq,
                         const float *wk, const float *rstd, int N, int NH, int NKV, int HS, int accum_dw)
{
    defer(ctx, r_qknorm_bwd, &(qkn_bwd_args_t){dqkv, dwq, dwk, xin, wq, wk, rstd, N, NH, NKV, HS, accum_dw, 0},
          sizeof(qkn_bwd_args_t));
}

typedef struct {
    float *out;
    uint16_t *out16;
    float *lse;
    const float *qkv;
    const int32_t *pos;
    int B, T, NH, NKV, HS;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} att_fwd_args_t;
static void r_attention_fwd(const ops_t *b, const void *a_)
{
    const att_fwd_args_t *a = a_;
    b->attention_fwd(b->ctx, a->out, a->out16, a->lse, a->qkv, a->pos, a->B, a->T, a->NH, a->NKV, a->HS);
}
static void d_attention_fwd(void *ctx, float *out, uint16_t *out16, float *lse, const float *qkv, const int32_t *pos,
                            int B, int T, int NH, int NKV, int HS)
{
    defer(ctx, r_attention_fwd, &(att_fwd_args_t){out, out16, lse, qkv, pos, B, T, NH, NKV, HS, 0},
          sizeof(att_fwd_args_t));
}

typedef struct {
    float *dqkv;
    uint16_t *dqkv16;
    const float *dout, *qkv, *out, *lse;
    const int32_t *pos;
    int B, T, NH, NKV, HS;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} att_bwd_args_t;
static void r_attention_bwd(const ops_t *b, const void *a_)
{
    const att_bwd_args_t *a = a_;
    b->attention_bwd(b->ctx, a->dqkv, a->dqkv16, a->dout, a->qkv, a->out, a->lse, a->pos, a->B, a->T, a->NH, a->NKV,
                     a->HS);
}
static void d_attention_bwd(void *ctx, float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv,
                            const float *out, const float *lse, const int32_t *pos, int B, int T, int NH, int NKV,
                            int HS)
{
    defer(ctx, r_attention_bwd, &(att_bwd_args_t){dqkv, dqkv16, dout, qkv, out, lse, pos, B, T, NH, NKV, HS, 0},
          sizeof(att_bwd_args_t));
}

/* The ring attention ops take their dimensions by pointer: the record
 * keeps a copy of the block, since the caller's may be gone by the drain. */
typedef struct {
    float *out, *lse;
    const float *qkv, *kv;
    const int32_t *qpos, *kpos, *qdoc;
    att_block_t blk;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} att_blk_fwd_args_t;
static void r_attention_block_fwd(const ops_t *b, const void *a_)
{
    const att_blk_fwd_args_t *a = a_;
    b->attention_block_fwd(b->ctx, a->out, a->lse, a->qkv, a->kv, a->qpos, a->kpos, a->qdoc, &a->blk);
}
static void d_attention_block_fwd(void *ctx, float *out, float *lse, const float *qkv, const float *kv,
                                  const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc,
                                  const att_block_t *blk)
{
    defer(ctx, r_attention_block_fwd, &(att_blk_fwd_args_t){out, lse, qkv, kv, qpos, kpos, qdoc, *blk, 0},
          sizeof(att_blk_fwd_args_t));
}

typedef struct {
    float *out, *lse;
    const float *pout, *plse;
    att_block_t blk;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} att_merge_args_t;
static void r_attention_merge(const ops_t *b, const void *a_)
{
    const att_merge_args_t *a = a_;
    b->attention_merge(b->ctx, a->out, a->lse, a->pout, a->plse, &a->blk);
}
static void d_attention_merge(void *ctx, float *out, float *lse, const float *pout, const float *plse,
                              const att_block_t *blk)
{
    defer(ctx, r_attention_merge, &(att_merge_args_t){out, lse, pout, plse, *blk, 0}, sizeof(att_merge_args_t));
}

typedef struct {
    float *dqkv, *dkv;
    const float *dout, *qkv, *kv, *out, *lse;
    const int32_t *qpos, *kpos, *qdoc;
    att_block_t blk;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} att_blk_bwd_args_t;
static void r_attention_block_bwd(const ops_t *b, const void *a_)
{
    const att_blk_bwd_args_t *a = a_;
    b->attention_block_bwd(b->ctx, a->dqkv, a->dkv, a->dout, a->qkv, a->kv, a->out, a->lse, a->qpos, a->kpos,
                           a->qdoc, &a->blk);
}
static void d_attention_block_bwd(void *ctx, float *dqkv, float *dkv, const float *dout, const float *qkv,
                                  const float *kv, const float *out, const float *lse, const int32_t *qpos,
                                  const int32_t *kpos, const int32_t *qdoc, const att_block_t *blk)
{
    defer(ctx, r_attention_block_bwd,
          &(att_blk_bwd_args_t){dqkv, dkv, dout, qkv, kv, out, lse, qpos, kpos, qdoc, *blk, 0},
          sizeof(att_blk_bwd_args_t));
}

typedef struct {
    float *kv;
    const float *qkv;
    int N, NH, NKV, HS;
} att_kv_pack_args_t;
static void r_attention_kv_pack(const ops_t *b, const void *a_)
{
    const att_kv_pack_args_t *a = a_;
    b->attention_kv_pack(b->ctx, a->kv, a->qkv, a->N, a->NH, a->NKV, a->HS);
}
static void d_attention_kv_pack(void *ctx, float *kv, const float *qkv, int N, int NH, int NKV, int HS)
{
    defer(ctx, r_attention_kv_pack, &(att_kv_pack_args_t){kv, qkv, N, NH, NKV, HS}, sizeof(att_kv_pack_args_t));
}

typedef struct {
    float *dqkv;
    const float *dkv;
    int N, NH, NKV, HS, accum;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} att_kv_unpack_args_t;
static void r_attention_kv_unpack(const ops_t *b, const void *a_)
{
    const att_kv_unpack_args_t *a = a_;
    b->attention_kv_unpack(b->ctx, a->dqkv, a->dkv, a->N, a->NH, a->NKV, a->HS, a->accum);
}
static void d_attention_kv_unpack(void *ctx, float *dqkv, const float *dkv, int N, int NH, int NKV, int HS, int accum)
{
    defer(ctx, r_attention_kv_unpack, &(att_kv_unpack_args_t){dqkv, dkv, N, NH, NKV, HS, accum, 0},
          sizeof(att_kv_unpack_args_t));
}

/* ---- pointwise --------------------------------------------------------------- */

typedef struct {
    float *out;
    uint16_t *out16;
    const float *x;
    size_t n;
} gelu_fwd_args_t;
static void r_gelu_fwd(const ops_t *b, const void *a_)
{
    const gelu_fwd_args_t *a = a_;
    b->gelu_fwd(b->ctx, a->out, a->out16, a->x, a->n);
}
static void d_gelu_fwd(void *ctx, float *out, uint16_t *out16, const float *x, size_t n)
{
    defer(ctx, r_gelu_fwd, &(gelu_fwd_args_t){out, out16, x, n}, sizeof(gelu_fwd_args_t));
}

typedef struct {
    float *dx;
    const float *x, *dout;
    size_t n;
} gelu_bwd_args_t;
static void r_gelu_bwd(const ops_t *b, const void *a_)
{
    const gelu_bwd_args_t *a = a_;
    b->gelu_bwd(b->ctx, a->dx, a->x, a->dout, a->n);
}
static void d_gelu_bwd(void *ctx, float *dx, const float *x, const float *dout, size_t n)
{
    defer(ctx, r_gelu_bwd, &(gelu_bwd_args_t){dx, x, dout, n}, sizeof(gelu_bwd_args_t));
}

typedef struct {
    float *out;
    uint16_t *out16;
    const float *gu;
    int N, F;
} swiglu_fwd_args_t;
static void r_swiglu_fwd(const ops_t *b, const void *a_)
{
    const swiglu_fwd_args_t *a = a_;
    b->swiglu_fwd(b->ctx, a->out, a->out16, a->gu, a->N, a->F);
}
static void d_swiglu_fwd(void *ctx, float *out, uint16_t *out16, const float *gu, int N, int F)
{
    defer(ctx, r_swiglu_fwd, &(swiglu_fwd_args_t){out, out16, gu, N, F}, sizeof(swiglu_fwd_args_t));
}

typedef struct {
    float *dgu;
    uint16_t *dgu16;
    const float *gu, *dout;
    int N, F;
} swiglu_bwd_args_t;
static void r_swiglu_bwd(const ops_t *b, const void *a_)
{
    const swiglu_bwd_args_t *a = a_;
    b->swiglu_bwd(b->ctx, a->dgu, a->dgu16, a->gu, a->dout, a->N, a->F);
}
static void d_swiglu_bwd(void *ctx, float *dgu, uint16_t *dgu16, const float *gu, const float *dout, int N, int F)
{
    defer(ctx, r_swiglu_bwd, &(swiglu_bwd_args_t){dgu, dgu16, gu, dout, N, F}, sizeof(swiglu_bwd_args_t));
}

typedef struct {
    float *out;
    const float *a, *b;
    size_t n;
} add_args_t;
static void r_add(const ops_t *b, const void *a_)
{
    const add_args_t *a = a_;
    b->add(b->ctx, a->out, a->a, a->b, a->n);
}
static void d_add(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    defer(ctx, r_add, &(add_args_t){out, a, b, n}, sizeof(add_args_t));
}

/* ---- embedding and cross-entropy ------------------------------------------------ */

typedef struct {
    float *out;
    const int32_t *tok, *pos;
    const float *wte, *wpe;
    int N, T, C, v0, Vl;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} emb_fwd_args_t;
static void r_embedding_fwd(const ops_t *b, const void *a_)
{
    const emb_fwd_args_t *a = a_;
    b->embedding_fwd(b->ctx, a->out, a->tok, a->pos, a->wte, a->wpe, a->N, a->T, a->C, a->v0, a->Vl);
}
static void d_embedding_fwd(void *ctx, float *out, const int32_t *tok, const int32_t *pos, const float *wte,
                            const float *wpe, int N, int T, int C, int v0, int Vl)
{
    defer(ctx, r_embedding_fwd, &(emb_fwd_args_t){out, tok, pos, wte, wpe, N, T, C, v0, Vl, 0}, sizeof(emb_fwd_args_t));
}

typedef struct {
    float *dwte, *dwpe;
    const float *dout;
    const int32_t *tok, *pos;
    int N, T, C, v0, Vl, accum;
} emb_bwd_args_t;
static void r_embedding_bwd(const ops_t *b, const void *a_)
{
    const emb_bwd_args_t *a = a_;
    b->embedding_bwd(b->ctx, a->dwte, a->dwpe, a->dout, a->tok, a->pos, a->N, a->T, a->C, a->v0, a->Vl, a->accum);
}
static void d_embedding_bwd(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                            const int32_t *pos, int N, int T, int C, int v0, int Vl, int accum)
{
    defer(ctx, r_embedding_bwd, &(emb_bwd_args_t){dwte, dwpe, dout, tok, pos, N, T, C, v0, Vl, accum},
          sizeof(emb_bwd_args_t));
}

typedef struct {
    float *rowmax;
    const float *logits;
    int N, Vl, ld;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} xmax_args_t;
static void r_xent_max(const ops_t *b, const void *a_)
{
    const xmax_args_t *a = a_;
    b->xent_max(b->ctx, a->rowmax, a->logits, a->N, a->Vl, a->ld);
}
static void d_xent_max(void *ctx, float *rowmax, const float *logits, int N, int Vl, int ld)
{
    defer(ctx, r_xent_max, &(xmax_args_t){rowmax, logits, N, Vl, ld, 0}, sizeof(xmax_args_t));
}

typedef struct {
    float *stats, *expbuf;
    const float *logits, *rowmax;
    const int32_t *targets;
    int v0, N, Vl, ld;
} xsum_args_t;
static void r_xent_sumexp(const ops_t *b, const void *a_)
{
    const xsum_args_t *a = a_;
    b->xent_sumexp(b->ctx, a->stats, a->expbuf, a->logits, a->rowmax, a->targets, a->v0, a->N, a->Vl, a->ld);
}
static void d_xent_sumexp(void *ctx, float *stats, float *expbuf, const float *logits, const float *rowmax,
                          const int32_t *targets, int v0, int N, int Vl, int ld)
{
    defer(ctx, r_xent_sumexp, &(xsum_args_t){stats, expbuf, logits, rowmax, targets, v0, N, Vl, ld},
          sizeof(xsum_args_t));
}

typedef struct {
    float *losses, *dlogits;
    uint16_t *dlogits16;
    const float *rowmax, *stats;
    const int32_t *targets;
    int v0, N, Vl, ld;
    float dloss;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} xfin_args_t;
static void r_xent_finish(const ops_t *b, const void *a_)
{
    const xfin_args_t *a = a_;
    b->xent_finish(b->ctx, a->losses, a->dlogits, a->dlogits16, a->rowmax, a->stats, a->targets, a->v0, a->N, a->Vl,
                   a->ld, a->dloss);
}
static void d_xent_finish(void *ctx, float *losses, float *dlogits, uint16_t *dlogits16, const float *rowmax,
                          const float *stats, const int32_t *targets, int v0, int N, int Vl, int ld, float dloss)
{
    defer(ctx, r_xent_finish,
          &(xfin_args_t){losses, dlogits, dlogits16, rowmax, stats, targets, v0, N, Vl, ld, dloss, 0},
          sizeof(xfin_args_t));
}

/* ---- optimizer, norms, casts --------------------------------------------------- */

typedef struct {
    float *p;
    uint16_t *p16;
    const float *g;
    float *m, *v;
    size_t n;
    float lr, beta1, beta2, eps, wd, grad_scale;
    int t;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} adamw_args_t;
static void r_adamw(const ops_t *b, const void *a_)
{
    const adamw_args_t *a = a_;
    b->adamw(b->ctx, a->p, a->p16, a->g, a->m, a->v, a->n, a->lr, a->beta1, a->beta2, a->eps, a->wd, a->grad_scale,
             a->t);
}
static void d_adamw(void *ctx, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float wd, float grad_scale, int t)
{
    defer(ctx, r_adamw, &(adamw_args_t){p, p16, g, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t, 0},
          sizeof(adamw_args_t));
}

static void d_sumsq(void *ctx, double *out, const float *const *x, const size_t *n, int count)
{
    defer_t *q = ctx;
    drain(q);
    q->base->sumsq(q->base->ctx, out, x, n, count);
}

typedef struct {
    float *x;
    size_t n;
    float s;
    int pad_;
} scale_args_t;
static void r_scale(const ops_t *b, const void *a_)
{
    const scale_args_t *a = a_;
    b->scale(b->ctx, a->x, a->s, a->n);
}
static void d_scale(void *ctx, float *x, float s, size_t n)
{
    defer(ctx, r_scale, &(scale_args_t){x, n, s, 0}, sizeof(scale_args_t));
}

typedef struct {
    uint16_t *out;
    const float *in;
    size_t n;
} to16_args_t;
static void r_cast_f32_to_bf16(const ops_t *b, const void *a_)
{
    const to16_args_t *a = a_;
    b->cast_f32_to_bf16(b->ctx, a->out, a->in, a->n);
}
static void d_cast_f32_to_bf16(void *ctx, uint16_t *out, const float *in, size_t n)
{
    ((defer_t *)ctx)->casts16++;
    defer(ctx, r_cast_f32_to_bf16, &(to16_args_t){out, in, n}, sizeof(to16_args_t));
}

typedef struct {
    float *out;
    const uint16_t *in;
    size_t n;
} to32_args_t;
static void r_cast_bf16_to_f32(const ops_t *b, const void *a_)
{
    const to32_args_t *a = a_;
    b->cast_bf16_to_f32(b->ctx, a->out, a->in, a->n);
}
static void d_cast_bf16_to_f32(void *ctx, float *out, const uint16_t *in, size_t n)
{
    defer(ctx, r_cast_bf16_to_f32, &(to32_args_t){out, in, n}, sizeof(to32_args_t));
}

/* ---- mixture of experts ------------------------------------------------------- */

typedef struct {
    float *scores, *lse;
    int32_t *idx;
    float *gate;
    const float *logits, *bias;
    int N, T, E, K, sigmoid, norm_topk, capacity;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} moe_route_args_t;
static void r_moe_route_fwd(const ops_t *b, const void *a_)
{
    const moe_route_args_t *a = a_;
    b->moe_route_fwd(b->ctx, a->scores, a->lse, a->idx, a->gate, a->logits, a->bias, a->N, a->T, a->E, a->K,
                     a->sigmoid, a->norm_topk, a->capacity);
}
static void d_moe_route_fwd(void *ctx, float *scores, float *lse, int32_t *idx, float *gate, const float *logits,
                            const float *bias, int N, int T, int E, int K, int sigmoid, int norm_topk, int capacity)
{
    defer(ctx, r_moe_route_fwd,
          &(moe_route_args_t){scores, lse, idx, gate, logits, bias, N, T, E, K, sigmoid, norm_topk, capacity, 0},
          sizeof(moe_route_args_t));
}

typedef struct {
    int32_t *perm, *offs, *where;
    const int32_t *idx;
    int N, E, K;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} moe_plan_args_t;
static void r_moe_plan(const ops_t *b, const void *a_)
{
    const moe_plan_args_t *a = a_;
    b->moe_plan(b->ctx, a->perm, a->offs, a->where, a->idx, a->N, a->E, a->K);
}
static void d_moe_plan(void *ctx, int32_t *perm, int32_t *offs, int32_t *where, const int32_t *idx, int N, int E, int K)
{
    defer(ctx, r_moe_plan, &(moe_plan_args_t){perm, offs, where, idx, N, E, K, 0}, sizeof(moe_plan_args_t));
}

typedef struct {
    float *stats;
    const int32_t *idx;
    const float *scores, *lse;
    int N, E, K, sigmoid;
} moe_stats_args_t;
static void r_moe_stats(const ops_t *b, const void *a_)
{
    const moe_stats_args_t *a = a_;
    b->moe_stats(b->ctx, a->stats, a->idx, a->scores, a->lse, a->N, a->E, a->K, a->sigmoid);
}
static void d_moe_stats(void *ctx, float *stats, const int32_t *idx, const float *scores, const float *lse, int N,
                        int E, int K, int sigmoid)
{
    defer(ctx, r_moe_stats, &(moe_stats_args_t){stats, idx, scores, lse, N, E, K, sigmoid}, sizeof(moe_stats_args_t));
}

typedef struct {
    float *xe;
    const float *x;
    const int32_t *perm;
    int M, K, C;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} moe_gather_args_t;
static void r_moe_gather(const ops_t *b, const void *a_)
{
    const moe_gather_args_t *a = a_;
    b->moe_gather(b->ctx, a->xe, a->x, a->perm, a->M, a->K, a->C);
}
static void d_moe_gather(void *ctx, float *xe, const float *x, const int32_t *perm, int M, int K, int C)
{
    defer(ctx, r_moe_gather, &(moe_gather_args_t){xe, x, perm, M, K, C, 0}, sizeof(moe_gather_args_t));
}

typedef struct {
    float *out;
    const float *ye, *gate;
    const int32_t *where;
    int N, K, C;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} moe_combine_args_t;
static void r_moe_combine_fwd(const ops_t *b, const void *a_)
{
    const moe_combine_args_t *a = a_;
    b->moe_combine_fwd(b->ctx, a->out, a->ye, a->gate, a->where, a->N, a->K, a->C);
}
static void d_moe_combine_fwd(void *ctx, float *out, const float *ye, const float *gate, const int32_t *where, int N,
                              int K, int C)
{
    defer(ctx, r_moe_combine_fwd, &(moe_combine_args_t){out, ye, gate, where, N, K, C, 0}, sizeof(moe_combine_args_t));
}

typedef struct {
    float *dye, *dgate;
    const float *dout, *ye, *gate;
    const int32_t *where;
    int N, K, C;
    int pad_; /* no hidden padding: records are compared as bytes (graphs) */
} moe_combine_bwd_args_t;
static void r_moe_combine_bwd(const ops_t *b, const void *a_)
{
    const moe_combine_bwd_args_t *a = a_;
    b->moe_combine_bwd(b->ctx, a->dye, a->dgate, a->dout, a->ye, a->gate, a->where, a->N, a->K, a->C);
}
static void d_moe_combine_bwd(void *ctx, float *dye, float *dgate, const float *dout, const float *ye,
                              const float *gate, const int32_t *where, int N, int K, int C)
{
    defer(ctx, r_moe_combine_bwd, &(moe_combine_bwd_args_t){dye, dgate, dout, ye, gate, where, N, K, C, 0},
          sizeof(moe_combine_bwd_args_t));
}

typedef struct {
    float *dx;
    const float *dxe;
    const int32_t *where;
    int N, K, C, accum;
} moe_scatter_args_t;
static void r_moe_scatter_bwd(const ops_t *b, const void *a_)
{
    const moe_scatter_args_t *a = a_;
    b->moe_scatter_bwd(b->ctx, a->dx, a->dxe, a->where, a->N, a->K, a->C, a->accum);
}
static void d_moe_scatter_bwd(void *ctx, float *dx, const float *dxe, const int32_t *where, int N, int K, int C,
                              int accum)
{
    defer(ctx, r_moe_scatter_bwd, &(moe_scatter_args_t){dx, dxe, where, N, K, C, accum}, sizeof(moe_scatter_args_t));
}

typedef struct {
    float *dlogits;
    const float *dgate, *logits, *scores, *lse;
    const int32_t *idx;
    const float *auxw;
    float zw;
    int N, E, K, sigmoid, norm_topk;
} moe_route_bwd_args_t;
static void r_moe_route_bwd(const ops_t *b, const void *a_)
{
    const moe_route_bwd_args_t *a = a_;
    b->moe_route_bwd(b->ctx, a->dlogits, a->dgate, a->logits, a->scores, a->lse, a->idx, a->auxw, a->zw, a->N, a->E,
                     a->K, a->sigmoid, a->norm_topk);
}
static void d_moe_route_bwd(void *ctx, float *dlogits, const float *dgate, const float *logits, const float *scores,
                            const float *lse, const int32_t *idx, const float *auxw, float zw, int N, int E, int K,
                            int sigmoid, int norm_topk)
{
    defer(ctx, r_moe_route_bwd,
          &(moe_route_bwd_args_t){dlogits, dgate, logits, scores, lse, idx, auxw, zw, N, E, K, sigmoid, norm_topk},
          sizeof(moe_route_bwd_args_t));
}

typedef struct {
    float *out, *s;
    const float *y;
    int N, C;
} moe_sgate_args_t;
static void r_moe_shared_gate_fwd(const ops_t *b, const void *a_)
{
    const moe_sgate_args_t *a = a_;
    b->moe_shared_gate_fwd(b->ctx, a->out, a->s, a->y, a->N, a->C);
}
static void d_moe_shared_gate_fwd(void *ctx, float *out, float *s, const float *y, int N, int C)
{
    defer(ctx, r_moe_shared_gate_fwd, &(moe_sgate_args_t){out, s, y, N, C}, sizeof(moe_sgate_args_t));
}

typedef struct {
    float *dy, *dz;
    const float *dout, *y, *s;
    int N, C;
} moe_sgate_bwd_args_t;
static void r_moe_shared_gate_bwd(const ops_t *b, const void *a_)
{
    const moe_sgate_bwd_args_t *a = a_;
    b->moe_shared_gate_bwd(b->ctx, a->dy, a->dz, a->dout, a->y, a->s, a->N, a->C);
}
static void d_moe_shared_gate_bwd(void *ctx, float *dy, float *dz, const float *dout, const float *y, const float *s,
                                  int N, int C)
{
    defer(ctx, r_moe_shared_gate_bwd, &(moe_sgate_bwd_args_t){dy, dz, dout, y, s, N, C},
          sizeof(moe_sgate_bwd_args_t));
}

/* ---- the graph table's memory ops: the base's, after the queue ---------------- */

static void g_sync(void *ctx)
{
    defer_t *q = ctx;
    drain(q);
    q->base->sync(q->base->ctx);
}

/* from_host's source differs every step (the tokens), so it stays out of
 * the segments: the queue is issued, then the copy (CUDA: stream-ordered
 * after it). */
static void g_from_host(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    defer_t *q = ctx;
    drain(q);
    q->base->from_host(q->base->ctx, dst, host_src, bytes);
}

/* The side-stream copies follow the ops issued before them: issued after
 * the queue; where the base has none, the plain copies serve. */
static void g_to_host_begin(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    defer_t *q = ctx;
    drain(q);
    if (q->base->to_host_begin)
        q->base->to_host_begin(q->base->ctx, host_dst, src, bytes);
    else
        q->base->to_host(q->base->ctx, host_dst, src, bytes);
}
static void g_to_host_end(void *ctx)
{
    const defer_t *q = ctx;
    if (q->base->to_host_end)
        q->base->to_host_end(q->base->ctx);
}
static void g_from_host_begin(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    defer_t *q = ctx;
    drain(q);
    if (q->base->from_host_begin)
        q->base->from_host_begin(q->base->ctx, dst, host_src, bytes);
    else
        q->base->from_host(q->base->ctx, dst, host_src, bytes);
}
/* the ops queued after it are issued after it: the compute stream's wait
 * comes first */
static void g_from_host_end(void *ctx)
{
    defer_t *q = ctx;
    drain(q);
    if (q->base->from_host_end)
        q->base->from_host_end(q->base->ctx);
}

/* host_alloc's memory is the base's (pinned on CUDA) */
static void *g_host_alloc(void *ctx, size_t bytes)
{
    const defer_t *q = ctx;
    return q->base->host_alloc(q->base->ctx, bytes);
}
static void g_host_free(void *ctx, void *p)
{
    const defer_t *q = ctx;
    q->base->host_free(q->base->ctx, p);
}

/* Runs what is queued, then ends the base table and this one. */
static void d_release(void *ctx)
{
    defer_t *q = ctx;
    drain(q);
    if (q->seg)
        for (int i = 0; i < GRAPH_SEGMENTS; i++)
            segment_drop(q, &q->seg[i]);
    free(q->seg);
    if (!q->borrowed)
        ops_release(q->base);
    free(q->buf);
    free(q->late);
    free(q->up);
    free(q);
}

static const ops_t defer_ops = {
    .name = "cpu-deferred",
    .host_readable = 1, /* the base table's memory, once drained */
    .release = d_release,
    .sync = d_sync,
    .alloc = d_alloc,
    .free = d_free,
    .copy = d_copy,
    .to_host = d_to_host,
    .to_host_begin = d_to_host_begin,
    .to_host_end = d_to_host_end,
    .from_host_begin = d_from_host_begin,
    .from_host_end = d_from_host_end,
    .from_host = d_from_host,
    .zero = d_zero,
    .matmul_fwd = d_matmul_fwd,
    .matmul_bwd = d_matmul_bwd,
    .matmul_fwd_bf16 = d_matmul_fwd_bf16,
    .matmul_bwd_bf16 = d_matmul_bwd_bf16,
    .matmul_gelu_fwd = d_matmul_gelu_fwd,
    .matmul_gelu_fwd_bf16 = d_matmul_gelu_fwd_bf16,
    .matmul_dgelu_bwd = d_matmul_dgelu_bwd,
    .matmul_dgelu_bwd_bf16 = d_matmul_dgelu_bwd_bf16,
    .gmm_fwd = d_gmm_fwd,
    .gmm_bwd = d_gmm_bwd,
    .gmm_fwd_bf16 = d_gmm_fwd_bf16,
    .gmm_bwd_bf16 = d_gmm_bwd_bf16,
    .layernorm_fwd = d_layernorm_fwd,
    .layernorm_bwd = d_layernorm_bwd,
    .rmsnorm_fwd = d_rmsnorm_fwd,
    .rmsnorm_bwd = d_rmsnorm_bwd,
    .rope_fwd = d_rope_fwd,
    .rope_bwd = d_rope_bwd,
    .qknorm_fwd = d_qknorm_fwd,
    .qknorm_bwd = d_qknorm_bwd,
    .attention_fwd = d_attention_fwd,
    .attention_bwd = d_attention_bwd,
    .attention_block_fwd = d_attention_block_fwd,
    .attention_merge = d_attention_merge,
    .attention_block_bwd = d_attention_block_bwd,
    .attention_kv_pack = d_attention_kv_pack,
    .attention_kv_unpack = d_attention_kv_unpack,
    .gelu_fwd = d_gelu_fwd,
    .gelu_bwd = d_gelu_bwd,
    .swiglu_fwd = d_swiglu_fwd,
    .swiglu_bwd = d_swiglu_bwd,
    .add = d_add,
    .embedding_fwd = d_embedding_fwd,
    .embedding_bwd = d_embedding_bwd,
    .xent_max = d_xent_max,
    .xent_sumexp = d_xent_sumexp,
    .xent_finish = d_xent_finish,
    .adamw = d_adamw,
    .sumsq = d_sumsq,
    .scale = d_scale,
    .cast_f32_to_bf16 = d_cast_f32_to_bf16,
    .cast_bf16_to_f32 = d_cast_bf16_to_f32,
    .moe_route_fwd = d_moe_route_fwd,
    .moe_plan = d_moe_plan,
    .moe_stats = d_moe_stats,
    .moe_gather = d_moe_gather,
    .moe_combine_fwd = d_moe_combine_fwd,
    .moe_combine_bwd = d_moe_combine_bwd,
    .moe_scatter_bwd = d_moe_scatter_bwd,
    .moe_route_bwd = d_moe_route_bwd,
    .moe_shared_gate_fwd = d_moe_shared_gate_fwd,
    .moe_shared_gate_bwd = d_moe_shared_gate_bwd,
};

const ops_t *ops_defer_create(const ops_t *base)
{
    defer_t *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->ops = defer_ops;
    q->ops.ctx = q;
    q->base = base;
    return &q->ops;
}

const ops_t *ops_graph_create(const ops_t *base, int own_base)
{
    const ops_t *d = ops_defer_create(base);
    segment_t *seg = calloc(GRAPH_SEGMENTS, sizeof *seg);
    if (!d || !seg) {
        free(d ? d->ctx : NULL);
        free(seg);
        return NULL;
    }
    defer_t *q = d->ctx;
    q->ops.name = base->name;
    q->ops.host_readable = base->host_readable;
    q->ops.sync = g_sync;
    q->ops.from_host = g_from_host;
    q->ops.to_host_begin = g_to_host_begin;
    q->ops.to_host_end = g_to_host_end;
    q->ops.from_host_begin = g_from_host_begin;
    q->ops.from_host_end = g_from_host_end;
    q->ops.host_alloc = base->host_alloc ? g_host_alloc : NULL;
    q->ops.host_free = base->host_free ? g_host_free : NULL;
    q->graphs = 1;
    q->borrowed = !own_base;
    q->seg = seg;
    return &q->ops;
}

void ops_graph_counts(const ops_t *d, ops_graph_counts_t *c)
{
    const defer_t *q = d->ctx;
    *c = q->gc;
}

void ops_defer_flush(void *ctx) { issue(ctx); }

void ops_defer_counts(const ops_t *d, long *ops, long *waits, long *casts16)
{
    const defer_t *q = d->ctx;
    *ops = q->ops_run;
    *waits = q->waits;
    if (casts16)
        *casts16 = q->casts16;
}
