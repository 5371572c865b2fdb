/* Internal to the trainer's files (src/train/train.c, src/train/train_setup.c,
 * src/train/train_ckpt.c): the functions one of them defines and another calls.
 * Not part of the trainer's interface (src/train/train.h); nothing else includes
 * it. The comments at the definitions say what each does. */
#ifndef DTRAIN_TRAIN_INTERNAL_H
#define DTRAIN_TRAIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "src/train/train.h"

/* src/train/train_ckpt.c: parameters and state to and from the host */
int params_to_host(trainer_t *tr, float *host, char *err, size_t errlen);
int init_params(trainer_t *tr, uint64_t seed, char *err, size_t errlen);
void free_state(trainer_t *tr);

/* src/train/train_ckpt.c: checkpoints (collective) */
int trainer_resume(trainer_t *tr, char *err, size_t errlen);
int setup_ckpt_async(trainer_t *tr, char *err, size_t errlen);
int trainer_save(trainer_t *tr, int step, char *err, size_t errlen);
int ckpt_wait(trainer_t *tr, int poll, char *err, size_t errlen);
void ckpt_copy_wait(trainer_t *tr);
int trainer_save_params(trainer_t *tr, char *err, size_t errlen);
int spike_rollback(trainer_t *tr, int step, char *err, size_t errlen);

/* src/train/train.c: --cp's view of a batch (this rank's chunks) */
void trainer_cp_view(trainer_t *tr, const int32_t **tok, const int32_t **pos, const int32_t **tgt, int B, int *t);

/* src/train/train.c: --offload's listener for the gradients the
 * data-parallel strategy tells final (dpsync_on_final; ctx: the trainer) */
void trainer_grads_final(void *ctx, size_t lo, size_t n);

/* src/train/eval_mc.c: --eval-mc's scores into r (collective) */
int trainer_eval_mc(trainer_t *tr, step_record_t *r, char *err, size_t errlen);

#endif
