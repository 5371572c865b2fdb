/* Tensor-core building blocks of the bf16 kernels (issue 32): the warp-wide
 * matrix multiply-accumulate mma.sync m16n8k16 (bf16 in, fp32 accumulate), the
 * warp-wide shared-memory fragment loads ldmatrix (x1, x2, x4, plain and
 * transposed), 16-byte asynchronous global-to-shared copies (cp.async) with
 * their commit and wait groups, and the XOR swizzle that makes those loads
 * free of bank conflicts.
 *
 * Two implementations with one set of signatures. Under nvcc (__CUDACC__)
 * they are inline PTX for sm_80 and later. In the host emulation (g++, the
 * includer having defined the CUDA dialect as test/emu/emu_cuda.h does:
 * threadIdx, __syncwarp) each is an emulation twin with the instruction's
 * warp-collective semantics: every lane passes its own registers, the twin
 * gathers the 32 lanes' inputs through a per-warp exchange and a
 * __syncwarp, computes the collective result per the PTX ISA fragment layouts
 * and returns this lane's part. test/emu/test_mma_emu.cpp checks the twins
 * element by element against layouts written out independently there.
 *
 * Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating
 * point type"; lane = 0..31, g = lane / 4, t = lane % 4; a .b32 register holds
 * two bf16, the lower-indexed element in the low 16 bits):
 *   A 16x16 row-major, 4 regs: reg0 = A[g][2t, 2t+1], reg1 = A[g+8][2t, 2t+1],
 *     reg2 = A[g][2t+8, 2t+9], reg3 = A[g+8][2t+8, 2t+9]
 *   B 16x8 (k x n), 2 regs: reg0 = B[2t, 2t+1][g], reg1 = B[2t+8, 2t+9][g]
 *   C, D 16x8 fp32, 4 regs: C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
 * ldmatrix .xN loads N 8x8 bf16 matrices: lane 8m + r gives the shared address
 * of row r of matrix m (16 contiguous bytes, 16-byte aligned; the addresses of
 * lanes 8N and up are ignored), and register m of lane l gets row l / 4,
 * elements 2(l % 4) and 2(l % 4) + 1 of matrix m (.trans: column l / 4, rows
 * 2(l % 4) and 2(l % 4) + 1). So an A tile is one x4 (matrices: rows 0-7 and
 * 8-15 of columns 0-7, then of columns 8-15), and a B tile is an x2 from
 * [n][k] storage (a K tile for Q K^T) or an x2 .trans from [k][n] storage (a
 * V tile for P V).
 *
 * All 32 lanes of a warp call mma and ldmatrix together (converged, as the
 * .sync.aligned forms require). ldmatrix reads shared memory that other
 * threads wrote: separate the writes from it with __syncthreads (or
 * __syncwarp within a warp). cp.async copies complete only at a
 * cp_async_wait covering their group, and then only for the issuing thread:
 * __syncthreads after the wait before other threads read them. A copy may
 * write its destination at any time from its issue: __syncthreads before
 * refilling a buffer that other threads may still be reading. */
#ifndef DTRAIN_CUDA_KERNELS_MMA_CUH
#define DTRAIN_CUDA_KERNELS_MMA_CUH

#include <stdint.h>

/* Element offset of bf16 (row, col) in a shared tile of rows of ld elements,
 * ld a multiple of 64 (128 bytes: 8 chunks of 16 bytes, the 32 banks once).
 * The 16-byte chunk col / 8 is stored at chunk (col / 8) ^ (row % 8) of its
 * row: the 8 rows an ldmatrix matrix reads at one logical chunk land on 8
 * different chunks, all 32 banks, where unswizzled rows of 128 bytes would
 * all hit the same 4 banks. A chunk stays whole (cp.async and ldmatrix move
 * whole chunks) and stays in its row. */
static __host__ __device__ inline unsigned smem_swizzle(unsigned row, unsigned col, unsigned ld)
{
    return row * ld + ((((col >> 3) ^ (row & 7u)) << 3) | (col & 7u));
}

#ifdef __CUDACC__
/* ---- nvcc: inline PTX (sm_80 and later) ---- */

/* D = A B + C, m16n8k16, bf16 A and B, fp32 C and D; d may alias c. */
static __device__ inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
}

/* The 32-bit shared-window address PTX's .shared operands take. */
static __device__ inline unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

static __device__ inline void ldmatrix_x1(uint32_t r[1], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(row)));
}

static __device__ inline void ldmatrix_x2(uint32_t r[2], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
}

static __device__ inline void ldmatrix_x4(uint32_t r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

static __device__ inline void ldmatrix_x1_trans(uint32_t r[1], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(row)));
}

