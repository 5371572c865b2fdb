/* Bootstrapping a communicator library that is set up from a shared
 * unique id (NCCL: ncclGetUniqueId / ncclCommInitRank) over the grid's MPI
 * groups: rank 0 of each group makes the id, MPI_Bcast over the group's
 * MPI communicator gives it to every member. No CUDA here: the id maker is
 * a callback, so the CPU tests run this exact code with a fake maker
 * (test/test_bootstrap.c) and cuda/nccl_comm.c with ncclGetUniqueId. */
#ifndef DTRAIN_BOOTSTRAP_H
#define DTRAIN_BOOTSTRAP_H

#include <stddef.h>

#include "mpi/comm.h"
#include "mpi/grid.h"

#define BOOTSTRAP_MAX_GROUPS GRID_MAX_GROUPS
#define BOOTSTRAP_MAX_ID 512 /* bytes; ncclUniqueId is 128 */

/* Makes a new id of `len` bytes into id. Returns 0, or -1 with one line in
 * err. Called only on group rank 0. */
typedef int (*bootstrap_make_id_fn)(void *id, size_t len, void *ctx, char *err, size_t errlen);

/* Collective over the group of c (a comm_mpi_create communicator): group
 * rank 0 calls make, MPI_Bcast shares the id (and whether making it
 * worked). Returns 0 with the id in `id` on every member, or -1 with one
 * line in err on every member. */
int bootstrap_group_id(comm_t *c, void *id, size_t len, bootstrap_make_id_fn make, void *ctx, char *err, size_t errlen);

/* The groups of g this rank belongs to, in the fixed kind order world, tp,
 * dp, pp, embed, shard, replica (absent ones skipped): list[i] and names[i]
 * (grid_groups).
 * Every rank walks the kinds in the same order and groups of one kind are
 * disjoint, so collectives over them one after another cannot deadlock. */
int bootstrap_grid_groups(const grid_t *g, comm_t **list, const char **names);

/* bootstrap_group_id over every group of bootstrap_grid_groups, in order:
 * ids + i*len receives group i's id. Returns the number of groups, or -1
 * with one line in err (naming the first failing group) on the members of
 * a failing group. The walk always enters every group's broadcast, so a
 * failure never leaves another rank waiting; callers agree over the world
 * before going on (agree, mpi/agree.h). */
int bootstrap_grid_ids(const grid_t *g, size_t len, bootstrap_make_id_fn make, void *ctx, unsigned char *ids,
                       comm_t **list, const char **names, char *err, size_t errlen);

#endif
