#include "src/optim/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

const char *const lr_kind_names[LR_N_KINDS + 1] = {"cosine", "linear", "wsd", "constant", NULL};
const char *const decay_shape_names[DECAY_N_SHAPES] = {"1-sqrt", "linear", "cosine"};

static int name_index(const char *const *names, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

int lr_schedule_make(lr_schedule_t *s, const char *kind, const char *shape, double lr, double min_lr, int warmup,
                     int steps, int decay_steps, char *err, size_t errlen)
{
    const int k = name_index(lr_kind_names, LR_N_KINDS, kind);
    const int sh = shape[0] ? name_index(decay_shape_names, DECAY_N_SHAPES, shape) : DECAY_1_SQRT;
    *s = (lr_schedule_t){.lr = lr, .min_lr = min_lr, .warmup = warmup, .steps = steps, .kind = LR_COSINE};
    if (k < 0 || sh < 0) {
        snprintf(err, errlen,
                 k < 0 ? "--lr-schedule '%s': allowed cosine|linear|wsd|constant"
                       : "--decay-shape '%s': allowed linear|cosine|1-sqrt",
                 k < 0 ? kind : shape);
        return -1;
    }
    s->kind = (lr_kind_t)k;
    s->shape = (decay_shape_t)sh;
    if (s->kind != LR_WSD) {
        if (decay_steps > 0 || shape[0]) {
            snprintf(err, errlen, "--%s shapes the decay of --lr-schedule wsd; this run's schedule is %s",
                     decay_steps > 0 ? "decay-steps" : "decay-shape", kind);
            return -1;
        }
        return 0;
    }
    /* 0: llm.c's decay point, (int)(0.8f * steps): the last 20 % decay */
    s->decay_steps = decay_steps > 0 ? decay_steps : steps - (int)(0.8f * (float)steps);
    if (s->decay_steps < 1 || warmup + s->decay_steps > steps) {
        snprintf(err, errlen,
                 "--lr-schedule wsd: --warmup %d plus %d decay steps exceed --steps %d; lower "
                 "--decay-steps or --warmup",
                 warmup, s->decay_steps, steps);
        return -1;
    }
    return 0;
}

void lr_schedule_describe(const lr_schedule_t *s, char *out, size_t outlen)
{
    if (s->kind == LR_WSD)
        snprintf(out, outlen, "wsd: warmup %d, stable at %g, %s decay over the last %d of %d steps towards %g",
                 s->warmup, s->lr, decay_shape_names[s->shape], s->decay_steps, s->steps, s->min_lr);
    else if (s->kind == LR_CONSTANT)
        snprintf(out, outlen, "constant: warmup %d, then %g", s->warmup, s->lr);
    else
        snprintf(out, outlen, "%s: warmup %d, then %g -> %g at step %d", lr_kind_names[s->kind], s->warmup, s->lr,
                 s->min_lr, s->steps);
}

void lr_schedule_record(const lr_schedule_t *s, char *kind, size_t kind_len, int *decay_steps, char *shape,
                        size_t shape_len)
{
    snprintf(kind, kind_len, "%s", lr_kind_names[s->kind]);
    *decay_steps = s->kind == LR_WSD ? s->decay_steps : 0;
    snprintf(shape, shape_len, "%s", s->kind == LR_WSD ? decay_shape_names[s->shape] : "none");
}

/* Warmup-stable-decay, as Megatron-LM (megatron/core/optimizer_param_scheduler.py,
 * get_lr's WSD branch with lr_wsd_decay_style linear | cosine | minus_sqrt)
 * and llm.c (llmc/schedulers.h, get_learning_rate_wsd: 1 - sqrt) define
 * it: the decay starts at anneal = steps - decay_steps, and step s (0-based,
 * Megatron's num_steps, llm.c's step) has ratio (s - anneal) / decay_steps,
 * 0 up to anneal; so the last step is at (N-1)/N of the decay, not at min_lr. */
static double wsd_at(const lr_schedule_t *s, int step)
{
    const int anneal = s->steps - s->decay_steps;
    if (step <= anneal)
        return s->lr;
    double ratio = (double)(step - anneal) / (double)s->decay_steps, coeff;
    if (ratio > 1.0)
        ratio = 1.0;
    switch (s->shape) {
    case DECAY_LINEAR: coeff = 1.0 - ratio; break;
    case DECAY_COSINE: coeff = 0.5 * (cos(M_PI * ratio) + 1.0); break;
    case DECAY_1_SQRT:
    default: coeff = 1.0 - sqrt(ratio); break;
    }
    return s->min_lr + coeff * (s->lr - s->min_lr);
}

double lr_at(const lr_schedule_t *s, int step)
{
    /* warmup as llm.c's schedulers: lr * (step + 1) / warmup */
    if (step < s->warmup)
        return s->lr * (double)(step + 1) / (double)s->warmup;
    if (s->kind == LR_CONSTANT)
        return s->lr;
    if (s->kind == LR_WSD)
        return wsd_at(s, step);
    int decay_steps = s->steps - s->warmup;
    if (decay_steps <= 1)
        return s->lr;
    /* cosine and linear reach min_lr at the last step (progress 1 there) */
    double progress = (double)(step - s->warmup) / (double)(decay_steps - 1);
    if (progress > 1.0)
        progress = 1.0;
    if (s->kind == LR_LINEAR) /* Megatron-LM's linear coefficient, 1 - ratio */
        return s->min_lr + (1.0 - progress) * (s->lr - s->min_lr);
    return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1.0 + cos(M_PI * progress));
}

