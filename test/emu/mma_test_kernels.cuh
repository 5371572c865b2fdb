/* The warp kernels that exercise cuda/kernels/mma.cuh: test_mma_emu.cpp runs
 * them in the host emulation (test/emu/emu_cuda.h) and checks their outputs;
 * mma_nvcc_check.cu compiles the same text with nvcc for the configured
 * architectures (so the inline PTX is assembled by ptxas). CUDA dialect only,
 * like cuda/kernels/: no host code, no launches.
 *
 * Matrices are bf16 bits (uint16_t) or fp32, row-major, in global memory.
 * Fragment elements are placed by the PTX ISA's closed forms (lane = 0..31,
 * g = lane / 4, t = lane % 4), written out here apart from mma.cuh's twins:
 *   A element i = 0..7: row g + 8 ((i / 2) % 2), column 2t + i % 2 + 8 (i / 4),
 *                       register i / 2, half i % 2 (0: low 16 bits)
 *   B element i = 0..3: k 2t + i % 2 + 8 (i / 2), n g
 *   C element i = 0..3: row g + 8 (i / 2), column 2t + i % 2 */
#ifndef DTRAIN_TEST_EMU_MMA_TEST_KERNELS_CUH
#define DTRAIN_TEST_EMU_MMA_TEST_KERNELS_CUH

#include <stdint.h>

#include "cuda/kernels/mma.cuh"

static __device__ inline unsigned frag_a_row(unsigned lane, unsigned i) { return lane / 4 + 8 * ((i / 2) % 2); }
static __device__ inline unsigned frag_a_col(unsigned lane, unsigned i) { return 2 * (lane % 4) + i % 2 + 8 * (i / 4); }
static __device__ inline unsigned frag_b_k(unsigned lane, unsigned i) { return 2 * (lane % 4) + i % 2 + 8 * (i / 2); }
static __device__ inline unsigned frag_c_row(unsigned lane, unsigned i) { return lane / 4 + 8 * (i / 2); }
static __device__ inline unsigned frag_c_col(unsigned lane, unsigned i) { return 2 * (lane % 4) + i % 2; }

/* D[16][8] = A[16][16] B[16][8] + C[16][8], one warp, fragments from global
 * memory by the closed forms; in_place: D accumulates into C's registers. */
__global__ void k_mma_tile(float *D, const uint16_t *A, const uint16_t *B, const float *C, int in_place)
{
    const unsigned lane = threadIdx.x % 32;
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4], d[4];
    for (unsigned i = 0; i < 8; i++)
        a[i / 2] |= (uint32_t)A[frag_a_row(lane, i) * 16 + frag_a_col(lane, i)] << (16 * (i % 2));
    for (unsigned i = 0; i < 4; i++)
        b[i / 2] |= (uint32_t)B[frag_b_k(lane, i) * 8 + lane / 4] << (16 * (i % 2));
    for (unsigned i = 0; i < 4; i++)
        c[i] = C[frag_c_row(lane, i) * 8 + frag_c_col(lane, i)];
    if (in_place)
        mma_m16n8k16_bf16(c, a, b, c);
    else
        mma_m16n8k16_bf16(d, a, b, c);
    for (unsigned i = 0; i < 4; i++)
        D[frag_c_row(lane, i) * 8 + frag_c_col(lane, i)] = in_place ? c[i] : d[i];
}

/* Shared row slot of row r of matrix m in k_ldmatrix's tile: a permutation (13 odd), so
 * that the test sees each lane's own address used. */
static __device__ inline unsigned ldm_slot(unsigned m, unsigned r) { return (8 * m + r) * 13 % 32; }

/* ldmatrix of nmat (1, 2, 4) 8x8 matrices mats[m][8][8] (bf16 bits), trans
 * or not, one warp: out[lane][4] = the lane's registers (zero beyond nmat).
 * Lanes 8 nmat and up point at poison rows, which must not show. */
__global__ void k_ldmatrix(uint32_t *out, const uint16_t *mats, unsigned nmat, int trans)
{
    __shared__ __align__(16) uint16_t tile[40][8]; /* 32 matrix rows, then 8 poison rows */
    const unsigned lane = threadIdx.x % 32;
    for (unsigned c = 0; c < 8; c++) {
        tile[ldm_slot(lane / 8, lane % 8)][c] = mats[lane * 8 + c];
        if (lane < 8)
            tile[32 + lane][c] = 0xdeadu;
    }
    __syncwarp();
    const void *row = lane < 8 * nmat ? tile[ldm_slot(lane / 8, lane % 8)] : tile[32 + lane % 8];
    uint32_t r[4] = {0, 0, 0, 0};
    if (nmat == 1)
        trans ? ldmatrix_x1_trans(r, row) : ldmatrix_x1(r, row);
    else if (nmat == 2)
        trans ? ldmatrix_x2_trans(r, row) : ldmatrix_x2(r, row);
    else
        trans ? ldmatrix_x4_trans(r, row) : ldmatrix_x4(r, row);
    for (unsigned m = 0; m < 4; m++)
        out[lane * 4 + m] = r[m];
}

