/* The trainer's step loop: the pipeline stages' callbacks, one optimizer
 * step, its statistics and report, validation, the gradient norm, the
 * replica check, the sample, the banner and the teardown. Setup is in
 * src/train/train_setup.c, checkpoints in src/train/train_ckpt.c. */
#include "src/train/train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "base/mem.h"
#include "io/fsutil.h"
#include "io/h5store.h"
#include "io/tok_sidecar.h"
#include "mpi/cp_sched.h"
#include "mpi/agree.h"
#include "mpi/clock.h"
#include "mpi/replica.h"
#include "src/backend/backend.h"
#include "src/backend/ops_cpu.h"
#include "src/ckpt/ckpt.h"
#include "src/ckpt/ckpt_async.h"
#include "src/ckpt/param_io.h"
#include "src/convert/hf_import.h"
#include "src/model/docmask.h"
#include "src/model/flops.h"
#include "src/train/forward.h"
#include "src/train/metrics.h"
#include "src/train/sample.h"
#include "src/train/train_internal.h"

/* " x cp N" for the banner */
static const char *cp_desc(const grid_t *g, char *buf, size_t n)
{
    snprintf(buf, n, " x cp %d", g->cp_size);
    return buf;
}

void trainer_banner(const trainer_t *tr, FILE *out)
{
    const model_config_t *c = &tr->cfg;
    const run_options_t *o = tr->opt;
    char buf[32];

    const grid_t *g = tr->grid;
    int rank0 = tr->env->world_rank == 0;
    if (rank0)
        fprintf(out, "dtrain %s | %d rank%s: tp %d x pp %d x dp %d%s | %d thread%s per rank | ddp %s\n",
                PACKAGE_VERSION, g->world_size, g->world_size == 1 ? "" : "s", g->tp_size, g->pp_size,
                grid_data_size(g), g->cp_size > 1 ? cp_desc(g, buf, sizeof buf) : "", tr->threads,
                tr->threads == 1 ? "" : "s", ddp_mode_names[tr->run->ddp_mode]);
    launch_describe(tr->env, out);
    char gerr[COMM_ERR_MAX];
    if (grid_print(g, out, gerr, sizeof gerr) != STATUS_OK && rank0)
        fprintf(out, "grid: %s\n", gerr);
    if (!rank0)
        return;
    if (g->tp_size > 1)
        fprintf(out,
                "tensor parallel: %d ranks, %d heads, %d KV heads, FFN %d and %d vocabulary rows (of %lld "
                "padded) per rank%s\n",
                g->tp_size, c->n_head / g->tp_size, c->n_kv_head / g->tp_size, c->d_ff / g->tp_size, tr->model.v_rows,
                (long long)param_padded_vocab(c->vocab_size, g->tp_size),
                o->sequence_parallel ? ", sequence parallel" : "");
    if (g->cp_size > 1)
        fprintf(out,
                "context parallel: %d ranks, each holding 2 of %d chunks of %d tokens of every sequence (zigzag), "
                "attention by a ring of K,V blocks; gradients over dp x cp = %d ranks\n",
                g->cp_size, 2 * g->cp_size, o->seq_len / (2 * g->cp_size), g->dp_size);
    if (g->pp_size > 1) {
        const run_config_t *run = tr->run;
        fprintf(out, "pipeline: %d stages, %s schedule", g->pp_size, pipe_kind_name(tr->pp_kind));
        if (run->pp_virtual > 1)
            fprintf(out, " (%d chunks per stage)", run->pp_virtual);
        fprintf(out, " over %d microbatches, layers", tr->accum);
        for (int s = 0; s < g->pp_size; s++) {
            int n, lo[PARAM_MAX_RUNS], hi[PARAM_MAX_RUNS];
            run_config_stage_runs(run, s, &n, lo, hi);
            for (int k = 0; k < n; k++)
                fprintf(out, "%s%d-%d", k ? "+" : s ? " | " : " ", lo[k], hi[k] - 1);
        }
        fprintf(out, "\n");
    }
    tr->sync.ops->banner(&tr->sync, out, ddp_mode_names[tr->run->ddp_mode], comm_dtype_names[tr->run->grad_dtype]);
    char extras[128];
    fprintf(out, "model %s (%s): L=%d C=%d heads=%d kv_heads=%d ffn=%d vocab=%d%s | %zu parameters\n", o->model,
            model_arch_name(c->arch), c->n_layer, c->d_model, c->n_head, c->n_kv_head, c->d_ff, c->vocab_size,
            model_config_extras(c, extras, sizeof extras), model_params_total(c));
    fprintf(out, "batch: micro %d x seq %d, %d microbatch%s per step x dp %d = %d tokens per step\n", o->micro_batch,
            o->seq_len, tr->accum, tr->accum == 1 ? "" : "es", grid_data_size(tr->grid),
            o->micro_batch * o->seq_len * tr->accum * grid_data_size(tr->grid));
    char dd[2048];
    data_describe(&tr->train, dd, sizeof dd);
    fprintf(out, "data: train %s", dd);
    if (tr->has_val) {
        data_describe(&tr->val, dd, sizeof dd);
        fprintf(out, "; val %s", dd);
    }
    fprintf(out, "\n");
    if (tr->tokenizer)
        fprintf(out, "tokenizer: %s (from %s)\n", tr->tokenizer->spec, tr->tokenizer_from);
    fprintf(out, "memory per rank:");
    for (int k = 0; k < MEM_N_CATEGORIES; k++) {
        metrics_format_bytes(buf, sizeof buf, (double)mem_bytes((mem_category_t)k));
        fprintf(out, " %s %s%s", mem_category_name((mem_category_t)k), buf, k + 1 < MEM_N_CATEGORIES ? "," : "\n");
    }
    const adamw_offload_t *h = &tr->optim.host;
    if (h->n) {
        metrics_format_bytes(buf, sizeof buf, (double)adamw_offload_bytes(h->n, h->p16 != NULL, h->params_are_master));
        fprintf(
            out,
            "offload: optimizer, %zu of %zu elements per rank (fraction %g) in %s host memory, %s: moments and fp32 "
            "master weights, updated by the host AdamW (%s)\n",
            h->n, tr->optim.n, tr->run->offload_fraction, h->pinned ? "pinned" : "plain", buf,
            adamw_host_isa_names[h->isa]);
        if (h->params_are_master) {
            metrics_format_bytes(buf, sizeof buf, (double)tr->model.params_n * sizeof(float));
            fprintf(out,
                    "offload: the fp32 weights (%s) are the master copy in host memory; the device holds their bf16 "
                    "copy and the %zu fp32 elements other ops than the matmuls read\n",
                    buf, tr->model.weights_dev_n);
        }
    }
    fprintf(out, "compute: %.1f GFLOP per step, peak %.1f GFLOP/s per rank (%s)\n",
            tr->flops_token * o->micro_batch * o->seq_len * tr->accum * grid_data_size(tr->grid) * 1e-9,
            tr->peak_gflops, tr->peak_how);
    char sched[160];
    lr_schedule_describe(&tr->sched, sched, sizeof sched);
    fprintf(out, "lr schedule: %s\n", sched);
    fprintf(out, "backend: %s\n", tr->backend.desc);
    fprintf(out, "communication: %s%s\n", tr->backend.comm_desc,
            tr->model.lay.tp_overlap ? "; tp's backward reductions beside the weight-gradient GEMMs (--tp-comm-overlap)"
                                     : "");
    if (tr->model.lay.bf16)
        fprintf(out,
                "precision: bf16 matmuls (operands rounded to bf16, fp32 sums; bf16 weight copy and matmul-only "
                "activations); fp32 master weights, gradients, AdamW state and other activations%s\n",
                tr->model.lay.tp_bf16 ? "; tensor-parallel activations sent and summed in bf16" : "");
    else
        fprintf(out, "precision: fp32\n");
    char att[320];
    backend_attention_desc(&tr->backend, model_head_size(&tr->cfg), att, sizeof att);
    if (tr->run->cp > 1 && tr->backend.cuda) /* the ring's block ops, not attention_fwd, run */
        snprintf(att, sizeof att,
                 "ring over the cp group (--cp %d): fp32 CUDA-core block kernels merged by log-sum-exp, whatever "
                 "--dtype (no tensor-core ring kernels yet)",
                 tr->run->cp);
    fprintf(out, "attention: %s\n", att);
    fprintf(out, "configuration:\n");
    options_print(o, out);
    fflush(out);
}

