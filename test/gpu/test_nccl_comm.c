/* The NCCL communicators on GPUs: mpiexec -np N test_nccl_comm (N <= GPUs).
 * nccl_grid_create over a tp N grid (world and tp groups of N), then on
 * both groups, with exact expected values (small integers, exact in fp32):
 * allreduce SUM and MAX, iallreduce + wait and + test polling,
 * reduce_scatter (out of place, and in place as ZeRO calls it: send ==
 * recv, the piece at the start), allgather, broadcast, a host (stack)
 * buffer through the staging path, a send/recv ring, the same ring with
 * every receive posted first inside one group (ncclGroupStart/End, as
 * the pipeline posts), barrier; the bf16
 * sums (ncclBfloat16: allreduce_bf16, iallreduce_bf16 + wait,
 * reduce_scatter_bf16 out of place and in place, ireduce_scatter_bf16 +
 * test, a host buffer) on integers whose partial
 * sums are exact in bf16 (up to 8 ranks); alltoallv (grouped
 * ncclSend/ncclRecv): uneven counts with empty ones and the sources laid
 * out in reverse with gaps (which must stay untouched), fp32 in managed
 * memory and int32 in host (stack) arrays through the staging path, all
 * counts zero, and a count over INT_MAX failing in one line on every rank.
 * Then a dp grid with --ep's groups (ep over every rank): its NCCL twins
 * land in ng.ep and ng.edp (not in the replica slot, which stays empty)
 * and the alltoallv checks pass on ng.ep. SKIP (77) with the CUDA error
 * string when any rank sees no GPU. */
#include <cuda_runtime.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "base/ops_math.h"
#include "cuda/device.h"
#include "cuda/nccl_comm.h"
#include "mpi/grid.h"
#include "mpi/launch.h"

static int nfail;
/* a failed check names the error of the group's last call (cerr), if it had one */
static void check(int ok, const comm_t *c, const char *cerr, const char *what)
{
    if (!ok) {
        nfail++;
        fprintf(stderr, "test_nccl_comm: rank %d: FAIL %s on %s%s%s\n", c->rank, what, c->name, cerr[0] ? ": " : "",
                cerr);
    }
}