/* Appends [offset, offset+n) (moments at soff, gradients at goff), merged
 * into the previous run when contiguous in all three with the same decay. */
static void add_range(adamw_t *a, size_t offset, size_t goff, size_t soff, size_t n, int decay)
{
    optim_range_t *last = a->n_ranges ? &a->ranges[a->n_ranges - 1] : NULL;
    if (n == 0)
        return;
    if (last && last->decay == decay && last->offset + last->n == offset && last->goff + last->n == goff &&
        last->soff + last->n == soff)
        last->n += n;
    else
        a->ranges[a->n_ranges++] =
            (optim_range_t){.offset = offset, .goff = goff, .soff = soff, .n = n, .decay = decay};
}

/* Backend moments for n elements: both zeroed and counted, or neither. */
static int alloc_moments(const ops_t *ops, size_t n, float **m, float **v)
{
    const size_t bytes = adamw_state_bytes(n) / 2; /* each moment */
    *m = ops->alloc(ops->ctx, bytes);
    *v = ops->alloc(ops->ctx, bytes);
    if (!*m || !*v) {
        if (*m)
            ops->free(ops->ctx, *m);
        if (*v)
            ops->free(ops->ctx, *v);
        *m = *v = NULL;
        return -1;
    }
    ops->zero(ops->ctx, *m, bytes);
    ops->zero(ops->ctx, *v, bytes);
    mem_track(MEM_OPTIM, (long long)adamw_state_bytes(n));
    return 0;
}

static void free_moments(const ops_t *ops, size_t n, float *m, float *v)
{
    if (m && v)
        mem_track(MEM_OPTIM, -(long long)adamw_state_bytes(n));
    if (m)
        ops->free(ops->ctx, m);
    if (v)
        ops->free(ops->ctx, v);
}

/* Each moment holds at least one float, so neither is empty. */
size_t adamw_state_bytes(size_t n) { return 2 * (n ? n : 1) * sizeof(float); }

static int offload_setup(adamw_t *a, size_t n_host, int bf16, int params_master, const optim_range_t *cuts,
                         int n_cuts);

