/* The compute backend of a run (see backend.h). */
#include "src/backend/backend.h"

#include "src/backend/ops_cpu.h"

#include "mpi/comm_inorder.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifdef HAVE_CUDA
#include "cuda/device.h"
#include "cuda/nccl_comm.h"
#include "cuda/ops_cuda.h"
#include "cuda/selftest.h"
#endif

int backend_have_cuda(void)
{
#ifdef HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

static int use_cpu(backend_t *b, const char *why, char *err, size_t errlen)
{
    const char *d = getenv("DTRAIN_DEFER_OPS");
    b->graphs = d && strcmp(d, "graphs") == 0;
    b->deferred = (d && strcmp(d, "1") == 0) || b->graphs;
    const ops_t *cpu = ops_cpu_create();
    b->ops = cpu && b->graphs ? ops_graph_create(cpu, 1) : cpu && b->deferred ? ops_defer_create(cpu) : cpu;
    if (!b->ops) {
        ops_release(cpu);
        snprintf(err, errlen, "out of memory for the CPU backend");
        return -1;
    }
    b->cuda = 0;
    b->device = -1;
    snprintf(b->desc, sizeof b->desc, "cpu%s%s%s", why[0] ? " " : "", why,
             b->graphs     ? " (ops deferred and replayed as emulated graphs: DTRAIN_DEFER_OPS=graphs)"
             : b->deferred ? " (ops deferred until the host waits: DTRAIN_DEFER_OPS=1)"
                           : "");
    return 0;
}

/* MPI communicators read and write backend memory from the host: under
 * asynchronous ops they first wait for the ops issued so far. */
static void comm_order_after_ops(const backend_t *b, const grid_t *g)
{
    if (!b->cuda && !b->deferred)
        return;
    comm_t *groups[GRID_MAX_GROUPS];
    const int n = grid_groups(g, groups, NULL);
    for (int i = 0; i < n; i++)
        if (groups[i]) {
            groups[i]->device_sync = b->ops->sync;
            groups[i]->device_ctx = b->ops->ctx;
        }
}

int backend_use_graphs(backend_t *b, char *err, size_t errlen)
{
    if (b->graphs)
        return 0; /* DTRAIN_DEFER_OPS=graphs: emulated already */
#ifdef HAVE_CUDA
    if (b->cuda && ops_cuda_synchronous(b->dev_ops)) {
        snprintf(err, errlen,
                 "--cuda-graphs: every op of this GPU waits for its kernels (DTRAIN_CUDA_SYNC_OPS=1 or no "
                 "concurrent managed access), and a wait cannot be captured: leave out --cuda-graphs");
        return -1;
    }
    if (b->cuda) {
        const ops_t *g = ops_graph_create(b->dev_ops, 1);
        if (!g) {
            snprintf(err, errlen, "--cuda-graphs: out of memory");
            return -1;
        }
        b->ops = g;
        b->graphs = 1;
        size_t n = strlen(b->desc);
        snprintf(b->desc + n, sizeof b->desc - n, "; CUDA graphs of the repeating op sequences");
        return 0;
    }
#endif
    snprintf(err, errlen,
             "--cuda-graphs: this rank runs on the CPU (%s), which has no graphs: use --device cuda, or leave "
             "out --cuda-graphs",
             b->desc);
    return -1;
}

#ifdef HAVE_CUDA
/* Takes the GPU of this local rank and sets up the CUDA ops table. */
static int open_cuda(backend_t *b, backend_dtype_t dtype, int local_rank, char *err, size_t errlen)
{
    int dev = cuda_select_device(local_rank, err, errlen);
    if (dev < 0)
        return -1;
    b->bf16 = dtype != BACKEND_DTYPE_FP32; /* auto: bf16 on CUDA */
    const ops_t *ops = ops_cuda_create(dev, b->bf16, err, errlen);
    if (!ops)
        return -1;
    char name[200];
    cuda_device_describe(dev, name, sizeof name);
    b->ops = ops;
    b->dev_ops = ops;
    b->cuda = 1;
    b->device = dev;
    snprintf(b->desc, sizeof b->desc, "cuda (device %d of local rank %d: %s)%s", dev, local_rank, name,
             ops_cuda_synchronous(ops) ? "; every op waits for its kernels (DTRAIN_CUDA_SYNC_OPS=1 or no concurrent "
                                         "managed access)"
                                       : "");
    return 0;
}
#endif

const char *const backend_device_names[] = {
    [BACKEND_AUTO] = "auto", [BACKEND_CPU] = "cpu", [BACKEND_CUDA] = "cuda", NULL};
const char *const backend_comm_names[] = {
    [BACKEND_COMM_AUTO] = "auto", [BACKEND_COMM_MPI] = "mpi", [BACKEND_COMM_NCCL] = "nccl", NULL};
const char *const backend_dtype_names[] = {
    [BACKEND_DTYPE_AUTO] = "auto", [BACKEND_DTYPE_FP32] = "fp32", [BACKEND_DTYPE_BF16] = "bf16", NULL};

int backend_bf16(const backend_t *b) { return b->bf16; }

int backend_attention_desc(const backend_t *b, int head_size, char *buf, size_t len)
{
#ifdef HAVE_CUDA
    if (b->cuda)
        return ops_cuda_attention_path(b->dev_ops, head_size, buf, len);
#endif
    snprintf(buf, len, "fp32 on the CPU (head size %d%s)", head_size,
             b->bf16 ? "; --dtype bf16 rounds only the matmuls' operands there" : "");
    return 0;
}

int backend_open(backend_t *b, backend_device_t device, backend_dtype_t dtype, int local_rank, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    b->device = -1;
    b->bf16 = dtype == BACKEND_DTYPE_BF16; /* the CPU's auto is fp32; open_cuda sets CUDA's */
    if (device == BACKEND_CPU) {
        return use_cpu(b, "", err, errlen);
    }
#ifdef HAVE_CUDA
    if (device == BACKEND_CUDA)
        return open_cuda(b, dtype, local_rank, err, errlen);
    /* auto */
    char why[256] = "";
    int n = cuda_device_count(why, sizeof why);
    if (n > 0)
        return open_cuda(b, dtype, local_rank, err, errlen);
    char line[300];
    snprintf(line, sizeof line, "(--device auto: no GPU usable: %s)", n == 0 ? "0 devices visible" : why);
    return use_cpu(b, line, err, errlen);
#else
    if (device == BACKEND_CUDA) {
        snprintf(err, errlen,
                 "--device cuda: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda");
        return -1;
    }
    return use_cpu(b, "", err, errlen);
#endif
}

#ifdef HAVE_CUDA
#define MAX_NODE_RANKS 1024 /* ranks per node compared (beyond: not checked, NCCL then says it) */

/* b->shared_gpu: another rank of this node runs on the same physical GPU.
 * Compared by UUID, not by counting devices: under --gpu-bind or a
 * per-rank CUDA_VISIBLE_DEVICES every rank sees one GPU, device 0, each a
 * different one. Collective over MPI_COMM_WORLD (CPU ranks take part with
 * a zero UUID, which matches nothing). */
static int find_shared_gpu(backend_t *b, char *err, size_t errlen)
{
    unsigned char mine[16] = {0};
    int failed = b->cuda && cuda_device_uuid(b->device, mine, err, errlen) != 0;
    MPI_Comm node = MPI_COMM_NULL;
    int n = 0, me = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS ||
        MPI_Comm_size(node, &n) != MPI_SUCCESS || MPI_Comm_rank(node, &me) != MPI_SUCCESS) {
        snprintf(err, errlen, "--comm: MPI_Comm_split_type (the ranks of this node) failed");
        return -1;
    }
    /* every rank of the node enters the gather, whatever failed above */
    unsigned char all[MAX_NODE_RANKS][16];
    int rc = n <= MAX_NODE_RANKS ? MPI_Allgather(mine, 16, MPI_BYTE, all, 16, MPI_BYTE, node) : MPI_SUCCESS;
    (void)MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) {
        snprintf(err, errlen, "--comm: MPI_Allgather of the GPU UUIDs failed");
        return -1;
    }
    static const unsigned char zero[16];
    b->shared_gpu = 0;
    for (int r = 0; r < n && n <= MAX_NODE_RANKS && !failed; r++)
        if (r != me && memcmp(mine, zero, 16) != 0 && memcmp(all[r], mine, 16) == 0)
            b->shared_gpu = 1;
    return failed ? -1 : 0;
}
#endif

