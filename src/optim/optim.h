/* AdamW with global-norm clipping and the LR schedules (warmup, then cosine,
 * linear, constant or warmup-stable-decay). */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include <stddef.h>

#include "base/ops.h"
#include "mpi/dpsync.h"
#include "src/optim/adamw_host.h"
#include "src/model/params.h"

/* --lr-schedule: what follows the warmup. */
typedef enum { LR_COSINE, LR_LINEAR, LR_WSD, LR_CONSTANT, LR_N_KINDS } lr_kind_t;
extern const char *const lr_kind_names[LR_N_KINDS + 1]; /* "cosine", "linear", "wsd", "constant", NULL */

/* --decay-shape: the curve of warmup-stable-decay's decay phase. */
typedef enum { DECAY_1_SQRT, DECAY_LINEAR, DECAY_COSINE, DECAY_N_SHAPES } decay_shape_t;
extern const char *const decay_shape_names[DECAY_N_SHAPES]; /* "1-sqrt", "linear", "cosine" */

typedef struct lr_schedule {
    double lr, min_lr;
    int warmup, steps;
    lr_kind_t kind;
    int decay_steps;     /* LR_WSD: the last decay_steps steps decay */
    decay_shape_t shape; /* LR_WSD: how */
} lr_schedule_t;

/* Fills s from the option values: kind and shape by name ("" shape =
 * 1-sqrt), decay_steps 0 = the last 20 % of steps (llm.c's decay point).
 * Returns 0, or -1 with one line in err (an unknown name, a decay that
 * overlaps the warmup, a decay option without wsd). */
int lr_schedule_make(lr_schedule_t *s, const char *kind, const char *shape, double lr, double min_lr, int warmup,
                     int steps, int decay_steps, char *err, size_t errlen);

/* One line for the banner and --plan, e.g. "wsd: warmup 50, stable at
 * 0.001, 1-sqrt decay over the last 200 of 1000 steps towards 0.0001". */
void lr_schedule_describe(const lr_schedule_t *s, char *out, size_t outlen);

/* What a checkpoint records of s: the kind's name, the decay steps and
 * the shape's name (0 and "none" outside wsd). */
void lr_schedule_record(const lr_schedule_t *s, char *kind, size_t kind_len, int *decay_steps, char *shape,
                        size_t shape_len);

/* Learning rate of optimizer step `step` (0-based): linear warmup from
 * lr/warmup to lr over the first `warmup` steps, then by kind: cosine or
 * linear decay to min_lr at the last step, lr (constant), or lr until the
 * last decay_steps steps and then the shape's decay towards min_lr (wsd). */
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

/* --offload optimizer (issue 36): elements [0, n) of the view's moment
 * index keep their moments and their fp32 master parameters in host
 * memory (pinned where the backend has it) and are updated there by the
 * host AdamW (adamw_host.h). Each step copies their gradients to the host,
 * updates, and copies the parameters (and the bf16 copy) back; the
 * backend's parameters stay a copy the forward reads. */
typedef struct adamw_offload {
    size_t n;              /* elements in host memory (0: no offload) */
    float *p, *g, *m, *v;  /* [n] master parameters, gradient staging, moments */
    uint16_t *p16;         /* [n] the bf16 copy's staging, or NULL */
    optim_range_t *ranges; /* soff indexes the arrays above */
    int n_ranges;
    /* The gradient copies: the same elements cut at every tensor and
     * piece boundary (never merged), ascending in goff, so that each lies
     * inside any stretch the strategy reports final (adamw_grads_final:
     * whole tensors or whole ZeRO units); begun[i] marks those whose copy
     * this step has begun. */
    optim_range_t *segs;
    unsigned char *begun;
    int n_segs;
    int pending;    /* copies begun with to_host_begin and not yet ended */
    adamw_host_isa_t isa;
    int pinned; /* the arrays come from the backend's host_alloc */
    /* the master parameters are the view's params themselves, host memory
     * (model_layout_t params_host): p is NULL, the host AdamW updates
     * params in place and only the bf16 copy goes back to the backend */
    int params_are_master;
} adamw_offload_t;

