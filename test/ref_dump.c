/* ref_dump: runs one forward, backward and AdamW step of a preset model on a
 * fixed batch and writes everything a PyTorch reference needs to redo the
 * same computation (test/ref/torch_ref.py compares the two).
 *
 *   ref_dump --model tiny|tiny-llama [--masked] OUTDIR
 *
 * --masked sets every fifth target to -1 (ignored by the loss), which checks
 * that the loss and its gradient are both the mean over the counted targets.
 *
 * OUTDIR receives
 *   config.json        shapes, batch size, loss, AdamW hyperparameters
 *   params.json        [{name, shape, offset, numel, decay}] in flat order
 *   params.bin         flat float32 parameters (before the step)
 *   tokens.bin         int32 [B*T]
 *   targets.bin        int32 [B*T]
 *   logits.bin         float32 [B*T, V] of the forward
 *   grads.bin          flat float32 gradients of the mean loss
 *   params_after.bin   flat float32 parameters after one AdamW step
 *   params_after2.bin  ... after a second step on the same gradients scaled by 0.5
 *
 * The 1-D tensors (biases, norm weights) start at exactly 0 or 1; they are
 * perturbed here so that a bias or norm weight used in the wrong place, or
 * not at all, changes the numbers. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/backend/ops_cpu.h"
#include "src/model/model.h"
#include "src/model/model_config.h"
#include "src/model/params.h"
#include "src/model/rng.h"

enum { REF_B = 2, REF_T = 16 };
static const uint64_t REF_SEED = 1234;
static const float ADAM_LR = 1e-3f, ADAM_BETA1 = 0.9f, ADAM_BETA2 = 0.95f, ADAM_EPS = 1e-8f, ADAM_WD = 0.1f,
                   ADAM_STEP2_SCALE = 0.5f;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ref_dump: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    MPI_Finalize();
    exit(1);
}

static void usage(void) { fputs("usage: ref_dump --model tiny|tiny-llama [--masked] OUTDIR\n", stderr); }

/* fopen/fwrite/fclose with every return checked. */
static FILE *open_out(const char *dir, const char *name, char *path, size_t pathlen)
{
    int n = snprintf(path, pathlen, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= pathlen)
        die("output path %s/%s is too long", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        die("cannot create %s: %s", path, strerror(errno));
    return f;
}

static void close_out(FILE *f, const char *path)
{
    if (ferror(f)) {
        fclose(f);
        die("error writing %s", path);
    }
    if (fclose(f) != 0)
        die("error closing %s: %s", path, strerror(errno));
}

static void write_bin(const char *dir, const char *name, const void *data, size_t elsize, size_t count)
{
    char path[4096];
    FILE *f = open_out(dir, name, path, sizeof path);
    if (count && fwrite(data, elsize, count, f) != count) {
        int e = errno;
        fclose(f);
        die("short write to %s: %s", path, strerror(e));
    }
    close_out(f, path);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        die("out of memory (%zu bytes)", bytes);
    return p;
}

static void write_config(const char *dir, const model_config_t *c, const char *preset, int B, int T, int masked,
                         float loss, float loss_train)
{
    char path[4096];
    FILE *f = open_out(dir, "config.json", path, sizeof path);
    int r = fprintf(f,
                    "{\n"
                    "  \"preset\": \"%s\",\n"
                    "  \"arch\": \"%s\",\n"
                    "  \"vocab_size\": %d,\n"
                    "  \"n_layer\": %d,\n"
                    "  \"n_head\": %d,\n"
                    "  \"n_kv_head\": %d,\n"
                    "  \"d_model\": %d,\n"
                    "  \"d_ff\": %d,\n"
                    "  \"max_seq\": %d,\n"
                    "  \"norm_eps\": %.9g,\n"
                    "  \"rope_theta\": %.9g,\n"
                    "  \"B\": %d,\n"
                    "  \"T\": %d,\n"
                    "  \"masked\": %d,\n"
                    "  \"seed\": %llu,\n"
                    "  \"loss\": %.9g,\n"
                    "  \"loss_train\": %.9g,\n"
                    "  \"adam\": {\"lr\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, "
                    "\"weight_decay\": %.9g, \"grad_scale\": 1, \"step\": 1, \"step2_grad_scale\": %.9g}\n"
                    "}\n",
                    preset, model_arch_name(c->arch), c->vocab_size, c->n_layer, c->n_head, c->n_kv_head, c->d_model,
                    c->d_ff, c->max_seq, (double)c->norm_eps, (double)c->rope_theta, B, T, masked,
                    (unsigned long long)REF_SEED, (double)loss, (double)loss_train, (double)ADAM_LR, (double)ADAM_BETA1,
                    (double)ADAM_BETA2, (double)ADAM_EPS, (double)ADAM_WD, (double)ADAM_STEP2_SCALE);
    if (r < 0) {
        fclose(f);
        die("error writing %s", path);
    }
    close_out(f, path);
}

static void write_params_json(const char *dir, const param_table_t *t)
{
    char path[4096];
    FILE *f = open_out(dir, "params.json", path, sizeof path);
    int bad = fputs("[\n", f) < 0;
    for (int k = 0; k < t->n && !bad; k++) {
        const param_desc_t *d = &t->p[k];
        char shape[64];
        if (d->ndim == 1)
            snprintf(shape, sizeof shape, "[%lld]", (long long)d->shape[0]);
        else
            snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)d->shape[0], (long long)d->shape[1]);
        bad = fprintf(f,
                      "  {\"name\": \"%s\", \"shape\": %s, \"offset\": %zu, \"numel\": %zu, "
                      "\"decay\": %d}%s\n",
                      d->name, shape, d->offset, d->numel, d->decay ? 1 : 0, k + 1 < t->n ? "," : "") < 0;
    }
    if (!bad)
        bad = fputs("]\n", f) < 0;
    if (bad) {
        fclose(f);
        die("error writing %s", path);
    }
    close_out(f, path);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);

    const char *model_name = NULL, *outdir = NULL;
    int masked = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            model_name = argv[++i];
        } else if (strcmp(argv[i], "--masked") == 0) {
            masked = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage();
            MPI_Finalize();
            return 0;
        } else if (argv[i][0] == '-' || outdir) {
            usage();
            die("unexpected argument '%s'", argv[i]);
        } else {
            outdir = argv[i];
        }
    }
    if (!model_name || !outdir) {
        usage();
        die("both --model and OUTDIR are required");
    }

    const model_preset_t *preset = model_preset_find(model_name);
    if (!preset)
        die("unknown model preset '%s'", model_name);
    const model_config_t *cfg = &preset->cfg;
    char err[512];
    if (model_config_check(cfg, err, sizeof err) != 0)
        die("preset %s: %s", model_name, err);
    if (cfg->arch == ARCH_LLAMA && cfg->n_kv_head >= cfg->n_head)
        fprintf(stderr,
                "ref_dump: warning: preset %s has n_kv_head %d = n_head %d, so grouped-"
                "query attention is not exercised\n",
                model_name, cfg->n_kv_head, cfg->n_head);

    const int B = REF_B, T = REF_T, N = B * T, V = cfg->vocab_size;
    if (T > cfg->max_seq)
        die("preset %s: max_seq %d is below the reference T %d", model_name, cfg->max_seq, T);

    const ops_t *ops = ops_cpu_create();
    if (!ops)
        die("out of memory for the CPU backend");
    model_t m;
    model_layout_t lay = model_layout_single(cfg);
    if (model_create(&m, cfg, ops, &lay, B, T, err, sizeof err) != 0)
        die("model_create(%s): %s", model_name, err);
    if (model_init_params(&m, REF_SEED) != 0)
        die("model_init_params: out of memory");

    const param_table_t *tab = &m.table;
    const size_t P = tab->numel;
    if (P != tab->logical_numel)
        die("preset %s: the vocabulary is padded in memory; the reference dump needs V a multiple of 128", model_name);
    float *host = xmalloc(P * sizeof *host);

    /* Perturb biases and norm weights (initialised to 0 and 1). */
    ops->to_host(ops->ctx, host, m.params, P * sizeof *host);
    for (int k = 0; k < tab->n; k++) {
        const param_desc_t *d = &tab->p[k];
        if (d->ndim != 1)
            continue;
        uint64_t stream = rng_stream_of(d->name) ^ 0x52656644756d70ull; /* "RefDump" */
        for (size_t i = 0; i < d->numel; i++)
            host[d->offset + i] += 0.1f * (float)(2.0 * rng_uniform(REF_SEED, stream, i) - 1.0);
    }
    ops->from_host(ops->ctx, m.params, host, P * sizeof *host);
    write_bin(outdir, "params.bin", host, sizeof *host, P);
    write_params_json(outdir, tab);

    int32_t *tokens = xmalloc((size_t)N * sizeof *tokens);
    int32_t *targets = xmalloc((size_t)N * sizeof *targets);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int32_t)((7 * i + 3) % V);
        targets[i] = masked && i % 5 == 4 ? -1 : (int32_t)((11 * i + 5) % V);
    }
    write_bin(outdir, "tokens.bin", tokens, sizeof *tokens, (size_t)N);
    write_bin(outdir, "targets.bin", targets, sizeof *targets, (size_t)N);

    /* Evaluation forward: logits stay logits. */
    float loss, loss_train;
    if (model_forward(&m, 0, tokens, NULL, targets, B, T, 0.0f, &loss, err, sizeof err) != STATUS_OK)
        die("model_forward: %s", err);
    float *logits = xmalloc((size_t)N * (size_t)V * sizeof *logits);
    for (int n = 0; n < N; n++)
        if (model_logits_row(&m, 0, n, logits + (size_t)n * (size_t)V, err, sizeof err) != STATUS_OK)
            die("model_logits_row: %s", err);
    write_bin(outdir, "logits.bin", logits, sizeof *logits, (size_t)N * (size_t)V);

    /* Training forward and backward: gradients of the mean loss. */
    if (model_forward(&m, 0, tokens, NULL, targets, B, T, 1.0f, &loss_train, err, sizeof err) != STATUS_OK)
        die("model_forward: %s", err);
    if (!isfinite(loss) || !isfinite(loss_train))
        die("non-finite loss (%g, %g)", (double)loss, (double)loss_train);
    if (loss_train != loss)
        fprintf(stderr,
                "ref_dump: note: training forward loss %.9g differs from evaluation "
                "forward loss %.9g\n",
                (double)loss_train, (double)loss);
    if (model_backward(&m, 0, 0, 1, err, sizeof err) != STATUS_OK)
        die("model_backward: %s", err);
    float *grads = xmalloc(P * sizeof *grads);
    ops->to_host(ops->ctx, grads, m.grads, P * sizeof *grads);
    write_bin(outdir, "grads.bin", grads, sizeof *grads, P);
    write_config(outdir, cfg, model_name, B, T, masked, loss, loss_train);

    /* One AdamW step, tensor by tensor, from zero moments. */
    float *mom = ops->alloc(ops->ctx, P * sizeof *mom), *var = ops->alloc(ops->ctx, P * sizeof *var);
    if (!mom || !var)
        die("out of memory for AdamW moments");
    ops->zero(ops->ctx, mom, P * sizeof *mom);
    ops->zero(ops->ctx, var, P * sizeof *var);
    for (int k = 0; k < tab->n; k++) {
        const param_desc_t *d = &tab->p[k];
        ops->adamw(ops->ctx, m.params + d->offset, NULL, m.grads + d->offset, mom + d->offset, var + d->offset,
                   d->numel, ADAM_LR, ADAM_BETA1, ADAM_BETA2, ADAM_EPS, d->decay ? ADAM_WD : 0.0f, 1.0f, 1);
    }
    ops->to_host(ops->ctx, host, m.params, P * sizeof *host);
    write_bin(outdir, "params_after.bin", host, sizeof *host, P);

    /* A second step (t = 2) on the same gradients with grad_scale 0.5:
     * exercises the moments carried over, the step-2 bias corrections and
     * the gradient scaling that clipping and averaging use. */
    for (int k = 0; k < tab->n; k++) {
        const param_desc_t *d = &tab->p[k];
        ops->adamw(ops->ctx, m.params + d->offset, NULL, m.grads + d->offset, mom + d->offset, var + d->offset,
                   d->numel, ADAM_LR, ADAM_BETA1, ADAM_BETA2, ADAM_EPS, d->decay ? ADAM_WD : 0.0f, ADAM_STEP2_SCALE, 2);
    }
    ops->to_host(ops->ctx, host, m.params, P * sizeof *host);
    write_bin(outdir, "params_after2.bin", host, sizeof *host, P);

    printf("ref_dump: %s (%s) B=%d T=%d%s params=%zu loss=%.9g -> %s\n", model_name, model_arch_name(cfg->arch), B, T,
           masked ? " masked" : "", P, (double)loss, outdir);

    ops->free(ops->ctx, mom);
    ops->free(ops->ctx, var);
    free(grads);
    free(logits);
    free(targets);
    free(tokens);
    free(host);
    model_destroy(&m);
    ops_release(ops);
    MPI_Finalize();
    return 0;
}
