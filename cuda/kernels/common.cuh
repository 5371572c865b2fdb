/* What every kernel family of the CUDA backend uses: the block size of the
 * row and elementwise kernels, and the grid and loop of a grid-stride
 * kernel.
 *
 * The files of cuda/kernels/ hold the CUDA backend's kernels, one family a
 * file, each with its launch shapes and conventions at its top. They are
 * included by cuda/ops_cuda.cu, whose host wrappers (the ops table's
 * entries) launch the kernels, and by the host emulation tests
 * (test/emu/test_kernels_emu.cpp, test_gemm_emu.cpp), which compile the
 * same text with g++ and run it on the CPU against the CPU ops. So a file
 * here holds only what g++ can compile once the includer has provided the
 * CUDA dialect (__global__, __device__, __shared__, threadIdx and the
 * other built-in variables, min, __syncthreads, __shfl_xor_sync): nvcc, or
 * the emulation's definitions made before the include. That is kernels,
 * __device__ helpers, their constants and the pure host functions that
 * give their launch shapes; no launches (<<<...>>> is not C++), no runtime
 * calls, no CUDA headers and no state (cuda/ops_cuda_state.cuh). The
 * per-element arithmetic is base/ops_math.h's, the functions the CPU
 * backend calls. A file includes the families it builds on; cuda_fatal
 * (cuda/device.h) is the includer's to declare. */
#ifndef DTRAIN_CUDA_KERNELS_COMMON_CUH
#define DTRAIN_CUDA_KERNELS_COMMON_CUH

#include "cuda/kernels/store16.cuh" /* DT_STORE16 */

#define THREADS 256     /* threads of row and elementwise kernels */
#define MAX_GRID 65535u /* cap of grid-stride elementwise grids */

static unsigned grid_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return b > MAX_GRID ? MAX_GRID : (unsigned)(b ? b : 1);
}

#define GRID_STRIDE(i, n)                                                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#endif
