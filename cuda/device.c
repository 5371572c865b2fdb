#include "device.h"

#include <cuda_runtime.h>
#include <stdio.h>

int cuda_device_count(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "%s (%s)", cudaGetErrorString(rc), cudaGetErrorName(rc));
        return -1;
    }
    return n;
}