/* --cp: the forward's view of the batch tok, tgt [B*T] and the document
 * positions pos [B*T] (NULL without --doc-mask): this rank's two chunks
 * of every sequence (mpi/cp_sched.h) in tr->ltok, ltgt and lpos, the
 * positions global or the documents'; *t becomes T/cp. Without --cp the
 * batch itself. */
void trainer_cp_view(trainer_t *tr, const int32_t **tok, const int32_t **pos, const int32_t **tgt, int B, int *t)
{
    const int cp = tr->grid->cp_size, T = *t;
    if (cp <= 1)
        return;
    const int L = T / cp, r = tr->grid->cp_rank;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++) {
            const size_t g = (size_t)b * T + (size_t)cp_global_pos(cp, T, r, i), l = (size_t)b * L + i;
            tr->ltok[l] = (*tok)[g];
            if (*tgt)
                tr->ltgt[l] = (*tgt)[g];
            tr->lpos[l] = *pos ? (*pos)[g] : cp_global_pos(cp, T, r, i);
        }
    *tok = tr->ltok;
    *tgt = *tgt ? tr->ltgt : NULL;
    *pos = tr->lpos;
    *t = L;
}

/* --doc-mask: the document positions of a b x t batch of tokens (in
 * tr->pos), which every stage computes from the tokens it draws; NULL
 * without --doc-mask. */
static const int32_t *batch_positions(trainer_t *tr, const int32_t *tok, int b, int t)
{
    if (!tr->opt->doc_mask)
        return NULL;
    docmask_positions(tok, b, t, tr->doc_start, tr->doc_end, tr->pos);
    return tr->pos;
}

int trainer_val_loss(trainer_t *tr, double *loss, char *err, size_t errlen)
{
    const int B = tr->opt->micro_batch, T = tr->opt->seq_len;
    const grid_t *g = tr->grid;
    /* microbatch i is evaluated by DP rank i % dp; the per-microbatch means
     * (from the last stage; 0 on the others) are summed over PP, gathered
     * over DP and added in microbatch order, so the value does not depend
     * on the layout beyond fp32 noise. Under ZeRO-3 every forward gathers
     * the blocks' parameters over the data-parallel group, so every DP rank
     * runs the same number of forwards: where val_batches is not a
     * multiple of dp, the ranks past the last microbatch evaluate
     * microbatch 0 again and drop the result (skipping it left the others
     * in that all-gather: a hang). --ep's all-to-alls are collective
     * over the EP group alike. After each round the ranks agree
     * whether any forward failed (a failed collective or model op; a
     * non-finite loss is a value, averaged in like any other); if one did
     * they all stop together, since a rank whose communicator failed skips
     * the collectives its peers would wait in. */
    const int nb = tr->opt->val_batches, dr = grid_data_rank(g), dn = grid_data_size(g);
    const int rounds = (nb + dn - 1) / dn;
    float *means = calloc((size_t)nb, sizeof *means);
    if (!means) /* every rank allocates the same few bytes: out of memory here is out of memory everywhere */
        return status_set(STATUS_FAIL, err, errlen, "validation: out of memory");
    int failed = 0;
    char why[512] = ""; /* this rank's failure, if it had one */
    for (int r = 0; r < rounds && !failed; r++) {
        const int i = r * dn + dr;
        if (i < nb || tr->sync.ops->collective_forward || g->ep) {
            const uint64_t src = i < nb ? (uint64_t)i : 0;
            int32_t *pos = tr->opt->doc_mask ? tr->pos : NULL;
            for (int b = 0; b < B; b++)
                data_sample(&tr->val, src * B + b, tr->tok + (size_t)b * T, tr->tgt + (size_t)b * T,
                            pos ? pos + (size_t)b * T : NULL);
            float v = 0.0f;
            const int32_t *tok = tr->tok, *tgt = tr->tgt, *vpos = pos;
            int t = T;
            trainer_cp_view(tr, &tok, &vpos, &tgt, B, &t);
            failed = forward_pipeline(&tr->model, tr->grid, tok, vpos, tgt, B, t, &v, why, sizeof why) != STATUS_OK;
            if (i < nb)
                means[i] = v;
        }
        if (g->world_size > 1 &&
            tr->world->ops->allreduce(tr->world, &failed, 1, COMM_INT32, COMM_MAX, why, sizeof why) != 0)
            failed = 1;
    }
    if (failed ||
        (g->pp_size > 1 &&
         g->pp->ops->allreduce(g->pp, means, (size_t)nb, COMM_FP32, COMM_SUM, why, sizeof why) != 0) ||
        (g->dp_size > 1 &&
         g->dp->ops->allreduce(g->dp, means, (size_t)nb, COMM_FP32, COMM_SUM, why, sizeof why) != 0)) {
        free(means);
        return status_set(STATUS_FAIL, err, errlen, "validation: %s",
                          why[0] ? why : "a forward or its collectives failed on a rank");
    }
    double sum = 0.0;
    for (int i = 0; i < nb; i++)
        sum += means[i];
    free(means);
    /* --cp: each CP rank's mean is over its rows, and they were summed */
    *loss = sum / nb / g->cp_size;
    return STATUS_OK;
}

int trainer_grad_norm(trainer_t *tr, double *norm, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    /* Each logical parameter counts once (setup_sync's norm flags); the
     * strategy knows which of its gradients this rank's sum of squares
     * covers: whole tensors where gradients are DP-averaged, so identical
     * on every replica; ZeRO-2/3's pieces, which its norm group adds up.
     * The fixed-order sum in double gives the same value on every rank;
     * one sumsq call for all tensors: one wait for the backend, not one
     * per tensor. */
    double expert = 0.0;
    comm_t *over_ep = tr->sync.norm_ep;
    double local = dpsync_grad_sumsq(&tr->sync, over_ep ? &expert : NULL);
    comm_t *over_dp = tr->sync.norm_group;
    /* --ep with whole expert gradients: each EP rank holds other experts,
     * each expert-DP replica the same ones: their part is summed over the
     * EP group (under ZeRO-2/3 each DP rank holds other pieces of them,
     * which the norm group's sum counts once) */
    if (over_ep) {
        CHECK(over_ep->ops->allreduce(over_ep, &expert, 1, COMM_FP64, COMM_SUM, err, errlen));
        /* --etp 1: the EP group spans TP ranks, so each of them now holds
         * the whole sum, which the TP sum below must count once */
        if (!run_config_ep_spans_tp(tr->run) || g->tp_rank == 0)
            local += expert;
    }
    if (g->tp_size > 1 || g->pp_size > 1 || over_dp) {
        /* the communicator carries fp32: ~1e-7 relative, ample for clipping */
        float part = (float)local;
        if (g->tp_size > 1)
            CHECK(g->tp->ops->allreduce(g->tp, &part, 1, COMM_FP32, COMM_SUM, err, errlen));
        if (g->pp_size > 1)
            CHECK(g->pp->ops->allreduce(g->pp, &part, 1, COMM_FP32, COMM_SUM, err, errlen));
        if (over_dp)
            CHECK(over_dp->ops->allreduce(over_dp, &part, 1, COMM_FP32, COMM_SUM, err, errlen));
        local = part;
    }
    *norm = sqrt(local);
    return STATUS_OK;
}

