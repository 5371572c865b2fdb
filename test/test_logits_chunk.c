/* The fused classifier (model_layout_t's logits_chunk) at the model level,
 * one process, against the whole logits (MODEL_LOGITS_WHOLE) on the same
 * parameters and batches.
 *
 * For tiny (GPT-2: the head is wte, so the head's gradient and the
 * embedding's meet in one tensor) and tiny-llama (its own head), each in
 * fp32 and --dtype bf16, with the vocabulary widened to 1000 (Vl 1024 with
 * its padding columns) and N = 2 x 50 = 100 rows, of which every 7th
 * target is -1 (ignored), for chunks of 1, 7, 33 and 99 rows (a partial
 * last chunk each), 100 and 4096 (one chunk) and auto:
 *   training: two microbatches, the second accumulated (the head's weight
 *     gradient written by the first forward, added by the second): each
 *     microbatch's per-token losses bit-identical to whole's (each row's
 *     softmax from the same reductions) where the chunk is one GEMM of all rows, else within
 *     1e-6 (the CPU's sgemm sums a row's logits in an order that depends on
 *     the rows of the GEMM, seen at 7 and 33 rows); every gradient tensor
 *     within 2e-6 relative (2-norm, worst tensor; the head's weight
 *     gradient sums the rows chunk by chunk), 1e-2 under bf16 (the blocks'
 *     bf16 roundings amplify those last bits), the head's weight gradient
 *     itself within 2e-6 under bf16 too (tiny-llama's own head), and all of
 *     them bit-identical with one chunk (the same GEMMs);
 *   evaluation (dloss 0) of a third batch: losses as above, and the
 *     logits of a forward without targets (model_logits_row: the chunk
 *     holding the row, computed from the final norm's output) equal to
 *     whole's at rows 0, 33, 98 and 99 (bit-identical or within 1e-6, as
 *     the losses);
 *   memory: the activation arena smaller by exactly r(N*Vl), the whole
 *     logits, and the workspace larger only by r(rows*Vl) where the
 *     chunk does not fit the backward's scratch (model.c's layout_acts).
 * Then the contract: a backward given accum 1 after the step's first
 * training forward (which wrote the head's gradient) fails, as does one
 * given last while a later training forward's gradient waits.
 * Prints one line per check; exits 1 if any fails. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/backend/ops_cpu.h"
#include "src/model/model.h"
#include "src/model/model_config.h"

#define TOL 2e-6
/* bf16: the head's fp32 sums in another order flip some bf16 roundings of
 * the blocks' backward GEMM operands (2^-8 each), which the four blocks
 * carry down to the embeddings (tiny's worst, h.0.ln1.w, is 3e-3) */
#define TOL_BF16 1e-2
#define LOSS_TOL 1e-6
enum { B = 2, T = 50, N = B * T, V = 1000 };

static int n_fail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_fail += !ok;
}

/* What one layout gives: per microbatch losses, the gradients after two
 * microbatches, evaluation losses, logits rows. */
typedef struct result {
    float loss[3][N];
    float *grads;
    float logits[4][V];
    size_t act_bytes, work_bytes;
    int xrows;
} result_t;

static const int probe_rows[4] = {0, 33, 98, 99};

static void batch(int k, int32_t *tok, int32_t *tgt)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % V);
        tgt[i] = i % 7 == 3 ? -1 : (int32_t)((s >> 13) % V);
    }
}

static int run(const ops_t *ops, const model_config_t *c, int bf16, int chunk, result_t *r)
{
    model_t m;
    char err[512];
    model_layout_t lay = model_layout_single(c);
    lay.bf16 = bf16;
    lay.logits_chunk = chunk;
    if (model_create(&m, c, ops, &lay, B, T, err, sizeof err) != 0 || model_init_params(&m, 11) != 0) {
        fprintf(stderr, "test_logits_chunk: model_create: %s\n", err);
        return -1;
    }
    int32_t tok[N], tgt[N];
    float loss;
    int bad = 0;
    for (int k = 0; k < 2 && !bad; k++) {
        batch(k, tok, tgt);
        bad |= model_forward(&m, 0, tok, NULL, tgt, B, T, 0.5f, &loss, err, sizeof err) != STATUS_OK;
        model_token_losses(&m, 0, r->loss[k], N);
        bad |= model_backward(&m, 0, k, k == 1, err, sizeof err) != STATUS_OK;
    }
    m.ops->to_host(m.ops->ctx, r->grads, m.grads, m.table.numel * sizeof(float));
    batch(2, tok, tgt);
    bad |= model_forward(&m, 0, tok, NULL, tgt, B, T, 0.0f, &loss, err, sizeof err) != STATUS_OK;
    model_token_losses(&m, 0, r->loss[2], N);
    bad |= model_forward(&m, 0, tok, NULL, NULL, B, T, 0.0f, &loss, err, sizeof err) != STATUS_OK;
    for (int i = 0; i < 4 && !bad; i++)
        bad |= model_logits_row(&m, 0, probe_rows[i], r->logits[i], err, sizeof err) != STATUS_OK;
    if (bad)
        fprintf(stderr, "test_logits_chunk: %s\n", err);
    r->act_bytes = m.act_bytes;
    r->work_bytes = m.work_bytes;
    r->xrows = m.xrows;
    model_destroy(&m);
    return bad ? -1 : 0;
}

