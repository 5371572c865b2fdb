/* Communication watchdog (--comm-timeout): ends the job, with one line
 * naming the stuck operation, when this rank has been blocked in one
 * communication call for longer than the timeout.
 *
 * A rank whose peer died or stopped waits forever inside MPI: a blocking
 * collective, a wait() on a nonblocking one, a receive. MPI offers no
 * timeout, and a job that hangs silently burns its allocation. So a
 * helper thread wakes about once a second (or sooner for short timeouts)
 * and looks at what the main thread is blocked in: the communicator
 * (comm_mpi.c, nccl_comm.c) marks each blocking call with
 * watchdog_enter/watchdog_leave. When one call has lasted longer than the
 * timeout, the thread prints
 *
 *   dtrain: rank 3 (tp 1 pp 1 dp 0, host n07): allreduce on group dp (2 ranks, 4 KiB; ranks 1 on n03, 3 on n07)
 *   has not finished after 600 s (--comm-timeout 600): a peer rank is stuck or dead; aborting the job
 *
 * (a receive names its peer instead: "peer pp rank 1 = rank 5 on n08"; the
 * world ranks and hosts come from watchdog_set_hosts/watchdog_add_group,
 * so that on a cluster the line says which machine stopped answering)
 *
 * and calls MPI_Abort, which ends every rank under mpirun and srun alike.
 * The process asks for MPI_THREAD_MULTIPLE (launch.h); where the library
 * gives less, MPI_Abort from a second thread is outside the standard's
 * promise; the job is already lost, and an alarm(30) set just before makes
 * the process end anyway should MPI_Abort itself block.
 *
 * Only blocking is timed: a nonblocking operation in flight while the
 * rank computes is progress, not a hang; its wait() is timed.
 *
 * Cost: a mutex lock/unlock pair per blocking call, nothing else on the
 * main thread. A NULL watchdog_t * makes enter/leave no-ops. */
#ifndef DTRAIN_WATCHDOG_H
#define DTRAIN_WATCHDOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct watchdog watchdog_t;

#define WATCHDOG_MAX_GROUPS 16 /* at least the grid's GRID_MAX_GROUPS (mpi/grid.h) */

/* Starts the thread. timeout_s > 0; who names this rank in the message
 * ("rank 3 (tp 1 pp 1 dp 0, host n07)"). NULL with err set on failure. */
watchdog_t *watchdog_start(double timeout_s, const char *who, char *err, size_t errlen);

/* The host of every world rank (world_size names of hostlen bytes each,
 * cut to hostlen - 1), copied, for the abort line. Call before the first
 * watchdog_enter. 0, or -1 (out of memory, a bad size, NULL w). */
int watchdog_set_hosts(watchdog_t *w, const char *hosts, int hostlen, int world_size);

/* Group `name` ("pp"): the world rank of each of its `size` ranks, in
 * group rank order, copied, so the abort line names peers by world rank
 * and host. At most WATCHDOG_MAX_GROUPS; call before the first
 * watchdog_enter. 0, or -1. */
int watchdog_add_group(watchdog_t *w, const char *name, int size, const int32_t *world_ranks);

/* Stops and joins the thread, frees w. NULL is fine. */
void watchdog_stop(watchdog_t *w);

/* The calling (main) thread is about to block in `op` ("allreduce",
 * "recv", "wait iallreduce") on group `group` ("dp") of `size` ranks,
 * moving `bytes` bytes (-1: not known), with `peer` (rank in the group)
 * for point to point, else -1. op and group must outlive the call. Calls
 * do not nest: a second enter replaces the first. */
void watchdog_enter(watchdog_t *w, const char *op, const char *group, int size, long long bytes, int peer);

/* The blocking call returned. */
void watchdog_leave(watchdog_t *w);

/* This rank has failed with `msg` and is about to wait for its peers to
 * agree on it (launch_any_failed). A peer stuck elsewhere (the next stage
 * of a pipeline waiting for activations this rank will never send) never
 * joins that agreement, so the watchdog ends the job, and the failure
 * would be lost with it: the abort line then ends with it,
 * "...; this rank had failed first: MSG". A copy is kept; NULL w is fine. */
void watchdog_note_failure(watchdog_t *w, const char *msg);

/* fn(ctx, silent, len) runs on the watchdog's thread when it fires, before
 * its line; when it returns nonzero the line is not printed
 * (lostpeer_claim_line: another rank printed the job's line already), the
 * job is ended all the same. What it writes into silent ("ranks 2,3 on
 * node2") replaces "a peer rank is stuck or dead" in the line, followed by
 * "stopped answering". NULL removes it. fn must return within seconds. */
void watchdog_on_fire(watchdog_t *w, int (*fn)(void *ctx, char *silent, size_t len), void *ctx);

/* What the main thread is blocked in, for another thread's line (ctx: the
 * watchdog_t *): "waiting 2.1 s in irecv on group pp, peer pp rank 1 =
 * rank 2 on node2", or "" when it is in no call or the watchdog is busy
 * (never waits for its lock). The lostpeer_set_context function. */
void watchdog_describe_wait(void *ctx, char *buf, size_t len);

#endif
