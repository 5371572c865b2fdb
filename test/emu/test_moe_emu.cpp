/* The CUDA backend's mixture-of-experts kernels (cuda/kernels/moe.cuh) run on
 * the host against the CPU ops (src/backend/ops_cpu_moe.c), element by
 * element.
 *
 * The kernels are compiled as host C++ under emu_cuda.h's thread-block
 * emulation: kernels with __syncthreads (the capacity drop, the counting
 * sort's count, offsets and placement) run every CUDA thread of a block as a
 * std::thread in its deterministic schedule (warp 0 runs ahead as far as
 * the barriers let it); the kernels without barriers or shared memory run
 * their threads one after another on the calling thread, in reverse order
 * (last block, last thread first), so a kernel whose threads depended on
 * each other's writes in launch order would show it. The launches are
 * ops_cuda.cu's moe_* wrappers', grid for grid.
 *
 * Every output is compared bit for bit with the CPU op on the same inputs
 * (each op fed the CPU's outputs of the ops before it, so each comparison
 * measures one op): the kernels reproduce the CPU's arithmetic operation
 * for operation and in the same order, and here both call glibc's expf and
 * logf (on a GPU those differ by an ulp or two: cuda/selftest.c's bounds).
 * Outputs start as poison (NaN, or 0x7fff7fff for the int32 ones) on both
 * sides, so an element the kernel fails to write, or writes where the CPU
 * does not, fails too.
 *
 * Shapes: N = 1; N = 300 and 600 (not multiples of the 256-thread blocks;
 * N K over the 1024-assignment counting chunk, so several chunks, one
 * boundary inside a token's K choices); E = 8, K = 2 and E = 64, K = 6
 * (Mixtral's and DeepSeek's shapes); K = E = 4; E = 300 (over the
 * 256 threads of the counting blocks); softmax and sigmoid
 * routers, with and without norm_topk; logits with many exact ties
 * (values on a grid of 4: top-k and capacity ties); capacity tight enough
 * to drop (each such case asserts that something was dropped) and with N
 * not a multiple of T (the last partial sequence is never capped, as on
 * the CPU); experts no token picks (asserted: an empty range in offs);
 * C = 1 and C = 300 (over THREADS); the router's backward with and without
 * the load-balancing and z-loss terms; the scatter written and
 * accumulated.
 *
 * Then the proof that these checks catch broken synchronisation: each
 * __syncthreads of the four barrier kernels skipped in turn
 * (emu_drop_syncthreads) must fail a check. Mutations of the arithmetic
 * (the combine's j order reversed, an offset off by one, the tie order,
 * ...) are test/emu/moe_mutants.sh's: it builds this test against changed
 * copies of moe.cuh, and each must fail its comparisons (run with
 * --cases: the comparisons without the barrier mutations).
 *
 * Output: one line per failed check, a summary. Exit 0 when all pass. */
extern "C" {
#include "base/ops.h"
#include "src/backend/ops_cpu.h"
}

#include "test/emu/emu_cuda.h"

#include <math.h>
#include <random>
#include <stdint.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/kernels/moe.cuh"

/* ---- launches ---- */

/* A kernel without barriers: every thread in turn on this thread, in
 * reverse order of block and thread. */
template <class F> static void plain_launch(dim3 grid, unsigned threads, F f)
{
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned b = grid.x * grid.y * grid.z; b-- > 0;) {
        blockIdx = dim3(b % grid.x, b / grid.x % grid.y, b / grid.x / grid.y);
        for (unsigned t = threads; t-- > 0;) {
            threadIdx = dim3(t);
            f();
        }
    }
}

/* A kernel with barriers, under emu_cuda.h's schedule. The barrier
 * mutations (below) skip barrier number mut_n of kernel mut_kernel. */
enum { K_DROP = 1, K_COUNT, K_OFFS, K_PLACE };
static int mut_kernel;
static unsigned mut_n;
template <class F> static void bar_launch(int kernel, dim3 grid, unsigned threads, F f)
{
    emu_drop_syncthreads = kernel == mut_kernel ? mut_n : 0;
    emu_launch(grid, threads, f);
    emu_drop_syncthreads = 0;
}