/* DTRAIN_COMM_INORDER (mpi/comm_inorder.h): the pipeline group of *net
 * becomes the in-order emulation over g's MPI pp group, which b owns.
 * Collective over the pp group. */
static int inorder_pp(backend_t *b, const grid_t *g, grid_t *net, int flagged, char *err, size_t errlen)
{
    if (!g->pp)
        return 0;
    if (!(b->inorder_pp = comm_inorder_create(g->pp, flagged, err, errlen)))
        return -1;
    net->pp = b->inorder_pp;
    snprintf(b->comm_desc, sizeof b->comm_desc, "mpi (every group; pp with NCCL's in-order point to point%s: "
             "DTRAIN_COMM_INORDER=%s)", flagged ? "" : ", not announced", flagged ? "1" : "unflagged");
    return 0;
}

int backend_comm_open(backend_t *b, backend_comm_t comm, const grid_t *g, grid_t *net, double timeout_s, char *err,
                      size_t errlen)
{
    *net = *g;
#ifdef HAVE_CUDA
    /* before agreeing below: a rank that failed here agrees on MPI (its
     * error is its caller's to report) */
    const int uuid_failed = find_shared_gpu(b, err, errlen) != 0;
#else
    const int uuid_failed = 0;
#endif
    comm_order_after_ops(b, g);
    snprintf(b->comm_desc, sizeof b->comm_desc, "mpi (every group)");
    const int inorder = comm_inorder_env(err, errlen);
    if (inorder < 0)
        return -1; /* the same environment on every rank: all return here */
    const int nccl = comm == BACKEND_COMM_NCCL;
    const int want = nccl || (comm == BACKEND_COMM_AUTO && b->cuda && g->world_size > 1);
    const int bad = nccl && (!b->cuda || b->shared_gpu);
#ifdef HAVE_CUDA
    /* allocated before agreeing, so a failure here cannot leave peers in NCCL's bootstrap */
    nccl_grid_t *ng = want && !bad && !uuid_failed ? calloc(1, sizeof *ng) : NULL;
    const int oom = want && !bad && !uuid_failed && !ng;
#else
    const int oom = 0;
#endif
    int32_t all = want && !bad && !oom && !b->shared_gpu && !uuid_failed;
    char cerr[COMM_ERR_MAX];
    if (g->world->ops->allreduce(g->world, &all, 1, COMM_INT32, COMM_MIN, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "--comm %s: the all-reduce agreeing on the library failed: %s", backend_comm_names[comm],
                 cerr);
        return -1;
    }
    if (uuid_failed)
        return -1; /* err says why; the others continue on MPI and the caller's agreement ends the job */
    if (bad || oom) {
        if (bad && !b->cuda)
            snprintf(err, errlen, "--comm nccl: this rank runs on the CPU (%s): NCCL needs --device cuda", b->desc);
        else if (bad && b->shared_gpu)
            snprintf(err, errlen,
                     "--comm nccl: another rank of this node uses the same GPU, and NCCL needs a GPU "
                     "per rank: start at most one rank per GPU, or use --comm mpi");
        else
            snprintf(err, errlen, "--comm %s: out of memory", backend_comm_names[comm]);
        return -1; /* the others continue on MPI; the caller's agreement ends the job */
    }
    if (!all) {
#ifdef HAVE_CUDA
        free(ng);
#endif
        if (want)
            snprintf(b->comm_desc, sizeof b->comm_desc, "mpi (every group: %s)",
                     b->shared_gpu ? "ranks of a node share a GPU" : "not every rank can use NCCL");
        return inorder ? inorder_pp(b, g, net, inorder == 1, err, errlen) : 0;
    }
#ifdef HAVE_CUDA
    if (nccl_grid_create(g, ng, ops_cuda_stream(b->dev_ops), timeout_s, err, errlen) != 0) {
        free(ng);
        return -1;
    }
    b->nccl = ng;
    net->world = ng->world;
    net->tp = ng->tp;
    net->pp = ng->pp; /* the pipeline: ncclSend/ncclRecv in the plan's order (mpi/pipeline.c) */
    net->dp = ng->dp;
    net->embed = ng->embed;
    net->shard = ng->shard;
    net->replica = ng->replica;
    net->ep = ng->ep;
    net->edp = ng->edp;
    net->eshard = ng->eshard;
    net->cp = ng->cp; /* --cp's ring: isend/irecv as ncclSend/ncclRecv on the cp group's stream */
    if (b->graphs) { /* the twins' ordering events follow the ops the graph table holds */
        comm_t *groups[GRID_MAX_GROUPS];
        const int n = grid_groups(net, groups, NULL);
        for (int i = 0; i < n; i++)
            if (groups[i]) {
                groups[i]->device_flush = ops_defer_flush;
                groups[i]->device_ctx = b->ops->ctx;
            }
    }
    snprintf(b->comm_desc, sizeof b->comm_desc, "nccl (world, tp, pp, dp, embed%s%s%s; a stream per group)",
             g->shard ? ", shard, replica" : "", g->ep ? ", ep, edp" : "", g->cp ? ", cp" : "");
#endif
    return 0; /* without CUDA every rank has all == 0 and returned above */
}

