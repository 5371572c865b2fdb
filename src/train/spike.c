/* Loss spikes and non-finite steps: the window, the decision, the log
 * (see spike.h). */
#include "src/train/spike.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/agree.h"

/* DTRAIN_TEST_INJECT_NAN / _SPIKE: "B[:F],B[:F]..." (test-only). */
static int parse_inject(const char *var, int with_factor, long long *batch, double *factor, int *n, char *err,
                        size_t errlen)
{
    const char *v = getenv(var);
    *n = 0;
    if (!v || !*v)
        return 0;
    const char *p = v;
    while (*p) {
        char *end;
        long long b = strtoll(p, &end, 10);
        double f = 1.0;
        if (end != p && with_factor && *end == ':')
            f = strtod(end + 1, &end);
        if (end == p || b < 1 || *n == SPIKE_MAX_INJECT || (*end && *end != ',')) {
            snprintf(err, errlen, "%s '%s' (a test-only variable): expected up to %d %s separated by commas", var, v,
                     SPIKE_MAX_INJECT, with_factor ? "BATCH:FACTOR" : "batch numbers");
            return -1;
        }
        batch[*n] = b;
        if (factor)
            factor[*n] = f;
        (*n)++;
        p = *end ? end + 1 : end;
    }
    return 0;
}

const char *const spike_verdict_names[] = {
    [SPIKE_UPDATE] = "update", [SPIKE_HIGH] = "loss_spike", [SPIKE_NONFINITE] = "nonfinite"};

int spike_init(spike_t *s, double z, int window, int max, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->z = z;
    s->window = window;
    s->max = max;
    if (window > 0 && !(s->loss = malloc((size_t)window * sizeof *s->loss))) {
        snprintf(err, errlen, "out of memory for --spike-window %d", window);
        return -1;
    }
    if (parse_inject("DTRAIN_TEST_INJECT_NAN", 0, s->nan_batch, NULL, &s->n_nan, err, errlen) != 0 ||
        parse_inject("DTRAIN_TEST_INJECT_SPIKE", 1, s->spike_batch, s->spike_factor, &s->n_spike, err, errlen) != 0)
        return -1;
    return 0;
}

void spike_free(spike_t *s)
{
    free(s->loss);
    memset(s, 0, sizeof *s);
}

void spike_reset(spike_t *s)
{
    s->n = s->head = 0;
    s->in_row = 0;
}

void spike_state_format(const spike_t *s, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "1 %d %d %d", s->in_row, s->first_skipped, s->n);
    for (int i = 0; i < s->n && at + 17 < len; i++) {
        uint64_t bits;
        memcpy(&bits, &s->loss[(s->head - s->n + i + s->window) % s->window], sizeof bits);
        at += (size_t)snprintf(buf + at, len - at, " %016llx", (unsigned long long)bits);
    }
}

int spike_state_parse(spike_t *s, const char *text, char *err, size_t errlen)
{
    int version, in_row, first, n, used;
    spike_reset(s);
    if (sscanf(text, "%d %d %d %d%n", &version, &in_row, &first, &n, &used) != 4 || version != 1 || in_row < 0 ||
        n < 0 || n > SPIKE_WINDOW_MAX) {
        snprintf(err, errlen, "its spike_state attribute '%.40s' is not version 1's \"1 IN_ROW FIRST N LOSSES\"", text);
        return -1;
    }
    const char *p = text + used;
    for (int i = 0; i < n; i++) {
        char *end;
        const unsigned long long bits = strtoull(p, &end, 16);
        if (end - p != 17) { /* a space and 16 hex digits */
            snprintf(err, errlen, "its spike_state attribute holds %d of the %d losses it announces", i, n);
            spike_reset(s);
            return -1;
        }
        p = end;
        if (i >= n - s->window) { /* the newest that fit this run's window */
            memcpy(&s->loss[s->head], &bits, sizeof(double));
            s->head = (s->head + 1) % s->window;
            s->n++;
        }
    }
    s->in_row = in_row;
    s->first_skipped = first;
    return 0;
}

/* Mean and standard deviation (population) of the window, in ring order
 * from the oldest: the same sums on every rank holding the same losses. */
static void window_stats(const spike_t *s, double *mean, double *sd)
{
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < s->n; i++)
        sum += s->loss[(s->head - s->n + i + s->window) % s->window];
    *mean = sum / s->n;
    for (int i = 0; i < s->n; i++) {
        const double d = s->loss[(s->head - s->n + i + s->window) % s->window] - *mean;
        sq += d * d;
    }
    *sd = sqrt(sq / s->n);
}

/* This rank's verdict and, for SPIKE_HIGH, the z score. */
static spike_verdict_t judge(const spike_t *s, double loss, double norm, double *z)
{
    *z = 0.0;
    if (!isfinite(loss) || !isfinite(norm))
        return SPIKE_NONFINITE;
    const int need = s->window < SPIKE_MIN_COUNT ? s->window : SPIKE_MIN_COUNT;
    if (s->max == 0 || s->z <= 0 || s->window == 0 || s->n < need)
        return SPIKE_UPDATE;
    double mean, sd;
    window_stats(s, &mean, &sd);
    if (sd <= 0.0)
        return SPIKE_UPDATE;
    *z = (loss - mean) / sd;
    return *z > s->z ? SPIKE_HIGH : SPIKE_UPDATE;
}

