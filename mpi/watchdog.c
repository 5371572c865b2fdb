/* Communication watchdog: see watchdog.h. */
#include "mpi/watchdog.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How long a rank whose watchdog fired after another rank's waits for
 * that rank to end the job (it asks every rank, up to a second, first). */
#define QUIET_WAIT_S 10

struct watchdog {
    double timeout_s;
    char who[160];
    pthread_t thread;
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t wake;  /* signalled by watchdog_stop */
    int stop;
    /* the blocking call in progress; op == NULL: none */
    const char *op, *group;
    int size, peer;
    long long bytes;
    struct timespec since; /* CLOCK_MONOTONIC at watchdog_enter */
    char failure[512];     /* watchdog_note_failure's message, or "" */
    /* who the peers are, for the abort line (watchdog_set_hosts,
     * watchdog_add_group); absent: the line names group ranks only */
    char *hosts; /* world_size names of hostlen bytes, by world rank */
    int hostlen, world_size;
    struct watch_group {
        char name[16];
        int size;
        int32_t *world; /* world rank of each group rank */
    } groups[WATCHDOG_MAX_GROUPS];
    int ngroups;
    /* watchdog_on_fire's function, called before the line */
    int (*on_fire)(void *ctx, char *silent, size_t len);
    void *on_fire_ctx;
};

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* "4 KiB", "1.5 MiB": bytes as a person reads them. */
static void human_bytes(char *buf, size_t len, long long b)
{
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%lld bytes", b);
    else
        snprintf(buf, len, "%.*f %s", v < 10 ? 1 : 0, v, unit[u]);
}

static const struct watch_group *find_group(const watchdog_t *w, const char *name)
{
    for (int i = 0; i < w->ngroups; i++)
        if (strcmp(w->groups[i].name, name) == 0)
            return &w->groups[i];
    return NULL;
}

static const char *host_of(const watchdog_t *w, int world_rank)
{
    if (!w->hosts || world_rank < 0 || world_rank >= w->world_size)
        return "?";
    return w->hosts + (size_t)world_rank * (size_t)w->hostlen;
}

/* ", peer pp rank 1 = rank 3 on node2": the peer by its group rank, and,
 * when the group is known, by world rank and host, so the line says which
 * process (and which machine) stopped answering. */
static void describe_peer(const watchdog_t *w, char *buf, size_t len)
{
    const struct watch_group *g = find_group(w, w->group);
    int n = snprintf(buf, len, ", peer %s rank %d", w->group, w->peer);
    if (g && w->peer < g->size && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " = rank %d on %s", g->world[w->peer], host_of(w, g->world[w->peer]));
}

/* "; ranks 0,1 on node1, 2,3 on node2": a stuck collective does not say
 * which member is missing, so the line lists them all by host (at most
 * 8 ranks a host and 4 hosts shown). */
static void describe_members(const watchdog_t *w, char *buf, size_t len)
{
    const struct watch_group *g = find_group(w, w->group);
    buf[0] = '\0';
    if (!g || !w->hosts)
        return;
    size_t at = 0;
    int shown_hosts = 0;
    for (int i = 0; i < g->size && at < len; i++) {
        const char *h = host_of(w, g->world[i]);
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = strcmp(host_of(w, g->world[j]), h) == 0;
        if (seen)
            continue;
        if (shown_hosts++ == 4) {
            snprintf(buf + at, len - at, ", ...");
            return;
        }
        int n = snprintf(buf + at, len - at, "%s", i ? ", " : "; ranks ");
        for (int j = i, k = 0; j < g->size && n >= 0 && at + (size_t)n < len; j++) {
            if (strcmp(host_of(w, g->world[j]), h) != 0)
                continue;
            if (k++ == 8) {
                n += snprintf(buf + at + n, len - at - (size_t)n, ",...");
                break;
            }
            n += snprintf(buf + at + n, len - at - (size_t)n, "%s%d", k > 1 ? "," : "", g->world[j]);
        }
        if (n < 0)
            return;
        at += (size_t)n;
        if (at < len)
            at += (size_t)snprintf(buf + at, len - at, " on %s", h);
    }
}

