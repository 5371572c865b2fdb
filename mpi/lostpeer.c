/* Naming the ranks that stopped answering: see lostpeer.h. */
#define _GNU_SOURCE /* pipe2, qsort_r */
#include "mpi/lostpeer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mpi/clock.h"

#define MAGIC 0x64744c50u  /* "dtLP" */
#define RESEND_S 0.05      /* a question is asked again this often until answered */
#define FIND_WAIT_S 0.2    /* how long the search for the judge waits on each step */
#define CHECK_WAIT_S 3.0   /* the start-up check's patience: the peers' threads may start late */
#define CLAIM_SETTLE_S 0.2 /* how long a rank that claimed the line listens for a lower rank's claim */
#define WINDOW 128         /* ranks asked at once */
#define RCVBUF (4 << 20)   /* answers to WINDOW questions sent to several addresses each */

/* ASK: are you there (flag: and judge, you are the lowest rank that is);
 * ANSWER: yes (flag: I know the verdict); VERDICT: the ranks still there
 * are known, report nothing (flag: and a rank printed the job's line, the
 * report's or the watchdog's: print no other) */
enum { ASK = 1, ANSWER = 2, VERDICT = 3 };

/* One datagram; every field in network byte order. */
struct msg {
    uint32_t magic;
    uint32_t type;     /* ASK, ANSWER, VERDICT */
    uint32_t token[2]; /* the job's (rank 0's token) */
    uint32_t from, to; /* world ranks */
    uint32_t flag;
    uint32_t round; /* the asker's round of questions, echoed in the answer */
};

/* A rank's state in one round of questions */
enum { IDLE = 0, ASKED = 1, ANSWERED = 2 };

struct lostpeer {
    int rank, size;
    char who[160];
    int answer_fd, ask_fd; /* UDP, bound to every interface */
    int wake[2];           /* pipe: 'T' at SIGTERM, 'S' for a survey, 'Q' to quit */
    pthread_t thread;
    int running;
    uint32_t token[2]; /* the job's */
    lostpeer_addr_t *peers;
    char *hosts; /* size names of hostlen bytes */
    int hostlen;
    int *rep; /* by world rank: the lowest rank on the same host */
    void (*describe)(void *ctx, char *buf, size_t len);
    void *ctx;
    atomic_int checked;     /* lostpeer_check passed: a SIGTERM asks */
    atomic_int verdict;     /* a VERDICT came, or this rank judged */
    atomic_int line;        /* a rank printed the job's line (a VERDICT with the flag, or this one) */
    atomic_int line_from;   /* the lowest other rank whose VERDICT had the flag (size: none) */
    atomic_int judge_asked; /* a rank asked this one to judge */
    pthread_mutex_t rx;     /* reading the answering socket: the thread, and lostpeer_claim_line */
    /* lostpeer_claim_line's survey, run by the thread: the ranks that did
     * not answer, described; done when set */
    pthread_mutex_t survey_mu;
    pthread_cond_t survey_cv;
    int survey_done;
    char survey[256];
    /* the thread's alone */
    int termed;     /* handled a SIGTERM */
    int judged;     /* judged, or is judging */
    uint32_t round; /* rounds of questions asked so far: an answer to an earlier one is stale */
    /* one round of questions, by world rank (the start-up check on the
     * main thread, then the thread's: never both, `checked` orders them) */
    unsigned char *state;
    int *targets;
};

static const char *host_of(const lostpeer_t *lp, int r) { return lp->hosts + (size_t)r * (size_t)lp->hostlen; }

/* A UDP socket on every interface, any port, nonblocking. -1 with err. */
static int open_udp(char *err, size_t errlen)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open a UDP socket: %s", strerror(errno));
        return -1;
    }
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        snprintf(err, errlen, "cannot bind a UDP socket: %s", strerror(errno));
        close(fd);
        return -1;
    }
    int sz = RCVBUF;
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz,
                     sizeof sz); /* the kernel's rmem_max caps it: resends cover drops */
    return fd;
}

static int port_of(int fd, uint32_t *port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return 0;
}

/* This host's IPv4 addresses that are up and not loopback, at most
 * LOSTPEER_ADDRS. */
static int local_addrs(uint32_t *ip, char *err, size_t errlen)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        snprintf(err, errlen, "cannot list the network interfaces: %s", strerror(errno));
        return -1;
    }
    int n = 0;
    for (struct ifaddrs *i = ifs; i && n < LOSTPEER_ADDRS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        ip[n++] = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
    }
    freeifaddrs(ifs);
    return 0;
}

