/* The graph table (ops_graph_create, src/backend/ops_defer.c) over a base
 * table written here, which counts what reaches it and has graphs of its
 * own: graph_begin..graph_end records the scale ops it is given instead of
 * running them, graph_launch replays a record, graph_epoch is a counter the
 * test moves. Checked, each with the numbers the data must hold after:
 *  - a segment (the ops between two waits) of at least 8 ops runs plainly
 *    the first time, is captured the second and launched (captured ops do
 *    not run: the launch runs them), and is launched alone from then on;
 *  - a segment that differs in one scalar or one pointer is another one;
 *  - a segment of 7 ops is never captured;
 *  - a move of the base's workspace (its epoch) drops the graph: the
 *    segment runs plainly at the new epoch, then is captured again;
 *  - a capture that fails (graph_end returns NULL) leaves the segment's
 *    ops run plainly, once, and the segment is never captured again;
 *  - from_host issues the queue before it copies.
 * Exit status 0 when all hold. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/backend/ops_cpu.h"

#define MAX_REC 64

typedef struct {
    float *x;
    float s;
    size_t n;
} scale_call_t;

typedef struct {
    scale_call_t call[MAX_REC];
    int n;
} fake_graph_t;

/* the base table's state */
typedef struct {
    ops_t ops;
    int capturing, fail_next_capture;
    fake_graph_t *cap;
    unsigned long epoch;
    long plain_scales, captured_scales, launches, begins, frees;
} fake_t;

static void f_scale_now(float *x, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static void f_scale(void *ctx, float *x, float s, size_t n)
{
    fake_t *f = ctx;
    if (f->capturing) {
        if (f->cap->n < MAX_REC)
            f->cap->call[f->cap->n++] = (scale_call_t){x, s, n};
        f->captured_scales++;
        return;
    }
    f_scale_now(x, s, n);
    f->plain_scales++;
}
static void f_sync(void *ctx) { (void)ctx; }
static void f_from_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
}
static void f_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
}
static void f_graph_begin(void *ctx)
{
    fake_t *f = ctx;
    f->cap = calloc(1, sizeof *f->cap);
    f->capturing = 1;
    f->begins++;
}
static void *f_graph_end(void *ctx)
{
    fake_t *f = ctx;
    fake_graph_t *g = f->cap;
    f->capturing = 0;
    f->cap = NULL;
    if (f->fail_next_capture) {
        f->fail_next_capture = 0;
        free(g);
        return NULL;
    }
    return g;
}
static void f_graph_launch(void *ctx, void *graph)
{
    fake_t *f = ctx;
    const fake_graph_t *g = graph;
    for (int i = 0; i < g->n; i++)
        f_scale_now(g->call[i].x, g->call[i].s, g->call[i].n);
    f->launches++;
}
static void f_graph_free(void *ctx, void *graph)
{
    fake_t *f = ctx;
    free(graph);
    f->frees++;
}
static unsigned long f_graph_epoch(void *ctx) { return ((fake_t *)ctx)->epoch; }
static void f_release(void *ctx) { (void)ctx; }

static int failures;
#define CHECK_EQ(what, got, want)                                                                                    \
    do {                                                                                                             \
        long g_ = (long)(got), w_ = (long)(want);                                                                    \
        if (g_ != w_) {                                                                                              \
            printf("FAIL: %s: %ld, wanted %ld\n", what, g_, w_);                                                     \
            failures++;                                                                                              \
        } else {                                                                                                     \
            printf("ok: %s: %ld\n", what, g_);                                                                       \
        }                                                                                                            \
    } while (0)

/* n scale ops of x[4] by s, then a wait; x must then be x0 * s^n */
static void segment(const ops_t *o, float *x, float s, int n, const char *label)
{
    float before = x[0];
    for (int i = 0; i < n; i++)
        o->scale(o->ctx, x, s, 4);
    o->sync(o->ctx);
    float want = before; /* the same products in the same order: exact */
    for (int i = 0; i < n; i++)
        want *= s;
    if (x[0] != want || x[3] != want) {
        printf("FAIL: %s: x = %g, wanted %g\n", label, x[0], want);
        failures++;
    }
}

