#include "mpi/launch.h"

#include "mpi/agree.h"

#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The one piece of state outside the run context: a signal handler gets no
 * argument to find a context through. Written only by the handler, read by
 * launch_stop_signal; sig_atomic_t makes both async-signal-safe. */
static volatile sig_atomic_t stop_signal;
/* launch_notify_term's descriptor, or -1; set by the main thread, read by
 * the handler */
static volatile sig_atomic_t term_fd = -1;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
    const int fd = term_fd;
    if (sig == SIGTERM && fd >= 0) {
        const int saved = errno; /* the interrupted code may be about to read it */
        ssize_t n = write(fd, "T", 1);
        (void)n; /* a full pipe already holds a wake-up */
        errno = saved;
    }
}

void launch_notify_term(int fd) { term_fd = fd; }

int launch_stop_signal(void) { return (int)stop_signal; }

/* SIGUSR1 (SLURM's warning before the time limit, --signal) and SIGTERM
 * (scancel, preemption, the time limit itself) only set the flag; the
 * training loop checkpoints and exits at its next step boundary. SA_RESTART:
 * a signal must not fail a write or an MPI call with EINTR. SIGINT keeps its
 * default, so ^C still ends an interactive run at once; a rank that never
 * reaches a step boundary is SIGKILLed by SLURM after KillWait. */
int launch_catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    if (sigemptyset(&sa.sa_mask) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
        return -1;
    /* SIGPIPE ignored (as Python, and so Megatron and torchtitan, do): a
     * write to a socket whose far end died (Open MPI's TCP transport to a
     * lost node, a dtrain-serve client that hung up) or to a closed stdout
     * pipe fails with EPIPE instead of killing the rank without a word;
     * the transport reports the error, or the --comm-timeout watchdog ends
     * the job with its line naming the lost ranks. */
    sa.sa_handler = SIG_IGN;
    sa.sa_flags = 0;
    if (sigaction(SIGPIPE, &sa, NULL) != 0)
        return -1;
    return 0;
}

/* An integer environment variable; def when unset or not a number. */
static long long env_ll(const char *name, long long def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    return *end ? def : x;
}

static void env_str(char *dst, size_t n, const char *name, const char *fallback)
{
    const char *v = getenv(name);
    if ((!v || !*v) && fallback)
        v = getenv(fallback);
    snprintf(dst, n, "%s", v ? v : "");
}

/* Who started us. OpenMPI's mpirun (orted) gives every rank
 * OMPI_COMM_WORLD_SIZE; srun's direct launch gives every task its own
 * SLURM_STEP_ID and SLURM_PROCID and no OMPI_COMM_WORLD_*. Under mpirun
 * inside an allocation the SLURM_* task variables are orted's (SLURM_PROCID
 * and SLURM_LOCALID 0 on every rank), so they are never used for identity. */
static void detect_launcher(launch_env_t *env)
{
    if (getenv("OMPI_COMM_WORLD_SIZE")) {
        env->kind = LAUNCH_MPIRUN;
        env->local_var = "OMPI_COMM_WORLD_LOCAL_RANK";
    } else if (getenv("SLURM_STEP_ID") && getenv("SLURM_PROCID")) {
        env->kind = LAUNCH_SRUN;
        env->local_var = "SLURM_LOCALID";
    } else {
        env->kind = env->world_size == 1 ? LAUNCH_SINGLETON : LAUNCH_OTHER;
        env->local_var = NULL;
    }
}

