#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include <cblas.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifdef HAVE_CUDA
#include "device.h"
#endif
#include "flops.h"
#include "mem.h"
#include "metrics.h"
#include "sample.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One threading layer: OpenMP's pool, which the OpenMP build of OpenBLAS
 * shares. --threads 0 keeps OMP_NUM_THREADS or the cores we may use. */
static int setup_threads(int requested)
{
    int n = 1;
#ifdef _OPENMP
    if (requested > 0)
        omp_set_num_threads(requested);
    n = omp_get_max_threads();
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    openblas_set_num_threads(n);
#endif
    (void)requested;
    return n;
}

int trainer_setup(trainer_t *tr, const run_options_t *o, const launch_env_t *env, char *err,
                  size_t errlen)
{
    memset(tr, 0, sizeof *tr);
    tr->opt = o;
    tr->env = env;
    tr->threads = setup_threads(o->threads);
    if (options_model_config(o, &tr->cfg, err, errlen) != 0)
        return -1;
    if (o->top_k > tr->cfg.vocab_size) {
        snprintf(err, errlen, "--top-k %d exceeds the vocabulary (%d)", o->top_k, tr->cfg.vocab_size);
        return -1;
    }
    tr->accum = options_accum_steps(o, 1);
    tr->sched = (lr_schedule_t){.lr = o->lr, .min_lr = o->min_lr, .warmup = o->warmup, .steps = o->steps};
    tokens_format_t fmt;
    if (tokens_format_parse(o->data_format, &fmt) != 0) {
        snprintf(err, errlen, "--data-format '%s': allowed llmc|raw-u16", o->data_format);
        return -1;
    }
    if (data_open(&tr->train, o->data, fmt, tr->cfg.vocab_size, o->seq_len, 1, (uint64_t)o->seed, err,
                  errlen) != 0)
        return -1;
    if (o->val_every > 0) {
        if (data_open(&tr->val, o->val_data, fmt, tr->cfg.vocab_size, o->seq_len, 0, 0, err, errlen) != 0)
            return -1;
        tr->has_val = 1;
    }
    if (model_create(&tr->model, &tr->cfg, ops_cpu(), o->micro_batch, o->seq_len, err, errlen) != 0)
        return -1;
    if (model_init_params(&tr->model, (uint64_t)o->seed) != 0 ||
        adamw_create(&tr->optim, tr->model.ops, &tr->model.table, o->beta1, o->beta2, o->adam_eps,
                     o->weight_decay, o->grad_clip) != 0) {
        snprintf(err, errlen, "out of memory for the optimizer state (%zu parameters)", tr->model.table.numel);
        return -1;
    }
    size_t n = (size_t)o->micro_batch * (size_t)o->seq_len;
    tr->tok = malloc(n * sizeof *tr->tok);
    tr->tgt = malloc(n * sizeof *tr->tgt);
    if (!tr->tok || !tr->tgt) {
        snprintf(err, errlen, "out of memory for the batch");
        return -1;
    }
    tr->flops_token = flops_per_token(&tr->cfg, o->seq_len);
    tr->peak_gflops = o->peak_gflops > 0 ? o->peak_gflops : flops_measure_peak_gflops();
    if (o->metrics[0] && env->world_rank == 0) {
        tr->metrics = fopen(o->metrics, "w");
        if (!tr->metrics) {
            snprintf(err, errlen, "--metrics %s: cannot create: %s", o->metrics, strerror(errno));
            return -1;
        }
    }
    return 0;
}

void trainer_banner(const trainer_t *tr, FILE *out)
{
    const model_config_t *c = &tr->cfg;
    const run_options_t *o = tr->opt;
    char buf[32];
    fprintf(out, "dtrain %s | %d rank%s | %d thread%s per rank | host %s\n", PACKAGE_VERSION,
            tr->env->world_size, tr->env->world_size == 1 ? "" : "s", tr->threads,
            tr->threads == 1 ? "" : "s", tr->env->host);
    fprintf(out, "model %s (%s): L=%d C=%d heads=%d kv_heads=%d ffn=%d vocab=%d | %zu parameters\n", o->model,
            model_arch_name(c->arch), c->n_layer, c->d_model, c->n_head, c->n_kv_head, c->d_ff,
            c->vocab_size, tr->model.table.logical_numel);
    fprintf(out, "batch: micro %d x seq %d, %d microbatch%s per step = %d tokens per step\n", o->micro_batch,
            o->seq_len, tr->accum, tr->accum == 1 ? "" : "es", o->micro_batch * o->seq_len * tr->accum);
    fprintf(out, "data: %zu train tokens (%zu samples)", tr->train.set.n_tokens, tr->train.n_samples);
    if (tr->has_val)
        fprintf(out, ", %zu val tokens", tr->val.set.n_tokens);
    fprintf(out, "\nmemory per rank:");
    for (int k = 0; k < MEM_N_CATEGORIES; k++) {
        metrics_format_bytes(buf, sizeof buf, (double)mem_bytes((mem_category_t)k));
        fprintf(out, " %s %s%s", mem_category_name((mem_category_t)k), buf, k + 1 < MEM_N_CATEGORIES ? "," : "\n");
    }
    fprintf(out, "compute: %.1f GFLOP per step, peak %.1f GFLOP/s per rank (%s)\n",
            tr->flops_token * o->micro_batch * o->seq_len * tr->accum * 1e-9, tr->peak_gflops,
            o->peak_gflops > 0 ? "--peak-gflops" : "sgemm probe");
#ifdef HAVE_CUDA
    char cerr[256];
    int ndev = cuda_device_count(cerr, sizeof cerr);
    if (ndev < 0)
        fprintf(out, "cuda: built with the toolkit; no device usable: %s\n", cerr);
    else
        fprintf(out, "cuda: %d device(s) visible; the CUDA backend is not implemented yet, training runs on the CPU\n", ndev);
#endif
    fprintf(out, "configuration:\n");
    options_print(o, out);
    fflush(out);
}

