/* Checkpoints: the whole training state in one HDF5 file of logical tensors
 * (doc/format.md), so a run resumes exactly at the same layout and
 * continues at any other.
 *
 *   DIR/step_00000200.h5   parameters, AdamW moments, run state (attributes)
 *   DIR/latest             the name of the newest complete checkpoint
 *
 * A checkpoint is complete and verified or it does not exist: the file is
 * written under a temporary name, fsynced and renamed (io/h5store_publish.c), and
 * only then is `latest` replaced (temporary file, fsync, rename, fsync of
 * the directory) and older checkpoints beyond --keep removed. A crash at
 * any point leaves `latest` naming a complete file. */
#ifndef DTRAIN_CKPT_H
#define DTRAIN_CKPT_H

#include <stddef.h>

#include "mpi/comm.h"
#include "src/model/model_config.h"
#include "src/model/params.h"

#define CKPT_FORMAT_VERSION 1
#define CKPT_DATA_MAX 256                     /* datasets whose positions a checkpoint records (a blend's limit) */
#define CKPT_SPIKE_STATE_MAX (64 + 17 * 1024) /* the loss-spike guard's text (src/train/spike.h's SPIKE_STATE_LEN) */

/* What besides tensors a run needs to continue exactly. The data order and
 * the LR schedule are pure functions of these, so no generator state is
 * stored. */
typedef struct ckpt_meta {
    int step;                  /* optimizer steps completed */
    long long tokens;          /* training tokens consumed */
    int adam_t;                /* AdamW's step counter (bias correction) */
    long long seed;            /* init, data order and sampling */
    int global_batch, seq_len; /* sequences per step and their length: the data order */
    double lr, min_lr;         /* the LR schedule ... */
    int warmup, steps;         /* ... and its length */
    /* ... its kind and decay ("cosine" in checkpoints older than the
     * attribute; like lr, recorded: a resume follows the command line) */
    char lr_schedule[16], decay_shape[16];
    int decay_steps;
    /* batches passed over by loss-spike rollbacks: step s reads batch
     * s + data_skip (src/train/spike.h; 0 in older checkpoints) */
    long long data_skip;
    /* the loss-spike guard's window and run of skips (spike_state_format;
     * "" when absent: a checkpoint older than the attribute spike_state) */
    char spike_state[CKPT_SPIKE_STATE_MAX];
    char layout[64];                          /* "tp 2 pp 2 dp 2" of the writer (information) */
    const char *tokenizer, *tokenizer_sha256; /* the data's tokenizer, "" or NULL when unknown */
    int n_data;                               /* datasets of the training data (0: not recorded) */
    long long data_drawn[CKPT_DATA_MAX];      /* samples the run drew of each (attributes data_drawn_<i>) */
    /* the MoE layers' expert bias [n_layer][E] (model_moe_has_bias;
     * attributes moe_bias_<layer>): what ckpt_save writes, and where
     * ckpt_load reads it to (zeros from a file without it); NULL: none,
     * or not read */
    float *moe_bias;
} ckpt_meta_t;

/* Collective over world (a communicator over MPI_COMM_WORLD). Writes
 * DIR/step_<step>.h5 from every rank's host buffers (params, m, v:
 * [table.numel]), then points `latest` at it and removes all but the newest `keep` checkpoints (keep 0 = all).
 * writer/tp_size/tp_rank as in param_io_write. The path written goes to
 * path_out. Returns 0, or -1 with one line in err on every rank (the
 * previous `latest` then still stands). */
int ckpt_save(comm_t *world, const char *dir, int keep, const model_config_t *cfg, const param_table_t *t,
              float *params, float *m, float *v, int writer, int tp_size, int tp_rank, const ckpt_meta_t *meta,
              char *path_out, size_t path_len, char *err, size_t errlen);

/* Removes the temporaries of checkpoints whose writing was interrupted
 * (a killed job). Rank 0, at start, before any new checkpoint is written:
 * one job per checkpoint directory. */
void ckpt_remove_stale(const char *dir);

/* Collective over world: the checkpoint --resume names. "auto": the file DIR/latest
 * names, or "" (a fresh start) when DIR has no `latest`; anything else is
 * the path itself, which must not be a directory. Returns 0, or -1 (e.g.
 * `latest` names a missing file; --resume DIR, with the fix). */
int ckpt_resolve(comm_t *world, const char *resume, const char *dir, char *path, size_t path_len, char *err,
                 size_t errlen);

/* Collective over world: the newest checkpoint of dir (step_NNNNNNNN.h5)
 * older than the file newer names, in path: 1 when there is one, 0 when
 * not, -1 with err when the broadcast failed. --resume auto falls back to
 * it when the newest checkpoint does not load. */
int ckpt_older(comm_t *world, const char *dir, const char *newer, char *path, size_t path_len, char *err,
               size_t errlen);

/* Collective over world: opens path, checks it is a checkpoint of this format and of
 * cfg's model, verifies every checksum, and reads this rank's slices of the
 * parameters and moments (any layout may have written it) and the run state. */
int ckpt_load(comm_t *world, const char *path, const model_config_t *cfg, const param_table_t *t, float *params,
              float *m, float *v, ckpt_meta_t *meta, char *err, size_t errlen);

#endif