/* A copy of host [t->numel] with every tensor but the experts' zeroed
 * (NULL when out of memory). */
static float *expert_copy(const param_table_t *t, const float *host)
{
    float *x = calloc(t->numel + 1, sizeof *x);
    for (int i = 0; x && i < t->n; i++)
        if (t->p[i].expert)
            memcpy(x + t->p[i].offset, host + t->p[i].offset, t->p[i].numel * sizeof *x);
    return x;
}

int trainer_check_replicas(trainer_t *tr, int step, char *err, size_t errlen)
{
    int bad = -1;
    /* the hashes are host loops, so on a host copy (the backend's memory
     * need not be host-readable); under ZeRO-3 that copy is the gathered
     * whole, as the blocks are held as pieces */
    const param_table_t *t = &tr->model.table;
    float *host = malloc(t->numel * sizeof *host + 1);
    size_t *start = malloc(((size_t)t->n + 1) * sizeof *start);
    char cerr[COMM_ERR_MAX];
    if (!host || !start || params_to_host(tr, host, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "replica check: %s", host && start ? cerr : "out of memory");
        free(host);
        free(start);
        return -1;
    }
    for (int i = 0; i < t->n; i++)
        start[i] = t->p[i].offset;
    start[t->n] = t->numel;
    /* --ep: the experts' ranks hold different experts, so every tensor is
     * compared over the expert-DP group (its replicas) and, with the
     * experts' zeroed, the rest over the DP group */
    status_t rc = STATUS_OK;
    if (tr->grid->edp) {
        /* --etp 1: an expert-DP group spans TP ranks, whose dense slices
         * differ: compared there with the dense tensors zeroed, on a copy */
        float *experts = run_config_ep_spans_tp(tr->run) ? expert_copy(t, host) : host;
        rc = experts ? replica_check(tr->grid->edp, experts, start, t->n, &bad, cerr, sizeof cerr)
                     : status_set(STATUS_FAIL, cerr, sizeof cerr, "out of memory");
        if (experts != host)
            free(experts);
        for (int i = 0; i < t->n; i++)
            if (t->p[i].expert)
                memset(host + t->p[i].offset, 0, t->p[i].numel * sizeof *host);
    }
    if (rc == STATUS_OK && bad < 0)
        rc = replica_check(tr->grid->dp, host, start, t->n, &bad, cerr, sizeof cerr);
    free(host);
    free(start);
    if (rc != STATUS_OK) {
        snprintf(err, errlen, "replica check: %s", cerr);
        return -1;
    }
    if (bad >= 0) {
        snprintf(err, errlen, "data-parallel replicas diverged %s %d: tensor %s differs between ranks of the dp group",
                 step ? "after step" : "at", step, tr->model.table.p[bad].name);
        return -1;
    }
    return 0;
}

/* The context of the callbacks the trainer hands to code that calls back
 * with an int (sample_generate, the pipeline executor's pipe_stage_ops_t):
 * the trainer and the caller's error buffer, where a failing callback
 * writes its one line. */
typedef struct callback_ctx {
    trainer_t *tr;
    char *err;
    size_t errlen;
} callback_ctx_t;

/* sample_generate's model: the window through the pipeline, the last
 * stage's logits row gathered over TP and broadcast over PP, so every rank
 * holds it and picks the same token. ctx: a callback_ctx_t. */
static int sample_logits(void *ctx, const int32_t *window, int t, int row, float *logits)
{
    const callback_ctx_t *c = ctx;
    trainer_t *tr = c->tr;
    float unused;
    CHECK(forward_pipeline(&tr->model, tr->grid, window, batch_positions(tr, window, 1, t), NULL, 1, t, &unused, c->err,
                           c->errlen));
    return forward_logits_row(&tr->model, tr->grid, row, logits, c->err, c->errlen);
}

/* ids as text: runs of the tokenizer's ids decoded together (a character
 * may span tokens), an id beyond its vocabulary (a model's padded rows)
 * as "[token N]". */
static int print_decoded(tokenizer_t *tk, const int32_t *ids, int n, FILE *out)
{
    tok_bytes_t text = {0};
    char why[256], mark[32];
    int rc = 0;
    for (int i = 0; i < n && rc == 0;) {
        int j = i;
        while (j < n && ids[j] >= 0 && ids[j] < tk->vocab_size)
            j++;
        if (j > i)
            rc = tokenizer_decode(tk, ids + i, (size_t)(j - i), &text, why, sizeof why);
        if (j < n && rc == 0) {
            int k = snprintf(mark, sizeof mark, "[token %d]", (int)ids[j++]);
            rc = tok_bytes_append(&text, mark, (size_t)k);
        }
        i = j;
    }
    if (rc == 0 && text.n > 0)
        fwrite(text.data, 1, text.n, out);
    free(text.data);
    return rc;
}

/* Collective over the whole grid: every rank generates (TP and PP ranks
 * together, DP replicas redundantly) from the same prompt ids, world rank
 * 0 prints. */
static status_t print_sample(trainer_t *tr, FILE *out, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const tok_ids_t *p = &tr->prompt_ids;
    tokenizer_t *tk = tr->tokenizer;
    int32_t *seq = malloc((p->n + (size_t)o->sample_tokens) * sizeof *seq);
    if (!seq)
        return status_set(STATUS_FAIL, err, errlen, "sampling failed: out of memory");
    const int quantum = o->sequence_parallel ? tr->grid->tp_size : 1;
    char why[512] = "out of memory"; /* sample_generate's own failure; a callback's replaces it */
    callback_ctx_t c = {.tr = tr, .err = why, .errlen = sizeof why};
    int n = sample_generate(sample_logits, &c, tr->cfg.vocab_size, o->seq_len, quantum, p->id, (int)p->n,
                            o->sample_tokens, o->temperature, o->top_k, (uint64_t)o->seed, seq);
    if (n < 0 || tr->env->world_rank != 0) {
        free(seq);
        return n < 0 ? status_set(STATUS_FAIL, err, errlen, "sampling failed: %s", why) : STATUS_OK;
    }
    int rc = 0;
    if (tk) {
        fprintf(out, "sample (temperature %g, top-k %d):\n", o->temperature, o->top_k);
        /* the document start the sample began with is not its text */
        const int skip = tk->doc_start != TOK_NO_ID && seq[0] == tk->doc_start;
        rc = print_decoded(tk, seq + skip, n - skip, out);
        fputc('\n', out);
    } else {
        fprintf(out, "sample token ids (no tokenizer for vocabulary %d, see --tokenizer; started from token 0):\n",
                tr->cfg.vocab_size);
        for (int i = 0; i < n; i++)
            fprintf(out, "%d%c", seq[i], i + 1 < n ? ' ' : '\n');
    }
    fflush(out);
    free(seq);
    return rc != 0 ? status_set(STATUS_FAIL, err, errlen, "sampling failed: out of memory") : STATUS_OK;
}

/* ---- one step over the pipeline schedule ---------------------------------------------- */