/* The worst tensor's ||a - b|| / ||a|| over the parameter table (only
 * the tensor `only` when not NULL), its name into name[64]. */
static double worst_tensor(const model_config_t *c, const float *a, const float *b, const char *only, char *name)
{
    param_table_t t;
    char err[256];
    double worst = 0.0;
    snprintf(name, 64, "-");
    if (param_table_build(&t, c, NULL, err, sizeof err) != 0)
        return INFINITY;
    for (int i = 0; i < t.n; i++) {
        /* GPT-2's key biases: softmax is blind to them, so their gradient
         * is rounding noise (compare_params.py leaves them out too) */
        const size_t len = strlen(t.p[i].name);
        if ((len > 8 && strcmp(t.p[i].name + len - 8, ".attn.bk") == 0) || (only && strcmp(t.p[i].name, only) != 0))
            continue;
        double d = 0.0, n = 0.0;
        for (size_t j = t.p[i].offset; j < t.p[i].offset + t.p[i].numel; j++) {
            d += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
            n += (double)a[j] * a[j];
        }
        const double rel = n > 0 ? sqrt(d / n) : sqrt(d);
        if (rel > worst) {
            worst = rel;
            snprintf(name, 64, "%s", t.p[i].name);
        }
    }
    param_table_free(&t);
    return worst;
}

/* max over i of |a - b| / max(|a|, 1). */
static double max_rel(const float *a, const float *b, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)a[i]), 1.0);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static size_t r64(size_t floats) { return (floats * sizeof(float) + 63) & ~(size_t)63; }

static void compare(const model_config_t *c, const char *label, int bf16, int chunk, const result_t *w,
                    const result_t *f)
{
    char what[96];
    if (chunk == MODEL_LOGITS_AUTO)
        snprintf(what, sizeof what, "%s %s chunk auto (%d rows)", label, bf16 ? "bf16" : "fp32", f->xrows);
    else
        snprintf(what, sizeof what, "%s %s chunk %d", label, bf16 ? "bf16" : "fp32", chunk);
    const int one = f->xrows >= N;
    if (one) {
        check(memcmp(w->loss, f->loss, sizeof w->loss) == 0,
              "%s: per-token losses of two training microbatches and an evaluation bit-identical to whole", what);
    } else {
        const double d = max_rel(&w->loss[0][0], &f->loss[0][0], 3 * N);
        check(d < LOSS_TOL, "%s: per-token losses of two training microbatches and an evaluation within %g of whole (%.3g)",
              what, LOSS_TOL, d);
    }
    char name[64];
    const double rel = worst_tensor(c, w->grads, f->grads, NULL, name);
    size_t numel = 0;
    param_table_t t;
    char err[256];
    if (param_table_build(&t, c, NULL, err, sizeof err) == 0) {
        numel = t.numel;
        param_table_free(&t);
    }
    const double tol = bf16 ? TOL_BF16 : TOL;
    if (one)
        check(memcmp(w->grads, f->grads, numel * sizeof(float)) == 0,
              "%s: gradients after 2 accumulated microbatches bit-identical to whole (one chunk)", what);
    else
        check(rel < tol, "%s: gradients after 2 accumulated microbatches within %g of whole (worst %.3g, %s)", what,
              tol, rel, name);
    if (!one && c->arch == ARCH_LLAMA) { /* the classifier's own gradient, before the blocks' bf16 roundings */
        const double h = worst_tensor(c, w->grads, f->grads, "lm_head.w", name);
        check(h < TOL, "%s: the head's weight gradient within %g of whole (%.3g)", what, TOL, h);
    }
    if (one)
        check(memcmp(w->logits, f->logits, sizeof w->logits) == 0,
              "%s: logits rows 0, 33, 98, 99 of a forward without targets bit-identical to whole", what);
    else {
        const double d = max_rel(&w->logits[0][0], &f->logits[0][0], 4 * V);
        check(d < LOSS_TOL, "%s: logits rows 0, 33, 98, 99 of a forward without targets within %g of whole (%.3g)",
              what, LOSS_TOL, d);
    }
    const size_t Vl = 1024, logits = r64((size_t)N * Vl);
    check(w->act_bytes - f->act_bytes == logits, "%s: activations %zu bytes, whole's %zu less the logits' %zu", what,
          f->act_bytes, w->act_bytes, logits);
    /* fp32: the chunk's own buffer where it does not fit dbig and dbig2
     * (2 r(N*big)); bf16 also resizes the dlogits' bf16 copy, so only the
     * total is held to fall */
    const size_t big = (size_t)(c->arch == ARCH_LLAMA ? 2 * c->d_ff : 4 * c->d_model);
    const size_t scratch = 2 * r64((size_t)N * big) / sizeof(float), own = (size_t)f->xrows * Vl;
    if (!bf16)
        check(f->work_bytes == w->work_bytes + (own > scratch ? r64(own) : 0),
              "%s: workspace %zu bytes: whole's %zu%s", what, f->work_bytes, w->work_bytes,
              own > scratch ? " + the chunk's logits" : " (the chunk fits the backward's scratch)");
    if (f->xrows < N)
        check(f->act_bytes + f->work_bytes < w->act_bytes + w->work_bytes,
              "%s: activations + workspace %zu bytes below whole's %zu", what, f->act_bytes + f->work_bytes,
              w->act_bytes + w->work_bytes);
}

