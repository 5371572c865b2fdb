#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

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

int adamw_create(adamw_t *a, const ops_t *ops, const param_table_t *t, double beta1, double beta2,
                 double eps, double weight_decay, double grad_clip)
{
    memset(a, 0, sizeof *a);
    a->ops = ops;
    a->n = t->numel;
    a->beta1 = beta1;
    a->beta2 = beta2;
    a->eps = eps;
    a->weight_decay = weight_decay;
    a->grad_clip = grad_clip;
    size_t bytes = a->n * sizeof(float);
    a->m = ops->alloc(bytes);
    a->v = ops->alloc(bytes);
    a->ranges = calloc((size_t)t->n, sizeof *a->ranges);
    if (!a->m || !a->v || !a->ranges) {
        adamw_destroy(a);
        return -1;
    }
    ops->zero(a->m, bytes);
    ops->zero(a->v, bytes);
    mem_track(MEM_OPTIM, 2 * (long long)bytes);
    for (int i = 0; i < t->n; i++) {
        const param_desc_t *d = &t->p[i];
        optim_range_t *last = a->n_ranges ? &a->ranges[a->n_ranges - 1] : NULL;
        if (last && last->decay == d->decay && last->offset + last->n == d->offset)
            last->n += d->numel;
        else
            a->ranges[a->n_ranges++] = (optim_range_t){.offset = d->offset, .n = d->numel, .decay = d->decay};
    }
    return 0;
}

void adamw_destroy(adamw_t *a)
{
    if (a->m && a->v)
        mem_track(MEM_OPTIM, -2 * (long long)(a->n * sizeof(float)));
    if (a->m)
        a->ops->free(a->m);
    if (a->v)
        a->ops->free(a->v);
    free(a->ranges);
    memset(a, 0, sizeof *a);
}

double adamw_clip_scale(const adamw_t *a, double grad_norm)
{
    if (a->grad_clip > 0 && grad_norm > a->grad_clip)
        return a->grad_clip / grad_norm;
    return 1.0;
}

void adamw_step(adamw_t *a, float *params, const float *grads, double lr, double grad_scale)
{
    a->t++;
    for (int i = 0; i < a->n_ranges; i++) {
        const optim_range_t *r = &a->ranges[i];
        a->ops->adamw(params + r->offset, grads + r->offset, a->m + r->offset, a->v + r->offset, r->n,
                      (float)lr, (float)a->beta1, (float)a->beta2, (float)a->eps,
                      r->decay ? (float)a->weight_decay : 0.0f, (float)grad_scale, a->t);
    }
}