static void random_token(uint32_t token[2])
{
    if (getrandom(token, 2 * sizeof *token, 0) != (ssize_t)(2 * sizeof *token)) {
        /* no entropy source: the time and the process still tell two jobs apart */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        token[0] = (uint32_t)t.tv_nsec ^ ((uint32_t)getpid() << 16);
        token[1] = (uint32_t)t.tv_sec;
    }
}

lostpeer_t *lostpeer_open(int rank, int size, const char *who, lostpeer_addr_t *mine, char *err, size_t errlen)
{
    lostpeer_t *lp = calloc(1, sizeof *lp);
    if (!lp) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    lp->rank = rank;
    lp->size = size;
    atomic_init(&lp->line_from, size);
    lp->answer_fd = lp->ask_fd = lp->wake[0] = lp->wake[1] = -1;
    lp->rx = lp->survey_mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    lp->survey_cv = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
    snprintf(lp->who, sizeof lp->who, "%s", who);
    memset(mine, 0, sizeof *mine);
    if ((lp->answer_fd = open_udp(err, errlen)) < 0 || (lp->ask_fd = open_udp(err, errlen)) < 0 ||
        local_addrs(mine->ip, err, errlen) != 0) {
        lostpeer_close(lp);
        return NULL;
    }
    if (port_of(lp->answer_fd, &mine->port) != 0) {
        snprintf(err, errlen, "cannot read the UDP socket's port: %s", strerror(errno));
        lostpeer_close(lp);
        return NULL;
    }
    if (pipe2(lp->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, errlen, "cannot make a pipe: %s", strerror(errno));
        lp->wake[0] = lp->wake[1] = -1;
        lostpeer_close(lp);
        return NULL;
    }
    random_token(mine->token);
    return lp;
}

/* Sends a datagram of `type` to rank `to` at each of its addresses (and at
 * 127.0.0.1 when it runs on this host). A full socket buffer drops it: the
 * caller asks again. */
static void send_to(const lostpeer_t *lp, int fd, int to, uint32_t type, int flag, uint32_t round)
{
    struct msg m = {htonl(MAGIC),
                    htonl(type),
                    {htonl(lp->token[0]), htonl(lp->token[1])},
                    htonl((uint32_t)lp->rank),
                    htonl((uint32_t)to),
                    htonl((uint32_t)flag),
                    htonl(round)};
    const lostpeer_addr_t *p = &lp->peers[to];
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)p->port);
    if (strcmp(host_of(lp, to), host_of(lp, lp->rank)) == 0) {
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        (void)sendto(fd, &m, sizeof m, 0, (struct sockaddr *)&a, sizeof a);
    }
    for (int i = 0; i < LOSTPEER_ADDRS && p->ip[i]; i++) {
        a.sin_addr.s_addr = p->ip[i];
        (void)sendto(fd, &m, sizeof m, 0, (struct sockaddr *)&a, sizeof a);
    }
}

/* Reads one datagram of this job from fd into *m (host byte order). 1, or
 * 0 when none is left. */
