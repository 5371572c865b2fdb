/* The CUDA dialect on the host, for kernels run in a deterministic schedule:
 * every CUDA thread of a block is a std::thread, but only one runs at a time.
 * A thread runs until it waits at a barrier (__syncthreads, __syncwarp, the
 * one inside __shfl_xor_sync) or ends, then hands the run to the
 * lowest-numbered runnable thread; the last thread to reach a barrier
 * releases the others and runs on. So warp 0 runs as far ahead as the
 * barriers let it, then warp 1, and so on: the widest skew between warps
 * that the barriers allow, the same every run. A kernel that lacks a barrier
 * then reads, every time, data the lagging warps have not yet written, or
 * the leading warp overwrites data the lagging warps have yet to read
 * (cuda/kernels/mma.cuh's cp.async twin poisons a destination at issue): a
 * deterministic failure where free-running threads would race and pass by
 * chance. A barrier that not every thread reaches (all remaining threads
 * waiting) aborts with a message instead of hanging.
 *
 * test_kernels_emu.cpp has its own free-running emulation (its threads run
 * concurrently); this one is test_mma_emu.cpp's, for the warp-collective
 * twins of cuda/kernels/mma.cuh. Blocks are 1-D (threadIdx.x), of at most
 * 1024 threads, run one after another with fresh threads (so thread_local
 * state, such as pending cp.async copies, is per block); __shared__ is
 * static. __syncwarp takes the whole warp (a mask other than the warp's
 * live lanes is not emulated). Include before any cuda/kernels/ header. */
#ifndef DTRAIN_TEST_EMU_CUDA_H
#define DTRAIN_TEST_EMU_CUDA_H

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 gridDim, blockDim;
using std::max;
using std::min;

/* The run token: cur is the one thread allowed to run; the others sleep on
 * their own condition variable. */
struct emu_sched {
    std::mutex m;
    std::unique_ptr<std::condition_variable[]> cv;
    std::vector<char> runnable; /* not waiting at a barrier, not ended */
    unsigned n = 0, cur = 0;
};
static emu_sched emu_s;

struct emu_barrier {
    unsigned expected = 0;
    std::vector<unsigned> waiting;
};
static emu_barrier emu_block_bar, emu_warp_bar[32];

/* Hand the run to the lowest-numbered runnable thread; emu_s.m held. */
static void emu_pass()
{
    for (unsigned u = 0; u < emu_s.n; u++) {
        if (emu_s.runnable[u]) {
            emu_s.cur = u;
            emu_s.cv[u].notify_one();
            return;
        }
    }
    /* none runnable: fine once every thread has ended, a deadlock while any waits */
    bool waiting = !emu_block_bar.waiting.empty();
    for (unsigned w = 0; w < 32; w++)
        waiting = waiting || !emu_warp_bar[w].waiting.empty();
    if (waiting) {
        fprintf(stderr, "emu_cuda: every live thread waits at a barrier that not all reach (deadlock)\n");
        abort();
    }
}

static void emu_wait_turn(std::unique_lock<std::mutex> &l, unsigned t)
{
    emu_s.cv[t].wait(l, [t] { return emu_s.cur == t; });
}

static void emu_barrier_wait(emu_barrier &b)
{
    const unsigned t = threadIdx.x;
    std::unique_lock<std::mutex> l(emu_s.m);
    if (b.waiting.size() + 1 == b.expected) { /* the last: release the others, run on */
        for (unsigned u : b.waiting)
            emu_s.runnable[u] = 1;
        b.waiting.clear();
        return;
    }
    b.waiting.push_back(t);
    emu_s.runnable[t] = 0;
    emu_pass();
    emu_wait_turn(l, t);
}

/* Test hook, 0 in every real use: n > 0 makes every thread of a block skip
 * its n-th __syncthreads, as if that barrier were missing from the kernel
 * (every thread skips the same one, so the others still match up);
 * test_att_mma_bwd_emu proves its checks catch each missing barrier. */
static unsigned emu_drop_syncthreads;
static thread_local unsigned emu_syncthreads_calls;

static void __syncthreads()
{
    if (emu_drop_syncthreads && ++emu_syncthreads_calls == emu_drop_syncthreads)
        return;
    emu_barrier_wait(emu_block_bar);
}
static void __syncwarp(unsigned = 0xffffffffu) { emu_barrier_wait(emu_warp_bar[threadIdx.x >> 5]); }

/* Per-thread slots of the shuffle exchange (blocks of at most 1024 threads),
 * two sets used by alternate shuffles so that one __syncwarp a shuffle
 * suffices (the reasoning of mma.cuh's exchange slots). */
alignas(8) static unsigned char emu_shfl_buf[2][1024][8];
static thread_local unsigned emu_shfl_calls;

template <typename T> static T __shfl_xor_sync(unsigned, T v, int o)
{
    static_assert(sizeof(T) <= 8, "shuffle of a type over 8 bytes");
    const unsigned t = threadIdx.x, set = emu_shfl_calls++ & 1;
    memcpy(emu_shfl_buf[set][t], &v, sizeof v);
    __syncwarp();
    T r;
    memcpy(&r, emu_shfl_buf[set][t ^ (unsigned)o], sizeof r);
    return r;
}

/* One block: threads 0 .. threads - 1 of f, thread 0 first. */
template <class F> static void emu_run_block(dim3 block, unsigned threads, const F &f)
{
    emu_s.n = threads;
    emu_s.cur = 0;
    emu_s.cv.reset(new std::condition_variable[threads]);
    emu_s.runnable.assign(threads, 1);
    emu_block_bar.expected = threads;
    for (unsigned w = 0; w < 32; w++)
        emu_warp_bar[w].expected = 32 * w < threads ? std::min(32u, threads - 32 * w) : 0;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < threads; t++)
        th.emplace_back([t, block, &f] {
            threadIdx = dim3(t);
            blockIdx = block;
            {
                std::unique_lock<std::mutex> l(emu_s.m);
                emu_wait_turn(l, t);
            }
            f();
            std::unique_lock<std::mutex> l(emu_s.m);
            emu_s.runnable[t] = 0;
            emu_pass();
        });
    for (std::thread &x : th)
        x.join();
}

/* f() by every thread of every block of grid, blocks in order (x fastest). */
template <class F> static void emu_launch(dim3 grid, unsigned threads, F f)
{
    if (threads == 0 || threads > 1024) {
        fprintf(stderr, "emu_cuda: a block of %u threads\n", threads);
        abort();
    }
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++)
                emu_run_block(dim3(x, y, z), threads, f);
}

#endif
