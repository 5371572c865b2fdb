/* What every communicator implementation shares (comm.h): the element
 * types' sizes, the operations' names, and the gradient reduction dtype.
 * The fp32 <-> bf16 staging casts around the bf16 collectives are the ops
 * table's (ops->cast_*), since the buffers are the backend's. */
#include "mpi/comm.h"

#include <string.h>

size_t comm_dtype_size(comm_dtype_t dt)
{
    static const size_t size[COMM_N_DTYPES] = {4, 2, 4, 8, 8, 1};
    return (unsigned)dt < COMM_N_DTYPES ? size[dt] : 0;
}

/* one row per kind: blocking names, then nonblocking ones, one per dtype */
#define NAMES(base)                                                                                                    \
    {                                                                                                                  \
        base, base "_bf16", base "_i32", base "_i64", base "_f64", base "_u8"                                          \
    }

const char *comm_op_name(comm_kind_t k, int nonblocking, comm_dtype_t dt)
{
    static const char *const names[COMM_N_KINDS][2][COMM_N_DTYPES] = {
        {NAMES("allreduce"), NAMES("iallreduce")}, {NAMES("reduce_scatter"), NAMES("ireduce_scatter")},
        {NAMES("allgather"), NAMES("iallgather")}, {NAMES("bcast"), NAMES("ibcast")},
        {NAMES("send"), NAMES("isend")},           {NAMES("recv"), NAMES("irecv")},
        {NAMES("alltoallv"), NAMES("ialltoallv")},
    };
    if ((unsigned)k >= COMM_N_KINDS || (unsigned)dt >= COMM_N_DTYPES)
        return "?";
    return names[k][nonblocking != 0][dt];
}

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