/* ops_cuda.cu's wrappers, launch for launch (scratch in host vectors) */
static void emu_route_fwd(float *scores, float *lse, int32_t *idx, float *gate, const float *logits, const float *bias,
                          int N, int T, int E, int K, int sigmoid, int norm_topk, int capacity)
{
    if (N <= 0 || E <= 0)
        return;
    plain_launch(dim3(grid_for((size_t)N, THREADS)), THREADS,
                 [=] { k_moe_route(scores, lse, idx, gate, logits, bias, N, E, K, sigmoid, norm_topk); });
    const int B = T > 0 ? N / T : 0;
    if (capacity > 0 && B > 0 && K > 0) {
        std::vector<int32_t> in(idx, idx + (size_t)B * T * K);
        const int32_t *pin = in.data();
        bar_launch(K_DROP, dim3(moe_tiles((size_t)T * K), (unsigned)B), MOE_TILE,
                   [=] { k_moe_drop(idx, pin, scores, T, E, K, capacity); });
    }
}

static void emu_plan(int32_t *perm, int32_t *offs, int32_t *where, const int32_t *idx, int N, int E, int K)
{
    const size_t NK = (size_t)N * (size_t)(K > 0 ? K : 0);
    const unsigned nc = moe_chunks(NK);
    if (E <= 0)
        return;
    std::vector<int> cntv((size_t)nc * (E + 1) + 1);
    int *cnt = cntv.data();
    if (nc > 0)
        bar_launch(K_COUNT, dim3(nc), THREADS, [=] { k_moe_count(cnt, idx, NK, E, 0); });
    bar_launch(K_OFFS, dim3(1), THREADS, [=] { k_moe_offs(offs, cnt, (int)nc, E); });
    if (nc > 0)
        bar_launch(K_PLACE, dim3(nc), THREADS, [=] { k_moe_place(perm, where, idx, cnt, NK, E); });
}

static void emu_stats(float *stats, const int32_t *idx, const float *scores, const float *lse, int N, int E, int K,
                      int sigmoid)
{
    const size_t NK = (size_t)N * (size_t)(K > 0 ? K : 0);
    const unsigned nc = moe_chunks(NK);
    if (E <= 0)
        return;
    std::vector<int> cntv((size_t)nc * (E + 1) + 1);
    std::vector<double> rs(sigmoid && N > 0 ? (size_t)N : 0);
    int *cnt = cntv.data();
    double *rowsum = rs.empty() ? NULL : rs.data();
    if (nc > 0)
        bar_launch(K_COUNT, dim3(nc), THREADS, [=] { k_moe_count(cnt, idx, NK, E, 1); });
    if (rowsum)
        plain_launch(dim3(grid_for((size_t)N, THREADS)), THREADS, [=] { k_moe_rowsum(rowsum, scores, N, E); });
    plain_launch(dim3(grid_for((size_t)E, THREADS)), THREADS, [=] { k_moe_psum(stats, scores, rowsum, N, E); });
    bar_launch(0, dim3(1), THREADS, [=] { k_moe_stats_fold(stats, cnt, (int)nc, lse, N, E); });
}

static void emu_gather(float *xe, const float *x, const int32_t *perm, int M, int K, int C)
{
    if (M > 0 && C > 0)
        plain_launch(dim3(grid_for((size_t)M * C, THREADS)), THREADS, [=] { k_moe_gather(xe, x, perm, M, K, C); });
}

static void emu_combine_fwd(float *out, const float *ye, const float *gate, const int32_t *where, int N, int K, int C)
{
    if (N > 0 && C > 0)
        plain_launch(dim3(grid_for((size_t)N * C, THREADS)), THREADS,
                     [=] { k_moe_combine_fwd(out, ye, gate, where, N, K, C); });
}

