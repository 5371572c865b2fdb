#define _POSIX_C_SOURCE 200809L /* open_memstream, ftello, fseeko, ftruncate */
#include "src/train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

void metrics_format_bytes(char *buf, size_t len, double bytes)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
}

void metrics_format_duration(char *buf, size_t len, double s)
{
    const long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t < 60)
        snprintf(buf, len, "%lds", t);
    else if (t < 3600)
        snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else if (t < 86400)
        snprintf(buf, len, "%ldh%02ldm", t / 3600, t % 3600 / 60);
    else
        snprintf(buf, len, "%ldd%02ldh", t / 86400, t % 86400 / 3600);
}

void metrics_eta(step_eta_t *e, step_record_t *r, int ckpt_every, int end)
{
    if (!e->seen_first) {
        e->first_ms = r->ms;
        e->seen_first = 1;
    } else {
        e->ms[e->next] = r->ms;
        e->next = (e->next + 1) % METRICS_ETA_WINDOW;
        e->n += e->n < METRICS_ETA_WINDOW;
    }
    double mean = e->first_ms;
    if (e->n > 0) {
        mean = 0.0;
        for (int i = 0; i < e->n; i++)
            mean += e->ms[i];
        mean /= e->n;
    }
    r->left_s = r->steps > r->step ? 1e-3 * mean * (r->steps - r->step) : 0.0;
    r->ckpt_left_s = 0.0;
    if (ckpt_every > 0) {
        int next = (r->step / ckpt_every + 1) * ckpt_every;
        next = next < end ? next : end;
        if (next > r->step)
            r->ckpt_left_s = 1e-3 * mean * (next - r->step);
    }
}

void metrics_print_step(FILE *out, const step_record_t *r)
{
    fprintf(out, "step %*d/%d | loss %.6f", r->steps >= 10000 ? 6 : 4, r->step, r->steps, r->loss);
    if (!isnan(r->val_loss))
        fprintf(out, " | val %.6f", r->val_loss);
    for (int i = 0; i < r->n_mc; i++)
        fprintf(out, " | %s acc_norm %.4f acc %.4f", r->mc[i].name, r->mc[i].acc_norm, r->mc[i].acc);
    if (r->n_moe > 0) {
        double m[4] = {0};
        for (int i = 0; i < r->n_moe; i++)
            for (int k = 0; k < 4; k++)
                m[k] += r->moe_layer[i][k] / r->n_moe;
        fprintf(out, " | moe aux %.4f z %.3f load %.2f", m[0], m[1], m[2]);
        if (m[3] > 0)
            fprintf(out, " dropped %.1f%%", 100.0 * m[3]);
    }
    fprintf(out, " | lr %.3e | norm %.4f | %.1f ms", r->lr, r->grad_norm, r->ms);
    if (r->comm_ms > 0 || r->bubble_max > 0)
        fprintf(out, " (compute %.1f/%.1f, comm wait %.1f/%.1f", r->compute_ms_max, r->compute_ms_mean, r->comm_ms,
                r->comm_ms_mean);
    if (r->a2a_ms > 0)
        fprintf(out, " of which all-to-all %.1f/%.1f", r->a2a_ms, r->a2a_ms_mean);
    if (r->ring_attn_ms > 0)
        fprintf(out, " of which ring %.1f/%.1f", r->ring_ms, r->ring_ms_mean);
    if (r->bubble_max > 0)
        fprintf(out, ", bubble %.0f%%/%.0f%%", 100.0 * r->bubble_max, 100.0 * r->bubble_mean);
    if (r->comm_ms > 0 || r->bubble_max > 0)
        fprintf(out, " max/mean)");
    fprintf(out, " | %.0f tok/s | MFU %.1f%%", r->tokens_per_s, 100.0 * r->mfu);
    char a[32], b[32];
    metrics_format_duration(a, sizeof a, r->left_s);
    metrics_format_duration(b, sizeof b, r->ckpt_left_s);
    const int left = r->left_s >= 0.5, ckpt = r->ckpt_left_s >= 0.5; /* "0s" says nothing */
    if (left && ckpt)
        fprintf(out, " | %s left, ckpt in %s", a, b);
    else if (left || ckpt)
        fprintf(out, " | %s %s", left ? a : "ckpt in", left ? "left" : b);
    fputc('\n', out);
    if (r->straggler.steps > 0) {
        char line[256];
        straggler_format(&r->straggler, line, sizeof line);
        fprintf(out, "%s\n", line);
    }
    fflush(out);
}