/* ctx: a callback_ctx_t. */
static int stage_forward(void *ctx, int chunk, int micro, int slot)
{
    const callback_ctx_t *c = ctx;
    trainer_t *tr = c->tr;
    const run_options_t *o = tr->opt;
    const grid_t *g = tr->grid;
    model_t *m = &tr->model;
    /* the first stage needs the tokens, the last the targets: the batch is
     * a pure function of (step, micro, dp rank), so each stage draws it */
    const int64_t batch = tr->cur_step + tr->spike.data_skip; /* past the batches a rollback skipped */
    const double t_data = tr->trace ? trace_now() : 0.0;
    int32_t *pos = o->doc_mask ? tr->pos : NULL; /* from the data: a Megatron index or the boundary tokens */
    data_batch(&tr->train, batch, micro, tr->accum, grid_data_rank(g), grid_data_size(g), o->micro_batch, tr->tok,
               tr->tgt, pos);
    trace_span(tr->trace, TRACE_COMPUTE, "data", t_data, tr->trace ? trace_now() : 0.0, NULL);
    m->trace_micro = micro;
    if (pos && chunk == 0) { /* the attention this step computes, for its MFU */
        tr->doc_sq += docmask_square_sum(pos, (size_t)o->micro_batch * o->seq_len);
        tr->doc_tok += (double)o->micro_batch * o->seq_len;
    }
    float loss;
    const int32_t *tok = tr->tok, *tgt = tr->tgt, *fpos = pos;
    int t = o->seq_len;
    trainer_cp_view(tr, &tok, &fpos, &tgt, o->micro_batch, &t);
    CHECK(model_forward_chunk(m, chunk, slot, tok, fpos, tgt, o->micro_batch, t,
                              spike_test_dloss(&tr->spike, batch, micro, g->dp_rank, 1.0f / (float)tr->accum), &loss,
                              c->err, c->errlen));
    if (chunk == m->lay.part.n_runs - 1) /* the stage's loss (0 off the last stage) comes from its last chunk */
        tr->loss_sum += spike_test_loss(&tr->spike, batch, micro, g->dp_rank, loss);
    return STATUS_OK;
}

/* A backward the data-parallel strategy brackets: it says whether the
 * backward adds to the gradients and is the last of this chunk's
 * (model_backward's flags), and communicates through the model's hook
 * during it where it needs to. weight_only: the split backward's W, whose
 * gradients are the final ones. The strategy's backward_end runs after a
 * failed backward too (its message then wins: its hook's failure is the
 * cause). */
static int bracketed_backward(const callback_ctx_t *c, int chunk, int micro, int slot, int weight_only)
{
    trainer_t *tr = c->tr;
    model_t *m = &tr->model;
    dpsync_t *s = &tr->sync;
    int accum, last;
    /* each chunk's backwards count apart: its last is that chunk's step's last */
    s->ops->backward_begin(s, tr->bwd_done[chunk], tr->accum, model_chunk_top(m, chunk), &accum, &last);
    m->trace_micro = micro;
    const status_t st = weight_only ? model_backward_weight(m, slot, accum, c->err, c->errlen)
                                    : model_backward_chunk(m, slot, accum, last, c->err, c->errlen);
    tr->bwd_done[chunk]++;
    if (dpsync_backward_end(s, c->err, c->errlen) != 0)
        return STATUS_FAIL;
    return st;
}

/* ctx: a callback_ctx_t. */
static int stage_backward(void *ctx, int chunk, int micro, int slot)
{
    return bracketed_backward(ctx, chunk, micro, slot, 0);
}

/* The split backward (zb-h1). B writes the gradients the whole backward
 * writes first (norms, embeddings, activations) with the flags a
 * replicated strategy gives backward k (accumulate from the second, last
 * on the step's last: the strategies zb-h1 runs with); W runs in the same
 * microbatch order, and it is W the data-parallel strategy brackets, since
 * the gradients are final only after it. ctx: a callback_ctx_t. */
static int stage_backward_input(void *ctx, int chunk, int micro, int slot)
{
    const callback_ctx_t *c = ctx;
    trainer_t *tr = c->tr;
    const int k = tr->bwd_input_done[chunk]++;
    tr->model.trace_micro = micro;
    return model_backward_input(&tr->model, slot, k > 0, k == tr->accum - 1, c->err, c->errlen);
}

static int stage_backward_weight(void *ctx, int chunk, int micro, int slot)
{
    return bracketed_backward(ctx, chunk, micro, slot, 1);
}

static model_t *ctx_model(void *ctx) { return &((callback_ctx_t *)ctx)->tr->model; }
static float *stage_input(void *ctx, int slot) { return model_stage_input(ctx_model(ctx), slot); }
static float *stage_output(void *ctx, int slot) { return model_stage_output(ctx_model(ctx), slot); }
static float *stage_grad(void *ctx) { return model_stage_grad(ctx_model(ctx)); }

/* --offload: view.grads[lo, lo+n) is final (dpsync_on_final): the
 * offloaded gradients among them begin their copies to the host (a span
 * "to_host grads" on the trace's communication row), except the tied
 * embedding's before its sum over the stages (tied: 1 after it). */
static void grads_final_copy(trainer_t *tr, size_t lo, size_t n)
{
    const double t0 = tr->trace ? trace_now() : 0.0;
    const size_t bytes = adamw_grads_final(&tr->optim, tr->sync.view.grads, lo, n);
    if (bytes)
        trace_span(tr->trace, TRACE_COMM, "to_host grads", t0, tr->trace ? trace_now() : 0.0,
                   &(trace_args_t){.bytes = (long long)bytes, .microbatch = -1, .layer = -1, .peer = -1});
}

void trainer_grads_final(void *ctx, size_t lo, size_t n)
{
    trainer_t *tr = ctx;
    const size_t hi = lo + n, a = tr->tied_lo, b = tr->tied_hi;
    if (b <= a || hi <= a || lo >= b) {
        grads_final_copy(tr, lo, n);
        return;
    }
    if (lo < a)
        grads_final_copy(tr, lo, a - lo);
    if (hi > b)
        grads_final_copy(tr, b, hi - b);
}

/* Forward and backward of the step's microbatches (the pipeline schedule
 * when pp > 1), then the gradient reductions: DP average, and the tied
 * embedding's sum over the first and last stage. Returns 0 or -1. */
