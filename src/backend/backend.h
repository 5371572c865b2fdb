/* The compute backend of a run: the one place src/ reaches cuda/.
 * --device cpu|cuda|auto picks the ops table; on CUDA each rank takes the
 * GPU of its local rank (local_rank % visible devices). */
#ifndef DTRAIN_BACKEND_H
#define DTRAIN_BACKEND_H

#include <stddef.h>
#include <stdio.h>

#include "base/ops.h"
#include "mpi/grid.h"

/* --device: which ops table (auto = cuda when built with it and a GPU is
 * visible, else cpu). */
typedef enum { BACKEND_AUTO = 0, BACKEND_CPU, BACKEND_CUDA } backend_device_t;
extern const char *const backend_device_names[]; /* indexed by backend_device_t, NULL-terminated */

/* --comm: the collectives' library (see backend_comm_open). */
typedef enum { BACKEND_COMM_AUTO = 0, BACKEND_COMM_MPI, BACKEND_COMM_NCCL } backend_comm_t;
extern const char *const backend_comm_names[]; /* indexed by backend_comm_t, NULL-terminated */

/* --dtype: the GEMM precision (auto = bf16 on cuda, fp32 on cpu; see
 * backend_bf16). */
typedef enum { BACKEND_DTYPE_AUTO = 0, BACKEND_DTYPE_FP32, BACKEND_DTYPE_BF16 } backend_dtype_t;
extern const char *const backend_dtype_names[]; /* indexed by backend_dtype_t, NULL-terminated */

typedef struct backend {
    const ops_t *ops;
    int cuda;       /* 1 when the CUDA backend is in use */
    int deferred;   /* 1 under DTRAIN_DEFER_OPS=1 or =graphs (the CPU table under ops_defer_create, ops_graph_create) */
    int graphs;     /* 1 under --cuda-graphs (ops is ops_graph_create over dev_ops) or DTRAIN_DEFER_OPS=graphs */
    const ops_t *dev_ops; /* CUDA: the CUDA table itself (ops may wrap it); NULL on the CPU */
    int device;     /* CUDA device id, -1 on the CPU */
    int shared_gpu; /* CUDA: another rank of this node uses the same GPU (NCCL cannot; set by backend_comm_open) */
    int bf16;                  /* --dtype resolved: bf16 GEMMs (and on CUDA tensor-core attention) */
    char desc[448];            /* one line for the banner */
    void *nccl;                /* the NCCL communicators (nccl_grid_t *) under --comm nccl, else NULL */
    comm_t *inorder_pp;        /* DTRAIN_COMM_INORDER's emulated pp group (backend_comm_open), else NULL */
    char comm_desc[200];       /* one line for the banner: which library each group uses */
} backend_t;

/* 1 when this dtrain was built with the CUDA backend. */
int backend_have_cuda(void);

/* Resolves `device` for the rank with this local
 * rank. auto = cuda when built with it and cudaGetDeviceCount finds a GPU,
 * else cpu. dtype is resolved with it, once (backend_bf16), and the CUDA
 * table takes it: under bf16 its attention runs on the tensor cores where
 * the head size allows (backend_attention_desc). On the CPU, DTRAIN_DEFER_OPS=1 in the environment wraps the
 * table in ops_defer_create (src/backend/ops_cpu.h): a test of the trainer's waits. Returns 0, or -1 with one line in err (--device cuda without a
 * CUDA build, or without a usable GPU: the CUDA error string). Local. */
int backend_open(backend_t *b, backend_device_t device, backend_dtype_t dtype, int local_rank, char *err,
                 size_t errlen);

/* --cuda-graphs: wraps the opened CUDA table in ops_graph_create
 * (src/backend/ops_cpu.h), so that the op sequences that repeat (a
 * microbatch's forward, its backward) are captured once into CUDA graphs
 * and launched as one each. Call before backend_comm_open. On the CPU it
 * fails with one line (DTRAIN_DEFER_OPS=graphs emulates the table there,
 * and then this returns 0), as on a GPU whose ops are synchronous. */
int backend_use_graphs(backend_t *b, char *err, size_t errlen);

/* 1 when --dtype (as given to backend_open) asks for bf16 GEMMs on this
 * opened backend. */
int backend_bf16(const backend_t *b);
/* One line for the banner: which attention kernels run at head size
 * head_size on this backend, and why. Returns 1 when that path rounds
 * q, k, v and dout to bf16 (CUDA's tensor cores), else 0. */
int backend_attention_desc(const backend_t *b, int head_size, char *buf, size_t len);
/* Releases the backend's resources, the communicators of
 * backend_comm_open included (safe on a zeroed or failed one). */
void backend_close(backend_t *b);

/* --comm auto|mpi|nccl: the communicators the step loop uses. *net
 * becomes a copy of *g; where the backend's ops are asynchronous (CUDA,
 * deferred) every MPI communicator of g gets device_sync = ops->sync (and
 * device_ctx = ops->ctx), and
 * NCCL twins order their streams after the compute stream with an event; under NCCL every group of g
 * (world, tp, pp, dp, embed, shard, replica, ep, edp, eshard, cp) is replaced by an NCCL twin
 * bootstrapped from g's MPI group, each on its own CUDA stream, with timeout_s as its timeout
 * (0 = none; see nccl_comm.h). pp's twin has in-order point to point (comm.h's `inorder`), which
 * the pipeline executor and the pipelined forward post for (doc/design.md, "NCCL in training").
 * auto = nccl when
 * every rank opened CUDA, no two ranks of a node use the same physical GPU
 * (compared by UUID; NCCL refuses two ranks of a communicator on one GPU,
 * and CUDA_VISIBLE_DEVICES or --gpu-bind may number each rank's GPU 0),
 * and there is more than one rank; the ranks agree
 * on it, so a mixed job falls back to MPI everywhere instead of hanging.
 * On MPI, DTRAIN_COMM_INORDER=1 (or =unflagged) makes *net's pp the
 * emulation of NCCL's point-to-point semantics (mpi/comm_inorder.h), for
 * the CPU tests; another value fails on every rank.
 * nccl on a rank without CUDA or on a shared GPU fails there (the others continue on MPI and
 * the caller's agreement ends the job). Collective over MPI_COMM_WORLD.
 * The twins belong to b: backend_close frees them, g keeps its own. */
int backend_comm_open(backend_t *b, backend_comm_t comm, const grid_t *g, grid_t *net, double timeout_s, char *err,
                      size_t errlen);

/* The run failed (every rank agreed): abort the NCCL communicators, so
 * that freeing memory and backend_close do not wait on collectives whose
 * peers have given up. Nothing to do under MPI. Local. */
void backend_comm_abort(backend_t *b);

/* --selftest: every CUDA op against the CPU op on this rank's GPU,
 * results on out. Returns the number of failed comparisons, or -1 with one
 * line in err (no CUDA build, no usable GPU, out of memory). */
int backend_selftest(int local_rank, FILE *out, char *err, size_t errlen);

#endif
