/* The TP x PP x DP process grid. Rank order: TP fastest, then DP, then PP,
 *   world_rank = tp + T * (dp + D * pp)
 * (Megatron's order), so a TP group is T consecutive ranks: inside a node. */
#ifndef DTRAIN_GRID_H
#define DTRAIN_GRID_H

#include <stdio.h>

#include "mpi/comm.h"

typedef struct grid {
    int world_rank, world_size;
    int tp_size, pp_size, dp_size;
    int tp_rank, pp_rank, dp_rank;
    /* one communicator per group this rank belongs to */
    comm_t *world, *tp, *dp, *pp;
    comm_t *embed;   /* first and last pipeline stage of this (tp, dp); NULL
                      on middle stages; with pp 1 it is a group of one */
    comm_t *shard;   /* --hybrid-shard H: the H consecutive DP ranks of this
                      rank's shard group (grid_create_shard_group); else NULL */
    comm_t *replica; /* with shard: the dp/H ranks holding the same pieces
                        (one per shard group, same rank within it) */
    /* --ep N (grid_create_ep_groups): Megatron's expert grid, expert-TP =
     * TP x EP x expert-DP x PP with the dense grid's pipeline groups. The
     * EP group is N consecutive DP ranks (tp-ep-dp order: ep fastest
     * inside DP), which split each MoE layer's experts; the expert-DP
     * group is the dp/N ranks holding the same experts (same tp, pp and
     * rank within the EP group). Both NULL without --ep; ep_size 1. */
    comm_t *ep, *edp;
    int ep_size, ep_rank, edp_rank;
    /* --hybrid-shard H with --ep N (grid_create_expert_shard): the H/N
     * (--etp 1: H tp/N) ranks of this rank's expert-DP group inside its
     * shard group, over
     * which ZeRO shards the experts' state (their replicas across the
     * shard groups are the dense part's, g->replica); else NULL */
    comm_t *eshard;
    /* --cp N (grid_create_cp_group): context parallelism. The DP axis
     * then holds DP x CP ranks, CP fastest (world_rank = tp + T * (cp +
     * N * dp + D N pp), Megatron's tp-cp-dp-pp order), so dp, dp_size and
     * dp_rank above are the DP x CP group's: gradients, ZeRO shards and
     * loss means run over it as over data-parallel ranks. The CP group
     * (cp) is N consecutive ranks of it, which share each sequence, each
     * holding two chunks (mpi/cp_sched.h); grid_data_rank/size give the
     * rank among the ranks drawing other data. NULL and 1 without --cp. */
    comm_t *cp;
    int cp_size, cp_rank;
} grid_t;

/* The rank and the number of ranks of the DP group that draw distinct
 * data: dp_rank / cp_size of dp_size / cp_size (the DP rank without --cp). */
int grid_data_rank(const grid_t *g);
int grid_data_size(const grid_t *g);

/* Checks tp * pp * dp == world (dp 0 = world / (tp*pp)) and builds the
 * groups with MPI_Comm_split. Collective over MPI_COMM_WORLD. Returns
 * STATUS_OK; STATUS_INPUT for a layout that does not fit the world (the
 * same message on every rank, found without communication); or
 * STATUS_FAIL on every rank with the lowest failing rank's message
 * ("rank R: ..."). The message goes into err (mpi/status.h). */
status_t grid_create(grid_t *g, int tp, int pp, int dp, char *err, size_t errlen);
void grid_destroy(grid_t *g);

/* HSDP: splits each DP group into dp/H groups of H consecutive DP ranks
 * (g->shard), and across them into H replica groups (g->replica). H must
 * divide dp. Collective over MPI_COMM_WORLD. Returns a status with one
 * line in err. */
status_t grid_create_shard_group(grid_t *g, int H, char *err, size_t errlen);

/* --ep N: splits each DP group into dp/N expert-parallel groups of N
 * consecutive DP ranks (g->ep) and across them into N expert-data-parallel
 * groups (g->edp). N must divide dp (options_resolve checked it).
 * spans_tp (--etp 1 at tp > 1, whole experts): the groups are cut from
 * the TP x DP plane of each pipeline stage instead, its ranks numbered
 * j = tp_rank + tp * dp_rank (world order): the EP group is N consecutive
 * j (TP ranks first, as Megatron's expert grid with ETP 1), the expert-DP
 * group the tp*dp/N ranks with the same j mod N; N divides tp * dp, and N
 * 1 is allowed (the expert-DP group is then the whole plane).
 * Collective over MPI_COMM_WORLD. Returns a status with one line in err. */
status_t grid_create_ep_groups(grid_t *g, int N, int spans_tp, char *err, size_t errlen);

/* --cp N: the CP groups, N consecutive ranks of each DP group (the DP x
 * CP group, see grid_t); N must divide dp_size. Collective over
 * MPI_COMM_WORLD. Returns a status with one line in err. */
status_t grid_create_cp_group(grid_t *g, int N, char *err, size_t errlen);

/* --hybrid-shard H with --ep N: the expert shard groups, g->eshard, n
 * consecutive ranks of each expert-DP group: n = H/N (N dividing H), or
 * with spans_tp (--etp 1, the EP groups cut from the TP x DP plane, as
 * grid_create_ep_groups) n = H tp/N, the expert-DP ranks of a shard
 * group's H x tp slab of the plane. Collective over MPI_COMM_WORLD.
 * Returns a status with one line in err. */
status_t grid_create_expert_shard(grid_t *g, int n, int spans_tp, char *err, size_t errlen);

#define GRID_MAX_GROUPS 11 /* world, tp, dp, pp, embed, shard, replica, ep, edp, cp, eshard */

/* The groups of g this rank belongs to, in the fixed kind order world, tp,
 * dp, pp, embed, shard, replica, ep, edp, cp, eshard (absent ones skipped): list[i], and
 * names[i] ("dp") when names is not NULL. Returns how many. Every rank
 * walks the kinds in the same order and groups of one kind are disjoint,
 * so collectives over them one after another cannot deadlock. */
int grid_groups(const grid_t *g, comm_t **list, const char **names);

/* Prints, on the calling rank, every group of each kind with its world
 * ranks and hosts: "tp group 0: ranks 0,1 (hostA)". Collective (gathers
 * host names); only world rank 0 writes to out. When a tensor-parallel
 * group spans more than one host, rank 0 also writes one warning line to
 * stderr naming the first such group and its hosts (even when out is
 * NULL): the run is correct, but TP across nodes is bandwidth-bound. */
status_t grid_print(const grid_t *g, FILE *out, char *err, size_t errlen);

#endif