int metrics_write_tfevents(tfevents_t *w, const step_record_t *r, double wall_time, char *err, size_t errlen)
{
    enum { NMEM = MEM_N_CATEGORIES + 1 };
    char mem_tags[NMEM][64], mc_tags[2 * METRICS_MC_MAX][96];
    tfevents_scalar_t v[13 + NMEM + 2 * METRICS_MC_MAX];
    int n = 0;
    v[n++] = (tfevents_scalar_t){"train/loss", r->loss};
    if (!isnan(r->val_loss))
        v[n++] = (tfevents_scalar_t){"val/loss", r->val_loss};
    v[n++] = (tfevents_scalar_t){"train/lr", r->lr};
    v[n++] = (tfevents_scalar_t){"train/grad_norm", r->grad_norm};
    v[n++] = (tfevents_scalar_t){"perf/tokens_per_s", r->tokens_per_s};
    v[n++] = (tfevents_scalar_t){"perf/mfu", r->mfu};
    v[n++] = (tfevents_scalar_t){"perf/step_ms", r->ms};
    v[n++] = (tfevents_scalar_t){"comm/exposed_ms", r->comm_ms};
    if (r->skipped)
        v[n++] = (tfevents_scalar_t){"train/skipped", 1.0};
    for (int i = 0; i < r->n_mc; i++) {
        snprintf(mc_tags[2 * i], sizeof mc_tags[2 * i], "eval/%s/acc", r->mc[i].name);
        snprintf(mc_tags[2 * i + 1], sizeof mc_tags[2 * i + 1], "eval/%s/acc_norm", r->mc[i].name);
        v[n++] = (tfevents_scalar_t){mc_tags[2 * i], r->mc[i].acc};
        v[n++] = (tfevents_scalar_t){mc_tags[2 * i + 1], r->mc[i].acc_norm};
    }
    static const char *const moe_tags[4] = {"moe/aux", "moe/z", "moe/max_load", "moe/dropped"};
    for (int k = 0; k < 4 && r->n_moe > 0; k++) { /* means over the MoE layers */
        double mean = 0.0;
        for (int i = 0; i < r->n_moe; i++)
            mean += r->moe_layer[i][k] / r->n_moe;
        v[n++] = (tfevents_scalar_t){moe_tags[k], mean};
    }
    for (int k = 0; k < NMEM; k++) {
        snprintf(mem_tags[k], sizeof mem_tags[k], "mem/peak_%s_bytes",
                 k < MEM_N_CATEGORIES ? mem_category_name((mem_category_t)k) : "total");
        v[n++] = (tfevents_scalar_t){mem_tags[k], (double)r->mem_peak[k]};
    }
    return tfevents_scalars(w, r->step, wall_time, v, n, err, errlen);
}

/* v in fmt (%.9g where fmt would not fit), or null when it is not finite:
 * JSON has no nan or inf (a %g of them is no JSON any parser reads). buf
 * holds 32. */
static const char *jnum(char *buf, const char *fmt, double v)
{
    if (!isfinite(v))
        return "null";
    if (snprintf(buf, 32, fmt, v) >= 32)
        snprintf(buf, 32, "%.9g", v);
    return buf;
}

/* ", \"key\": v" with v as jnum writes it, unless an earlier fprintf
 * failed (rc < 0). Returns fprintf's result, or rc. */
static int jfield(FILE *f, int rc, const char *key, const char *fmt, double v)
{
    char b[32];
    return rc < 0 ? rc : fprintf(f, ", \"%s\": %s", key, jnum(b, fmt, v));
}

/* Appends len bytes (one record and its newline) to the unbuffered f
 * whole or not at all: a write that fails part way (a full disk) is cut
 * back to where the record began, so the file never ends in a torn line. */
static int append_whole(FILE *f, const char *text, size_t len)
{
    const off_t start = ftello(f);
    if (start < 0)
        return -1;
    if (fwrite(text, 1, len, f) == len && fflush(f) == 0)
        return 0;
    int saved = errno;
    clearerr(f);
    if (ftruncate(fileno(f), start) != 0 || fseeko(f, start, SEEK_SET) != 0) {
        /* errno of the write is what the caller reports */
    }
    errno = saved;
    return -1;
}

/* Formats one record with fmt_fn into memory, then appends it whole. */
static int write_record(FILE *f, int (*fmt_fn)(FILE *, const void *), const void *arg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m)
        return -1;
    int rc = fmt_fn(m, arg);
    if (fclose(m) != 0)
        rc = -1;
    rc = rc < 0 ? -1 : append_whole(f, buf, len);
    free(buf);
    return rc;
}

static int format_val0(FILE *f, const void *arg)
{
    const double val_loss = *(const double *)arg;
    int rc = jfield(f, fprintf(f, "{\"step\": 0"), "val_loss", "%.9g", val_loss);
    return rc < 0 || fprintf(f, "}\n") < 0 ? -1 : 0;
}

int metrics_write_json_val0(FILE *f, double val_loss) { return write_record(f, format_val0, &val_loss); }

