/* AdamW with global-norm clipping and the warmup + cosine LR schedule. */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include <stddef.h>

#include "base/ops.h"
#include "src/params.h"
#include "mpi/dpsync.h"

typedef struct lr_schedule {
    double lr, min_lr;
    int warmup, steps;
} lr_schedule_t;

/* Learning rate of optimizer step `step` (0-based): linear warmup from
 * lr/warmup to lr over the first `warmup` steps, then cosine decay to min_lr
 * at the last step. */
double lr_at(const lr_schedule_t *s, int step);

/* A run of consecutive elements sharing one weight-decay setting: the
 * update is one fused pass per run instead of one per tensor. Offsets in
 * floats: into the parameters, the gradients, and the moments (the three
 * differ under ZeRO, where moments and sharded gradients cover only this
 * rank's pieces). */
typedef struct optim_range {
    size_t offset, goff, soff, n;
    int decay;
} optim_range_t;

typedef struct adamw {
    const ops_t *ops;
    float *m, *v; /* [n] first and second moments */
    size_t n;
    optim_range_t *ranges;
    int n_ranges;
    double beta1, beta2, eps, weight_decay, grad_clip;
    int t; /* steps taken */
} adamw_t;

/* Moments [v->n] for the pieces of the data-parallel strategy's view
 * (mpi/dpsync.h): every parameter when replicated, this rank's ZeRO pieces
 * otherwise; each piece is cut at the table's tensor boundaries (weight
 * decay differs between tensors). adamw_step's params and grads are
 * indexed as the view's (its params and grads). */
int adamw_create(adamw_t *a, const ops_t *ops, const param_table_t *t, const dpsync_optim_view_t *v,
                 double beta1, double beta2, double eps, double weight_decay, double grad_clip);
void adamw_destroy(adamw_t *a);

/* Gradient-norm clipping factor for a global norm: min(1, clip / norm). */
double adamw_clip_scale(const adamw_t *a, double grad_norm);

/* One step over params/grads; grads are multiplied by grad_scale first.
 * params16 (NULL: none) is a bf16 copy indexed like params, written in the
 * same pass (ops adamw's p16): pass it only when the ranges cover every
 * parameter (the view's whole), or parts of it would go stale. */
void adamw_step(adamw_t *a, float *params, uint16_t *params16, const float *grads, double lr, double grad_scale);

#endif