static int step_gradients(trainer_t *tr, int step, double *bubble_s, char *err, size_t errlen)
{
    model_t *m = &tr->model;
    const grid_t *g = tr->grid;
    tr->cur_step = step;
    memset(tr->bwd_done, 0, sizeof tr->bwd_done);
    memset(tr->bwd_input_done, 0, sizeof tr->bwd_input_done);
    tr->sync.ops->step_begin(&tr->sync);
    tr->loss_sum = 0.0;
    *bubble_s = 0.0;
    char why[512] = ""; /* a stage callback's failure */
    callback_ctx_t c = {.tr = tr, .err = why, .errlen = sizeof why};
    if (g->pp_size == 1) {
        for (int micro = 0; micro < tr->accum; micro++)
            if (stage_forward(&c, 0, micro, 0) != 0 || stage_backward(&c, 0, micro, 0) != 0)
                return status_set(STATUS_FAIL, err, errlen, "step %d: %s", step + 1, why);
    } else {
        const pipe_stage_ops_t ops = {.forward = stage_forward,
                                      .backward = stage_backward,
                                      .backward_input = stage_backward_input,
                                      .backward_weight = stage_backward_weight,
                                      .input = stage_input,
                                      .output = stage_output,
                                      .grad = stage_grad,
                                      .n = model_stage_floats(m, tr->opt->micro_batch, tr->opt->seq_len),
                                      .mem = m->ops};
        const pipe_shape_t shape = run_config_pipe_shape(tr->run);
        pipe_stats_t st = {0};
        char perr[COMM_ERR_MAX];
        if (pipe_run(g->pp, &shape, &ops, &c, &st, perr, sizeof perr) != 0)
            return status_set(STATUS_FAIL, err, errlen, "step %d: pipeline: %s", step + 1, why[0] ? why : perr);
        *bubble_s = st.wait_s;
    }
    char cerr[COMM_ERR_MAX];
    if (tr->sync.ops->grads_finish(&tr->sync, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "step %d: %s", step + 1, cerr);
        return -1;
    }
    if (tr->tied >= 0) {
        /* wte and its copy, as this rank holds their gradients (the same
         * elements of both: ZeRO-2/3's pieces of one-tensor units coincide) */
        const param_desc_t *d = &m->table.p[tr->tied];
        size_t n;
        float *buf = tr->sync.ops->tensor_grads(&tr->sync, d->offset, d->numel, &n);
        m->ops->sync(m->ops->ctx); /* running kernels are compute, not communication */
        double t0 = now_s();
        if (g->embed->ops->allreduce(g->embed, buf, n, COMM_FP32, COMM_SUM, cerr, sizeof cerr) != 0) {
            snprintf(err, errlen, "step %d: tied embedding all-reduce failed: %s", step + 1, cerr);
            return -1;
        }
        tr->embed_comm_s = now_s() - t0;
        if (tr->tied_hi > tr->tied_lo) /* --offload: its copy now */
            grads_final_copy(tr, tr->tied_lo, tr->tied_hi - tr->tied_lo);
    }
    return 0;
}

/* --trace: every rank's spans into one file. Collective. */
static int write_trace(trainer_t *tr, char *err, size_t errlen)
{
    MPI_Comm world = MPI_COMM_WORLD;
    if (trace_write_merged(tr->trace, &world, tr->opt->trace, err, errlen) != 0)
        return -1;
    if (tr->env->world_rank == 0)
        printf("trace: %zu spans on rank 0 written to %s (open in ui.perfetto.dev)\n", trace_count(tr->trace),
               tr->opt->trace);
    return 0;
}

/* At the boundary after `step` completed steps: did SIGUSR1 or SIGTERM
 * reach any rank? A signal reaches the ranks at different moments (srun
 * and mpirun forward it one by one), so all ranks decide together on the
 * maximum of their flags; one all-reduce of one int per step. If so, writes
 * the checkpoint of `step` (unless this boundary just wrote it), says why
 * it stops and sets stopped_by. Collective. */
static int stop_requested(trainer_t *tr, int step, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    int32_t sig = launch_stop_signal();
    char cerr[COMM_ERR_MAX];
    if (tr->grid->world_size > 1 &&
        tr->world->ops->allreduce(tr->world, &sig, 1, COMM_INT32, COMM_MAX, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "step %d: the all-reduce of the stop signal failed: %s", step, cerr);
        return -1;
    }
    if (sig == 0)
        return 0;
    const char *name = sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "a signal";
    if ((o->ckpt_dir[0] && tr->last_ckpt_step != step && trainer_save(tr, step, err, errlen) != 0) ||
        ckpt_wait(tr, 0, err, errlen) != 0)
        return -1;
    if (tr->env->world_rank == 0) {
        if (o->ckpt_dir[0])
            printf("stopping at step %d: %s received, checkpoint %s written; requeue to continue (--resume auto)\n",
                   step, name, tr->last_ckpt);
        else
            printf("stopping at step %d: %s received; nothing saved (no --ckpt-dir), so a rerun starts again "
                   "from step 0\n",
                   step, name);
        fflush(stdout);
    }
    tr->stopped_by = sig;
    return 0;
}

/* Model FLOPs per token of the step just run: with --doc-mask the
 * attention its documents needed (this rank's microbatches: the other
 * data-parallel ranks' documents differ but not their expected lengths),
 * else the configuration's. */
static double step_flops_token(trainer_t *tr)
{
    if (!tr->opt->doc_mask || tr->doc_tok <= 0)
        return tr->flops_token;
    double f = flops_per_token(&tr->cfg, tr->doc_sq / tr->doc_tok);
    tr->doc_sq = tr->doc_tok = 0.0;
    return f;
}

/* A --tensorboard write (rank 0's alone) failed with err: one warning,
 * and no more events. The curves are not the run's state: a weeks-long
 * run goes on, as under PyTorch's SummaryWriter; a full disk still stops
 * it, every rank alike, at its next checkpoint. Returns 0. */
static int tensorboard_failed(trainer_t *tr, char *err, size_t errlen)
{
    char ignored[256];
    fprintf(stderr,
            "dtrain: warning: --tensorboard %s: %s; training goes on without TensorBoard events from step %d on "
            "(the step lines keep every step)\n",
            tr->opt->tensorboard, err, tr->steps_done);
    fflush(stderr);
    tfevents_close(tr->tb, ignored, sizeof ignored);
    tr->tb = NULL;
    err[0] = '\0';
    (void)errlen;
    return 0;
}

/* A --metrics write (rank 0's alone) failed: one warning and no more
 * lines, as for --tensorboard. */
static void metrics_failed(trainer_t *tr)
{
    fprintf(stderr,
            "dtrain: warning: --metrics %s: write failed: %s: check free space and permissions; training goes on "
            "without metrics lines from step %d on\n",
            tr->opt->metrics, strerror(errno), tr->steps_done);
    fflush(stderr);
    fclose(tr->metrics);
    tr->metrics = NULL;
}

/* The run's end (also by a stop signal), after everything collective: the
 * --tensorboard file closed, its last bytes written. rc: the run's status
 * so far, returned unless it is 0 and the close fails. */
static int close_tensorboard(trainer_t *tr, int rc, char *err, size_t errlen)
{
    if (rc != 0 || !tr->tb)
        return rc; /* a failed run's file: trainer_teardown closes it */
    tfevents_t *w = tr->tb;
    tr->tb = NULL;
    return tfevents_close(w, err, errlen) != 0 ? tensorboard_failed(tr, err, errlen) : 0;
}

/* The untrained model's validation loss: the baseline the run improves on. */
static int baseline_val(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    double v;
    if (trainer_val_loss(tr, &v, err, errlen) != 0)
        return -1;
    if (tr->env->world_rank != 0)
        return 0;
    printf("step %*d/%d | val %.6f\n", o->steps >= 10000 ? 6 : 4, 0, o->steps, v);
    if (tr->metrics && metrics_write_json_val0(tr->metrics, v) != 0)
        metrics_failed(tr);
    const tfevents_scalar_t v0 = {"val/loss", v};
    if (tr->tb && tfevents_scalars(tr->tb, 0, tfevents_now(), &v0, 1, err, errlen) != 0)
        return tensorboard_failed(tr, err, errlen);
    return 0;
}

/* The step's loss, the mean over the global batch: the last stage's
 * microbatch means, summed over PP (others add 0) and DP. */
static status_t step_loss(trainer_t *tr, double *loss, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    float lf = g->pp_rank == g->pp_size - 1 ? (float)(tr->loss_sum / tr->accum) : 0.0f;
    if (g->pp_size > 1)
        CHECK(g->pp->ops->allreduce(g->pp, &lf, 1, COMM_FP32, COMM_SUM, err, errlen));
    if (g->dp_size > 1)
        CHECK(g->dp->ops->allreduce(g->dp, &lf, 1, COMM_FP32, COMM_SUM, err, errlen));
    *loss = (double)lf / g->dp_size;
    return STATUS_OK;
}