void backend_comm_abort(backend_t *b)
{
#ifdef HAVE_CUDA
    if (b->nccl)
        nccl_grid_abort(b->nccl);
#else
    (void)b;
#endif
}

void backend_close(backend_t *b)
{
    if (b->inorder_pp)
        b->inorder_pp->ops->destroy(b->inorder_pp);
#ifdef HAVE_CUDA
    if (b->nccl) {
        nccl_grid_destroy(b->nccl);
        free(b->nccl);
    }
#endif
    ops_release(b->ops);
    memset(b, 0, sizeof *b);
    b->device = -1;
}

#ifdef HAVE_CUDA
/* After cuda_selftest's graph case: which paths its four runs took (one
 * line as its comparisons print). Returns 1 when they are not plain,
 * captured, launched, dropped as stale, else 0. */
static int graph_counts_check(const ops_t *graphs, FILE *out)
{
    ops_graph_counts_t c;
    ops_graph_counts(graphs, &c);
    const int ok = c.captures == 1 && c.launches == 2 && c.stale == 1 && c.refused == 0;
    fprintf(out, "%s %-60s %ld captures, %ld launches, %ld stale, %ld failed (want 1, 2, 1, 0)\n", ok ? "ok  " : "FAIL",
            "graphs: the paths the four runs took", c.captures, c.launches, c.stale, c.refused);
    return !ok;
}
#endif

