/* What every communicator implementation shares (comm.h): the gradient
 * reduction dtype. The fp32 <-> bf16 staging casts around the *_bf16
 * collectives are the ops table's (ops->cast_*), since the buffers are the
 * backend's. */
#include "mpi/comm.h"

#include <string.h>

int comm_dtype_parse(const char *s, comm_dtype_t *dtype)
{
    if (s && strcmp(s, "fp32") == 0) {
        *dtype = COMM_FP32;
        return 0;
    }
    if (s && strcmp(s, "bf16") == 0) {
        *dtype = COMM_BF16;
        return 0;
    }
    return -1;
}