int adamw_create(adamw_t *a, const ops_t *ops, const param_table_t *t, const dpsync_optim_view_t *v, double beta1,
                 double beta2, double eps, double weight_decay, double grad_clip, size_t n_host, int host_bf16,
                 int params_master)
{
    memset(a, 0, sizeof *a);
    a->ops = ops;
    a->n = v->n;
    a->beta1 = beta1;
    a->beta2 = beta2;
    a->eps = eps;
    a->weight_decay = weight_decay;
    a->grad_clip = grad_clip;
    /* at most one run per (tensor, piece) overlap: tensors + pieces */
    a->ranges = calloc((size_t)t->n + (size_t)v->n_pieces + 1, sizeof *a->ranges);
    if (!a->ranges) {
        adamw_destroy(a);
        return -1;
    }
    /* each piece, cut at tensor boundaries (decay); offload keeps the
     * cuts unmerged too, as the runs its gradient copies go by */
    const size_t max_cuts = (size_t)t->n + (size_t)v->n_pieces + 1;
    optim_range_t *cuts = n_host ? calloc(max_cuts, sizeof *cuts) : NULL;
    int n_cuts = 0;
    if (n_host && !cuts) {
        adamw_destroy(a);
        return -1;
    }
    int i = 0;
    for (int u = 0; u < v->n_pieces; u++) {
        const dpsync_piece_t *pc = &v->pieces[u];
        const size_t lo = pc->lo, hi = pc->lo + pc->n;
        while (i < t->n && t->p[i].offset + t->p[i].numel <= lo)
            i++;
        for (int k = i; k < t->n && t->p[k].offset < hi; k++) {
            const size_t a0 = t->p[k].offset > lo ? t->p[k].offset : lo;
            const size_t e = t->p[k].offset + t->p[k].numel, a1 = e < hi ? e : hi;
            add_range(a, pc->param + (a0 - lo), pc->grad + (a0 - lo), pc->state + (a0 - lo), a1 - a0, t->p[k].decay);
            if (cuts && a1 > a0)
                cuts[n_cuts++] = (optim_range_t){.offset = pc->param + (a0 - lo),
                                                 .goff = pc->grad + (a0 - lo),
                                                 .soff = pc->state + (a0 - lo),
                                                 .n = a1 - a0,
                                                 .decay = t->p[k].decay};
        }
    }
    /* the host's part first, so that the backend holds only the rest at
     * any time (its peak counter included) */
    const int host_rc = n_host ? offload_setup(a, n_host, host_bf16, params_master, cuts, n_cuts) : 0;
    free(cuts);
    if (host_rc != 0 ||
        (a->n > n_host && alloc_moments(ops, a->n - n_host, &a->m, &a->v) != 0)) {
        adamw_destroy(a);
        return -1;
    }
    if (n_host)
        adamw_offload_pull(a, v->params);
    return 0;
}

static void offload_free(const ops_t *ops, adamw_offload_t *h)
{
    ops_host_free(ops, h->p);
    ops_host_free(ops, h->g);
    ops_host_free(ops, h->m);
    ops_host_free(ops, h->v);
    ops_host_free(ops, h->p16);
    free(h->ranges);
    free(h->segs);
    free(h->begun);
    memset(h, 0, sizeof *h);
}

void adamw_destroy(adamw_t *a)
{
    if (a->ops && a->host.begun) { /* no copy may still use the host arrays */
        adamw_grads_drop(a);
        a->ops->sync(a->ops->ctx);
    }
    if (a->ops)
        free_moments(a->ops, a->n - a->host.n, a->m, a->v);
    if (a->ops)
        offload_free(a->ops, &a->host);
    free(a->ranges);
    memset(a, 0, sizeof *a);
}

size_t adamw_offload_count(size_t n, double f)
{
    const double k = floor(f * (double)n + 0.5);
    return k <= 0 ? 0 : k >= (double)n ? n : (size_t)k;
}

size_t adamw_offload_bytes(size_t n_host, int bf16, int params_master)
{
    return n_host * ((params_master ? 3 : 4) * sizeof(float) + (bf16 ? sizeof(uint16_t) : 0));
}

