/* The CUDA backend's state and error checks: the context cu_t (the table,
 * the device, the compute stream, the cuBLASLt and cuBLAS handles, the
 * buffers ops grow, the kept GEMM plans), every method's ctx and every
 * helper's `g`, made by ops_cuda_create and freed by ops_release
 * (cuda/ops_cuda.cu). Every CUDA and cuBLAS status goes
 * through ck or ckb, which end the job through cuda_fatal with the op's
 * name (the ops table has no error returns); an op ends with finish(g, op),
 * and waits with wait_all(g, op) before the host reads backend memory.
 *
 * Host code, included by cuda/ops_cuda.cu and, through the GEMM path
 * (cuda/ops_cuda_gemm.cuh), compiled by test/emu/test_gemm_emu.cpp against
 * an emulated runtime (test/emu/cublaslt_shim.h). The includer provides
 * cuda_runtime.h, cublasLt.h, cublas_v2.h, cuda/device.h and base/ops.h. */
#ifndef DTRAIN_CUDA_OPS_CUDA_STATE_CUH
#define DTRAIN_CUDA_OPS_CUDA_STATE_CUH

/* The GEMM plans kept per distinct GEMM (why: ops_cuda_gemm.cuh). */
#define LT_PLANS 64

typedef struct lt_key {
    int ab, ta, tb; /* cudaDataType_t of A/B, cublasOperation_t of each */
    int m, n, k, lda, ldb, ldc;
    int epi;                   /* cublasLtEpilogue_t (bias and aux pointers are set per call) */
    uint32_t al_a, al_b, al_c; /* alignments in bytes (mat_align) */
    uint32_t al_bias, al_aux;  /* of the bias vector and the GELU aux matrix; 0 without */
} lt_key_t;

typedef struct lt_plan {
    lt_key_t key;
    int used;
    int found; /* the heuristic returned an algorithm */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} lt_plan_t;

typedef struct lt_cache {
    lt_plan_t plan[LT_PLANS];
    int next;                       /* the slot replaced when every slot is used */
    long made, reused;              /* ops_cuda_gemm_plans */
    long blas;                      /* plain GEMMs run by cublasGemmEx instead (ops_cuda_gemm_plans) */
    long gelu_fused, gelu_separate; /* ops_cuda_gelu_epilogues */
    long bgrad_fused, bgrad_separate; /* db by the dW GEMM's BGRADB epilogue, or by colsum (ops_cuda_gemm.cuh) */
    long grouped;                   /* cublasGemmGroupedBatchedEx calls (ops_cuda_gmm.cuh) */
} lt_cache_t;

typedef struct cuda_ctx {
    ops_t ops; /* the table; ops.ctx points here, so ops_release frees both */
    int dev;
    int sync_ops;   /* every op waits for its kernels (see the header comment) */
    cudaStream_t stream;
    cudaStream_t copy_stream; /* to_host_begin's side stream, made at its first call */
    cudaEvent_t copy_after;   /* ... recorded on stream: the copies start after it */
    cudaEvent_t copy_done;    /* ... recorded on copy_stream: from_host_end's wait */
    cublasLtHandle_t lt;
    cublasHandle_t blas; /* for the GEMMs cuBLASLt has no algorithm for (lt_gemm) */
    void *ws;
    /* sumsq: room for `sum_cap` vectors of partial sums (device and host)
     * and their pointers and lengths (device) */
    int sum_cap;
    double *part, *hpart;
    const float **xs;
    size_t *ns;
    float *col_part;                 /* the column reductions' partial sums (col_part_room) */
    size_t col_cap;                  /* floats */
    void *emb;                       /* embedding_bwd's grouping buffers (emb_room) */
    size_t emb_cap, emb_scratch_cap; /* tokens, bytes */
    void *moe;                       /* the MoE ops' scratch (moe_room) */
    size_t moe_cap;                  /* bytes */
    void *gmm_host, *gmm_dev;        /* the grouped GEMMs' arrays: pageable host, device (ops_cuda_gmm.cuh) */
    size_t gmm_host_cap;             /* bytes */
    size_t gmm_dev_cap;              /* bytes */
    int att_bf16;                    /* --dtype bf16: attention on the tensor cores where the head size allows */
    void *att;                       /* the tensor-core attention's bf16 copies and D (ops_cuda_attention.cuh) */
    size_t att_cap;                  /* bytes */
    lt_cache_t plans;                /* the kept cuBLASLt plans (ops_cuda_gemm.cuh) */
    int capturing;                   /* between graph_begin and graph_end (--cuda-graphs) */
    unsigned long epoch;             /* graph_epoch: moves of the buffers above (room_moved) */
} cu_t;

/* ---- error checks ------------------------------------------------------------ */

static void ck(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s (%s)", cudaGetErrorString(rc), cudaGetErrorName(rc));
        cuda_fatal(what, msg);
    }
}

static void ckb(cublasStatus_t rc, const char *what)
{
    if (rc != CUBLAS_STATUS_SUCCESS)
        cuda_fatal(what, cublasGetStatusString(rc));
}

/* After an op's launches: the launch status (and, in the synchronous
 * mode, the kernels' own). */
static void finish(cu_t *g, const char *op)
{
    ck(cudaGetLastError(), op);
    if (g->sync_ops)
        ck(cudaStreamSynchronize(g->stream), op);
}

/* The host is about to see backend memory: everything enqueued is done. */
static void wait_all(cu_t *g, const char *op)
{
    ck(cudaGetLastError(), op);
    ck(cudaStreamSynchronize(g->stream), op);
}

/* A buffer of the context is about to move (grown to a new address):
 * graphs captured before point at the old one, so graph_epoch advances.
 * Never while capturing, where the allocation would become the graph's:
 * the graph table captures a segment only after it ran once with the
 * same arguments, which grew every buffer it needs (ops_graph_create). */
static void room_moved(cu_t *g, const char *what)
{
    if (g->capturing)
        cuda_fatal(what, "internal error: a workspace grew while a CUDA graph was being captured");
    g->epoch++;
}

/* The column reductions' partial sums: at least n floats, on the compute
 * stream. Grown stream-ordered (cudaFreeAsync/cudaMallocAsync), as cudaFree
 * would wait for the whole device, NCCL kernels of other streams included. */
static float *col_part_room(cu_t *g, size_t n, const char *what)
{
    if (n > g->col_cap) {
        room_moved(g, what);
        if (g->col_part)
            ck(cudaFreeAsync(g->col_part, g->stream), what);
        g->col_part = NULL;
        g->col_cap = 0;
        ck(cudaMallocAsync((void **)&g->col_part, n * sizeof(float), g->stream), what);
        g->col_cap = n;
    }
    return g->col_part;
}

#endif