int main(void)
{
    fake_t f = {0};
    f.ops = (ops_t){.name = "fake",
                    .host_readable = 1,
                    .release = f_release,
                    .sync = f_sync,
                    .from_host = f_from_host,
                    .to_host = f_to_host,
                    .scale = f_scale,
                    .graph_begin = f_graph_begin,
                    .graph_end = f_graph_end,
                    .graph_launch = f_graph_launch,
                    .graph_free = f_graph_free,
                    .graph_epoch = f_graph_epoch};
    f.ops.ctx = &f;
    const ops_t *o = ops_graph_create(&f.ops, 1);
    if (!o) {
        printf("FAIL: ops_graph_create\n");
        return 1;
    }
    float x[4] = {1, 1, 1, 1}, y[4] = {1, 1, 1, 1};
    ops_graph_counts_t c;

    segment(o, x, 1.5f, 8, "first");
    CHECK_EQ("first time: ops run plainly", f.plain_scales, 8);
    CHECK_EQ("first time: captures", f.begins, 0);
    segment(o, x, 1.5f, 8, "second");
    CHECK_EQ("second time: captured, not run, by the capture", f.captured_scales, 8);
    CHECK_EQ("second time: launched", f.launches, 1);
    CHECK_EQ("second time: plain ops unchanged", f.plain_scales, 8);
    segment(o, x, 1.5f, 8, "third");
    CHECK_EQ("third time: launched again", f.launches, 2);
    CHECK_EQ("third time: no new capture", f.begins, 1);

    segment(o, x, 0.5f, 8, "other scalar");
    CHECK_EQ("another scalar: plain", f.plain_scales, 16);
    segment(o, y, 1.5f, 8, "other pointer");
    CHECK_EQ("another pointer: plain", f.plain_scales, 24);
    CHECK_EQ("another pointer: no launch", f.launches, 2);

    for (int i = 0; i < 3; i++)
        segment(o, x, 2.0f, 7, "short");
    CHECK_EQ("7 ops three times: never captured", f.begins, 1);
    CHECK_EQ("7 ops three times: plain", f.plain_scales, 45);

    f.epoch++; /* the workspace moved */
    segment(o, x, 1.5f, 8, "after the move");
    ops_graph_counts(o, &c);
    CHECK_EQ("after the move: the graph dropped as stale", c.stale, 1);
    CHECK_EQ("after the move: freed", f.frees, 1);
    CHECK_EQ("after the move: plain", f.plain_scales, 53);
    segment(o, x, 1.5f, 8, "after the move, again");
    CHECK_EQ("after the move, again: captured anew", f.begins, 2);
    CHECK_EQ("after the move, again: launched", f.launches, 3);

    /* seen once, then the workspace moves: the next time it runs plainly
     * again (at the new epoch its buffers may need to grow, which a
     * capture cannot hold), the time after it is captured */
    float u[4] = {1, 1, 1, 1};
    segment(o, u, 2.0f, 8, "seen before a move");
    f.epoch++;
    segment(o, u, 2.0f, 8, "seen before a move: again");
    CHECK_EQ("seen at another epoch: not captured", f.begins, 2);
    CHECK_EQ("seen at another epoch: plain", f.plain_scales, 69);
    segment(o, u, 2.0f, 8, "seen before a move: third");
    CHECK_EQ("seen at this epoch: captured", f.begins, 3);

    float z[4] = {1, 1, 1, 1};
    segment(o, z, 3.0f, 8, "capture fails: seen");
    f.fail_next_capture = 1;
    segment(o, z, 3.0f, 8, "capture fails: the failed capture's ops run plainly");
    segment(o, z, 3.0f, 8, "capture fails: plain after");
    ops_graph_counts(o, &c);
    CHECK_EQ("a failed capture: counted", c.refused, 1);
    CHECK_EQ("a failed capture: not tried again", f.begins, 4);
    CHECK_EQ("a failed capture: ops run plainly three times", f.plain_scales, 69 + 24);

    /* from_host issues what is queued before it copies: the scale runs on
     * the old contents, the copy lands after */
    float w[4] = {1, 1, 1, 1}, src[4] = {7, 7, 7, 7};
    for (int i = 0; i < 8; i++)
        o->scale(o->ctx, w, 2.0f, 4);
    o->from_host(o->ctx, w, src, sizeof src);
    o->sync(o->ctx);
    CHECK_EQ("from_host after queued ops: the copy last", (long)w[0], 7);

    ops_graph_counts(o, &c);
    printf("counts: %ld segments, %ld captures, %ld launches, %ld ops in graphs, %ld plain\n", c.segments, c.captures,
           c.launches, c.graph_ops, c.plain_ops);
    ops_release(o);
    CHECK_EQ("release frees the graphs still held", f.frees, 3);
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}
