/* CUDA device discovery (built only with --with-cuda). The CUDA ops table
 * and NCCL communicators build on this; until they exist the banner says
 * what is visible and that training runs on the CPU. */
#ifndef DTRAIN_CUDA_DEVICE_H
#define DTRAIN_CUDA_DEVICE_H

#include <stddef.h>

/* Number of visible devices (>= 0), or -1 with the CUDA error in err. */
int cuda_device_count(char *err, size_t errlen);

#endif