double trainer_val_loss(trainer_t *tr)
{
    const int B = tr->opt->micro_batch, T = tr->opt->seq_len;
    double sum = 0.0;
    for (int i = 0; i < tr->opt->val_batches; i++) {
        for (int b = 0; b < B; b++)
            data_sample(&tr->val, (uint64_t)i * B + b, tr->tok + (size_t)b * T, tr->tgt + (size_t)b * T);
        sum += model_forward(&tr->model, tr->tok, tr->tgt, B, T, 0.0f);
    }
    return sum / tr->opt->val_batches;
}

static void print_sample(trainer_t *tr, FILE *out)
{
    const run_options_t *o = tr->opt;
    const int byte_vocab = tr->cfg.vocab_size == 256;
    int n_prompt = byte_vocab ? (int)strlen(o->prompt) : 1;
    if (n_prompt == 0)
        n_prompt = 1;
    int32_t *seq = malloc((size_t)(n_prompt + o->sample_tokens) * sizeof *seq);
    if (!seq)
        return;
    for (int i = 0; i < n_prompt; i++)
        seq[i] = byte_vocab && o->prompt[0] ? (unsigned char)o->prompt[i] : 0;
    int n = sample_generate(&tr->model, seq, n_prompt, o->sample_tokens, o->temperature, o->top_k,
                            (uint64_t)o->seed, seq);
    if (byte_vocab) {
        fprintf(out, "sample (temperature %g, top-k %d):\n", o->temperature, o->top_k);
        for (int i = 0; i < n; i++)
            fputc(seq[i], out);
        fputc('\n', out);
    } else {
        fprintf(out, "sample token ids (no detokenizer for vocabulary %d; started from token 0):\n",
                tr->cfg.vocab_size);
        for (int i = 0; i < n; i++)
            fprintf(out, "%d%c", seq[i], i + 1 < n ? ' ' : '\n');
    }
    fflush(out);
    free(seq);
}

int trainer_run(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const int B = o->micro_batch, T = o->seq_len, rank0 = tr->env->world_rank == 0;
    model_t *m = &tr->model;
    const double tokens_step = (double)B * T * tr->accum;
    double t_run = now_s(), loss = NAN;
    if (tr->has_val) {
        /* the untrained model's validation loss: the baseline the run improves on */
        double v = trainer_val_loss(tr);
        if (rank0) {
            printf("step %*d/%d | val %.6f\n", o->steps >= 10000 ? 6 : 4, 0, o->steps, v);
            if (tr->metrics && fprintf(tr->metrics, "{\"step\": 0, \"val_loss\": %.9g}\n", v) < 0) {
                snprintf(err, errlen, "--metrics %s: write failed: %s", o->metrics, strerror(errno));
                return -1;
            }
        }
    }
    for (int step = 0; step < o->steps; step++) {
        double t0 = now_s();
        double lr = lr_at(&tr->sched, step), loss_sum = 0.0;
        for (int micro = 0; micro < tr->accum; micro++) {
            data_batch(&tr->train, step, micro, tr->accum, 0, 1, B, tr->tok, tr->tgt);
            loss_sum += model_forward(m, tr->tok, tr->tgt, B, T, 1.0f / (float)tr->accum);
            model_backward(m, micro > 0);
        }
        loss = loss_sum / tr->accum;
        double norm = sqrt(m->ops->sumsq(m->grads, m->table.numel));
        if (!isfinite(loss) || !isfinite(norm)) {
            snprintf(err, errlen, "step %d: loss %g, gradient norm %g: training diverged; lower --lr or raise --warmup",
                     step + 1, loss, norm);
            return -1;
        }
        adamw_step(&tr->optim, m->params, m->grads, lr, adamw_clip_scale(&tr->optim, norm));
        double dt = now_s() - t0;

        step_record_t r = {.step = step + 1, .steps = o->steps, .loss = loss, .val_loss = NAN, .lr = lr,
                           .grad_norm = norm, .ms = 1e3 * dt, .tokens_per_s = tokens_step / dt};
        r.mfu = tr->peak_gflops > 0 ? tr->flops_token * r.tokens_per_s * 1e-9 / tr->peak_gflops : 0.0;
        if (tr->has_val && ((step + 1) % o->val_every == 0 || step + 1 == o->steps))
            r.val_loss = trainer_val_loss(tr);
        if (rank0) {
            metrics_print_step(stdout, &r);
            if (tr->metrics && metrics_write_json(tr->metrics, &r) != 0) {
                snprintf(err, errlen, "--metrics %s: write failed: %s", o->metrics, strerror(errno));
                return -1;
            }
        }
    }
    if (rank0) {
        double total = now_s() - t_run;
        printf("done: %d steps in %.1f s, final loss %.6f, %.0f tok/s average\n", o->steps, total, loss,
               tokens_step * o->steps / total);
        if (o->sample_tokens > 0)
            print_sample(tr, stdout);
    }
    return 0;
}

void trainer_teardown(trainer_t *tr)
{
    if (tr->metrics && fclose(tr->metrics) != 0)
        fprintf(stderr, "dtrain: warning: closing --metrics %s failed\n", tr->opt->metrics);
    free(tr->tok);
    free(tr->tgt);
    adamw_destroy(&tr->optim);
    if (tr->model.ops)
        model_destroy(&tr->model);
    data_close(&tr->train);
    if (tr->has_val)
        data_close(&tr->val);
    memset(tr, 0, sizeof *tr);
}
