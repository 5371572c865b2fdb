/* Data-parallel gradient synchronisation over the DP group, on one flat
 * gradient buffer in the backend's memory (the model's gradients). Knows
 * nothing of models: the training loop says which
 * tensors exist (offsets into the flat buffer) and, during the backward of
 * the last microbatch, how far down the gradients are final.
 *
 *   naive:    after backward, one allreduce per tensor
 *   flat:     after backward, one allreduce of the whole buffer
 *   bucketed: buckets of about bucket_bytes in reverse buffer order (the
 *             order backward finishes them); each is started as a
 *             nonblocking allreduce as soon as the backward has finished
 *             every gradient in it, progressed (MPI_Test) whenever the loop
 *             reports progress, and waited for in ddp_finish.
 * In every mode ddp_finish leaves the DP average (sum / dp size) in place.
 *
 * dtype COMM_BF16 (--grad-reduce-dtype bf16): the gradients stay fp32; each
 * communicated range (tensor, buffer or bucket) is rounded to bf16 into its
 * own part of a staging buffer just before its all-reduce is posted, summed
 * in bf16 (comm.h's COMM_BF16 sums), and widened back to fp32 when it
 * completes, before the 1/dp scaling. The staging buffer (2 bytes per
 * gradient, MEM_COMM) is allocated by ddp_create, and only when the group
 * has more than one rank: a group of one reduces nothing, so bf16 changes
 * nothing there.
 *
 * Memory: the gradients are the backend's and so is the staging buffer
 * (ops->alloc, counted in MEM_COMM through the creator's mem_tracker_t); the casts and the 1/dp
 * scaling are the backend's ops (ops->cast_*, ops->scale), so with CUDA
 * they run as kernels on the GPU's buffers, not as host loops. */
#ifndef DTRAIN_DDP_H
#define DTRAIN_DDP_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "base/ops.h"
#include "mpi/comm.h"

typedef enum { DDP_NAIVE = 0, DDP_FLAT, DDP_BUCKETED } ddp_mode_t;
/* The names of ddp_mode_t, indexed by it, NULL-terminated (--ddp-mode). */
extern const char *const ddp_mode_names[];

typedef struct ddp_bucket {
    size_t start, n; /* floats: [start, start+n) of the flat buffer */
    comm_t *comm;    /* where it is summed: dp, or edp for expert tensors */
    comm_req_t req;
    int launched;
} ddp_bucket_t;

typedef struct ddp {
    const ops_t *ops;  /* the backend owning grads and half */
    mem_tracker_t mem; /* counts half */
    ddp_mode_t mode;
    comm_t *dp;
    float *grads;
    size_t n;
    size_t *tensor_start; /* [n_tensors+1] ascending offsets, last = n */
    int n_tensors;
    ddp_bucket_t *buckets; /* buckets[0] is the highest offsets (first ready) */
    int n_buckets;
    int next_bucket;    /* first not launched */
    double comm_wait_s; /* time blocked in ddp_finish this step */
    comm_dtype_t dtype; /* what the all-reduces send */
    uint16_t *half;     /* bf16 and dp > 1 (or edp > 1) only: [n] staging; gradients [a, b) use half[a, b) */
    size_t half_bytes;  /* its size, as counted in mem */
    /* --ep (ddp_set_experts): tensor_expert[t] marks a routed expert's
     * tensor, summed over edp instead of dp; NULL: none */
    unsigned char *tensor_expert;
    comm_t *edp;
    /* ddp_on_done: told [start, start+n) is the step's final average */
    void (*done)(void *ctx, size_t start, size_t n);
    void *done_ctx;
} ddp_t;

/* ops: the backend grads belong to. mem: counts the bf16 staging buffer
 * (NULL: not counted). grads: [n] floats of its memory.
 * tensor_start: ascending offsets of the tensors, n_tensors of them,
 * covering [0, n). Bucket boundaries fall on tensor boundaries (a tensor
 * larger than the bucket size is a bucket of its own). dtype: fp32 or bf16
 * reductions (see above). Returns a status with one line "ddp: ..." in err
 * (mpi/status.h, as every fallible function here). */
status_t ddp_create(ddp_t *d, const ops_t *ops, const mem_tracker_t *mem, ddp_mode_t mode, comm_t *dp, float *grads,
                    size_t n, const size_t *tensor_start, int n_tensors, size_t bucket_bytes, comm_dtype_t dtype,
                    char *err, size_t errlen);
void ddp_destroy(ddp_t *d);

/* --ep: the tensors marked in expert[n_tensors] (a routed expert's, which
 * differs across the EP group) are summed over edp, the expert-data-
 * parallel group, and the rest over dp as before; every gradient is then
 * scaled by 1/dp alike, since an expert's gradient on its rank already
 * sums the EP group's tokens (so the sum over edp covers every DP rank's
 * loss once). Buckets never mix the two groups. Call right after
 * ddp_create, before the first step. Returns a status (out of memory). */
status_t ddp_set_experts(ddp_t *d, const unsigned char *expert, comm_t *edp, size_t bucket_bytes, char *err,
                         size_t errlen);

/* Bucketed mode: done(ctx, start, n) is called once a step for each
 * bucket as soon as its gradients are the final average (its all-reduce
 * completed and scaled; on a group of one, as soon as the backward has
 * finished it), from ddp_grads_ready or ddp_finish, after the ops that
 * scale it are issued. Other modes call nothing: their reductions run in
 * ddp_finish, after the backward. */
void ddp_on_done(ddp_t *d, void (*done)(void *ctx, size_t start, size_t n), void *ctx);

/* Bytes of the bf16 staging buffer (MEM_COMM) ddp_create allocates for n
 * gradients over dp_size ranks: 0 in fp32 or on one rank. The planner
 * counts the same. */
size_t ddp_staging_bytes(size_t n, int dp_size, comm_dtype_t dtype);

/* Start of a step's communicating backward (the last microbatch). */
void ddp_begin(ddp_t *d);
/* Every gradient at offset >= ready_from is final for this step. Launches
 * the buckets that became complete (bucketed mode) and tests the ones in
 * flight. Cheap when nothing changed; call it between kernels. */
status_t ddp_grads_ready(ddp_t *d, size_t ready_from, char *err, size_t errlen);
/* All gradients final: completes communication (naive/flat: does all of
 * it) and scales by 1/dp. Returns a status, the communicator's message in
 * err. */
status_t ddp_finish(ddp_t *d, char *err, size_t errlen);

/* "naive" / "flat" / "bucketed" -> mode; -1 otherwise. */
int ddp_mode_parse(const char *s, ddp_mode_t *mode);

#endif