static __device__ inline void ldmatrix_x2_trans(uint32_t r[2], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
}

static __device__ inline void ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

/* 16 bytes global -> shared, asynchronous (.cg: through L2 only). Both
 * addresses 16-byte aligned. */
static __device__ inline void cp_async_16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

/* The same, copying src_bytes (0..16) and zero-filling the rest: partial
 * tiles. src stays a valid address even when src_bytes is 0. */
static __device__ inline void cp_async_16_zfill(void *dst, const void *src, unsigned src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}

/* Close the group of this thread's cp.async issued since the last commit. */
static __device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Wait until at most N of this thread's committed groups are pending. */
template <int N> static __device__ inline void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#else
/* ---- host emulation: the twins ---- */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

/* Test hook, 0 in every real use: test_mma_emu sets it to prove that its
 * checks catch a broken layout. 1: A rows g and g + 8 exchanged (the roles
 * of reg0 and reg1, reg2 and reg3); 2: ldmatrix takes row r of a matrix from
 * the lane of row r + 1. */
static int mma_emu_mutation;

/* Per-thread exchange slots (a warp's lanes use 32 consecutive ones), in two
 * sets used by alternate collectives: a lane writes set p again (two
 * collectives on) only after passing the next collective's __syncwarp, which
 * every lane reaches only after reading set p, so one __syncwarp per
 * collective suffices. Lanes of a warp run the same collectives (converged),
 * so their counts agree; each block runs on fresh host threads, from 0. */
static uint32_t mma_emu_slot[2][1024][6];
static thread_local unsigned mma_emu_calls;

/* This lane's slot in the current collective. */
static inline uint32_t *mma_emu_mine() { return mma_emu_slot[mma_emu_calls & 1][threadIdx.x]; }

/* After the __syncwarp: the warp's 32 slots of the current collective, which
 * this call ends for this lane. */
typedef const uint32_t (*mma_emu_lanes_t)[6];
static inline mma_emu_lanes_t mma_emu_warp() { return mma_emu_slot[mma_emu_calls++ & 1] + (threadIdx.x & ~31u); }

static inline float mma_emu_bf16(uint32_t bits16)
{
    const uint32_t u = bits16 << 16; /* bf16 is the top half of an fp32 */
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Element e (0..1) of register word w: the lower-indexed element is the low half. */
static inline uint32_t mma_emu_half(uint32_t w, unsigned e) { return (w >> (16 * e)) & 0xffffu; }

static inline void mma_emu_aligned(const void *p, const char *what)
{
    if ((uintptr_t)p & 15) {
        fprintf(stderr, "mma emulation: %s address %p not 16-byte aligned\n", what, p);
        abort();
    }
}

/* A[row][k] of the warp's A fragments (lanes' slots 0..3). */
static inline float mma_emu_a(mma_emu_lanes_t lanes, unsigned row, unsigned k)
{
    unsigned hi_row = row >> 3;
    if (mma_emu_mutation == 1)
        hi_row ^= 1u;
    const unsigned lane = 4 * (row & 7) + ((k & 7) >> 1), reg = hi_row | ((k >> 3) << 1);
    return mma_emu_bf16(mma_emu_half(lanes[lane][reg], k & 1));
}

/* B[k][n] of the warp's B fragments (slots 4..5). */
static inline float mma_emu_b(mma_emu_lanes_t lanes, unsigned k, unsigned n)
{
    const unsigned lane = 4 * n + ((k & 7) >> 1), reg = 4 + (k >> 3);
    return mma_emu_bf16(mma_emu_half(lanes[lane][reg], k & 1));
}

/* D = A B + C. Each lane computes its 4 elements of D as C + sum over k = 0..15
 * in order, one fp32 add per product (the products of bf16 are exact in
 * fp32). The tensor core's order and rounding inside the k = 16 dot are not
 * specified: compare hardware results with fp32 bounds. */
static inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    const unsigned lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    memcpy(mma_emu_mine(), a, 4 * sizeof(uint32_t));
    memcpy(mma_emu_mine() + 4, b, 2 * sizeof(uint32_t));
    __syncwarp();
    const mma_emu_lanes_t lanes = mma_emu_warp();
    float out[4];
    for (unsigned i = 0; i < 4; i++) {
        const unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float acc = c[i];
        for (unsigned k = 0; k < 16; k++)
            acc += mma_emu_a(lanes, row, k) * mma_emu_b(lanes, k, col);
        out[i] = acc;
    }
    memcpy(d, out, sizeof out);
}

/* bf16 element e (0..7) of the 16-byte row lane src gave. */
static inline uint32_t ldm_emu_elem(mma_emu_lanes_t lanes, unsigned src, unsigned e)
{
    return mma_emu_half(lanes[src][e >> 1], e & 1);
}

