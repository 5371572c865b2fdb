#include "src/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/mem.h"

double lr_at(const lr_schedule_t *s, int step)
{
    if (step < s->warmup)
        return s->lr * (double)(step + 1) / (double)s->warmup;
    int decay_steps = s->steps - s->warmup;
    if (decay_steps <= 1)
        return s->lr;
    double progress = (double)(step - s->warmup) / (double)(decay_steps - 1);
    if (progress > 1.0)
        progress = 1.0;
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
        a->ranges[a->n_ranges++] = (optim_range_t){.offset = offset, .goff = goff, .soff = soff, .n = n,
                                                   .decay = decay};
}

int adamw_create(adamw_t *a, const ops_t *ops, const param_table_t *t, const dpsync_optim_view_t *v,
                 double beta1, double beta2, double eps, double weight_decay, double grad_clip)
{
    memset(a, 0, sizeof *a);
    a->ops = ops;
    a->n = v->n;
    a->beta1 = beta1;
    a->beta2 = beta2;
    a->eps = eps;
    a->weight_decay = weight_decay;
    a->grad_clip = grad_clip;
    size_t bytes = (a->n ? a->n : 1) * sizeof(float);
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
    mem_track(MEM_OPTIM, 2 * (long long)bytes);
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
        mem_track(MEM_OPTIM, -2 * (long long)((a->n ? a->n : 1) * sizeof(float)));
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