/* hb: [(size + 1) * 1000] managed bf16 */
static void bf16_checks(comm_t *c, uint16_t *hb)
{
    char cerr[COMM_ERR_MAX] = "";
    const int r = c->rank, W = c->size;
    const size_t n = 1000;
    int ok;
    /* allreduce: sum_q (q + 1 + i % 7) = W(W+1)/2 + W (i % 7) <= 92 */
    for (size_t i = 0; i < n; i++)
        hb[i] = dt_f32_to_bf16((float)(r + 1 + (int)(i % 7)));
    ok = c->ops->allreduce(c, hb, n, COMM_BF16, COMM_SUM, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= hb[i] == dt_f32_to_bf16((float)(W * (W + 1) / 2 + W * (int)(i % 7)));
    check(ok, c, cerr, "allreduce_bf16");
    comm_req_t q = {0};
    for (size_t i = 0; i < n; i++)
        hb[i] = dt_f32_to_bf16(1.0f);
    ok = c->ops->iallreduce(c, hb, n, COMM_BF16, COMM_SUM, &q, cerr, sizeof cerr) == 0 &&
         c->ops->wait(&q, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= hb[i] == dt_f32_to_bf16((float)W);
    check(ok, c, cerr, "iallreduce_bf16 + wait");
    /* reduce_scatter: send[j*n + i] = r + j; rank r gets W(W-1)/2 + W r */
    uint16_t *recv = hb + (size_t)W * n;
    for (int j = 0; j < W; j++)
        for (size_t i = 0; i < n; i++)
            hb[(size_t)j * n + i] = dt_f32_to_bf16((float)(r + j));
    const uint16_t want = dt_f32_to_bf16((float)(W * (W - 1) / 2 + W * r));
    ok = c->ops->reduce_scatter(c, hb, recv, n, COMM_BF16, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= recv[i] == want;
    check(ok, c, cerr, "reduce_scatter_bf16");
    ok = c->ops->ireduce_scatter(c, hb, recv, n, COMM_BF16, &q, cerr, sizeof cerr) == 0;
    int done = 0;
    while (ok && !done)
        ok = c->ops->test(&q, &done, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= recv[i] == want;
    check(ok, c, cerr, "ireduce_scatter_bf16 + test");
    /* in place (ZeRO's call): this rank's piece lands at the start */
    for (int j = 0; j < W; j++)
        for (size_t i = 0; i < n; i++)
            hb[(size_t)j * n + i] = dt_f32_to_bf16((float)(r + j));
    ok = c->ops->reduce_scatter(c, hb, hb, n, COMM_BF16, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= hb[i] == want;
    check(ok, c, cerr, "reduce_scatter_bf16 in place");
    uint16_t host[3] = {dt_f32_to_bf16(1.0f), dt_f32_to_bf16((float)r), dt_f32_to_bf16(-2.0f)};
    ok = c->ops->allreduce(c, host, 3, COMM_BF16, COMM_SUM, cerr, sizeof cerr) == 0 &&
         host[0] == dt_f32_to_bf16((float)W) && host[1] == dt_f32_to_bf16((float)(W * (W - 1) / 2)) &&
         host[2] == dt_f32_to_bf16(-2.0f * (float)W);
    check(ok, c, cerr, "allreduce_bf16 of a host (stack) buffer");
}

/* alltoallv: rank r sends a2a_n(r, q) elements (some none, uneven) to
 * rank q, value 1000 r + 100 q + i; the receive layout takes the sources
 * in reverse order with one gap element before each, filled with -7,
 * which must come back unchanged. buf, buf2: managed, >= 4 W + 1 floats. */
static size_t a2a_n(int r, int q) { return (size_t)((r + 2 * q) % 3 + (r == q)); }

static void a2a_checks(comm_t *c, float *buf, float *buf2)
{
    char cerr[COMM_ERR_MAX] = "";
    const int r = c->rank, W = c->size;
    size_t v[4 * 8] = {0};
    int32_t si[4 * 8 + 1] = {0}, ri[2 * 4 * 8 + 1] = {0};
    if (W > 8)
        return; /* the stack tables */
    size_t *scnt = v, *sdsp = v + W, *rcnt = v + 2 * W, *rdsp = v + 3 * W, ns = 0, nr = 0;
    for (int q = 0; q < W; q++) {
        scnt[q] = a2a_n(r, q);
        sdsp[q] = ns;
        for (size_t i = 0; i < scnt[q]; i++) {
            buf[ns + i] = (float)(1000 * r + 100 * q + (int)i);
            si[ns + i] = 1000 * r + 100 * q + (int)i;
        }
        ns += scnt[q];
    }
    for (int s = W - 1; s >= 0; s--) {
        nr++; /* the gap */
        rcnt[s] = a2a_n(s, r);
        rdsp[s] = nr;
        nr += rcnt[s];
    }
    for (size_t i = 0; i < nr; i++)
        buf2[i] = -7.0f, ri[i] = -7;
    int ok = c->ops->alltoallv(c, buf, scnt, sdsp, buf2, rcnt, rdsp, COMM_FP32, cerr, sizeof cerr) == 0;
    int oki = ok && c->ops->alltoallv(c, si, scnt, sdsp, ri, rcnt, rdsp, COMM_INT32, cerr, sizeof cerr) == 0;
    for (int s = 0; s < W; s++) {
        ok &= buf2[rdsp[s] - 1] == -7.0f;
        oki &= ri[rdsp[s] - 1] == -7;
        for (size_t i = 0; i < rcnt[s]; i++) {
            ok &= buf2[rdsp[s] + i] == (float)(1000 * s + 100 * r + (int)i);
            oki &= ri[rdsp[s] + i] == 1000 * s + 100 * r + (int)i;
        }
    }
    check(ok, c, cerr, "alltoallv fp32, managed memory, uneven and empty counts, gaps kept");
    check(oki, c, cerr, "alltoallv_i32, host (stack) arrays through the staging path, gaps kept");
    /* nothing to move at all */
    for (int q = 0; q < W; q++)
        scnt[q] = rcnt[q] = 0;
    buf2[0] = -7.0f;
    ok = c->ops->alltoallv(c, buf, scnt, sdsp, buf2, rcnt, rdsp, COMM_FP32, cerr, sizeof cerr) == 0 &&
         buf2[0] == -7.0f;
    check(ok, c, cerr, "alltoallv with every count zero");
    /* every rank: a count over INT_MAX fails before any NCCL call */
    scnt[0] = (size_t)INT_MAX + 1;
    cerr[0] = '\0';
    ok = c->ops->alltoallv(c, buf, scnt, sdsp, buf2, rcnt, rdsp, COMM_FP32, cerr, sizeof cerr) != 0 &&
         strstr(cerr, "exceeds INT_MAX") != NULL;
    check(ok, c, ok ? "" : cerr, "alltoallv with a count over INT_MAX fails in one line");
}

static int group_checks(comm_t *c, float *buf, float *buf2, uint16_t *hb)
{
    char cerr[COMM_ERR_MAX] = "";
    const int r = c->rank, W = c->size;
    const size_t n = 1000;
    int bad0 = nfail;
    char e[600];
    /* allreduce SUM: sum_r (r + 1 + i) = W(W+1)/2 + W i */
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(r + 1) + (float)i;
    if (c->ops->allreduce(c, buf, n, COMM_FP32, COMM_SUM, cerr, sizeof cerr) != 0)
        return snprintf(e, sizeof e, "%s", cerr), fprintf(stderr, "%s\n", e), -1;
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= buf[i] == (float)(W * (W + 1) / 2) + (float)(W * (int)i);
    check(ok, c, cerr, "allreduce sum");
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)((r * 7 + (int)i) % W);
    ok = c->ops->allreduce(c, buf, n, COMM_FP32, COMM_MAX, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= buf[i] == (float)(W - 1);
    check(ok, c, cerr, "allreduce max");
    /* iallreduce, wait and test */
    comm_req_t q = {0};
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f;
    ok = c->ops->iallreduce(c, buf, n, COMM_FP32, COMM_SUM, &q, cerr, sizeof cerr) == 0 &&
         c->ops->wait(&q, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= buf[i] == (float)W;
    check(ok, c, cerr, "iallreduce + wait");
    ok = c->ops->iallreduce(c, buf, n, COMM_FP32, COMM_SUM, &q, cerr, sizeof cerr) == 0;
    int done = 0;
    while (ok && !done)
        ok = c->ops->test(&q, &done, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= buf[i] == (float)(W * W);
    check(ok, c, cerr, "iallreduce + test");
    /* reduce_scatter: send[j*n + i] = r + j; rank r gets sum_q (q + r) */
    for (int j = 0; j < W; j++)
        for (size_t i = 0; i < n; i++)
            buf[(size_t)j * n + i] = (float)(r + j);
    ok = c->ops->reduce_scatter(c, buf, buf2, n, COMM_FP32, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= buf2[i] == (float)(W * (W - 1) / 2 + W * r);
    check(ok, c, cerr, "reduce_scatter");
    /* in place (ZeRO's call): this rank's piece lands at the start */
    for (int j = 0; j < W; j++)
        for (size_t i = 0; i < n; i++)
            buf[(size_t)j * n + i] = (float)(r + j);
    ok = c->ops->reduce_scatter(c, buf, buf, n, COMM_FP32, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= buf[i] == (float)(W * (W - 1) / 2 + W * r);
    check(ok, c, cerr, "reduce_scatter in place");
    /* in place through the host staging path */
    float hrs[8 * 2];
    for (int j = 0; j < W && W <= 8; j++)
        for (int i = 0; i < 2; i++)
            hrs[j * 2 + i] = (float)(r + j + i);
    ok = W > 8 || c->ops->reduce_scatter(c, hrs, hrs, 2, COMM_FP32, cerr, sizeof cerr) == 0;
    for (int i = 0; ok && W <= 8 && i < 2; i++)
        ok &= hrs[i] == (float)(W * (W - 1) / 2 + W * (r + i));
    check(ok, c, cerr, "reduce_scatter in place, host buffer");
    /* allgather: rank q's block holds q */
    for (size_t i = 0; i < n; i++)
        buf2[i] = (float)r;
    ok = c->ops->allgather(c, buf2, buf, n, COMM_FP32, cerr, sizeof cerr) == 0;
    for (int j = 0; ok && j < W; j++)
        for (size_t i = 0; i < n; i++)
            ok &= buf[(size_t)j * n + i] == (float)j;
    check(ok, c, cerr, "allgather");
    /* broadcast from the last rank */
    for (size_t i = 0; i < n; i++)
        buf[i] = r == W - 1 ? 42.0f + (float)i : -1.0f;
    ok = c->ops->broadcast(c, buf, n, COMM_FP32, W - 1, cerr, sizeof cerr) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok &= buf[i] == 42.0f + (float)i;
    check(ok, c, cerr, "broadcast");
    /* host buffer: staged */
    float host[3] = {1.0f, (float)r, -2.0f};
    ok = c->ops->allreduce(c, host, 3, COMM_FP32, COMM_SUM, cerr, sizeof cerr) == 0 && host[0] == (float)W &&
         host[1] == (float)(W * (W - 1) / 2) && host[2] == -2.0f * (float)W;
    check(ok, c, cerr, "allreduce of a host (stack) buffer");
    /* ring: send to r+1, receive from r-1 (nonblocking both, then wait).
     * NCCL runs a rank's point-to-point calls in posting order on the
     * group's stream, each waiting for its peer: if every rank posted its
     * receive first, every receive would wait on a send queued behind its
     * peer's own receive. Even ranks send first, odd ranks receive first. */
    if (W > 1) {
        comm_req_t s = {0}, rq = {0};
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)(r * 1000) + (float)i;
        const int to = (r + 1) % W, from = (r + W - 1) % W;
        if (r % 2 == 0)
            ok = c->ops->isend(c, buf, n, COMM_FP32, to, 7, &s, cerr, sizeof cerr) == 0 &&
                 c->ops->irecv(c, buf2, n, COMM_FP32, from, 7, &rq, cerr, sizeof cerr) == 0;
        else
            ok = c->ops->irecv(c, buf2, n, COMM_FP32, from, 7, &rq, cerr, sizeof cerr) == 0 &&
                 c->ops->isend(c, buf, n, COMM_FP32, to, 7, &s, cerr, sizeof cerr) == 0;
        ok = ok && c->ops->wait(&rq, cerr, sizeof cerr) == 0 && c->ops->wait(&s, cerr, sizeof cerr) == 0;
        for (size_t i = 0; ok && i < n; i++)
            ok &= buf2[i] == (float)(((r + W - 1) % W) * 1000) + (float)i;
        check(ok, c, cerr, "isend/irecv ring");
        /* the same ring with every rank posting its receive first, both in
         * one group (comm.h's group_begin/group_end: ncclGroupStart/End,
         * the pipeline executor's launches): only the group makes this
         * order safe; a request of the open group refuses test */
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)(r * 1000 + 7) + (float)i;
        int gdone = 1;
        char terr[COMM_ERR_MAX] = "";
        ok = c->ops->inorder == 1 && c->ops->group_begin(c, cerr, sizeof cerr) == 0;
        if (ok) {
            ok = c->ops->irecv(c, buf2, n, COMM_FP32, from, 7, &rq, cerr, sizeof cerr) == 0 &&
                 c->ops->isend(c, buf, n, COMM_FP32, to, 7, &s, cerr, sizeof cerr) == 0;
            ok = ok && c->ops->test(&rq, &gdone, terr, sizeof terr) != 0 && gdone == 0;
            ok = c->ops->group_end(c, cerr, sizeof cerr) == 0 && ok;
        }
        ok = ok && c->ops->wait(&rq, cerr, sizeof cerr) == 0 && c->ops->wait(&s, cerr, sizeof cerr) == 0;
        for (size_t i = 0; ok && i < n; i++)
            ok &= buf2[i] == (float)(((r + W - 1) % W) * 1000 + 7) + (float)i;
        check(ok, c, cerr, "grouped ring, every receive posted first");
    }
    check(c->ops->barrier(c, cerr, sizeof cerr) == 0, c, cerr, "barrier");
    a2a_checks(c, buf, buf2);
    bf16_checks(c, hb);
    return nfail > bad0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    char err[512] = "";
    int dev = cuda_select_device(env.local_rank, err, sizeof err), ok = dev >= 0, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (env.world_rank == 0)
            printf("SKIP: %s\n", ok ? "a rank sees no GPU" : err);
        launch_exit(&env, 77);
    }
    grid_t g;
    if (grid_create(&g, env.world_size, 1, 0, err, sizeof err) != 0) {
        fprintf(stderr, "test_nccl_comm: %s\n", err);
        launch_exit(&env, 99);
    }
    nccl_grid_t ng;
    if (nccl_grid_create(&g, &ng, NULL, 60.0, err, sizeof err) != 0) {
        fprintf(stderr, "test_nccl_comm: rank %d: %s\n", env.world_rank, err);
        launch_exit(&env, 1);
    }
    float *buf = NULL, *buf2 = NULL;
    uint16_t *hb = NULL;
    size_t bytes = (size_t)env.world_size * 1000 * sizeof(float);
    if (cudaMallocManaged((void **)&buf, bytes, cudaMemAttachGlobal) != cudaSuccess ||
        cudaMallocManaged((void **)&buf2, bytes, cudaMemAttachGlobal) != cudaSuccess ||
        cudaMallocManaged((void **)&hb, (size_t)(env.world_size + 1) * 1000 * sizeof *hb, cudaMemAttachGlobal) !=
            cudaSuccess) {
        fprintf(stderr, "test_nccl_comm: cudaMallocManaged failed\n");
        launch_exit(&env, 99);
    }
    comm_t *groups[] = {ng.world, ng.tp};
    for (int i = 0; i < 2; i++) {
        if (!groups[i]) {
            nfail++;
            fprintf(stderr, "test_nccl_comm: rank %d: group %d missing\n", env.world_rank, i);
        } else if (group_checks(groups[i], buf, buf2, hb) != 0 && nfail == 0) {
            nfail++; /* its first all-reduce failed: printed there, counted here */
        }
    }
    nccl_grid_destroy(&ng);
    grid_destroy(&g);
    /* --ep's groups: a dp W grid, one EP group of every rank */
    if (grid_create(&g, 1, 1, 0, err, sizeof err) != 0 || grid_create_ep_groups(&g, env.world_size, 0, err, sizeof err) != 0) {
        fprintf(stderr, "test_nccl_comm: %s\n", err);
        launch_exit(&env, 99);
    }
    if (nccl_grid_create(&g, &ng, NULL, 60.0, err, sizeof err) != 0) {
        fprintf(stderr, "test_nccl_comm: rank %d: ep grid: %s\n", env.world_rank, err);
        launch_exit(&env, 1);
    }
    if (!ng.ep || !ng.edp || ng.replica || ng.ep->size != env.world_size || strcmp(ng.ep->name, "ep") != 0 ||
        strcmp(ng.edp->name, "edp") != 0) {
        nfail++;
        fprintf(stderr, "test_nccl_comm: rank %d: FAIL the ep grid's NCCL twins: ep %s, edp %s, replica %s\n",
                env.world_rank, ng.ep ? ng.ep->name : "missing", ng.edp ? ng.edp->name : "missing",
                ng.replica ? "set (should be absent)" : "absent");
    } else {
        a2a_checks(ng.ep, buf, buf2);
    }
    nccl_grid_destroy(&ng);
    grid_destroy(&g);
    cudaFree(buf);
    cudaFree(buf2);
    cudaFree(hb);
    int total = 0;
    MPI_Allreduce(&nfail, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (env.world_rank == 0)
        printf("test_nccl_comm: %s: %d rank(s), world, tp and ep groups, %d failure(s)\n", total ? "FAIL" : "ok",
               env.world_size, total);
    launch_exit(&env, total ? 1 : 0);
    return 0;
}
