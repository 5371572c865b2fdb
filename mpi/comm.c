/* What every communicator implementation shares (comm.h): the gradient
 * reduction dtype. The fp32 <-> bf16 staging casts around the *_bf16
 * collectives are the ops table's (ops->cast_*), since the buffers are the
 * backend's. */
#include "mpi/comm.h"

#include <string.h>

const char *const comm_dtype_names[] = {[COMM_FP32] = "fp32", [COMM_BF16] = "bf16", NULL};

int comm_dtype_parse(const char *s, comm_dtype_t *dtype)
{
    for (int i = 0; s && comm_dtype_names[i]; i++)
        if (strcmp(s, comm_dtype_names[i]) == 0) {
            *dtype = (comm_dtype_t)i;
            return 0;
        }
    return -1;
}