/* The optimizer step on the strategy's view of this rank's state, then
 * the strategy gathers what the update changed elsewhere. */
static int update_params(trainer_t *tr, int step, double lr, double norm, char *err, size_t errlen)
{
    model_t *m = &tr->model;
    const dpsync_optim_view_t *v = &tr->sync.view;
    ckpt_copy_wait(tr); /* --ckpt-async: the writer has copied what the update writes */
    double t_opt = tr->trace ? trace_now() : 0.0;
    /* a view of every parameter keeps the bf16 weights current in the
     * same pass; otherwise the gather writes params, and the bf16 weights
     * are recast once per step */
    adamw_step(&tr->optim, v->params, v->whole ? m->params16 : NULL, v->grads, lr, adamw_clip_scale(&tr->optim, norm));
    if (tr->trace)
        m->ops->sync(m->ops->ctx); /* the span measures the kernels (see model.c span_end) */
    trace_span(tr->trace, TRACE_COMPUTE, "optimizer", t_opt, tr->trace ? trace_now() : 0.0, NULL);
    char cerr[COMM_ERR_MAX];
    if (tr->sync.ops->after_update(&tr->sync, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "step %d: %s", step + 1, cerr);
        return -1;
    }
    /* after the gather: under --offload with host weights, the device's
     * fp32 copies are taken from the params it wrote */
    if (!v->whole)
        model_params_written(m);
    else
        model_params_updated(m);
    return 0;
}

/* The spike guard's verdict on the step (src/train/spike.h): go on, or skip the
 * update (the strategy's gather still runs, of unchanged parameters, so
 * every strategy ends the step as after an update), or roll back. */
static int guard_step(trainer_t *tr, int step, double loss, double norm, spike_action_t *act, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    const spike_ctx_t c = {.world = tr->world,
                           .world_rank = g->world_rank,
                           .tp_rank = g->tp_rank,
                           .pp_rank = g->pp_rank,
                           .dp_rank = g->dp_rank,
                           .sync = &tr->sync,
                           .table = &tr->model.table};
    if (spike_check(&tr->spike, &c, step + 1, tr->opt->steps, loss, norm, act, err, errlen) != 0)
        return -1;
    if (*act == SPIKE_ROLLBACK)
        return spike_rollback(tr, step, err, errlen);
    char cerr[COMM_ERR_MAX];
    if (*act == SPIKE_SKIP && tr->sync.ops->after_update(&tr->sync, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "step %d: %s", step + 1, cerr);
        return -1;
    }
    return 0;
}

/* A step's seconds on this rank: the whole step, its exposed
 * communication (blocked in the DP strategy's waits, TP collectives, the
 * tied-embedding sum) and the pipeline bubble (blocked waiting for a
 * neighbour stage). */
typedef struct step_times {
    double dt, comm, bubble, a2a; /* a2a: the part of comm in the experts' all-to-alls */
    double ring, ring_attn;       /* --cp: the ring's exposed waits (part of comm), and its whole time */
} step_times_t;

/* DeepSeek-V3's aux-loss-free balancing: every MoE layer's expert bias
 * moves by the rate toward balance, b_e += rate * sign(mean - load_e),
 * from load[n_layer][E], the step's assignments over the world (so every
 * layout moves it alike), and goes to the model's local layers. */
static void moe_bias_update(trainer_t *tr, const double *load)
{
    const model_config_t *c = &tr->cfg;
    const int E = c->moe.experts;
    for (int l = 0; l < c->n_layer; l++) {
        if (!model_layer_moe(c, l))
            continue;
        const double *d = load + (size_t)l * E;
        double mean = 0.0;
        for (int x = 0; x < E; x++)
            mean += d[x];
        mean /= E;
        for (int x = 0; x < E; x++)
            tr->moe_bias[(size_t)l * E + x] += c->moe.bias_rate * (float)((d[x] < mean) - (d[x] > mean));
    }
    model_moe_bias_set(&tr->model, tr->moe_bias);
}

/* The MoE layers' routing statistics of the step just run (the model's
 * since model_moe_stats_reset), per model layer over the world: TP rank 0
 * of each stage contributes its layers, each data-parallel replica its
 * own microbatches. Fills r's moe fields (tr->moe_layer holds them); with
 * an expert bias and update set, the same reduction brings the expert
 * loads for moe_bias_update. Collective. */
enum { MOE_STAT_N = 6 };
static int moe_step_stats(trainer_t *tr, step_record_t *r, int update, char *err, size_t errlen)
{
    const model_t *m = &tr->model;
    const int L = tr->cfg.n_layer, E = tr->cfg.moe.experts;
    if (!E)
        return 0;
    const size_t nl = tr->moe_bias ? (size_t)L * E : 0; /* [L][E] loads after the sums */
    if (!tr->moe_layer && !(tr->moe_layer = calloc((size_t)L * (MOE_STAT_N + 5) + nl, sizeof *tr->moe_layer)))
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the MoE statistics of %d layers", L);
    double *sum = tr->moe_layer, *load = sum + (size_t)L * MOE_STAT_N;
    double(*out)[4] = (double(*)[4])(load + nl);
    int *index = (int *)(load + nl + (size_t)L * 4);
    memset(sum, 0, ((size_t)L * MOE_STAT_N + nl) * sizeof *sum);
    for (int i = 0; i < m->n_local && tr->grid->tp_rank == 0; i++) {
        const model_moe_stats_t *st = &m->moe_stats[i];
        const int l = param_layout_layer(&m->lay.part, i);
        double *d = sum + (size_t)l * MOE_STAT_N;
        const double v[MOE_STAT_N] = {st->aux, st->z, st->max_load, st->dropped, st->assigned, st->micro};
        for (int k = 0; k < MOE_STAT_N; k++)
            d[k] += v[k];
        for (size_t x = 0; x < nl / (size_t)L; x++)
            load[(size_t)l * E + x] += m->mload_host[(size_t)i * E + x];
    }
    char cerr[COMM_ERR_MAX];
    if (tr->world->ops->allreduce(tr->world, sum, (size_t)L * MOE_STAT_N + nl, COMM_FP64, COMM_SUM, cerr,
                                  sizeof cerr) != 0)
        return status_set(STATUS_FAIL, err, errlen, "MoE statistics all-reduce failed: %s", cerr);
    if (nl && update && tr->cfg.moe.bias_rate > 0)
        moe_bias_update(tr, load);
    int n = 0;
    for (int l = 0; l < L; l++) {
        const double *d = sum + (size_t)l * MOE_STAT_N;
        if (!model_layer_moe(&tr->cfg, l) || d[5] == 0)
            continue;
        out[n][0] = d[0] / d[5];
        out[n][1] = d[1] / d[5];
        out[n][2] = d[2] / d[5];
        out[n][3] = d[4] > 0 ? d[3] / d[4] : 0.0;
        index[n++] = l;
    }
    r->n_moe = n;
    r->moe_layer = (const double(*)[4])out;
    r->moe_index = index;
    return 0;
}

/* One optimizer step: gradients, loss, norm, update. Fills r's step,
 * loss, lr, norm and rate, and *t. */