/* The runs split at moment index n_host: those below go to the host's
 * list, the rest stay with their moment offset moved down by n_host. */
static void split_ranges(adamw_t *a, size_t n_host)
{
    adamw_offload_t *h = &a->host;
    int nd = 0;
    for (int i = 0; i < a->n_ranges; i++) {
        optim_range_t r = a->ranges[i];
        if (r.soff < n_host) {
            const size_t k = r.soff + r.n <= n_host ? r.n : n_host - r.soff;
            h->ranges[h->n_ranges++] = (optim_range_t){r.offset, r.goff, r.soff, k, r.decay};
            r = (optim_range_t){r.offset + k, r.goff + k, r.soff + k, r.n - k, r.decay};
        }
        if (r.n > 0)
            a->ranges[nd++] = (optim_range_t){r.offset, r.goff, r.soff - n_host, r.n, r.decay};
    }
    a->n_ranges = nd;
}

/* The copies' runs: the cuts below moment index n_host (the last one
 * cut there), in the order of their gradients. */
static int make_segs(adamw_offload_t *h, const optim_range_t *cuts, int n_cuts)
{
    h->segs = calloc((size_t)n_cuts + 1, sizeof *h->segs);
    h->begun = calloc((size_t)n_cuts + 1, 1);
    if (!h->segs || !h->begun)
        return -1;
    for (int i = 0; i < n_cuts; i++)
        if (cuts[i].soff < h->n) {
            optim_range_t r = cuts[i];
            if (r.soff + r.n > h->n)
                r.n = h->n - r.soff;
            h->segs[h->n_segs++] = r;
        }
    for (int i = 1; i < h->n_segs; i++)
        if (h->segs[i].goff < h->segs[i - 1].goff + h->segs[i - 1].n)
            return -1; /* the views' pieces ascend in gradients too (dpsync.h) */
    return 0;
}

/* Host arrays for the first n_host elements and the runs split between
 * host and backend. */
static int offload_setup(adamw_t *a, size_t n_host, int bf16, int params_master, const optim_range_t *cuts,
                         int n_cuts)
{
    const ops_t *ops = a->ops;
    adamw_offload_t *h = &a->host;
    *h = (adamw_offload_t){.n = n_host,
                           .isa = adamw_host_best(),
                           .pinned = ops->host_alloc && ops->host_free,
                           .params_are_master = params_master};
    const size_t bytes = n_host * sizeof(float);
    h->p = params_master ? NULL : ops_host_alloc(ops, bytes);
    h->g = ops_host_alloc(ops, bytes);
    h->m = ops_host_alloc(ops, bytes);
    h->v = ops_host_alloc(ops, bytes);
    h->p16 = bf16 ? ops_host_alloc(ops, n_host * sizeof(uint16_t)) : NULL;
    h->ranges = calloc((size_t)a->n_ranges + 1, sizeof *h->ranges);
    if ((!params_master && !h->p) || !h->g || !h->m || !h->v || (bf16 && !h->p16) || !h->ranges)
        return -1;
    memset(h->m, 0, bytes); /* a fresh optimizer's moments; a checkpoint's come later */
    memset(h->v, 0, bytes);
    split_ranges(a, n_host);
    return make_segs(h, cuts, n_cuts);
}

void adamw_offload_pull(adamw_t *a, const float *params)
{
    const adamw_offload_t *h = &a->host;
    if (h->params_are_master) /* the params are the master copy: nothing to read */
        return;
    for (int i = 0; i < h->n_ranges; i++) {
        const optim_range_t *r = &h->ranges[i];
        a->ops->to_host(a->ops->ctx, h->p + r->soff, params + r->offset, r->n * sizeof(float));
    }
}

/* The backend part [n - host.n] of moment `which`, or the host part. */
static float *moment_dev(const adamw_t *a, int which) { return which ? a->v : a->m; }
static float *moment_host(const adamw_t *a, int which) { return which ? a->host.v : a->host.m; }