/* A failed collective of the launch: MPI errors are not recoverable. */
static void comm_check(status_t rc, const char *err)
{
    if (rc == STATUS_OK)
        return;
    fprintf(stderr, "dtrain: MPI error at launch: %s\n", err);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Cross-checks MPI's local rank with the launcher's: a disagreement means
 * ranks were placed differently from what the launcher thinks (and device
 * binding by local rank would pick the wrong GPU). Collective. */
static void check_local_rank(launch_env_t *env)
{
    int var = env->local_var ? (int)env_ll(env->local_var, -1) : env->local_rank;
    int32_t first = var != env->local_rank ? env->world_rank : INT32_MAX;
    char cerr[COMM_ERR_MAX];
    comm_check(env->world->ops->allreduce(env->world, &first, 1, COMM_INT32, COMM_MIN, cerr, sizeof cerr), cerr);
    env->mismatch_rank = first == INT32_MAX ? -1 : (int)first;
    if (first == INT32_MAX)
        return;
    int32_t pair[2] = {env->local_rank, var};
    comm_check(env->world->ops->broadcast(env->world, pair, 2, COMM_INT32, (int)first, cerr, sizeof cerr), cerr);
    env->mismatch_mpi = pair[0];
    env->mismatch_var = pair[1];
}

/* Gathers each rank's host and local rank on rank 0 for the banner's host
 * layout. Collective. */
static void gather_hosts(launch_env_t *env)
{
    char me[LAUNCH_HOST_MAX];
    snprintf(me, sizeof me, "%.*s", LAUNCH_HOST_MAX - 1, env->host);
    if (env->world_rank == 0) {
        env->rank_host = malloc((size_t)env->world_size * LAUNCH_HOST_MAX);
        env->rank_local = malloc((size_t)env->world_size * sizeof *env->rank_local);
        if (!env->rank_host || !env->rank_local) { /* the others are entering the gather: end, never hang */
            fprintf(stderr, "dtrain: out of memory for the host names of %d ranks\n", env->world_size);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    launch_mpi_check(
        MPI_Gather(me, LAUNCH_HOST_MAX, MPI_CHAR, env->rank_host, LAUNCH_HOST_MAX, MPI_CHAR, 0, MPI_COMM_WORLD),
        "MPI_Gather(host names)");
    launch_mpi_check(MPI_Gather(&env->local_rank, 1, MPI_INT, env->rank_local, 1, MPI_INT, 0, MPI_COMM_WORLD),
                     "MPI_Gather(local ranks)");
}

static void read_slurm_job(launch_env_t *env)
{
    env_str(env->job_id, sizeof env->job_id, "SLURM_JOB_ID", "SLURM_JOBID");
    env_str(env->nodelist, sizeof env->nodelist, "SLURM_JOB_NODELIST", "SLURM_NODELIST");
    env->restart_count = (int)env_ll("SLURM_RESTART_COUNT", 0);
    env->n_job_nodes = (int)env_ll("SLURM_JOB_NUM_NODES", env_ll("SLURM_NNODES", 0));
    env->end_time = env_ll("SLURM_JOB_END_TIME", 0);
}

void launch_mpi_check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "dtrain: MPI error in %s: %s\n", what, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

void launch_init(launch_env_t *env, int *argc, char ***argv)
{
    memset(env, 0, sizeof *env);
    /* OpenMPI's default in-place MPI_Iallreduce is a binomial tree whose
     * post blocks for a whole round (about 2x a blocking allreduce at 64 MB,
     * ../shared/notes/platform.md); the ring is as fast as the blocking
     * call. An MCA parameter has no API, so set it before MPI_Init unless the
     * user chose one. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    /* MULTIPLE where the library has it: --ckpt-async's writer thread makes
     * MPI-IO calls on its own communicator while the main thread trains */
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dtrain: MPI_Init_thread failed: check the MPI installation and launcher\n");
        exit(1);
    }
    env->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    /* errors come back as codes, checked at each call */
    launch_mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    launch_mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &env->world_rank), "MPI_Comm_rank");
    launch_mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &env->world_size), "MPI_Comm_size");
    MPI_Comm node;
    launch_mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env->world_rank, MPI_INFO_NULL, &node),
                     "MPI_Comm_split_type");
    launch_mpi_check(MPI_Comm_rank(node, &env->local_rank), "MPI_Comm_rank(node)");
    launch_mpi_check(MPI_Comm_size(node, &env->local_size), "MPI_Comm_size(node)");
    launch_mpi_check(MPI_Comm_free(&node), "MPI_Comm_free");
    int len = 0;
    char name[MPI_MAX_PROCESSOR_NAME] = "";
    launch_mpi_check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name");
    snprintf(env->host, sizeof env->host, "%s", name);
    MPI_Comm world = MPI_COMM_WORLD;
    if (!(env->world = comm_mpi_create(&world))) {
        fprintf(stderr, "dtrain: cannot make the world communicator (MPI_Comm_dup of MPI_COMM_WORLD)\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int32_t nodes = env->local_rank == 0;
    char cerr[COMM_ERR_MAX];
    comm_check(env->world->ops->allreduce(env->world, &nodes, 1, COMM_INT32, COMM_SUM, cerr, sizeof cerr), cerr);
    env->n_nodes = (int)nodes;
    detect_launcher(env);
    check_local_rank(env);
    gather_hosts(env);
    read_slurm_job(env);
}

static const char *kind_name(launch_kind_t k)
{
    switch (k) {
    case LAUNCH_SINGLETON: return "singleton (no launcher)";
    case LAUNCH_SRUN: return "srun";
    case LAUNCH_MPIRUN: return "mpirun";
    default: return "unknown launcher";
    }
}

/* The ranks on host h (local: their local ranks): "0,1", or past 8 of
 * them "0,2,...,14 (8 ranks)"-style, the first 8 and a count. */
static void print_on_host(const launch_env_t *env, FILE *out, const char *h, int local)
{
    int n = 0;
    for (int r = 0; r < env->world_size; r++) {
        if (strcmp(env->rank_host + (size_t)r * LAUNCH_HOST_MAX, h) != 0)
            continue;
        if (n < 8)
            fprintf(out, "%s%d", n ? "," : "", local ? env->rank_local[r] : r);
        else if (n == 8)
            fprintf(out, ",...");
        n++;
    }
    if (n > 8)
        fprintf(out, " (%d ranks)", n);
}

/* The host layout, rank 0 only, on more than one node: which ranks each
 * host runs and their local ranks there (a GPU is picked by local rank, so
 * on every node these must count from 0). At most 16 hosts shown. */
static void describe_hosts(const launch_env_t *env, FILE *out)
{
    if (env->n_nodes < 2 || !env->rank_host || !env->rank_local)
        return;
    fprintf(out, "hosts:");
    int shown = 0;
    for (int r = 0; r < env->world_size; r++) {
        const char *h = env->rank_host + (size_t)r * LAUNCH_HOST_MAX;
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = strcmp(env->rank_host + (size_t)q * LAUNCH_HOST_MAX, h) == 0;
        if (seen)
            continue;
        if (shown++ == 16) {
            fprintf(out, ", ... (%d hosts)", env->n_nodes);
            break;
        }
        fprintf(out, "%s %s ranks ", shown > 1 ? "," : "", h);
        print_on_host(env, out, h, 0);
        fprintf(out, " (local ");
        print_on_host(env, out, h, 1);
        fprintf(out, ")");
    }
    fprintf(out, "\n");
}

void launch_describe(const launch_env_t *env, FILE *out)
{
    if (env->world_rank != 0)
        return;
    fprintf(out, "launch: %s, %d rank%s on %d node%s", kind_name(env->kind), env->world_size,
            env->world_size == 1 ? "" : "s", env->n_nodes, env->n_nodes == 1 ? "" : "s");
    if (env->mismatch_rank >= 0)
        fprintf(out,
                "; warning: rank %d's local rank is %d by MPI but %s=%d: check the launcher's task "
                "placement\n",
                env->mismatch_rank, env->mismatch_mpi, env->local_var, env->mismatch_var);
    else if (env->local_var)
        fprintf(out, ", local ranks agree with %s\n", env->local_var);
    else
        fprintf(out, "\n");
    describe_hosts(env, out);
    if (!env->job_id[0])
        return;
    fprintf(out, "slurm: job %s, restart %d, %d node%s %s, time limit ", env->job_id, env->restart_count,
            env->n_job_nodes, env->n_job_nodes == 1 ? "" : "s", env->nodelist[0] ? env->nodelist : "?");
    if (env->end_time > 0) {
        long long left = env->end_time - (long long)time(NULL);
        time_t end = (time_t)env->end_time;
        struct tm tm;
        char when[32] = "?";
        if (localtime_r(&end, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        if (left < 0)
            left = 0;
        fprintf(out, "%s (%lldh%02lldm%02llds left)\n", when, left / 3600, left / 60 % 60, left % 60);
    } else {
        fprintf(out, "unknown (SLURM_JOB_END_TIME unset)\n");
    }
}

status_t launch_any_failed(const launch_env_t *env, const char *prog, int failed, const char *msg)
{
    char buf[AGREE_MSG_MAX] = "";
    if (failed) {
        snprintf(buf, sizeof buf, "%s", msg ? msg : "unknown error");
        watchdog_note_failure(env->world ? env->world->watch : NULL, buf);
    }
    int first = -1;
    const status_t st = agree_rank(env->world, failed, buf, sizeof buf, &first);
    if (st == STATUS_OK)
        return STATUS_OK;
    if (first < 0) { /* the agreement itself failed: MPI errors are not recoverable */
        fprintf(stderr, "%s: error: %s\n", prog, buf);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (env->world_rank == 0) {
        if (env->world_size > 1 && first > 0)
            fprintf(stderr, "%s: error: rank %d: %s\n", prog, first, buf);
        else
            fprintf(stderr, "%s: error: %s\n", prog, buf);
        fflush(stderr);
    }
    return st;
}

void launch_exit(const launch_env_t *env, int status)
{
    fflush(stdout);
    fflush(stderr);
    if (env->world)
        env->world->ops->destroy(env->world);
    free(env->rank_host);
    free(env->rank_local);
    MPI_Finalize();
    exit(status);
}