static void accept(spike_t *s, double loss)
{
    s->in_row = 0;
    if (s->window == 0)
        return;
    s->loss[s->head] = loss;
    s->head = (s->head + 1) % s->window;
    if (s->n < s->window)
        s->n++;
}

/* Where the first non-finite gradient is: the lowest world rank holding
 * one in its norm pieces (each logical tensor counted once, as the norm),
 * and there the first in table order. Collective over world. */
static int locate(const spike_ctx_t *c, char *where, size_t len)
{
    const dpsync_t *s = c->sync;
    int found = -1;
    for (int i = 0; i < s->n_norm && found < 0; i++)
        if (!isfinite(s->norm_ss[i]))
            found = i;
    char msg[256] = "";
    if (found >= 0) {
        const char *name = "?";
        for (int k = 0; k < c->table->n; k++) {
            const float *x;
            size_t n;
            const param_desc_t *d = &c->table->p[k];
            if (s->ops->norm_piece(s, d->offset, d->numel, &x, &n) && x == s->norm_x[found]) {
                name = d->name;
                break;
            }
        }
        snprintf(msg, sizeof msg, "rank %d (tp %d pp %d dp %d), tensor %s", c->world_rank, c->tp_rank, c->pp_rank,
                 c->dp_rank, name);
    }
    int rank = -1;
    const status_t rc = agree_rank(c->world, found >= 0 ? -1 : 0, msg, sizeof msg, &rank);
    if (rc == STATUS_OK) {
        snprintf(where, len, "none in the gradients");
        return 0;
    }
    snprintf(where, len, "%s", msg);
    return rank < 0 ? -1 : 0; /* rank < 0: the agreement's own communication failed (msg says how) */
}

/* Rank 0's line for a skipped step. */
static void log_skip(const spike_t *s, int step, int steps, spike_verdict_t v, double loss, double norm, double z,
                     const char *where)
{
    if (v == SPIKE_HIGH) {
        double mean, sd;
        window_stats(s, &mean, &sd);
        printf("spike: step %d/%d skipped: loss %.6f is %.1f standard deviations above the mean %.6f of the last %d "
               "steps (--spike-z %g); no update (%d of --spike-max %d in a row)\n",
               step, steps, loss, z, mean, s->n, s->z, s->in_row, s->max);
    } else {
        printf("spike: step %d/%d skipped: loss %g, gradient norm %g; first non-finite gradient: %s; no update (%d "
               "of --spike-max %d in a row)\n",
               step, steps, loss, norm, where, s->in_row, s->max);
    }
    fflush(stdout);
}

int spike_check(spike_t *s, const spike_ctx_t *c, int step, int steps, double loss, double norm, spike_action_t *act,
                char *err, size_t errlen)
{
    double z;
    int32_t v = (int32_t)judge(s, loss, norm, &z);
    /* the one reduction that decides: every rank skips, or none */
    char cerr[COMM_ERR_MAX];
    if (c->world->size > 1 && c->world->ops->allreduce(c->world, &v, 1, COMM_INT32, COMM_MAX, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "step %d: the all-reduce of the spike verdict failed: %s", step, cerr);
        return -1;
    }
    *act = SPIKE_GO;
    s->verdict = (spike_verdict_t)v;
    if (v == SPIKE_UPDATE) {
        accept(s, loss);
        return 0;
    }
    if (s->max == 0) { /* the guard is off (the z test too): as before it existed */
        snprintf(err, errlen, "step %d: loss %g, gradient norm %g: training diverged; lower --lr or raise --warmup",
                 step, loss, norm);
        return -1;
    }
    char where[300] = "";
    if (v == SPIKE_NONFINITE && locate(c, where, sizeof where) != 0) {
        snprintf(err, errlen, "step %d: locating the non-finite gradient failed: %s", step, where);
        return -1;
    }
    if (s->in_row++ == 0)
        s->first_skipped = step;
    s->skipped++;
    if (c->world_rank == 0)
        log_skip(s, step, steps, (spike_verdict_t)v, loss, norm, z, where);
    *act = s->in_row >= s->max ? SPIKE_ROLLBACK : SPIKE_SKIP;
    return 0;
}

static int injected(const long long *b, int n, int64_t batch)
{
    for (int i = 0; i < n; i++)
        if (b[i] == batch + 1)
            return i;
    return -1;
}

float spike_test_dloss(const spike_t *s, int64_t batch, int micro, int dp_rank, float dloss)
{
    if (s->n_nan == 0 || micro != 0 || dp_rank != 0 || injected(s->nan_batch, s->n_nan, batch) < 0)
        return dloss;
    return INFINITY; /* the backward's loss scale: every gradient of the stage turns inf or nan */
}

float spike_test_loss(const spike_t *s, int64_t batch, int micro, int dp_rank, float loss)
{
    int i;
    if (s->n_spike == 0 || micro != 0 || dp_rank != 0 || (i = injected(s->spike_batch, s->n_spike, batch)) < 0)
        return loss;
    return (float)(loss * s->spike_factor[i]);
}