static void emu_combine_bwd(float *dye, float *dgate, const float *dout, const float *ye, const float *gate,
                            const int32_t *where, int N, int K, int C)
{
    const size_t NK = (size_t)N * (size_t)(K > 0 ? K : 0);
    if (NK == 0)
        return;
    if (C > 0)
        plain_launch(dim3(grid_for(NK * C, THREADS)), THREADS,
                     [=] { k_moe_combine_dye(dye, dout, gate, where, (int)NK, K, C); });
    plain_launch(dim3(grid_for(NK, THREADS)), THREADS,
                 [=] { k_moe_combine_dgate(dgate, dout, ye, where, (int)NK, K, C); });
}

static void emu_scatter_bwd(float *dx, const float *dxe, const int32_t *where, int N, int K, int C, int accum)
{
    if (N > 0 && C > 0)
        plain_launch(dim3(grid_for((size_t)N * C, THREADS)), THREADS,
                     [=] { k_moe_scatter_bwd(dx, dxe, where, N, K, C, accum); });
}

/* the shared expert's gate: a thread per token */
static void emu_shared_gate_fwd(float *out, float *sg, const float *y, int N, int C)
{
    if (N > 0)
        plain_launch(dim3(grid_for((size_t)N, THREADS)), THREADS, [=] { k_moe_shared_gate_fwd(out, sg, y, N, C); });
}
static void emu_shared_gate_bwd(float *dy, float *dz, const float *dout, const float *y, const float *sg, int N, int C)
{
    if (N > 0)
        plain_launch(dim3(grid_for((size_t)N, THREADS)), THREADS,
                     [=] { k_moe_shared_gate_bwd(dy, dz, dout, y, sg, N, C); });
}

static void emu_route_bwd(float *dlogits, const float *dgate, const float *logits, const float *scores,
                          const float *lse, const int32_t *idx, const float *auxw, float zw, int N, int E, int K,
                          int sigmoid, int norm_topk)
{
    if (N > 0 && E > 0)
        plain_launch(dim3(grid_for((size_t)N, THREADS)), THREADS, [=] {
            k_moe_route_bwd(dlogits, dgate, logits, scores, lse, idx, auxw, zw, N, E, K, sigmoid, norm_topk);
        });
}

/* ---- checks ---- */

static const ops_t *cpu;
static int checks, failed;
static bool quiet; /* the barrier mutations: count failures, print none */

template <typename T> static void same(const char *what, const std::string &shape, const T *emu, const T *ref, size_t n)
{
    checks++;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&emu[i], &ref[i], sizeof(T)) != 0) {
            failed++;
            if (!quiet)
                printf("FAIL %s %s: element %zu of %zu: %.9g, cpu %.9g\n", what, shape.c_str(), i, n, (double)emu[i],
                       (double)ref[i]);
            return;
        }
}

static void expect(bool ok, const char *what, const std::string &shape)
{
    checks++;
    if (!ok) {
        failed++;
        if (!quiet)
            printf("FAIL %s %s\n", what, shape.c_str());
    }
}

static std::mt19937 rng(33);
static std::vector<float> rvec(size_t n, float lo, float hi)
{
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float &x : v)
        x = u(rng);
    return v;
}

static const int32_t IPOISON = 0x7fff7fff;

typedef struct {
    int N, T, E, K, C;
    int sigmoid, norm_topk, capacity;
    int ties;  /* logits on a grid of 4 values: exact ties */
    int empty; /* experts E/2 .. E-1 never picked (logits far below) */
    int bias;  /* DeepSeek's expert bias (random, +-0.3) selects */
} moe_case_t;

static std::string shape_of(const moe_case_t &c)
{
    char s[160];
    snprintf(s, sizeof s, "[N=%d T=%d E=%d K=%d C=%d %s%s cap=%d%s%s]", c.N, c.T, c.E, c.K, c.C,
             c.sigmoid ? "sigmoid" : "softmax", c.norm_topk ? " norm" : "", c.capacity, c.ties ? " ties" : "",
             c.empty ? " empty" : "");
    if (c.bias)
        return std::string(s) + "[bias]";
    return s;
}

