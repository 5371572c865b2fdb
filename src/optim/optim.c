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

/* Each moment holds at least one float, so neither is empty. */
size_t adamw_state_bytes(size_t n) { return 2 * (n ? n : 1) * sizeof(float); }

int adamw_create(adamw_t *a, const ops_t *ops, const param_table_t *t, const dpsync_optim_view_t *v, double beta1,
                 double beta2, double eps, double weight_decay, double grad_clip)
{
    memset(a, 0, sizeof *a);
    a->ops = ops;
    a->n = v->n;
    a->beta1 = beta1;
    a->beta2 = beta2;
    a->eps = eps;
    a->weight_decay = weight_decay;
    a->grad_clip = grad_clip;
    const size_t bytes = adamw_state_bytes(a->n) / 2; /* each moment */
    a->m = ops->alloc(ops->ctx, bytes);
    a->v = ops->alloc(ops->ctx, bytes);
    /* at most one run per (tensor, piece) overlap: tensors + pieces */
    a->ranges = calloc((size_t)t->n + (size_t)v->n_pieces + 1, sizeof *a->ranges);
    if (!a->m || !a->v || !a->ranges) {
        adamw_destroy(a);
        return -1;
    }
    ops->zero(ops->ctx, a->m, bytes);
    ops->zero(ops->ctx, a->v, bytes);
    mem_track(MEM_OPTIM, (long long)adamw_state_bytes(a->n));
    /* each piece, cut at tensor boundaries (decay) */
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
        }
    }
    return 0;
}

void adamw_destroy(adamw_t *a)
{
    if (a->m && a->v)
        mem_track(MEM_OPTIM, -(long long)adamw_state_bytes(a->n));
    if (a->m)
        a->ops->free(a->ops->ctx, a->m);
    if (a->v)
        a->ops->free(a->ops->ctx, a->v);
    free(a->ranges);
    memset(a, 0, sizeof *a);
}

double adamw_clip_scale(const adamw_t *a, double grad_norm)
{
    if (a->grad_clip > 0 && grad_norm > a->grad_clip)
        return a->grad_clip / grad_norm;
    return 1.0;
}

void adamw_step(adamw_t *a, float *params, uint16_t *params16, const float *grads, double lr, double grad_scale)
{
    a->t++;
    for (int i = 0; i < a->n_ranges; i++) {
        const optim_range_t *r = &a->ranges[i];
        a->ops->adamw(a->ops->ctx, params + r->offset, params16 ? params16 + r->offset : NULL, grads + r->goff,
                      a->m + r->soff, a->v + r->soff, r->n, (float)lr, (float)a->beta1, (float)a->beta2, (float)a->eps,
                      r->decay ? (float)a->weight_decay : 0.0f, (float)grad_scale, a->t);
    }
}
