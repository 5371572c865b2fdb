#include "src/train/straggler.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* DTRAIN_TEST_SLOW_RANK=R:MS -> this rank's delay in seconds (0 unless it
 * is rank R). A malformed value is an error, not silently ignored. */
static int read_test_delay(straggler_t *s, char *err, size_t errlen)
{
    const char *v = getenv("DTRAIN_TEST_SLOW_RANK");
    s->slow_s = 0.0;
    if (!v || !v[0])
        return 0;
    int r, used = 0;
    double ms;
    if (sscanf(v, "%d:%lf%n", &r, &ms, &used) != 2 || v[used] != '\0' || r < 0 || ms < 0 || ms > 1e6) {
        snprintf(err, errlen, "DTRAIN_TEST_SLOW_RANK '%s': expected RANK:MILLISECONDS (a test-only delay)", v);
        return -1;
    }
    if (r == s->rank)
        s->slow_s = ms * 1e-3;
    return 0;
}

/* gethostname, cut to what JSON and the report line take as they are */
static void host_name(char *out)
{
    char h[256] = "";
    if (gethostname(h, sizeof h) != 0 || !h[0])
        snprintf(h, sizeof h, "?");
    h[sizeof h - 1] = '\0';
    for (char *p = h; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-' && *p != '_')
            *p = '?';
    memset(out, 0, STRAGGLER_HOST_MAX);
    snprintf(out, STRAGGLER_HOST_MAX, "%s", h);
}

int straggler_setup(straggler_t *s, comm_t *world, int every, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->every = every;
    s->rank = world->rank;
    s->size = world->size;
    s->first = 1;
    if (read_test_delay(s, err, errlen) != 0)
        return -1;
    if (every <= 0)
        return 0;
    s->hosts = calloc((size_t)s->size, STRAGGLER_HOST_MAX);
    s->means = calloc(2 * (size_t)s->size, sizeof *s->means);
    if (!s->hosts || !s->means) {
        snprintf(err, errlen, "out of memory for --straggler-every");
        return -1;
    }
    char mine[STRAGGLER_HOST_MAX];
    host_name(mine);
    char cerr[COMM_ERR_MAX];
    if (world->ops->allgather(world, mine, s->hosts, STRAGGLER_HOST_MAX, COMM_BYTE, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "--straggler-every: the all-gather of the host names failed: %s", cerr);
        return -1;
    }
    return 0;
}

void straggler_test_delay(const straggler_t *s)
{
    if (s->slow_s <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)s->slow_s,
                          .tv_nsec = (long)((s->slow_s - (double)(time_t)s->slow_s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) /* resumed after a signal (SIGUSR1 asks the run to stop, not to hurry) */
        ;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* rank 0: the slowest rank of the gathered means and the median over ranks */
static void fill_report(const straggler_t *s, int step, straggler_report_t *rep)
{
    double *sorted = s->means + s->size;
    int worst = 0;
    for (int r = 0; r < s->size; r++) {
        sorted[r] = s->means[r];
        if (s->means[r] > s->means[worst])
            worst = r;
    }
    qsort(sorted, (size_t)s->size, sizeof *sorted, cmp_double);
    const int h = s->size / 2;
    rep->median_ms = s->size % 2 ? sorted[h] : 0.5 * (sorted[h - 1] + sorted[h]);
    rep->steps = s->n;
    rep->first = s->first;
    rep->last = step;
    rep->rank = worst;
    rep->ms = s->means[worst];
    snprintf(rep->host, sizeof rep->host, "%s", s->hosts + (size_t)worst * STRAGGLER_HOST_MAX);
}

int straggler_step(straggler_t *s, comm_t *world, int step, double compute_s, straggler_report_t *rep, char *err,
                   size_t errlen)
{
    memset(rep, 0, sizeof *rep);
    if (s->every <= 0)
        return 0;
    if (s->n == 0)
        s->first = step;
    s->sum_s += compute_s;
    s->n++;
    if (step % s->every != 0)
        return 0;
    double mine = 1e3 * s->sum_s / s->n;
    char cerr[COMM_ERR_MAX];
    if (world->ops->allgather(world, &mine, s->means, 1, COMM_FP64, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "step %d: --straggler-every: the all-gather of the compute times failed: %s", step, cerr);
        return -1;
    }
    if (s->rank == 0)
        fill_report(s, step, rep);
    s->sum_s = 0.0;
    s->n = 0;
    return 0;
}

void straggler_format(const straggler_report_t *rep, char *buf, size_t len)
{
    snprintf(buf, len, "straggler: rank %d (%s) compute %.1f ms/step, %.2fx the median %.1f ms (steps %d-%d)",
             rep->rank, rep->host, rep->ms, rep->median_ms > 0 ? rep->ms / rep->median_ms : 1.0, rep->median_ms,
             rep->first, rep->last);
}

void straggler_free(straggler_t *s)
{
    free(s->hosts);
    free(s->means);
    memset(s, 0, sizeof *s);
}