typedef struct adamw {
    const ops_t *ops;
    float *m, *v;          /* [n - host.n] first and second moments in backend memory */
    size_t n;              /* elements of the view: backend ones and host.n host ones */
    optim_range_t *ranges; /* soff indexes m and v */
    int n_ranges;
    adamw_offload_t host;
    double beta1, beta2, eps, weight_decay, grad_clip;
    int t; /* steps taken */
} adamw_t;

/* How many of a view's n elements --offload-fraction f puts in host
 * memory (the first ones of the moment index): round(f x n). */
size_t adamw_offload_count(size_t n, double f);

/* Host bytes the offloaded part of n_host elements takes (master
 * parameters unless params_master, gradient staging, two moments; the
 * bf16 staging when bf16), as adamw_create allocates them; the planner
 * counts the same. */
size_t adamw_offload_bytes(size_t n_host, int bf16, int params_master);

/* Moments [v->n] for the pieces of the data-parallel strategy's view
 * (mpi/dpsync.h): every parameter when replicated, this rank's ZeRO pieces
 * otherwise; each piece is cut at the table's tensor boundaries (weight
 * decay differs between tensors). adamw_step's params and grads are
 * indexed as the view's (its params and grads). --offload: the first
 * n_host elements (adamw_offload_count) live in host memory instead, their
 * master parameters read from the view's params now; host_bf16: they also
 * stage the bf16 copy (the update writes params16); params_master: the
 * view's params are host memory and are the master copy themselves
 * (model_layout_t params_host; n_host must be v->n). -1: out of memory. */
int adamw_create(adamw_t *a, const ops_t *ops, const param_table_t *t, const dpsync_optim_view_t *v, double beta1,
                 double beta2, double eps, double weight_decay, double grad_clip, size_t n_host, int host_bf16,
                 int params_master);

/* --offload: the view's gradients [lo, lo + n) are final for this step
 * (reduced and averaged; the strategy says so as each bucket or unit
 * completes, during the backward). Begins the copies of the offloaded
 * elements among them into host memory (the backend's to_host_begin: on
 * CUDA its copy stream, behind the ops issued so far; to_host where it
 * has none), each once a step; adamw_step ends them before the host
 * AdamW and copies there whatever no call reported. Returns the bytes
 * whose copies began. No-op without offload. */
size_t adamw_grads_final(adamw_t *a, const float *grads, size_t lo, size_t n);

/* The step ends without an update (the spike guard skipped it): the
 * copies begun are ended and forgotten, so the next step copies afresh. */
void adamw_grads_drop(adamw_t *a);

/* The view's parameters were written outside adamw_step (a checkpoint
 * loaded, a rollback): the host master copy reads them again (no-op when
 * the params are the master copy). */
void adamw_offload_pull(adamw_t *a, const float *params);

/* Moment `which` (0: m, 1: v) whole, indexed as the view [n], in backend
 * memory, for the strategy's state_to_host/state_from_host: the backend
 * array itself when nothing is offloaded, else a temporary that
 * adamw_moment_put writes back (when written) and frees. NULL: out of
 * memory. */
float *adamw_moment_get(adamw_t *a, int which);
void adamw_moment_put(adamw_t *a, int which, float *buf, int written);
void adamw_destroy(adamw_t *a);

/* Bytes of the AdamW moments (m and v, MEM_OPTIM) adamw_create allocates
 * for n elements; the planner counts the same. */
size_t adamw_state_bytes(size_t n);

/* Gradient-norm clipping factor for a global norm: min(1, clip / norm). */
double adamw_clip_scale(const adamw_t *a, double grad_norm);

/* One step over params/grads; grads are multiplied by grad_scale first.
 * params16 (NULL: none) is a bf16 copy indexed like params, written in the
 * same pass (ops adamw's p16): pass it only when the ranges cover every
 * parameter (the view's whole), or parts of it would go stale. */
void adamw_step(adamw_t *a, float *params, uint16_t *params16, const float *grads, double lr, double grad_scale);
/* Offloaded (a->host.n > 0): params16 non-NULL only when adamw_offload was
 * told bf16. */

#endif