/* One case through all eight ops; returns nothing, counts failures. */
static void run_case(const moe_case_t &c)
{
    const std::string sh = shape_of(c);
    const int N = c.N, T = c.T, E = c.E, K = c.K, C = c.C;
    const size_t NK = (size_t)N * K, NE = (size_t)N * E;
    std::vector<float> logits = rvec(NE, -3.0f, 3.0f);
    for (size_t i = 0; i < NE; i++) {
        if (c.ties)
            logits[i] = (float)((int)(rng() % 4)) * 0.5f - 0.5f;
        if (c.empty && (int)(i % E) >= E / 2)
            logits[i] -= 40.0f;
    }
    /* route */
    std::vector<float> sc(NE, NAN), ls(N, NAN), gt(NK, NAN), rsc = sc, rls = ls, rgt = gt;
    std::vector<int32_t> id(NK, IPOISON), rid = id;
    std::vector<float> bias = rvec((size_t)E, -0.3f, 0.3f);
    const float *b = c.bias ? bias.data() : NULL;
    cpu->moe_route_fwd(cpu->ctx, rsc.data(), rls.data(), rid.data(), rgt.data(), logits.data(), b, N, T, E, K,
                       c.sigmoid, c.norm_topk, c.capacity);
    emu_route_fwd(sc.data(), ls.data(), id.data(), gt.data(), logits.data(), b, N, T, E, K, c.sigmoid, c.norm_topk,
                  c.capacity);
    same("moe_route_fwd scores", sh, sc.data(), rsc.data(), NE);
    same("moe_route_fwd lse", sh, ls.data(), rls.data(), N);
    same("moe_route_fwd idx", sh, id.data(), rid.data(), NK);
    same("moe_route_fwd gate", sh, gt.data(), rgt.data(), NK);
    /* the dispatch order */
    std::vector<int32_t> perm(NK + 1, IPOISON), offs(E + 1, IPOISON), where(NK, IPOISON);
    std::vector<int32_t> rperm = perm, roffs = offs, rwhere = where;
    cpu->moe_plan(cpu->ctx, rperm.data(), roffs.data(), rwhere.data(), rid.data(), N, E, K);
    emu_plan(perm.data(), offs.data(), where.data(), rid.data(), N, E, K);
    same("moe_plan perm", sh, perm.data(), rperm.data(), NK + 1);
    same("moe_plan offs", sh, offs.data(), roffs.data(), (size_t)E + 1);
    same("moe_plan where", sh, where.data(), rwhere.data(), NK);
    const int M = roffs[E];
    /* the case's premises: something dropped, an expert left empty */
    int dropped = 0, empties = 0;
    for (size_t a = 0; a < NK; a++)
        dropped += rid[a] < 0;
    for (int e = 0; e < E; e++)
        empties += roffs[e + 1] == roffs[e];
    if (c.capacity)
        expect(dropped > 0, "capacity premise: some assignment dropped", sh);
    if (c.empty)
        expect(empties > 0, "empty-expert premise: some expert has no tokens", sh);
    /* stats */
    std::vector<float> st(2 * (size_t)E + 2, NAN), rst = st;
    cpu->moe_stats(cpu->ctx, rst.data(), rid.data(), rsc.data(), rls.data(), N, E, K, c.sigmoid);
    emu_stats(st.data(), rid.data(), rsc.data(), rls.data(), N, E, K, c.sigmoid);
    same("moe_stats", sh, st.data(), rst.data(), st.size());
    /* gather: xe[M, C] (one poison row past M) */
    std::vector<float> x = rvec((size_t)N * C, -1, 1), xe(((size_t)M + 1) * C, NAN), rxe = xe;
    cpu->moe_gather(cpu->ctx, rxe.data(), x.data(), rperm.data(), M, K, C);
    emu_gather(xe.data(), x.data(), rperm.data(), M, K, C);
    same("moe_gather", sh, xe.data(), rxe.data(), xe.size());
    /* combine */
    std::vector<float> ye = rvec(((size_t)M + 1) * C, -2, 2), out((size_t)N * C, NAN), rout = out;
    cpu->moe_combine_fwd(cpu->ctx, rout.data(), ye.data(), rgt.data(), rwhere.data(), N, K, C);
    emu_combine_fwd(out.data(), ye.data(), rgt.data(), rwhere.data(), N, K, C);
    same("moe_combine_fwd", sh, out.data(), rout.data(), out.size());
    std::vector<float> dout = rvec((size_t)N * C, -1, 1), dye(((size_t)M + 1) * C, NAN), rdye = dye;
    std::vector<float> dgate(NK, NAN), rdgate = dgate;
    cpu->moe_combine_bwd(cpu->ctx, rdye.data(), rdgate.data(), dout.data(), ye.data(), rgt.data(), rwhere.data(), N, K,
                         C);
    emu_combine_bwd(dye.data(), dgate.data(), dout.data(), ye.data(), rgt.data(), rwhere.data(), N, K, C);
    same("moe_combine_bwd dye", sh, dye.data(), rdye.data(), dye.size());
    same("moe_combine_bwd dgate", sh, dgate.data(), rdgate.data(), NK);
    /* scatter backward, written and accumulated */
    std::vector<float> dxe = rvec(((size_t)M + 1) * C, -1, 1);
    for (int accum = 0; accum < 2; accum++) {
        std::vector<float> dx = accum ? rvec((size_t)N * C, -1, 1) : std::vector<float>((size_t)N * C, NAN), rdx = dx;
        cpu->moe_scatter_bwd(cpu->ctx, rdx.data(), dxe.data(), rwhere.data(), N, K, C, accum);
        emu_scatter_bwd(dx.data(), dxe.data(), rwhere.data(), N, K, C, accum);
        same(accum ? "moe_scatter_bwd (accum)" : "moe_scatter_bwd", sh, dx.data(), rdx.data(), dx.size());
    }
    /* the router's backward: gates only, + load balancing, + z-loss */
    std::vector<float> dg = rvec(NK, -1, 1), auxw = rvec((size_t)E, 0.0f, 0.05f);
    for (int terms = 0; terms < 3; terms++) {
        const float *aw = terms >= 1 ? auxw.data() : NULL;
        const float zw = terms == 2 ? 0.003f : 0.0f;
        std::vector<float> dl(NE, NAN), rdl = dl;
        cpu->moe_route_bwd(cpu->ctx, rdl.data(), dg.data(), logits.data(), rsc.data(), rls.data(), rid.data(), aw, zw,
                           N, E, K, c.sigmoid, c.norm_topk);
        emu_route_bwd(dl.data(), dg.data(), logits.data(), rsc.data(), rls.data(), rid.data(), aw, zw, N, E, K,
                      c.sigmoid, c.norm_topk);
        static const char *const name[] = {"moe_route_bwd (gates)", "moe_route_bwd (gates, aux)",
                                           "moe_route_bwd (gates, aux, z)"};
        same(name[terms], sh, dl.data(), rdl.data(), NE);
    }
    /* the shared expert's gate (Qwen2-MoE), forward and backward */
    std::vector<float> sy = rvec((size_t)N * C, -2, 2), gz = rvec((size_t)N, -4, 4), rgz = gz;
    std::vector<float> gout((size_t)N * C, NAN), rgout = gout;
    cpu->moe_shared_gate_fwd(cpu->ctx, rgout.data(), rgz.data(), sy.data(), N, C);
    emu_shared_gate_fwd(gout.data(), gz.data(), sy.data(), N, C);
    same("moe_shared_gate_fwd out", sh, gout.data(), rgout.data(), gout.size());
    same("moe_shared_gate_fwd s", sh, gz.data(), rgz.data(), (size_t)N);
    std::vector<float> gdy((size_t)N * C, NAN), rgdy = gdy, gdz((size_t)N, NAN), rgdz = gdz;
    cpu->moe_shared_gate_bwd(cpu->ctx, rgdy.data(), rgdz.data(), dout.data(), sy.data(), rgz.data(), N, C);
    emu_shared_gate_bwd(gdy.data(), gdz.data(), dout.data(), sy.data(), rgz.data(), N, C);
    same("moe_shared_gate_bwd dy", sh, gdy.data(), rgdy.data(), gdy.size());
    same("moe_shared_gate_bwd dz", sh, gdz.data(), rgdz.data(), (size_t)N);
}

