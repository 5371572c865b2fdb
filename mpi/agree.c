/* Deciding together (agree.h): one all-reduce of the lowest failing rank,
 * then, only when some rank failed, one broadcast of its status and
 * message. */
#include "mpi/agree.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* What the lowest failing rank broadcasts: its status, then its message. */
typedef struct verdict {
    int32_t status;
    char msg[AGREE_MSG_MAX];
} verdict_t;

status_t agree_rank(comm_t *c, int status, char *msg, size_t len, int *rank)
{
    int32_t low = status != 0 ? (int32_t)c->rank : INT32_MAX;
    if (rank)
        *rank = -1;
    if (c->ops->allreduce(c, &low, 1, COMM_INT32, COMM_MIN) != 0)
        return status_set(STATUS_FAIL, msg, len, "agreeing on the ranks' status failed: %s", c->err);
    if (low == INT32_MAX)
        return STATUS_OK;
    verdict_t v = {.status = status_of(status), .msg = "error"};
    if (c->rank == low && msg && len > 0 && msg[0])
        snprintf(v.msg, sizeof v.msg, "%.*s", (int)(len < sizeof v.msg ? len : sizeof v.msg) - 1, msg);
    if (c->ops->broadcast(c, &v, sizeof v, COMM_BYTE, (int)low) != 0)
        return status_set(STATUS_FAIL, msg, len, "agreeing on rank %d's error failed: %s", (int)low, c->err);
    v.msg[sizeof v.msg - 1] = '\0';
    if (rank)
        *rank = (int)low;
    return status_set(status_of(v.status), msg, len, "%s", v.msg);
}

status_t agree(comm_t *c, int status, char *msg, size_t len)
{
    return agree_rank(c, status, msg, len, NULL);
}
