/* CUDA device discovery and selection (see device.h). */
#include "cuda/device.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuda_device_count(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "%s (%s)", cudaGetErrorString(rc), cudaGetErrorName(rc));
        (void)cudaGetLastError(); /* not sticky: clear it */
        return -1;
    }
    return n;
}

int cuda_select_device(int local_rank, char *err, size_t errlen)
{
    char why[256] = "";
    int n = cuda_device_count(why, sizeof why);
    if (n < 0) {
        snprintf(err, errlen, "--device cuda: no usable GPU: %s", why);
        return -1;
    }
    if (n == 0) {
        snprintf(err, errlen,
                 "--device cuda: no GPU visible (cudaGetDeviceCount found 0 devices; check CUDA_VISIBLE_DEVICES)");
        return -1;
    }
    int dev = (local_rank < 0 ? 0 : local_rank) % n;
    cudaError_t rc = cudaSetDevice(dev);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "--device cuda: cudaSetDevice(%d) failed: %s (%s)", dev, cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
        return -1;
    }
    return dev;
}

int cuda_device_uuid(int dev, unsigned char uuid[16], char *err, size_t errlen)
{
    struct cudaDeviceProp p;
    cudaError_t rc = cudaGetDeviceProperties(&p, dev);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "cudaGetDeviceProperties(%d): %s (%s)", dev, cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
        return -1;
    }
    memcpy(uuid, p.uuid.bytes, 16);
    return 0;
}

void cuda_device_describe(int dev, char *buf, size_t len)
{
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(buf, len, "device %d (properties unavailable)", dev);
        return;
    }
    snprintf(buf, len, "%s, sm_%d%d, %.1f GiB", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

void cuda_fatal(const char *what, const char *msg)
{
    int up = 0, fin = 0, rank = -1, size = 1;
    MPI_Initialized(&up);
    MPI_Finalized(&fin);
    if (up && !fin) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    if (size > 1)
        fprintf(stderr, "dtrain: error: rank %d: CUDA %s: %s\n", rank, what, msg);
    else
        fprintf(stderr, "dtrain: error: CUDA %s: %s\n", what, msg);
    fflush(stderr);
    if (up && !fin)
        MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}