static int receive(const lostpeer_t *lp, int fd, struct msg *m, struct sockaddr_in *from)
{
    for (;;) {
        socklen_t len = sizeof *from;
        ssize_t k = recvfrom(fd, m, sizeof *m, 0, (struct sockaddr *)from, &len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return 0;
        if (k != (ssize_t)sizeof *m || ntohl(m->magic) != MAGIC || ntohl(m->token[0]) != lp->token[0] ||
            ntohl(m->token[1]) != lp->token[1])
            continue; /* not ours: another job's, or a stray datagram */
        m->type = ntohl(m->type);
        m->from = ntohl(m->from);
        m->to = ntohl(m->to);
        m->flag = ntohl(m->flag);
        m->round = ntohl(m->round);
        if (m->from < (uint32_t)lp->size && m->to == (uint32_t)lp->rank)
            return 1;
    }
}

/* Answers every question waiting on the answering socket and takes in
 * the verdicts; a request to judge is left in judge_asked for the
 * thread's loop (it may come in while the thread asks questions of its
 * own, or on another thread). */
static void answer_questions(lostpeer_t *lp)
{
    struct msg m;
    struct sockaddr_in from;
    pthread_mutex_lock(&lp->rx);
    while (receive(lp, lp->answer_fd, &m, &from)) {
        if (m.type == VERDICT) {
            atomic_store(&lp->verdict, 1);
            if (m.flag) {
                atomic_store(&lp->line, 1);
                int low = atomic_load(&lp->line_from);
                while ((int)m.from < low && !atomic_compare_exchange_weak(&lp->line_from, &low, (int)m.from)) {
                }
            }
        } else if (m.type == ASK) {
            struct msg r = {htonl(MAGIC),
                            htonl(ANSWER),
                            {htonl(lp->token[0]), htonl(lp->token[1])},
                            htonl((uint32_t)lp->rank),
                            htonl(m.from),
                            htonl((uint32_t)atomic_load(&lp->verdict)),
                            htonl(m.round)};
            (void)sendto(lp->answer_fd, &r, sizeof r, 0, (struct sockaddr *)&from, sizeof from);
            if (m.flag)
                atomic_store(&lp->judge_asked, 1);
        }
    }
    pthread_mutex_unlock(&lp->rx);
}

/* Reads the answers waiting on the asking socket; returns how many of the
 * ranks asked answered for the first time, and sets *verdict when one
 * knows the verdict. */
static int read_answers(lostpeer_t *lp, int *verdict)
{
    struct msg m;
    struct sockaddr_in from;
    int n = 0;
    while (receive(lp, lp->ask_fd, &m, &from)) {
        if (m.type != ANSWER || m.round != lp->round || lp->state[m.from] != ASKED)
            continue; /* an answer to an earlier round, or a second copy (one per address and asking) */
        lp->state[m.from] = ANSWERED;
        n++;
        if (m.flag)
            *verdict = 1;
    }
    return n;
}

/* Asks ranks t[0..n) whether they are there (judge: and to judge), WINDOW
 * at a time, each window for up to wait_s, again every RESEND_S; with
 * serve, answers the questions of others meanwhile (the thread). Leaves
 * ANSWERED or ASKED in lp->state for each; returns how many answered, and
 * sets *verdict when one knows the verdict. */
static int ask(lostpeer_t *lp, const int *t, int n, int judge, double wait_s, int serve, int *verdict)
{
    int got = 0;
    for (int at = 0; at < n; at += WINDOW) {
        const int m = n - at < WINDOW ? n - at : WINDOW;
        lp->round++;
        for (int i = 0; i < m; i++)
            lp->state[t[at + i]] = ASKED;
        int left = m;
        const double t0 = now_s(), end = t0 + wait_s;
        double next = t0;
        for (double now = t0; left > 0 && now < end; now = now_s()) {
            if (now >= next) {
                for (int i = 0; i < m; i++)
                    if (lp->state[t[at + i]] == ASKED)
                        send_to(lp, lp->ask_fd, t[at + i], ASK, judge, lp->round);
                next = now + RESEND_S;
            }
            const double until = next < end ? next : end;
            struct pollfd p[2] = {{lp->ask_fd, POLLIN, 0}, {lp->answer_fd, POLLIN, 0}};
            if (poll(p, serve ? 2 : 1, (int)((until - now) * 1e3) + 1) < 0 && errno != EINTR)
                break;
            if (serve && (p[1].revents & POLLIN))
                answer_questions(lp);
            if (p[0].revents & POLLIN)
                left -= read_answers(lp, verdict);
        }
        got += m - left;
    }
    return got;
}

/* One rank, asked alone: 1 when it answered. */
static int ask_one(lostpeer_t *lp, int r, int judge, double wait_s, int *verdict)
{
    return ask(lp, &r, 1, judge, wait_s, 1, verdict) == 1;
}

/* Appends to buf at *at, never past len. */
__attribute__((format(printf, 4, 5))) static void cat(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
    if (*at >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    if (n > 0)
        *at = *at + (size_t)n < len ? *at + (size_t)n : len;
}

/* "ranks 2,3 on node2", "rank 5 on n07", "ranks 8-15 on n02, 17 on n03":
 * the ranks that did not answer (state ASKED), by host, at most 8 hosts. */
static void describe_lost(const lostpeer_t *lp, int nlost, char *buf, size_t len)
{
    size_t at = 0;
    cat(buf, len, &at, "%s ", nlost == 1 ? "rank" : "ranks");
    int shown = 0;
    for (int r = 0; r < lp->size; r++) {
        if (lp->state[r] != ASKED)
            continue;
        const char *h = host_of(lp, r);
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = lp->state[q] == ASKED && strcmp(host_of(lp, q), h) == 0;
        if (seen)
            continue;
        if (shown++ == 8) {
            cat(buf, len, &at, ", ... (%d ranks in all)", nlost);
            return;
        }
        cat(buf, len, &at, "%s", shown > 1 ? ", " : "");
        const char *sep = "";
        for (int q = r; q < lp->size; q++) {
            if (lp->state[q] != ASKED || strcmp(host_of(lp, q), h) != 0)
                continue;
            int e = q; /* a run of consecutive lost ranks on h */
            while (e + 1 < lp->size && lp->state[e + 1] == ASKED && strcmp(host_of(lp, e + 1), h) == 0)
                e++;
            cat(buf, len, &at, "%s%d", sep, q);
            if (e == q + 1)
                cat(buf, len, &at, ",%d", e);
            else if (e > q + 1)
                cat(buf, len, &at, "-%d", e);
            sep = ",";
            q = e;
        }
        cat(buf, len, &at, " on %s", h);
    }
}

/* The line, from the rank that prints it. */
static void report(lostpeer_t *lp, int nlost)
{
    char lost[512], doing[400] = "", tail[420] = "";
    describe_lost(lp, nlost, lost, sizeof lost);
    if (lp->describe)
        lp->describe(lp->ctx, doing, sizeof doing);
    if (doing[0])
        snprintf(tail, sizeof tail, "; rank %d was %s", lp->rank, doing);
    fprintf(stderr,
            "dtrain: %s stopped answering: no reply to %s within %.1f s when the job was being ended (SIGTERM)%s\n",
            lost, lp->who, LOSTPEER_WAIT_S, tail);
    fflush(stderr);
}

/* Tells every rank that the verdict is in (line: and that this rank
 * printed the job's line): none reports after this. */
static void send_verdict(lostpeer_t *lp, int line)
{
    atomic_store(&lp->verdict, 1);
    if (line)
        atomic_store(&lp->line, 1);
    for (int r = 0; r < lp->size; r++)
        if (r != lp->rank)
            send_to(lp, lp->answer_fd, r, VERDICT, line, 0);
}

/* The lowest rank still there asks every rank and prints those that do
 * not answer; then every rank knows the verdict, also when all answered:
 * a launcher ends the ranks of one node after another (mpirun its own
 * node's first, 2 s before the others'), and the ranks ended first must
 * not look lost to those ended later. */
static void judge(lostpeer_t *lp)
{
    if (lp->judged || atomic_load(&lp->verdict))
        return;
    lp->judged = 1;
    int n = 0, verdict = 0;
    for (int r = 0; r < lp->size; r++)
        if (r != lp->rank)
            lp->targets[n++] = r;
    const int got = ask(lp, lp->targets, n, 0, LOSTPEER_WAIT_S, 1, &verdict);
    const int lost = got < n && !verdict && !atomic_load(&lp->verdict);
    if (lost)
        report(lp, n - got);
    send_verdict(lp, lost);
}

/* The lowest rank in t[0..n) that answered the last ask(), or -1. */
static int lowest_answered(const lostpeer_t *lp, const int *t, int n)
{
    int low = -1;
    for (int i = 0; i < n; i++)
        if (lp->state[t[i]] == ANSWERED && (low < 0 || t[i] < low))
            low = t[i];
    return low;
}

/* At SIGTERM: find the lowest rank still there and have it judge. The
 * lowest rank of each host that answers speaks for the host (its ranks get
 * the same SIGTERM) and asks rank 0 to judge; only when rank 0 does not
 * answer, the lowest rank below it that does (WINDOW at a time, upwards).
 * So rank 0 hears from one rank per host, not from every rank. */
static void on_term(lostpeer_t *lp)
{
    const int me = lp->rank, host = lp->rep[me];
    int verdict = 0, n = 0;
    if (!atomic_load(&lp->checked) || atomic_load(&lp->verdict))
        return;
    for (int r = host; r < me; r++)
        if (lp->rep[r] == host)
            lp->targets[n++] = r;
    if (n > 0 && ask(lp, lp->targets, n, 0, FIND_WAIT_S, 1, &verdict) > 0)
        return; /* a lower rank of this host speaks for it */
    if (lp->rep[0] != host && ask_one(lp, 0, 1, FIND_WAIT_S, &verdict))
        return; /* rank 0 judges */
    n = 0;
    for (int r = 1; r < me; r++)
        if (lp->rep[r] != host) /* this host's lower ranks did not answer */
            lp->targets[n++] = r;
    for (int at = 0; at < n; at += WINDOW) {
        const int m = n - at < WINDOW ? n - at : WINDOW;
        if (ask(lp, lp->targets + at, m, 0, FIND_WAIT_S, 1, &verdict) > 0) {
            (void)ask_one(lp, lowest_answered(lp, lp->targets + at, m), 1, FIND_WAIT_S, &verdict);
            return;
        }
    }
    judge(lp);
}

/* For lostpeer_claim_line: asks every rank, describes those that do not
 * answer ("" when all do) and hands the words to the waiting thread. */
static void survey(lostpeer_t *lp)
{
    char what[sizeof lp->survey] = "";
    int n = 0, verdict = 0;
    for (int r = 0; r < lp->size; r++)
        if (r != lp->rank)
            lp->targets[n++] = r;
    const int got = ask(lp, lp->targets, n, 0, LOSTPEER_WAIT_S, 1, &verdict);
    if (got < n)
        describe_lost(lp, n - got, what, sizeof what);
    pthread_mutex_lock(&lp->survey_mu);
    memcpy(lp->survey, what, sizeof what);
    lp->survey_done = 1;
    pthread_cond_signal(&lp->survey_cv);
    pthread_mutex_unlock(&lp->survey_mu);
}

static void *run(void *arg)
{
    lostpeer_t *lp = arg;
    for (;;) {
        struct pollfd p[2] = {{lp->answer_fd, POLLIN, 0}, {lp->wake[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return NULL;
        }
        if (p[1].revents & POLLIN) {
            char c[16];
            ssize_t k = read(lp->wake[0], c, sizeof c);
            for (ssize_t i = 0; i < k; i++) {
                if (c[i] == 'Q')
                    return NULL;
                if (c[i] == 'S')
                    survey(lp);
                if (c[i] == 'T' && !lp->termed) {
                    lp->termed = 1;
                    on_term(lp);
                }
            }
        }
        if (p[0].revents & POLLIN)
            answer_questions(lp);
        if (atomic_load(&lp->judge_asked) && atomic_load(&lp->checked))
            judge(lp);
    }
}

static int by_host(const void *a, const void *b, void *lp)
{
    const int x = *(const int *)a, y = *(const int *)b;
    const int c = strcmp(host_of(lp, x), host_of(lp, y));
    return c ? c : (x > y) - (x < y);
}

/* rep[r]: the lowest rank on r's host (sorting by host, then rank: N log N
 * comparisons, not N^2). 0, or -1 out of memory. */
static int find_reps(lostpeer_t *lp)
{
    int *order = malloc((size_t)lp->size * sizeof *order);
    lp->rep = malloc((size_t)lp->size * sizeof *lp->rep);
    if (!order || !lp->rep) {
        free(order);
        return -1;
    }
    for (int r = 0; r < lp->size; r++)
        order[r] = r;
    qsort_r(order, (size_t)lp->size, sizeof *order, by_host, lp);
    for (int i = 0; i < lp->size; i++)
        lp->rep[order[i]] =
            i > 0 && strcmp(host_of(lp, order[i]), host_of(lp, order[i - 1])) == 0 ? lp->rep[order[i - 1]] : order[i];
    free(order);
    return 0;
}

int lostpeer_start(lostpeer_t *lp, const lostpeer_addr_t *all, const char *hosts, int hostlen, char *err, size_t errlen)
{
    lp->peers = malloc((size_t)lp->size * sizeof *lp->peers);
    lp->hosts = malloc((size_t)lp->size * (size_t)hostlen);
    lp->state = calloc((size_t)lp->size, 1);
    lp->targets = malloc((size_t)lp->size * sizeof *lp->targets);
    if (!lp->peers || !lp->hosts || !lp->state || !lp->targets) {
        snprintf(err, errlen, "out of memory for %d ranks' addresses", lp->size);
        return -1;
    }
    memcpy(lp->peers, all, (size_t)lp->size * sizeof *lp->peers);
    memcpy(lp->hosts, hosts, (size_t)lp->size * (size_t)hostlen);
    lp->hostlen = hostlen;
    for (int r = 0; r < lp->size; r++)
        lp->hosts[(size_t)(r + 1) * (size_t)hostlen - 1] = '\0';
    if (find_reps(lp) != 0) {
        snprintf(err, errlen, "out of memory for %d ranks' hosts", lp->size);
        return -1;
    }
    lp->token[0] = all[0].token[0];
    lp->token[1] = all[0].token[1];
    /* the thread takes no signal: SIGTERM and the others stay the main thread's */
    sigset_t every, old;
    sigfillset(&every);
    int rc = pthread_sigmask(SIG_SETMASK, &every, &old);
    if (rc == 0) {
        rc = pthread_create(&lp->thread, NULL, run, lp);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (rc != 0) {
        snprintf(err, errlen, "cannot start its thread: %s", strerror(rc));
        return -1;
    }
    lp->running = 1;
    return 0;
}

int lostpeer_check(lostpeer_t *lp, char *err, size_t errlen)
{
    int n = 0, verdict = 0;
    if (lp->rank == 0)
        for (int r = 1; r < lp->size; r++)
            lp->targets[n++] = r;
    else /* the paths a SIGTERM takes: to the host's first rank, from there to rank 0 */
        lp->targets[n++] = lp->rep[lp->rank] != lp->rank ? lp->rep[lp->rank] : 0;
    if (ask(lp, lp->targets, n, 0, CHECK_WAIT_S, 0, &verdict) < n) {
        for (int i = 0; i < n; i++)
            if (lp->state[lp->targets[i]] != ANSWERED) {
                int r = lp->targets[i];
                snprintf(err, errlen, "rank %d (host %s) did not answer over UDP within %.0f s", r, host_of(lp, r),
                         CHECK_WAIT_S);
                break;
            }
        return -1;
    }
    atomic_store(&lp->checked, 1);
    return 0;
}

void lostpeer_set_context(lostpeer_t *lp, void (*describe)(void *ctx, char *buf, size_t len), void *ctx)
{
    lp->describe = describe;
    lp->ctx = ctx;
}

int lostpeer_term_fd(const lostpeer_t *lp) { return lp ? lp->wake[1] : -1; }

int lostpeer_claim_line(lostpeer_t *lp, char *silent, size_t len)
{
    if (len > 0)
        silent[0] = '\0';
    if (!lp || !lp->running)
        return 0;
    /* a verdict that came while this process was stopped (SIGSTOP, then the
     * launcher's SIGCONT) waits in the socket: read it before deciding */
    answer_questions(lp);
    if (atomic_exchange(&lp->line, 1))
        return 1;
    const double claimed = now_s();
    send_verdict(lp, 1);
    /* the survey, on the thread that owns the asking socket; it may be busy
     * with a SIGTERM's questions for up to a second first */
    pthread_mutex_lock(&lp->survey_mu);
    lp->survey_done = 0;
    pthread_mutex_unlock(&lp->survey_mu);
    if (write(lp->wake[1], "S", 1) != 1)
        return 0;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* pthread_cond_timedwait's clock */
    until.tv_sec += 2;
    pthread_mutex_lock(&lp->survey_mu);
    int rc = 0;
    while (!lp->survey_done && rc == 0)
        rc = pthread_cond_timedwait(&lp->survey_cv, &lp->survey_mu, &until);
    if (lp->survey_done && len > 0)
        snprintf(silent, len, "%s", lp->survey);
    pthread_mutex_unlock(&lp->survey_mu);
    /* two watchdogs that fire within one datagram's flight of each other
     * both claimed (a rank waiting on a lost peer and its TP partner
     * waiting on it time out in the same second): the lower rank prints.
     * Its VERDICT is sent before its survey, so by the end of this one's,
     * and at least CLAIM_SETTLE_S after the claim, it is here. */
    const double settle = claimed + CLAIM_SETTLE_S - now_s();
    if (settle > 0) {
        struct timespec t = {0, (long)(settle * 1e9)};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {
        }
    }
    answer_questions(lp);
    return atomic_load(&lp->line_from) < lp->rank;
}

void lostpeer_close(lostpeer_t *lp)
{
    if (!lp)
        return;
    if (lp->running) {
        /* the pipe has room for this byte unless the thread is stuck, which it never is for long */
        while (write(lp->wake[1], "Q", 1) < 0 && errno == EINTR) {
        }
        pthread_join(lp->thread, NULL);
    }
    for (int i = 0; i < 2; i++)
        if (lp->wake[i] >= 0)
            close(lp->wake[i]);
    if (lp->answer_fd >= 0)
        close(lp->answer_fd);
    if (lp->ask_fd >= 0)
        close(lp->ask_fd);
    free(lp->peers);
    free(lp->hosts);
    free(lp->state);
    free(lp->targets);
    free(lp->rep);
    pthread_mutex_destroy(&lp->rx);
    pthread_mutex_destroy(&lp->survey_mu);
    pthread_cond_destroy(&lp->survey_cv);
    free(lp);
}