/* D[16][16] = A[16][16] B, one warp, operands through shared memory by
 * ldmatrix as FlashAttention loads them: A by an x4; B either [k][n]
 * (bt = 0, a V tile: x4 .trans) or its transpose [n][k] (bt = 1, a K tile:
 * x4), each x4 giving the B fragments of both 8-column n tiles. */
__global__ void k_ldmatrix_mma(float *D, const uint16_t *A, const uint16_t *B, int bt)
{
    __shared__ __align__(16) uint16_t sa[16][16], sb[16][16];
    const unsigned lane = threadIdx.x % 32;
    for (unsigned i = lane; i < 256; i += 32) {
        sa[i / 16][i % 16] = A[i];
        sb[i / 16][i % 16] = B[i];
    }
    __syncwarp();
    uint32_t a[4], b[4];
    /* A matrices: rows 0-7 and 8-15 of columns 0-7, then of columns 8-15 */
    ldmatrix_x4(a, &sa[lane % 16][8 * (lane / 16)]);
    if (bt) /* [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) */
        ldmatrix_x4(b, &sb[lane % 8 + 8 * (lane / 16)][8 * ((lane / 8) % 2)]);
    else /* [k][n], transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) */
        ldmatrix_x4_trans(b, &sb[lane % 16][8 * (lane / 16)]);
    for (unsigned nt = 0; nt < 2; nt++) {
        const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float d[4];
        mma_m16n8k16_bf16(d, a, b + 2 * nt, zero);
        for (unsigned i = 0; i < 4; i++)
            D[frag_c_row(lane, i) * 16 + 8 * nt + frag_c_col(lane, i)] = d[i];
    }
}

#define CPT_THREADS 128 /* threads of k_cp_async_tile and k_gemm_bf16 */

/* cp.async of two [rows][LD] bf16 tiles (rows of src ld elements apart) into
 * swizzled shared tiles, one commit group each; rows at or past nvalid are
 * zero-filled. Waits for the first group only, reads it back through the
 * swizzle into out0, then waits for the second into out1 ([rows][LD] each).
 * The shared tiles are poisoned first, so a skipped copy or zero fill
 * shows. rows LD <= 8192. */
template <unsigned LD>
__global__ void k_cp_async_tile(uint16_t *out0, uint16_t *out1, const uint16_t *src0, const uint16_t *src1,
                                unsigned rows, unsigned ld, unsigned nvalid)
{
    __shared__ __align__(16) uint16_t s0[8192], s1[8192];
    const unsigned n = rows * LD, chunks = n / 8;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
        s0[i] = s1[i] = 0xffffu; /* bf16 NaN */
    __syncthreads();
    for (unsigned tile = 0; tile < 2; tile++) {
        uint16_t *s = tile ? s1 : s0;
        const uint16_t *src = tile ? src1 : src0;
        for (unsigned i = threadIdx.x; i < chunks; i += blockDim.x) {
            const unsigned r = i / (LD / 8), c = 8 * (i % (LD / 8));
            const bool valid = r < nvalid;
            cp_async_16_zfill(&s[smem_swizzle(r, c, LD)], valid ? src + (size_t)r * ld + c : src, valid ? 16 : 0);
        }
        cp_async_commit();
    }
    cp_async_wait<1>();
    __syncthreads();
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
        out0[i] = s0[smem_swizzle(i / LD, i % LD, LD)];
    cp_async_wait<0>();
    __syncthreads();
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
        out1[i] = s1[smem_swizzle(i / LD, i % LD, LD)];
}

/* ---- a multi-tile GEMM: C[M][N] = A[M][K] B[N][K]^T, fp32 out ----
 * Block tiles of GEMM_BM x GEMM_BN, K in tiles of GEMM_BK, double-buffered
 * through cp.async into swizzled shared tiles (2 stages x (A, B) x 64 x 64
 * bf16 = 32 KiB). 4 warps in 2 x 2, each a 32 x 32 C tile: 2 m16 tiles x 4
 * n8 tiles of accumulators. Grid (ceil(N / 64), ceil(M / 64)); rows past M or
 * N are zero-filled and not stored; K a multiple of GEMM_BK.
 * skip: 0 the kernel as it must be; 1 without cp_async_wait, 2 without the
 * __syncthreads between the wait and the reads, 3 without the __syncthreads
 * between the reads and the copies that reuse the stage (test_mma_emu's
 * proof that the emulation catches each). */