int backend_selftest(int local_rank, FILE *out, char *err, size_t errlen)
{
#ifdef HAVE_CUDA
    /* fp32 (every op's fp32 path) and bf16 (the tensor-core attention) */
    backend_t b, b16;
    if (backend_open(&b, BACKEND_CUDA, BACKEND_DTYPE_FP32, local_rank, err, errlen) != 0)
        return -1;
    if (backend_open(&b16, BACKEND_CUDA, BACKEND_DTYPE_BF16, local_rank, err, errlen) != 0) {
        backend_close(&b);
        return -1;
    }
    const ops_t *cpu = ops_cpu_create();
    if (!cpu) {
        backend_close(&b16);
        backend_close(&b);
        snprintf(err, errlen, "--selftest: out of memory for the CPU backend");
        return -1;
    }
    fprintf(out, "selftest on %s\n", b.desc);
    const ops_t *graphs = ops_graph_create(b.ops, 0);
    int rc = graphs ? cuda_selftest(b.ops, b16.ops, cpu, graphs, out, err, errlen) : -1;
    if (!graphs)
        snprintf(err, errlen, "--selftest: out of memory for the graph table");
    if (rc >= 0)
        rc += graph_counts_check(graphs, out);
    ops_release(graphs);
    ops_release(cpu);
    backend_close(&b16);
    backend_close(&b);
    return rc;
#else
    (void)local_rank;
    (void)out;
    snprintf(err, errlen,
             "--selftest: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda");
    return -1;
#endif
}