/* ldmatrix .xN (N = nmat), .trans or not: each of lanes 0 .. 8N - 1 reads its
 * row, the warp exchanges them, each lane picks its elements. */
static inline void ldmatrix_emu(uint32_t *r, unsigned nmat, bool trans, const void *row)
{
    const unsigned lane = threadIdx.x & 31u;
    if (lane < 8 * nmat) {
        mma_emu_aligned(row, "ldmatrix row");
        memcpy(mma_emu_mine(), row, 16);
    }
    __syncwarp();
    const mma_emu_lanes_t lanes = mma_emu_warp();
    const unsigned q = lane >> 2, e = 2 * (lane & 3u); /* row q, elements e, e + 1 (.trans: column q, rows e, e + 1) */
    for (unsigned m = 0; m < nmat; m++) {
        const unsigned skew = mma_emu_mutation == 2 ? 1u : 0u;
        uint32_t lo, hi;
        if (trans) {
            lo = ldm_emu_elem(lanes, 8 * m + ((e + skew) & 7), q);
            hi = ldm_emu_elem(lanes, 8 * m + ((e + 1 + skew) & 7), q);
        } else {
            const unsigned src = 8 * m + ((q + skew) & 7);
            lo = ldm_emu_elem(lanes, src, e);
            hi = ldm_emu_elem(lanes, src, e + 1);
        }
        r[m] = lo | hi << 16;
    }
}

static inline void ldmatrix_x1(uint32_t r[1], const void *row) { ldmatrix_emu(r, 1, false, row); }
static inline void ldmatrix_x2(uint32_t r[2], const void *row) { ldmatrix_emu(r, 2, false, row); }
static inline void ldmatrix_x4(uint32_t r[4], const void *row) { ldmatrix_emu(r, 4, false, row); }
static inline void ldmatrix_x1_trans(uint32_t r[1], const void *row) { ldmatrix_emu(r, 1, true, row); }
static inline void ldmatrix_x2_trans(uint32_t r[2], const void *row) { ldmatrix_emu(r, 2, true, row); }
static inline void ldmatrix_x4_trans(uint32_t r[4], const void *row) { ldmatrix_emu(r, 4, true, row); }

/* cp.async: on the device the destination is undefined from the issue until
 * a wait retires the copy. The twin makes both ends of that window show: at
 * issue it fills the 16 destination bytes with 0xff (bf16 and fp32 NaN), and
 * the copy lands (source read, destination written) only when a
 * cp_async_wait retires its group. So a read of the new data before the
 * wait (a missing wait, or a missing barrier after another thread's wait)
 * and a read of the old data after the issue (a missing barrier before a
 * buffer is reused) both read NaN. Per thread: each CUDA thread is its own
 * host thread in the emulation. */
struct cp_async_emu_copy {
    void *dst;
    const void *src;
    unsigned bytes; /* copied; the rest of the 16 zero-filled */
};
struct cp_async_emu_state {
    std::vector<cp_async_emu_copy> open;                /* issued since the last commit */
    std::vector<std::vector<cp_async_emu_copy>> groups; /* committed, oldest first */
};
static thread_local cp_async_emu_state cp_async_emu;

static inline void cp_async_16_zfill(void *dst, const void *src, unsigned src_bytes)
{
    mma_emu_aligned(dst, "cp.async destination");
    mma_emu_aligned(src, "cp.async source");
    memset(dst, 0xff, 16);
    cp_async_emu.open.push_back({dst, src, src_bytes < 16 ? src_bytes : 16});
}

static inline void cp_async_16(void *dst, const void *src) { cp_async_16_zfill(dst, src, 16); }

static inline void cp_async_commit()
{
    cp_async_emu.groups.push_back(std::move(cp_async_emu.open));
    cp_async_emu.open.clear();
}

/* Test hook, 0 in every real use: n > 0 makes each thread skip its n-th
 * cp_async_wait, as if that wait were missing (test_att_mma_bwd_emu). */
static unsigned cp_async_emu_drop_wait;
static thread_local unsigned cp_async_emu_waits;

template <int N> static inline void cp_async_wait()
{
    if (cp_async_emu_drop_wait && ++cp_async_emu_waits == cp_async_emu_drop_wait)
        return;
    std::vector<std::vector<cp_async_emu_copy>> &gs = cp_async_emu.groups;
    while (gs.size() > (size_t)N) {
        for (const cp_async_emu_copy &c : gs.front()) {
            memcpy(c.dst, c.src, c.bytes);
            memset((char *)c.dst + c.bytes, 0, 16 - c.bytes);
        }
        gs.erase(gs.begin());
    }
}
#endif

#endif