#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 64

/* Issue the copies of k tile kt into stage st (A rows m0.., B rows n0..). */
static __device__ void gemm_load(uint16_t (*sa)[GEMM_BM * GEMM_BK], uint16_t (*sb)[GEMM_BN * GEMM_BK], unsigned st,
                                 const uint16_t *A, const uint16_t *B, int M, int N, int K, int m0, int n0, int kt)
{
    for (unsigned i = threadIdx.x; i < GEMM_BM * GEMM_BK / 8; i += CPT_THREADS) {
        const unsigned r = i / (GEMM_BK / 8), c = 8 * (i % (GEMM_BK / 8));
        const bool va = m0 + (int)r < M, vb = n0 + (int)r < N;
        const size_t ka = (size_t)kt * GEMM_BK + c;
        cp_async_16_zfill(&sa[st][smem_swizzle(r, c, GEMM_BK)], va ? A + (size_t)(m0 + r) * K + ka : A, va ? 16 : 0);
        cp_async_16_zfill(&sb[st][smem_swizzle(r, c, GEMM_BK)], vb ? B + (size_t)(n0 + r) * K + ka : B, vb ? 16 : 0);
    }
    cp_async_commit();
}

/* acc += the warp's 32 x 32 part of stage st's A B^T (rows wm0.., cols wn0..). */
static __device__ void gemm_tile_mma(float (*acc)[4][4], const uint16_t *sa, const uint16_t *sb, unsigned wm0,
                                     unsigned wn0)
{
    const unsigned lane = threadIdx.x % 32;
    for (unsigned k0 = 0; k0 < GEMM_BK; k0 += 16) {
        uint32_t a[2][4], b[4][2];
        for (unsigned mt = 0; mt < 2; mt++)
            ldmatrix_x4(a[mt], &sa[smem_swizzle(wm0 + 16 * mt + lane % 16, k0 + 8 * (lane / 16), GEMM_BK)]);
        for (unsigned np = 0; np < 2; np++) { /* n tiles 2 np, 2 np + 1 from one x4 */
            uint32_t r[4];
            const unsigned n = wn0 + 16 * np + lane % 8 + 8 * (lane / 16);
            ldmatrix_x4(r, &sb[smem_swizzle(n, k0 + 8 * ((lane / 8) % 2), GEMM_BK)]);
            b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
        }
        for (unsigned mt = 0; mt < 2; mt++)
            for (unsigned nt = 0; nt < 4; nt++)
                mma_m16n8k16_bf16(acc[mt][nt], a[mt], b[nt], acc[mt][nt]);
    }
}

__global__ void __launch_bounds__(CPT_THREADS)
    k_gemm_bf16(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, int skip)
{
    __shared__ __align__(16) uint16_t sa[2][GEMM_BM * GEMM_BK], sb[2][GEMM_BN * GEMM_BK];
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN, nk = K / GEMM_BK;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm0 = 32 * (warp / 2), wn0 = 32 * (warp % 2);
    float acc[2][4][4] = {};
    gemm_load(sa, sb, 0, A, B, M, N, K, m0, n0, 0);
    for (int kt = 0; kt < nk; kt++) {
        if (kt + 1 < nk) { /* the next tile flies while this one is used */
            gemm_load(sa, sb, (kt + 1) % 2, A, B, M, N, K, m0, n0, kt + 1);
            if (skip != 1)
                cp_async_wait<1>();
        } else if (skip != 1) {
            cp_async_wait<0>();
        }
        if (skip != 2)
            __syncthreads(); /* every thread's copies of tile kt have landed */
        gemm_tile_mma(acc, sa[kt % 2], sb[kt % 2], wm0, wn0);
        if (skip != 3)
            __syncthreads(); /* stage kt % 2 is read before tile kt + 2 overwrites it */
    }
    for (unsigned mt = 0; mt < 2; mt++)
        for (unsigned nt = 0; nt < 4; nt++)
            for (unsigned i = 0; i < 4; i++) {
                const int m = m0 + wm0 + 16 * mt + frag_c_row(lane, i), n = n0 + wn0 + 8 * nt + frag_c_col(lane, i);
                if (m < M && n < N)
                    C[(size_t)m * N + n] = acc[mt][nt][i];
            }
}

#endif
