/* Id-broadcast bootstrap over the grid's MPI groups (see bootstrap.h). */
#include "mpi/bootstrap.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>

int bootstrap_group_id(comm_t *c, void *id, size_t len, bootstrap_make_id_fn make, void *ctx, char *err, size_t errlen)
{
    MPI_Comm mc;
    if (len == 0 || len > BOOTSTRAP_MAX_ID || !make || comm_mpi_handle(c, &mc) != 0) {
        snprintf(err, errlen, "bootstrap: needs an MPI communicator and an id of 1..%d bytes", BOOTSTRAP_MAX_ID);
        return -1;
    }
    /* [status byte][id][rank 0's error line]: one broadcast says both
     * whether rank 0 made the id and, if not, why */
    unsigned char buf[1 + BOOTSTRAP_MAX_ID + 256];
    memset(buf, 0, sizeof buf);
    if (c->rank == 0) {
        char why[256] = "";
        if (make(buf + 1, len, ctx, why, sizeof why) == 0) {
            buf[0] = 1;
        } else {
            memcpy(buf + 1 + BOOTSTRAP_MAX_ID, why, sizeof why);
            buf[sizeof buf - 1] = '\0';
        }
    }
    int rc = MPI_Bcast(buf, (int)sizeof buf, MPI_BYTE, 0, mc);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING] = "";
        int n = 0;
        MPI_Error_string(rc, msg, &n);
        snprintf(err, errlen, "bootstrap: MPI_Bcast of the id (group size %d) failed: %s", c->size, msg);
        return -1;
    }
    if (!buf[0]) {
        snprintf(err, errlen, "bootstrap: group rank 0 could not make the id: %s",
                 (const char *)(buf + 1 + BOOTSTRAP_MAX_ID));
        return -1;
    }
    memcpy(id, buf + 1, len);
    return 0;
}

int bootstrap_grid_groups(const grid_t *g, comm_t **list, const char **names) { return grid_groups(g, list, names); }

int bootstrap_grid_ids(const grid_t *g, size_t len, bootstrap_make_id_fn make, void *ctx, unsigned char *ids,
                       comm_t **list, const char **names, char *err, size_t errlen)
{
    int n = bootstrap_grid_groups(g, list, names), failed = 0;
    /* after a failure the walk goes on, so that every group's broadcast is
     * still entered by all its members: the others would wait forever */
    for (int i = 0; i < n; i++) {
        char why[400] = "";
        if (bootstrap_group_id(list[i], ids + (size_t)i * len, len, make, ctx, why, sizeof why) != 0 && !failed++)
            snprintf(err, errlen, "%s group: %s", names[i], why);
    }
    return failed ? -1 : n;
}