float *adamw_moment_get(adamw_t *a, int which)
{
    if (a->host.n == 0)
        return moment_dev(a, which);
    const ops_t *ops = a->ops;
    const size_t n_dev = a->n - a->host.n;
    float *buf = ops->alloc(ops->ctx, a->n * sizeof(float));
    if (!buf)
        return NULL;
    ops->from_host(ops->ctx, buf, moment_host(a, which), a->host.n * sizeof(float));
    if (n_dev)
        ops->copy(ops->ctx, buf + a->host.n, moment_dev(a, which), n_dev * sizeof(float));
    return buf;
}

void adamw_moment_put(adamw_t *a, int which, float *buf, int written)
{
    if (a->host.n == 0 || !buf)
        return;
    const ops_t *ops = a->ops;
    const size_t n_dev = a->n - a->host.n;
    if (written) {
        ops->to_host(ops->ctx, moment_host(a, which), buf, a->host.n * sizeof(float));
        if (n_dev)
            ops->copy(ops->ctx, moment_dev(a, which), buf + a->host.n, n_dev * sizeof(float));
    }
    ops->free(ops->ctx, buf);
}

double adamw_clip_scale(const adamw_t *a, double grad_norm)
{
    if (a->grad_clip > 0 && grad_norm > a->grad_clip)
        return a->grad_clip / grad_norm;
    return 1.0;
}

/* Segments [i, e) (none begun yet, each contiguous with the next in both
 * the gradients and the host arrays) as one copy, begun once a step: on
 * the backend's copy stream where it has one (ended by offload_fetch),
 * else made now. Returns its bytes. */
static size_t copy_run(adamw_t *a, const float *grads, int i, int e)
{
    adamw_offload_t *h = &a->host;
    const ops_t *ops = a->ops;
    const optim_range_t *r = &h->segs[i];
    const size_t bytes = (h->segs[e - 1].goff + h->segs[e - 1].n - r->goff) * sizeof(float);
    if (ops->to_host_begin && ops->to_host_end) {
        ops->to_host_begin(ops->ctx, h->g + r->soff, grads + r->goff, bytes);
        h->pending = 1;
    } else {
        ops->to_host(ops->ctx, h->g + r->soff, grads + r->goff, bytes);
    }
    memset(h->begun + i, 1, (size_t)(e - i));
    return bytes;
}

/* Begins the copies of the segments in [i, end) not begun yet, as few
 * copies as their contiguity allows. Returns their bytes. */
static size_t copy_segs(adamw_t *a, const float *grads, int i, int end)
{
    const adamw_offload_t *h = &a->host;
    size_t bytes = 0;
    while (i < end) {
        if (h->begun[i]) {
            i++;
            continue;
        }
        int e = i + 1;
        while (e < end && !h->begun[e] && h->segs[e].goff == h->segs[e - 1].goff + h->segs[e - 1].n &&
               h->segs[e].soff == h->segs[e - 1].soff + h->segs[e - 1].n)
            e++;
        bytes += copy_run(a, grads, i, e);
        i = e;
    }
    return bytes;
}

size_t adamw_grads_final(adamw_t *a, const float *grads, size_t lo, size_t n)
{
    const adamw_offload_t *h = &a->host;
    if (h->n_segs == 0 || n == 0)
        return 0;
    /* the segments inside [lo, lo + n): from the first not below lo (they
     * ascend) */
    int i = 0, j = h->n_segs;
    while (i < j) {
        const int mid = i + (j - i) / 2;
        if (h->segs[mid].goff < lo)
            i = mid + 1;
        else
            j = mid;
    }
    int end = i;
    while (end < h->n_segs && h->segs[end].goff + h->segs[end].n <= lo + n)
        end++;
    return copy_segs(a, grads, i, end);
}