static const moe_case_t cases[] = {
    /* N  T    E   K  C    sig norm cap ties empty bias */
    {1, 1, 8, 2, 5, 0, 1, 0, 0, 0, 0},
    {1, 1, 64, 6, 3, 1, 1, 0, 0, 0, 0},
    {300, 100, 8, 2, 40, 0, 1, 0, 0, 0, 0},
    {300, 100, 8, 2, 40, 0, 0, 30, 1, 0, 0},
    {600, 200, 8, 2, 7, 1, 1, 20, 1, 0, 0},
    {300, 300, 64, 6, 9, 1, 1, 12, 0, 1, 0},
    {300, 300, 64, 6, 1, 0, 1, 0, 1, 1, 0},
    {250, 100, 64, 6, 300, 0, 0, 5, 0, 0, 0},
    {37, 37, 4, 4, 33, 0, 1, 8, 1, 0, 0},
    {600, 200, 300, 2, 7, 1, 1, 2, 1, 0, 0},
    {300, 100, 16, 4, 9, 1, 1, 0, 0, 0, 1},
    {300, 100, 16, 4, 9, 1, 1, 0, 1, 0, 1},
};

/* Each barrier of the four barrier kernels skipped in turn (k_moe_drop's
 * first two, after a tile's load and after its use; k_moe_count's one;
 * k_moe_offs' two; k_moe_place's one): the case below (drops, two
 * sequences of two drop tiles, two counting chunks, E over THREADS, so
 * that the thread emu_cuda.h runs first after a barrier has an expert,
 * and random logits, so that expert has tokens) must then fail some
 * check. */