static int train_step(trainer_t *tr, int step, step_record_t *r, step_times_t *t, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    model_t *m = &tr->model;
    double t0 = now_s();
    straggler_test_delay(&tr->strag); /* DTRAIN_TEST_SLOW_RANK: tests only */
    double lr = lr_at(&tr->sched, step);
    m->tp_comm_s = 0.0;
    m->ep_comm_s = 0.0;
    m->cp_stats = (cp_ring_stats_t){0};
    tr->embed_comm_s = 0.0;
    model_moe_stats_reset(m);
    if (step_gradients(tr, step, &t->bubble, err, errlen) != 0)
        return -1;
    double loss, norm;
    char cerr[COMM_ERR_MAX];
    if (step_loss(tr, &loss, cerr, sizeof cerr) != STATUS_OK)
        return status_set(STATUS_FAIL, err, errlen, "step %d: loss all-reduce failed: %s", step + 1, cerr);
    if (trainer_grad_norm(tr, &norm, cerr, sizeof cerr) != STATUS_OK)
        return status_set(STATUS_FAIL, err, errlen, "step %d: gradient norm all-reduce failed: %s", step + 1, cerr);
    spike_action_t act;
    if (guard_step(tr, step, loss, norm, &act, err, errlen) != 0)
        return -1;
    if (act != SPIKE_GO) /* --offload: no update takes the gradients copied */
        adamw_grads_drop(&tr->optim);
    if (act == SPIKE_ROLLBACK) { /* the loop goes on from the checkpoint (tr->spike.rolled_back) */
        *t = (step_times_t){0};
        return 0;
    }
    if (act == SPIKE_GO && update_params(tr, step, lr, norm, err, errlen) != 0)
        return -1;
    m->ops->sync(m->ops->ctx); /* the step's time covers its kernels (the optimizer's run ahead of the host) */
    const double dt = now_s() - t0,
                 tokens_step = (double)o->micro_batch * o->seq_len * tr->accum * grid_data_size(tr->grid);
    tr->steps_done = step + 1;
    *r = (step_record_t){.step = step + 1,
                         .steps = o->steps,
                         .loss = loss,
                         .val_loss = NAN,
                         .lr = lr,
                         .grad_norm = norm,
                         .ms = 1e3 * dt,
                         .tokens_per_s = tokens_step / dt};
    t->dt = dt;
    t->ring = m->cp_stats.wait_fwd_s + m->cp_stats.wait_bwd_s;
    t->ring_attn = m->cp_stats.ring_fwd_s + m->cp_stats.ring_bwd_s;
    t->comm = tr->sync.ops->comm_s(&tr->sync) + m->tp_comm_s + m->ep_comm_s + tr->embed_comm_s + t->ring;
    t->a2a = m->ep_comm_s;
    return moe_step_stats(tr, r, act == SPIKE_GO, err, errlen);
}

/* The step's compute, exposed communication and bubble, max and mean over
 * ranks (a straggler or a slow link shows as max well above mean), the
 * allocator's peaks (max over ranks) and the MFU. Collective. */
static int step_stats(trainer_t *tr, step_record_t *r, const step_times_t *st, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    const double dt = st->dt;
    enum { NT = 7 }; /* compute, comm, bubble, a2a, ring, ring_attn, ring busy: max, then sum */
    float t[2 * NT] = {(float)(dt - st->comm - st->bubble),
                       (float)st->comm,
                       (float)(st->bubble / dt),
                       (float)st->a2a,
                       (float)st->ring,
                       (float)st->ring_attn,
                       (float)(st->ring_attn - st->ring)},
                tmax[NT];
    memcpy(tmax, t, sizeof tmax);
    memcpy(t + NT, t, sizeof tmax);
    char cerr[COMM_ERR_MAX];
    if (g->world_size > 1 &&
        (g->world->ops->allreduce(g->world, tmax, NT, COMM_FP32, COMM_MAX, cerr, sizeof cerr) != 0 ||
         g->world->ops->allreduce(g->world, t + NT, NT, COMM_FP32, COMM_SUM, cerr, sizeof cerr) != 0)) {
        snprintf(err, errlen, "step %d: timing all-reduce failed: %s", r->step, cerr);
        return -1;
    }
    for (int k = 0; k < MEM_N_CATEGORIES; k++)
        r->mem_peak[k] = (long long)mem_peak_bytes((mem_category_t)k);
    r->mem_peak[MEM_N_CATEGORIES] = (long long)mem_total_peak_bytes();
    if (tr->world->ops->allreduce(tr->world, r->mem_peak, MEM_N_CATEGORIES + 1, COMM_INT64, COMM_MAX, cerr,
                                  sizeof cerr) != 0) {
        snprintf(err, errlen, "step %d: the all-reduce of the memory peaks failed: %s", r->step, cerr);
        return -1;
    }
    r->compute_ms_max = 1e3 * tmax[0];
    r->comm_ms = 1e3 * tmax[1];
    r->bubble_max = tmax[2];
    r->a2a_ms = 1e3 * tmax[3];
    r->ring_ms = 1e3 * tmax[4];
    r->ring_attn_ms = 1e3 * tmax[5];
    r->compute_ms_mean = 1e3 * t[NT] / g->world_size;
    r->comm_ms_mean = 1e3 * t[NT + 1] / g->world_size;
    r->bubble_mean = t[NT + 2] / g->world_size;
    r->a2a_ms_mean = 1e3 * t[NT + 3] / g->world_size;
    r->ring_ms_mean = 1e3 * t[NT + 4] / g->world_size;
    r->ring_attn_ms_mean = 1e3 * t[NT + 5] / g->world_size;
    r->ring_busy_ms = 1e3 * tmax[6];
    r->ring_busy_ms_mean = 1e3 * t[NT + 6] / g->world_size;
    /* MFU never exceeds 100 %: a step faster than the peak shows the peak
     * was wrong (a probe disturbed by a neighbour, a --peak-gflops too
     * low), and the peak becomes that step's rate from then on */
    double rate = step_flops_token(tr) * r->tokens_per_s * 1e-9 / g->world_size;
    if (tr->peak_gflops > 0 && rate > tr->peak_gflops) {
        if (tr->env->world_rank == 0 && !tr->peak_rebased)
            printf("mfu: step %d ran at %.1f GFLOP/s per rank, above the peak of %.1f (%s): that peak is too "
                   "low; MFU is against the fastest step's rate from here on\n",
                   r->step, rate, tr->peak_gflops, tr->opt->peak_gflops > 0 ? "--peak-gflops" : "sgemm probe");
        tr->peak_rebased = 1;
        tr->peak_gflops = rate;
    }
    r->mfu = tr->peak_gflops > 0 ? rate / tr->peak_gflops : 0.0;
    return straggler_step(&tr->strag, tr->world, r->step, dt - st->comm - st->bubble, &r->straggler, err, errlen);
}

/* After step r->step (of this job's `end`): the replica check and the
 * validation when due, the record printed and written, the checkpoint
 * when due. Collective. */
