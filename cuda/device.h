/* CUDA device discovery and selection (built only with --with-cuda).
 * Plain C interface, usable from C and from the .cu files. */
#ifndef DTRAIN_CUDA_DEVICE_H
#define DTRAIN_CUDA_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible devices (>= 0), or -1 with the CUDA error in err
 * ("CUDA driver version is insufficient for CUDA runtime version
 * (cudaErrorInsufficientDriver)" on a machine without a GPU driver). */
int cuda_device_count(char *err, size_t errlen);

/* The device of the rank with this local rank: local_rank % count. Sets it
 * current for the calling thread. Returns the device id, or -1 with one
 * line in err (no device visible, or cudaSetDevice failed). */
int cuda_select_device(int local_rank, char *err, size_t errlen);

/* The device's 16-byte UUID (cudaDeviceProp.uuid: the physical GPU,
 * whatever CUDA_VISIBLE_DEVICES numbers it). 0, or -1 with err. */
int cuda_device_uuid(int dev, unsigned char uuid[16], char *err, size_t errlen);

/* "NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB" for device dev, into buf. */
void cuda_device_describe(int dev, char *buf, size_t len);

/* An unrecoverable CUDA, cuBLAS or NCCL failure inside an op (the ops table
 * has no error returns: a failed kernel leaves the device unusable).
 * Prints "dtrain: error: [rank R: ]CUDA <what>: <msg>" on this rank's
 * stderr and aborts the job with status 2 (MPI_Abort when MPI is up). */
void cuda_fatal(const char *what, const char *msg);

#ifdef __cplusplus
}
#endif

#endif