static void barrier_mutations()
{
    static const struct {
        int kernel;
        unsigned n;
        const char *name;
    } muts[] = {{K_DROP, 1, "k_moe_drop, barrier after the tile's load"},
                {K_DROP, 2, "k_moe_drop, barrier before the next tile's load"},
                {K_COUNT, 1, "k_moe_count, barrier after the chunk's load"},
                {K_OFFS, 1, "k_moe_offs, barrier before the scan of the totals"},
                {K_OFFS, 2, "k_moe_offs, barrier after the scan"},
                {K_PLACE, 1, "k_moe_place, barrier after the chunk's load"}};
    const moe_case_t c = {600, 200, 300, 2, 7, 1, 1, 2, 0, 0, 0};
    for (const auto &m : muts) {
        /* in a child: a broken kernel may write anywhere (an offset it
         * scanned before it was written places rows far out of range), and
         * a crash is as much a failure as a wrong element */
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            /* a kernel that wrote anywhere may leave the heap's lock held:
             * a child that hangs is ended, and counts as caught */
            alarm(120);
            quiet = true;
            mut_kernel = m.kernel;
            mut_n = m.n;
            run_case(c);
            _exit(failed > 100 ? 100 : failed);
        }
        int st = 0;
        checks++;
        if (pid < 0 || waitpid(pid, &st, 0) != pid) {
            failed++;
            printf("FAIL %s: fork or waitpid failed\n", m.name);
        } else if (WIFEXITED(st) && WEXITSTATUS(st) > 0) {
            printf("caught: %s skipped (%d checks failed)\n", m.name, WEXITSTATUS(st));
        } else if (WIFSIGNALED(st)) {
            printf("caught: %s skipped (the kernel crashed: signal %d)\n", m.name, WTERMSIG(st));
        } else {
            failed++;
            printf("FAIL mutation not caught: %s skipped\n", m.name);
        }
    }
}

int main(int argc, char **argv)
{
    const bool cases_only = argc > 1 && strcmp(argv[1], "--cases") == 0;
    if (argc > 1 && !cases_only) {
        fprintf(stderr, "usage: test_moe_emu [--cases]   (--cases: the comparisons only, no barrier mutations)\n");
        return 2;
    }
    cpu = ops_cpu_create();
    if (!cpu)
        return 1;
    ops_cpu_threads(1);
    for (const moe_case_t &c : cases)
        run_case(c);
    if (!cases_only)
        barrier_mutations();
    printf("%s: %d of %d checks failed\n", failed ? "FAIL" : "PASS", failed, checks);
    ops_release(cpu);
    return failed ? 1 : 0;
}
