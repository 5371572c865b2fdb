/* Parameter table and initialisation:
 *  - parameter counts of the published models (the table's shapes are right);
 *  - a tensor's values do not depend on how it is sliced (TP 2 and 4 slices are
 *    bit-identical to the matching hyperslab of the unsliced tensor);
 *  - the normal init has the requested mean and standard deviation;
 *  - the same seed gives identical values, another seed different ones. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_config.h"
#include "params.h"

static int failures;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok)
        failures++;
}

static void check_count(const char *preset, size_t want)
{
    param_table_t t;
    char err[256], what[256];
    const model_preset_t *p = model_preset_find(preset);
    if (!p || param_table_build(&t, &p->cfg, 1, 0, err, sizeof err) != 0) {
        check(0, preset);
        return;
    }
    snprintf(what, sizeof what, "%s has %zu parameters (expected %zu)", preset, t.logical_numel, want);
    check(t.logical_numel == want && t.numel == want, what);
    param_table_free(&t);
}

/* Every TP slice equals the corresponding part of the full tensor, bit for bit. */
static void check_slicing(const char *preset, int tp)
{
    const model_preset_t *p = model_preset_find(preset);
    char err[256], what[256];
    param_table_t full;
    if (param_table_build(&full, &p->cfg, 1, 0, err, sizeof err) != 0) {
        check(0, err);
        return;
    }
    float *ref = malloc(full.numel * sizeof *ref);
    param_table_init(&full, ref, 42);
    long long mismatches = 0, compared = 0;
    for (int r = 0; r < tp; r++) {
        param_table_t part;
        if (param_table_build(&part, &p->cfg, tp, r, err, sizeof err) != 0) {
            check(0, err);
            continue;
        }
        float *buf = malloc(part.numel * sizeof *buf);
        param_table_init(&part, buf, 42);
        for (int k = 0; k < part.n; k++) {
            const param_desc_t *d = &part.p[k];
            const param_desc_t *f = &full.p[param_table_find(&full, d->name)];
            for (int64_t i = 0; i < d->count[0]; i++)
                for (int64_t j = 0; j < d->count[1]; j++) {
                    float a = buf[d->offset + i * d->count[1] + j];
                    float b = ref[f->offset + (d->start[0] + i) * f->shape[1] + d->start[1] + j];
                    mismatches += memcmp(&a, &b, sizeof a) != 0;
                    compared++;
                }
        }
        free(buf);
        param_table_free(&part);
    }
    snprintf(what, sizeof what, "%s at tp %d: %lld of %lld sliced elements differ from the unsliced tensor",
             preset, tp, mismatches, compared);
    check(mismatches == 0 && compared > 0, what);
    free(ref);
    param_table_free(&full);
}

static void check_statistics(void)
{
    const model_preset_t *p = model_preset_find("tiny");
    param_table_t t;
    char err[256], what[256];
    param_table_build(&t, &p->cfg, 1, 0, err, sizeof err);
    float *a = malloc(t.numel * sizeof *a), *b = malloc(t.numel * sizeof *b);
    param_table_init(&t, a, 7);
    param_table_init(&t, b, 7);
    check(memcmp(a, b, t.numel * sizeof *a) == 0, "same seed gives bit-identical parameters");
    param_table_init(&t, b, 8);
    const param_desc_t *wfc = &t.p[param_table_find(&t, "h.0.mlp.wfc")];
    size_t same = 0;
    for (size_t i = 0; i < wfc->numel; i++)
        same += a[wfc->offset + i] == b[wfc->offset + i];
    snprintf(what, sizeof what, "another seed changes the weights (%zu of %zu equal)", same, wfc->numel);
    check(same == 0, what);

    double sum = 0, sq = 0;
    for (size_t i = 0; i < wfc->numel; i++) {
        sum += a[wfc->offset + i];
        sq += (double)a[wfc->offset + i] * a[wfc->offset + i];
    }
    double n = (double)wfc->numel, mean = sum / n, std = sqrt(sq / n - mean * mean);
    snprintf(what, sizeof what, "h.0.mlp.wfc: mean %.2e (|mean| < %.1e), std %.5f (0.02 +- 3%%)", mean,
             4 * 0.02 / sqrt(n), std);
    check(fabs(mean) < 4 * 0.02 / sqrt(n) && fabs(std - 0.02) < 0.0006, what);

    const param_desc_t *ln = &t.p[param_table_find(&t, "h.1.ln2.w")];
    const param_desc_t *bias = &t.p[param_table_find(&t, "h.1.mlp.bfc")];
    int ok = 1;
    for (size_t i = 0; i < ln->numel; i++)
        ok &= a[ln->offset + i] == 1.0f;
    for (size_t i = 0; i < bias->numel; i++)
        ok &= a[bias->offset + i] == 0.0f;
    check(ok, "norm weights start at 1 and biases at 0");
    const param_desc_t *proj = &t.p[param_table_find(&t, "h.0.mlp.wproj")];
    sq = 0;
    for (size_t i = 0; i < proj->numel; i++)
        sq += (double)a[proj->offset + i] * a[proj->offset + i];
    std = sqrt(sq / (double)proj->numel);
    double want = 0.02 / sqrt(2.0 * p->cfg.n_layer);
    snprintf(what, sizeof what, "residual projections scaled: std %.5f (%.5f +- 3%%)", std, want);
    check(fabs(std - want) < 0.03 * want, what);
    free(a);
    free(b);
    param_table_free(&t);
}

int main(void)
{
    /* Published counts: GPT-2 124M (untied head counted once), Llama 2 7B and 70B. */
    check_count("gpt2-124m", 124439808);
    check_count("gpt2-350m", 354823168);
    check_count("llama-7b", 6738415616);
    check_count("llama-70b", 68976648192);
    check_slicing("tiny", 2);
    check_slicing("tiny", 4);
    check_slicing("tiny-llama", 2);
    check_statistics();
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