/* Ends the copies begun; the next step begins its own. */
static void copies_done(adamw_offload_t *h, const ops_t *ops)
{
    if (h->pending)
        ops->to_host_end(ops->ctx);
    h->pending = 0;
    memset(h->begun, 0, (size_t)h->n_segs);
}

void adamw_grads_drop(adamw_t *a)
{
    if (a->host.n)
        copies_done(&a->host, a->ops);
}

/* Every offloaded gradient in host memory: the copies no strategy
 * reported (adamw_grads_final) begun now, after the backward, then all of
 * them ended. Called before the backend's own ranges are issued, so that
 * on an asynchronous backend those update while the host does. */
static void offload_fetch(adamw_t *a, const float *grads)
{
    adamw_offload_t *h = &a->host;
    copy_segs(a, grads, 0, h->n_segs);
    copies_done(h, a->ops);
}

/* The host AdamW over the offloaded elements, then their parameters (and
 * bf16 copy) back to the backend. */
static void offload_update(adamw_t *a, float *params, uint16_t *params16, double lr, double grad_scale)
{
    const ops_t *ops = a->ops;
    const adamw_offload_t *h = &a->host;
    /* the coefficients exactly as the ops table's adamw computes them */
    const dt_adamw_coef_t k[2] = {
        dt_adamw_coef((float)lr, (float)a->beta1, (float)a->beta2, (float)a->eps, 0.0f, (float)grad_scale, a->t),
        dt_adamw_coef((float)lr, (float)a->beta1, (float)a->beta2, (float)a->eps, (float)a->weight_decay,
                      (float)grad_scale, a->t)};
    /* params as the master copy: the host writes them, so no backend op
     * may still read them (a gather's copy, the fp32 copies' refresh, a
     * recast). Those ran before the backward, whose gradients were
     * copied here, and the norm was read before the update, so this
     * wait costs nothing; it keeps the host's writes safe on its own */
    if (h->params_are_master)
        ops->sync(ops->ctx);
    for (int i = 0; i < h->n_ranges; i++) {
        const optim_range_t *r = &h->ranges[i];
        float *p = h->params_are_master ? params + r->offset : h->p + r->soff;
        adamw_host(h->isa, p, params16 ? h->p16 + r->soff : NULL, h->g + r->soff, h->m + r->soff, h->v + r->soff, r->n,
                   &k[r->decay != 0]);
    }
    /* up on the backend's side stream where it has one: the host goes on
     * at once, the backend's next ops wait for the copies; the host
     * arrays are written next after the next step's offload_fetch (its
     * to_host_end) or a sync */
    const int side = ops->from_host_begin && ops->from_host_end;
    void (*up)(void *, void *, const void *, size_t) = side ? ops->from_host_begin : ops->from_host;
    for (int i = 0; i < h->n_ranges; i++) {
        const optim_range_t *r = &h->ranges[i];
        if (!h->params_are_master)
            up(ops->ctx, params + r->offset, h->p + r->soff, r->n * sizeof(float));
        if (params16)
            up(ops->ctx, params16 + r->offset, h->p16 + r->soff, r->n * sizeof(uint16_t));
    }
    if (side)
        ops->from_host_end(ops->ctx);
}

void adamw_step(adamw_t *a, float *params, uint16_t *params16, const float *grads, double lr, double grad_scale)
{
    a->t++;
    if (a->host.n)
        offload_fetch(a, grads);
    for (int i = 0; i < a->n_ranges; i++) {
        const optim_range_t *r = &a->ranges[i];
        a->ops->adamw(a->ops->ctx, params + r->offset, params16 ? params16 + r->offset : NULL, grads + r->goff,
                      a->m + r->soff, a->v + r->soff, r->n, (float)lr, (float)a->beta1, (float)a->beta2, (float)a->eps,
                      r->decay ? (float)a->weight_decay : 0.0f, (float)grad_scale, a->t);
    }
    if (a->host.n)
        offload_update(a, params, params16, lr, grad_scale);
}