/* The accum/last contract of model.h's model_forward. */
static void contract(const ops_t *ops, const model_config_t *c)
{
    model_t m;
    char err[512];
    model_layout_t lay = model_layout_single(c);
    lay.logits_chunk = 7;
    lay.n_slots = 2;
    if (model_create(&m, c, ops, &lay, B, T, err, sizeof err) != 0 || model_init_params(&m, 11) != 0) {
        check(0, "contract: model_create: %s", err);
        return;
    }
    int32_t tok[N], tgt[N];
    float loss;
    batch(0, tok, tgt);
    int ok = model_forward(&m, 0, tok, NULL, tgt, B, T, 1.0f, &loss, err, sizeof err) == STATUS_OK;
    ok &= model_backward(&m, 0, 1, 1, err, sizeof err) == STATUS_FAIL && strstr(err, "internal error");
    check(ok, "a backward that adds after the step's first fused forward wrote the head's gradient fails: %s", err);
    model_destroy(&m);
    if (model_create(&m, c, ops, &lay, B, T, err, sizeof err) != 0 || model_init_params(&m, 11) != 0) {
        check(0, "contract: model_create: %s", err);
        return;
    }
    err[0] = '\0';
    ok = model_forward(&m, 0, tok, NULL, tgt, B, T, 1.0f, &loss, err, sizeof err) == STATUS_OK &&
         model_forward(&m, 1, tok, NULL, tgt, B, T, 1.0f, &loss, err, sizeof err) == STATUS_OK;
    ok &= model_backward(&m, 0, 0, 1, err, sizeof err) == STATUS_FAIL && strstr(err, "pending");
    check(ok, "a last backward while a later forward's head gradient waits fails: %s", err);
    model_destroy(&m);
}

int main(void)
{
    const ops_t *ops = ops_cpu_create();
    if (!ops)
        return 1;
    const char *models[] = {"tiny", "tiny-llama"};
    const int chunks[] = {1, 7, 33, 99, 100, 4096, MODEL_LOGITS_AUTO};
    for (int mi = 0; mi < 2; mi++) {
        model_config_t c = model_preset_find(models[mi])->cfg;
        c.vocab_size = V;
        param_table_t t;
        char err[256];
        if (param_table_build(&t, &c, NULL, err, sizeof err) != 0) {
            check(0, "%s: %s", models[mi], err);
            continue;
        }
        const size_t numel = t.numel;
        param_table_free(&t);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            result_t whole, fused;
            whole.grads = malloc(numel * sizeof(float));
            fused.grads = malloc(numel * sizeof(float));
            if (!whole.grads || !fused.grads || run(ops, &c, bf16, MODEL_LOGITS_WHOLE, &whole) != 0) {
                check(0, "%s: the whole-logits run failed", models[mi]);
                free(whole.grads);
                free(fused.grads);
                continue;
            }
            for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
                if (run(ops, &c, bf16, chunks[k], &fused) != 0)
                    check(0, "%s chunk %d: the run failed", models[mi], chunks[k]);
                else
                    compare(&c, models[mi], bf16, chunks[k], &whole, &fused);
            }
            free(whole.grads);
            free(fused.grads);
        }
        if (mi == 0)
            contract(ops, &c);
    }
    printf(n_fail ? "%d check(s) FAILED\n" : "all checks passed\n", n_fail);
    ops_release(ops);
    return n_fail ? 1 : 0;
}