static int format_step(FILE *f, const void *arg)
{
    const step_record_t *r = arg;
    int rc = jfield(f, fprintf(f, "{\"step\": %d", r->step), "loss", "%.9g", r->loss);
    if (!isnan(r->val_loss))
        rc = jfield(f, rc, "val_loss", "%.9g", r->val_loss);
    rc = jfield(f, rc, "lr", "%.9g", r->lr);
    rc = jfield(f, rc, "grad_norm", "%.9g", r->grad_norm);
    rc = jfield(f, rc, "ms", "%.3f", r->ms);
    rc = jfield(f, rc, "compute_ms_max", "%.3f", r->compute_ms_max);
    rc = jfield(f, rc, "compute_ms_mean", "%.3f", r->compute_ms_mean);
    rc = jfield(f, rc, "comm_ms", "%.3f", r->comm_ms);
    rc = jfield(f, rc, "comm_ms_mean", "%.3f", r->comm_ms_mean);
    if (r->a2a_ms > 0) {
        rc = jfield(f, rc, "a2a_ms", "%.3f", r->a2a_ms);
        rc = jfield(f, rc, "a2a_ms_mean", "%.3f", r->a2a_ms_mean);
    }
    if (r->ring_attn_ms > 0) {
        rc = jfield(f, rc, "ring_ms", "%.3f", r->ring_ms);
        rc = jfield(f, rc, "ring_ms_mean", "%.3f", r->ring_ms_mean);
        rc = jfield(f, rc, "ring_attn_ms", "%.3f", r->ring_attn_ms);
        rc = jfield(f, rc, "ring_attn_ms_mean", "%.3f", r->ring_attn_ms_mean);
        rc = jfield(f, rc, "ring_busy_ms", "%.3f", r->ring_busy_ms);
        rc = jfield(f, rc, "ring_busy_ms_mean", "%.3f", r->ring_busy_ms_mean);
    }
    rc = jfield(f, rc, "bubble_max", "%.4f", r->bubble_max);
    rc = jfield(f, rc, "bubble_mean", "%.4f", r->bubble_mean);
    rc = jfield(f, rc, "tokens_per_s", "%.3f", r->tokens_per_s);
    rc = jfield(f, rc, "mfu", "%.6f", r->mfu);
    rc = rc < 0 ? rc : fprintf(f, ", \"mem_peak\": {");
    for (int k = 0; k <= MEM_N_CATEGORIES && rc >= 0; k++)
        rc = fprintf(f, "\"%s\": %lld%s", k < MEM_N_CATEGORIES ? mem_category_name((mem_category_t)k) : "total",
                     r->mem_peak[k], k < MEM_N_CATEGORIES ? ", " : "}");
    if (rc >= 0 && r->ckpt_stall_ms > 0)
        rc = fprintf(f, ", \"ckpt_stall_ms\": %.3f", r->ckpt_stall_ms);
    const straggler_report_t *g = &r->straggler;
    if (rc >= 0 && g->steps > 0)
        rc = fprintf(f,
                     ", \"straggler_rank\": %d, \"straggler_host\": \"%s\", \"straggler_ms\": %.3f, "
                     "\"straggler_median_ms\": %.3f, \"straggler_first_step\": %d",
                     g->rank, g->host, g->ms, g->median_ms, g->first);
    if (rc >= 0 && r->skipped)
        rc = fprintf(f, ", \"skipped\": \"%s\"", r->skipped);
    for (int i = 0; i < r->n_mc && rc >= 0; i++)
        rc = fprintf(f, "%s\"%s\": {\"acc\": %.6f, \"acc_norm\": %.6f, \"examples\": %d}%s",
                     i == 0 ? ", \"eval_mc\": {" : ", ", r->mc[i].name, r->mc[i].acc, r->mc[i].acc_norm,
                     r->mc[i].examples, i + 1 == r->n_mc ? "}" : "");
    static const char *const moe_keys[4] = {"aux", "z", "max_load", "dropped"};
    for (int k = 0; k < 4 && r->n_moe > 0 && rc >= 0; k++) {
        rc = fprintf(f, "%s\"%s\": [", k == 0 ? ", \"moe\": {" : ", ", moe_keys[k]);
        for (int i = 0; i < r->n_moe && rc >= 0; i++)
            rc = fprintf(f, "%.6g%s", r->moe_layer[i][k], i + 1 < r->n_moe ? ", " : "]");
    }
    if (r->n_moe > 0 && rc >= 0) {
        rc = fprintf(f, ", \"layers\": [");
        for (int i = 0; i < r->n_moe && rc >= 0; i++)
            rc = fprintf(f, "%d%s", r->moe_index[i], i + 1 < r->n_moe ? ", " : "]}");
    }
    rc = rc < 0 ? rc : fprintf(f, "}\n");
    return rc < 0 ? -1 : 0;
}

int metrics_write_json(FILE *f, const step_record_t *r) { return write_record(f, format_step, r); }