static int report_step(trainer_t *tr, step_record_t *r, int end, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const int done = r->step;
    if (o->check_replicas > 0 && done % o->check_replicas == 0 && trainer_check_replicas(tr, done, err, errlen) != 0)
        return -1;
    if (tr->has_val && (done % o->val_every == 0 || done == end) &&
        trainer_val_loss(tr, &r->val_loss, err, errlen) != 0)
        return -1;
    if (tr->mc.n && (done % o->eval_every == 0 || done == end) && trainer_eval_mc(tr, r, err, errlen) != 0)
        return -1;
    if (ckpt_wait(tr, 1, err, errlen) != 0)
        return -1;
    r->ckpt_stall_ms = 1e3 * tr->ckpt_stall_s;
    tr->ckpt_stall_s = 0.0;
    r->skipped = tr->spike.in_row > 0 ? spike_verdict_names[tr->spike.verdict] : NULL;
    if (tr->env->world_rank == 0) {
        if (!r->skipped) { /* a skipped step has its spike line instead */
            metrics_eta(&tr->eta, r, o->ckpt_dir[0] ? o->ckpt_every : 0, end);
            metrics_print_step(stdout, r);
        }
        if (tr->metrics && metrics_write_json(tr->metrics, r) != 0)
            metrics_failed(tr);
        if (tr->tb && metrics_write_tfevents(tr->tb, r, tfevents_now(), err, errlen) != 0)
            return tensorboard_failed(tr, err, errlen);
    }
    if (o->ckpt_dir[0] && ((o->ckpt_every > 0 && done % o->ckpt_every == 0) || done == end) &&
        trainer_save(tr, done, err, errlen) != 0)
        return -1;
    return 0;
}

/* --cuda-graphs: what ran inside graphs from the second step on (the
 * first runs every segment plainly; the second captures them). */
static void print_graph_counts(const trainer_t *tr, int end, int ran)
{
    ops_graph_counts_t c, c0 = tr->graph0;
    ops_graph_counts(tr->backend.ops, &c);
    const double steps = ran - 1, in = (double)(c.graph_ops - c0.graph_ops) / steps,
                 out = (double)(c.plain_ops - c0.plain_ops) / steps;
    printf("graphs (rank 0, steps %d-%d): %.1f of %.1f ops per step inside %.1f graph launches; %ld captured, %ld "
           "dropped as stale, %ld captures failed\n",
           tr->start_step + 2, end, in, in + out, (double)(c.launches - c0.launches) / steps, c.captures, c.stale,
           c.refused);
}

/* After the last step of a run that was not stopped: the summary, the
 * final parameters, the sample and the trace. defer0: the deferred ops'
 * counts after the first step. */
static int finish_run(trainer_t *tr, int end, double t_run, double loss, const long defer0[3], char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    if (tr->env->world_rank == 0) {
        double total = now_s() - t_run;
        const int ran = end > tr->start_step ? end - tr->start_step : 0;
        const double tokens_step = (double)o->micro_batch * o->seq_len * tr->accum * grid_data_size(tr->grid);
        printf("done: %d steps in %.1f s, final loss %.6f, %.0f tok/s average\n", ran, total, loss,
               ran > 0 ? tokens_step * ran / total : 0.0);
        if (tr->backend.deferred && ran >= 2) {
            /* what a GPU's host would wait on: the cost the asynchronous ops avoid */
            long ops = 0, waits = 0, casts = 0;
            ops_defer_counts(tr->backend.ops, &ops, &waits, &casts);
            printf("deferred ops (rank 0, steps %d-%d): %.1f ops and %.1f host waits per step\n", tr->start_step + 2,
                   end, (double)(ops - defer0[0]) / (ran - 1), (double)(waits - defer0[1]) / (ran - 1));
            /* the bf16 data path's leftover rounding passes (doc/design.md) */
            printf("deferred ops (rank 0, steps %d-%d): %.1f cast_f32_to_bf16 calls per step\n", tr->start_step + 2,
                   end, (double)(casts - defer0[2]) / (ran - 1));
        }
        if (tr->backend.graphs && ran >= 2)
            print_graph_counts(tr, end, ran);
    }
    if (o->save_params[0] && trainer_save_params(tr, err, errlen) != 0)
        return -1;
    if (o->sample_tokens > 0)
        CHECK(print_sample(tr, stdout, err, errlen));
    if (tr->trace && write_trace(tr, err, errlen) != 0)
        return -1;
    return 0;
}

int trainer_run(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    double t_run = now_s(), loss = NAN;
    long defer0[3] = {0, 0, 0}; /* DTRAIN_DEFER_OPS counts after the first step */
    if (tr->has_val && tr->start_step == 0 && baseline_val(tr, err, errlen) != 0)
        return -1;
    if (tr->start_step >= o->steps && tr->env->world_rank == 0)
        printf("resume: the checkpoint is at step %d and --steps is %d: nothing left to train\n", tr->start_step,
               o->steps);
    /* --stop-at-step ends this job early; the schedule is still --steps' */
    const int end = o->stop_at_step > 0 && o->stop_at_step < o->steps ? o->stop_at_step : o->steps;
    for (int step = tr->start_step; step < end; step++) {
        step_record_t r;
        step_times_t t = {0};
        if (train_step(tr, step, &r, &t, err, errlen) != 0)
            return -1;
        if (tr->spike.rolled_back) { /* on from the checkpoint's step */
            tr->spike.rolled_back = 0;
            step = tr->steps_done - 1;
            continue;
        }
        if (step_stats(tr, &r, &t, err, errlen) != 0 || report_step(tr, &r, end, err, errlen) != 0)
            return -1;
        loss = r.loss;
        if (tr->backend.deferred && step == tr->start_step)
            ops_defer_counts(tr->backend.ops, &defer0[0], &defer0[1], &defer0[2]);
        if (tr->backend.graphs && step == tr->start_step)
            ops_graph_counts(tr->backend.ops, &tr->graph0);
        if (step + 1 < end && stop_requested(tr, step + 1, err, errlen) != 0)
            return -1;
        if (tr->stopped_by)
            break;
    }
    if (ckpt_wait(tr, 0, err, errlen) != 0)
        return -1;
    if (tr->stopped_by) {
        /* the run continues in a later job: no final parameters, no sample */
        return close_tensorboard(tr, tr->trace ? write_trace(tr, err, errlen) : 0, err, errlen);
    }
    return close_tensorboard(tr, finish_run(tr, end, t_run, loss, defer0, err, errlen), err, errlen);
}
void trainer_teardown(trainer_t *tr)
{
    comm_t *groups[GRID_MAX_GROUPS];
    for (int i = 0, n = grid_groups(tr->grid, groups, NULL); i < n; i++) {
        groups[i]->trace = NULL;
        groups[i]->watch = NULL;
    }
    if (tr->world)
        tr->world->watch = NULL;
    trace_destroy(tr->trace);
    /* the report's thread reads the watchdog, the watchdog's hook the report:
     * unhook, end the report, then the watchdog */
    launch_notify_term(-1);
    watchdog_on_fire(tr->watch, NULL, NULL);
    lostpeer_close(tr->lost);
    tr->lost = NULL;
    watchdog_stop(tr->watch);
    mc_eval_close(&tr->mc);
    if (tr->metrics && fclose(tr->metrics) != 0)
        fprintf(stderr, "dtrain: warning: closing --metrics %s failed\n", tr->opt->metrics);
    char tb_err[256]; /* a failed run's file: its one line is the run's error, not this close's */
    tfevents_close(tr->tb, tb_err, sizeof tb_err);
    straggler_free(&tr->strag);
    free(tr->moe_layer);
    free(tr->moe_bias);
    free(tr->tok);
    free(tr->tgt);
    free(tr->pos);
    free(tr->ltok);
    free(tr->ltgt);
    free(tr->lpos);
    free_state(tr);
    ckpt_async_destroy(tr->ckpt_async);
    dpsync_destroy(&tr->sync);
    adamw_destroy(&tr->optim);
    if (tr->model.ops)
        model_destroy(&tr->model);
    backend_close(&tr->backend);
    tokenizer_close(tr->tokenizer);
    free(tr->prompt_ids.id);
    spike_free(&tr->spike);
    data_close(&tr->train);
    if (tr->has_val)
        data_close(&tr->val);
    memset(tr, 0, sizeof *tr);
}