/* Called with w->lock held and a call in progress for longer than the
 * timeout: prints the line and ends the job. Does not return. */
static void fire(watchdog_t *w, double waited_s)
{
    char what[96] = "";
    if (w->bytes >= 0)
        human_bytes(what, sizeof what, w->bytes);
    char peer[320] = "";
    if (w->peer >= 0)
        describe_peer(w, peer, sizeof peer);
    else
        describe_members(w, peer, sizeof peer);
    char silent[256] = "";
    if (w->on_fire && w->on_fire(w->on_fire_ctx, silent, sizeof silent)) {
        /* another rank is printing the job's line and ending the job: wait
         * for its MPI_Abort, which ends this rank too. Aborting at once
         * would have the launcher wake stopped peers (SIGCONT) before that
         * rank has asked who no longer answers. Should it never come, end
         * the job from here after QUIET_WAIT_S. */
        struct timespec t = {QUIET_WAIT_S, 0};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {
        }
        alarm(30);
        MPI_Abort(MPI_COMM_WORLD, 1);
        _exit(1);
    }
    fprintf(stderr,
            "dtrain: %s: %s on group %s (%d ranks%s%s%s) has not finished after %.0f s (--comm-timeout %g): "
            "%s%s; aborting the job%s%s\n",
            w->who, w->op, w->group, w->size, what[0] ? ", " : "", what, peer, waited_s, w->timeout_s,
            silent[0] ? silent : "a peer rank is stuck or dead", silent[0] ? " stopped answering" : "",
            w->failure[0] ? "; this rank had failed first: " : "", w->failure);
    fflush(stderr);
    alarm(30); /* should MPI_Abort block, SIGALRM's default action ends the process */
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

static void *watch_loop(void *arg)
{
    watchdog_t *w = arg;
    /* wake often enough that the job ends within ~1/8 of the timeout after
     * it, and at most once a second */
    double period = w->timeout_s / 8 < 1.0 ? w->timeout_s / 8 : 1.0;
    if (period < 0.01)
        period = 0.01;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until); /* pthread_cond_timedwait's default clock */
        long long ns = (long long)until.tv_nsec + (long long)(period * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        int rc = pthread_cond_timedwait(&w->wake, &w->lock, &until);
        if (rc != 0 && rc != ETIMEDOUT && rc != EINTR)
            break;
        if (!w->stop && w->op) {
            double waited = seconds_since(&w->since);
            if (waited > w->timeout_s)
                fire(w, waited);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

watchdog_t *watchdog_start(double timeout_s, const char *who, char *err, size_t errlen)
{
    if (!(timeout_s > 0)) {
        snprintf(err, errlen, "watchdog: the timeout must be positive (got %g)", timeout_s);
        return NULL;
    }
    watchdog_t *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory for the communication watchdog");
        return NULL;
    }
    w->timeout_s = timeout_s;
    snprintf(w->who, sizeof w->who, "%s", who);
    if (pthread_mutex_init(&w->lock, NULL) != 0) {
        snprintf(err, errlen, "watchdog: pthread_mutex_init failed");
        free(w);
        return NULL;
    }
    if (pthread_cond_init(&w->wake, NULL) != 0) {
        snprintf(err, errlen, "watchdog: pthread_cond_init failed");
        pthread_mutex_destroy(&w->lock);
        free(w);
        return NULL;
    }
    /* The thread inherits the signal mask: block everything in it, so that
     * SIGUSR1/SIGTERM (stop requests) and SIGINT keep reaching the main
     * thread as before. */
    sigset_t all, old;
    sigfillset(&all);
    int rc = pthread_sigmask(SIG_SETMASK, &all, &old);
    if (rc == 0) {
        rc = pthread_create(&w->thread, NULL, watch_loop, w);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (rc != 0) {
        snprintf(err, errlen, "watchdog: cannot start its thread: %s", strerror(rc));
        pthread_cond_destroy(&w->wake);
        pthread_mutex_destroy(&w->lock);
        free(w);
        return NULL;
    }
    return w;
}

void watchdog_stop(watchdog_t *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    for (int i = 0; i < w->ngroups; i++)
        free(w->groups[i].world);
    free(w->hosts);
    free(w);
}

int watchdog_set_hosts(watchdog_t *w, const char *hosts, int hostlen, int world_size)
{
    if (!w || hostlen <= 0 || world_size <= 0)
        return -1;
    char *copy = malloc((size_t)hostlen * (size_t)world_size);
    if (!copy)
        return -1;
    memcpy(copy, hosts, (size_t)hostlen * (size_t)world_size);
    for (int r = 0; r < world_size; r++)
        copy[(size_t)(r + 1) * (size_t)hostlen - 1] = '\0';
    pthread_mutex_lock(&w->lock);
    free(w->hosts);
    w->hosts = copy;
    w->hostlen = hostlen;
    w->world_size = world_size;
    pthread_mutex_unlock(&w->lock);
    return 0;
}

int watchdog_add_group(watchdog_t *w, const char *name, int size, const int32_t *world_ranks)
{
    if (!w || size <= 0 || w->ngroups == WATCHDOG_MAX_GROUPS)
        return -1;
    int32_t *copy = malloc((size_t)size * sizeof *copy);
    if (!copy)
        return -1;
    memcpy(copy, world_ranks, (size_t)size * sizeof *copy);
    pthread_mutex_lock(&w->lock);
    struct watch_group *g = &w->groups[w->ngroups++];
    snprintf(g->name, sizeof g->name, "%s", name);
    g->size = size;
    g->world = copy;
    pthread_mutex_unlock(&w->lock);
    return 0;
}

void watchdog_enter(watchdog_t *w, const char *op, const char *group, int size, long long bytes, int peer)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->op = op;
    w->group = group;
    w->size = size;
    w->bytes = bytes;
    w->peer = peer;
    clock_gettime(CLOCK_MONOTONIC, &w->since);
    pthread_mutex_unlock(&w->lock);
}

void watchdog_leave(watchdog_t *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->op = NULL;
    pthread_mutex_unlock(&w->lock);
}

void watchdog_note_failure(watchdog_t *w, const char *msg)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    snprintf(w->failure, sizeof w->failure, "%s", msg ? msg : "unknown error");
    pthread_mutex_unlock(&w->lock);
}

void watchdog_on_fire(watchdog_t *w, int (*fn)(void *ctx, char *silent, size_t len), void *ctx)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->on_fire = fn;
    w->on_fire_ctx = ctx;
    pthread_mutex_unlock(&w->lock);
}

void watchdog_describe_wait(void *ctx, char *buf, size_t len)
{
    watchdog_t *w = ctx;
    buf[0] = '\0';
    /* never wait: the lock is held for good once the watchdog has fired */
    if (!w || pthread_mutex_trylock(&w->lock) != 0)
        return;
    if (w->op) {
        char peer[320] = "";
        const double s = seconds_since(&w->since);
        if (w->peer >= 0) {
            describe_peer(w, peer, sizeof peer); /* ", peer pp rank 1 = rank 2 on node2" */
            snprintf(buf, len, "waiting %.1f s in %s on group %s%s", s, w->op, w->group, peer);
        } else {
            describe_members(w, peer, sizeof peer); /* "; ranks 0,1 on node1", or "" */
            snprintf(buf, len, "waiting %.1f s in %s on group %s%s%s%s", s, w->op, w->group, peer[0] ? " (" : "",
                     peer[0] ? peer + 2 : "", peer[0] ? ")" : "");
        }
    }
    pthread_mutex_unlock(&w->lock);
}
