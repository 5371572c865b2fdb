#include "src/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "src/model/moe.h"

/* ---- local widths ------------------------------------------------------------------ */

static int tp_size(const model_t *m) { return m->lay.part.tp_size; }
static int heads(const model_t *m) { return m->cfg.n_head / tp_size(m); }
static int kv_heads(const model_t *m) { return m->cfg.n_kv_head / tp_size(m); }
/* The widest dense MLP on this rank: d_ff, or a MoE layer's shared
 * expert (what the slots' fc and fc_act have room for). */
static int ffn(const model_t *m)
{
    const int F = m->cfg.moe.shared_ffn > m->cfg.d_ff ? m->cfg.moe.shared_ffn : m->cfg.d_ff;
    return F / tp_size(m);
}
/* Local block i: a MoE layer, its dense MLP width on this rank (a MoE
 * layer's shared expert's, 0 for none) and that MLP's fc output width. */
static int layer_moe(const model_t *m, int i) { return model_layer_moe(&m->cfg, param_layout_layer(&m->lay.part, i)); }
static int layer_ffn(const model_t *m, int i)
{
    return model_layer_ffn(&m->cfg, param_layout_layer(&m->lay.part, i)) / tp_size(m);
}
static int layer_fcw(const model_t *m, int i) { return (m->cfg.arch == ARCH_LLAMA ? 2 : 1) * layer_ffn(m, i); }
static int has_moe(const model_t *m) { return m->cfg.moe.experts > 0; }
/* --cp: the sequence is cut over the CP group, attention by the ring */
static int cp_on(const model_t *m) { return m->lay.cp_size > 1; }

/* --ep: the EP group's size (1: none) */
static size_t ep_size(const model_t *m) { return m->lay.part.ep_size > 1 ? (size_t)m->lay.part.ep_size : 1; }
static int qkv_width(const model_t *m) { return (heads(m) + 2 * kv_heads(m)) * model_head_size(&m->cfg); }
/* Width of the MLP's first matmul output: F (GPT-2) or 2F (Llama gate|up). */
static int fc_width(const model_t *m) { return (m->cfg.arch == ARCH_LLAMA ? 2 : 1) * ffn(m); }
/* Residual-stream rows this rank holds for n tokens. */
static int res_rows(const model_t *m, int n) { return m->lay.sequence_parallel ? n / tp_size(m) : n; }

/* ---- TP collectives: the first failure ends the pass ----------------------------- */

static int tp_active(const model_t *m) { return tp_size(m) > 1; }

/* cerr: the communicator's message */
static status_t tp_fail(const char *cerr, char *err, size_t errlen)
{
    return status_set(STATUS_FAIL, err, errlen, "tensor-parallel collective failed: %.400s", cerr);
}

/* Each blocks until the group is done: exposed communication, timed. The
 * timer starts after ops->sync, so on an asynchronous backend (CUDA) the
 * kernels still running count as compute, not as communication. */

/* The TP collectives in element type dt (COMM_FP32, or COMM_BF16 for
 * the bf16 wire below); no-ops at tp 1. */
typedef enum { TP_SUM, TP_GATHER, TP_SCATTER } tp_kind_t;
static status_t tp_coll(model_t *m, tp_kind_t k, const void *send, void *recv, size_t n, comm_dtype_t dt, comm_op_t op,
                        char *err, size_t errlen)
{
    if (!tp_active(m))
        return STATUS_OK;
    comm_t *c = m->lay.tp;
    m->ops->sync(m->ops->ctx);
    double t0 = trace_now();
    char cerr[COMM_ERR_MAX];
    int rc = k == TP_SUM      ? c->ops->allreduce(c, recv, n, dt, op, cerr, sizeof cerr)
             : k == TP_GATHER ? c->ops->allgather(c, send, recv, n, dt, cerr, sizeof cerr)
                              : c->ops->reduce_scatter(c, send, recv, n, dt, cerr, sizeof cerr);
    m->tp_comm_s += trace_now() - t0;
    return rc != 0 ? tp_fail(cerr, err, errlen) : STATUS_OK;
}

/* Sum of the partial results of a row-parallel matmul, in place. */
static status_t tp_allreduce(model_t *m, float *buf, size_t n, comm_op_t op, char *err, size_t errlen)
{
    return tp_coll(m, TP_SUM, buf, buf, n, COMM_FP32, op, err, errlen);
}

status_t model_tp_sum(model_t *m, float *buf, size_t n, char *err, size_t errlen)
{
    return tp_allreduce(m, buf, n, COMM_SUM, err, errlen);
}

/* all[P*n_each] = every rank's rows in rank order */
static status_t tp_allgather(model_t *m, float *all, const float *mine, size_t n_each, char *err, size_t errlen)
{
    return tp_coll(m, TP_GATHER, mine, all, n_each, COMM_FP32, COMM_SUM, err, errlen);
}

/* The activations' collectives (the row-parallel sums, sequence
 * parallelism's gathers and scatters, and their gradients'): fp32, or
 * under --tp-comm-dtype bf16 rounded into the bf16 GEMM workspaces (a16:
 * the whole [N*C] side, d16: one rank's piece), sent and summed in bf16,
 * and widened back. Nothing else uses a16 and d16 between a GEMM and the
 * next, where these run. */
static int tp_wire16(const model_t *m) { return m->lay.tp_bf16 && tp_active(m); }

static status_t tp_act_sum(model_t *m, float *buf, size_t n, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    if (!tp_wire16(m))
        return tp_allreduce(m, buf, n, COMM_SUM, err, errlen);
    o->cast_f32_to_bf16(o->ctx, m->a16, buf, n);
    CHECK(tp_coll(m, TP_SUM, m->a16, m->a16, n, COMM_BF16, COMM_SUM, err, errlen));
    o->cast_bf16_to_f32(o->ctx, buf, m->a16, n);
    return STATUS_OK;
}

/* all[P*n_each] = every rank's mine[n_each], in rank order */
static status_t tp_act_gather(model_t *m, float *all, const float *mine, size_t n_each, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    if (!tp_wire16(m))
        return tp_allgather(m, all, mine, n_each, err, errlen);
    o->cast_f32_to_bf16(o->ctx, m->d16, mine, n_each);
    CHECK(tp_coll(m, TP_GATHER, m->d16, m->a16, n_each, COMM_BF16, COMM_SUM, err, errlen));
    o->cast_bf16_to_f32(o->ctx, all, m->a16, n_each * (size_t)tp_size(m));
    return STATUS_OK;
}

/* mine[n_each] = the sum over ranks of all's piece r (this rank's) */
static status_t tp_act_scatter(model_t *m, float *mine, const float *all, size_t n_each, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    if (!tp_wire16(m))
        return tp_coll(m, TP_SCATTER, all, mine, n_each, COMM_FP32, COMM_SUM, err, errlen);
    o->cast_f32_to_bf16(o->ctx, m->a16, all, n_each * (size_t)tp_size(m));
    CHECK(tp_coll(m, TP_SCATTER, m->a16, m->d16, n_each, COMM_BF16, COMM_SUM, err, errlen));
    o->cast_bf16_to_f32(o->ctx, mine, m->d16, n_each);
    return STATUS_OK;
}

/* --tp-comm-overlap: a column-parallel matmul's input gradient dln[N*C]
 * (partial sums over TP) reduced beside its weight-gradient GEMM. begin
 * posts the reduce-scatter into dlnr (sequence parallelism) or the
 * all-reduce in place, staged in tpo16 under the bf16 wire; end waits for
 * it (the wait is the exposed TP time) and widens the bf16 result. The
 * sums are the blocking collectives'. */
typedef struct tp_dgrad {
    comm_req_t req;
    int active;
} tp_dgrad_t;

static status_t tp_dgrad_begin(model_t *m, tp_dgrad_t *p, int N, int NR, char *err, size_t errlen)
{
    comm_t *c = m->lay.tp;
    const size_t C = (size_t)m->cfg.d_model, n = (size_t)N * C, nr = (size_t)NR * C;
    const int sp = m->lay.sequence_parallel, w16 = tp_wire16(m);
    const comm_dtype_t dt = w16 ? COMM_BF16 : COMM_FP32;
    void *send = m->dln;
    if (w16) {
        m->ops->cast_f32_to_bf16(m->ops->ctx, m->tpo16, m->dln, n);
        send = m->tpo16;
    }
    char cerr[COMM_ERR_MAX];
    const double t0 = trace_now();
    int rc = sp ? c->ops->ireduce_scatter(c, send, w16 ? (void *)(m->tpo16 + n) : (void *)m->dlnr, nr, dt, &p->req,
                                          cerr, sizeof cerr)
                : c->ops->iallreduce(c, send, n, dt, COMM_SUM, &p->req, cerr, sizeof cerr);
    m->tp_comm_s += trace_now() - t0; /* posting (on MPI it waits for the ops issued so far) */
    p->active = rc == 0;
    return rc != 0 ? tp_fail(cerr, err, errlen) : STATUS_OK;
}

/* The wait for a posted TP collective: the exposed TP time. */
static status_t tp_pending_wait(model_t *m, tp_dgrad_t *p, char *err, size_t errlen)
{
    comm_t *c = m->lay.tp;
    char cerr[COMM_ERR_MAX];
    const double t0 = trace_now();
    const int rc = c->ops->wait(&p->req, cerr, sizeof cerr);
    m->tp_comm_s += trace_now() - t0;
    p->active = 0;
    return rc != 0 ? tp_fail(cerr, err, errlen) : STATUS_OK;
}

static status_t tp_dgrad_end(model_t *m, tp_dgrad_t *p, int N, int NR, char *err, size_t errlen)
{
    const size_t C = (size_t)m->cfg.d_model, n = (size_t)N * C;
    CHECK(tp_pending_wait(m, p, err, errlen));
    if (tp_wire16(m)) {
        if (m->lay.sequence_parallel)
            m->ops->cast_bf16_to_f32(m->ops->ctx, m->dlnr, m->tpo16 + n, (size_t)NR * C);
        else
            m->ops->cast_bf16_to_f32(m->ops->ctx, m->dln, m->tpo16, n);
    }
    return STATUS_OK;
}

/* --tp-comm-overlap under sequence parallelism: the gather of dres (this
 * rank's rows of the attention output's gradient) into dfull2, posted
 * before the MLP's deferred weight-gradient GEMM (which reads dfull) and
 * waited for after it; staged in tpo16 under the bf16 wire (that GEMM
 * rounds its output gradient into d16). */
static status_t tp_gather_begin(model_t *m, tp_dgrad_t *p, int N, int NR, char *err, size_t errlen)
{
    comm_t *c = m->lay.tp;
    const size_t C = (size_t)m->cfg.d_model, n = (size_t)N * C, nr = (size_t)NR * C;
    const int w16 = tp_wire16(m);
    if (w16)
        m->ops->cast_f32_to_bf16(m->ops->ctx, m->tpo16 + n, m->dres, nr);
    char cerr[COMM_ERR_MAX];
    const double t0 = trace_now();
    const int rc = w16 ? c->ops->iallgather(c, m->tpo16 + n, m->tpo16, nr, COMM_BF16, &p->req, cerr, sizeof cerr)
                       : c->ops->iallgather(c, m->dres, m->dfull2, nr, COMM_FP32, &p->req, cerr, sizeof cerr);
    m->tp_comm_s += trace_now() - t0;
    p->active = rc == 0;
    return rc != 0 ? tp_fail(cerr, err, errlen) : STATUS_OK;
}

static status_t tp_gather_end(model_t *m, tp_dgrad_t *p, int N, char *err, size_t errlen)
{
    CHECK(tp_pending_wait(m, p, err, errlen));
    if (tp_wire16(m))
        m->ops->cast_bf16_to_f32(m->ops->ctx, m->dfull2, m->tpo16, (size_t)N * m->cfg.d_model);
    return STATUS_OK;
}

/* A compute span from t0 to now on the trace (no-op without --trace):
 * "fwd h.3", "bwd head". layer -1 = not a block. On an asynchronous
 * backend it waits for the span's kernels, so a traced run measures them
 * (and loses the host running ahead of the GPU). */
static void span_end(const model_t *m, const char *what, int layer, double t0)
{
    if (!m->trace)
        return;
    m->ops->sync(m->ops->ctx);
    char name[TRACE_NAME_MAX + 1];
    if (layer >= 0)
        snprintf(name, sizeof name, "%s h.%d", what, layer);
    else
        snprintf(name, sizeof name, "%s", what);
    trace_span(m->trace, TRACE_COMPUTE, name, t0, trace_now(),
               &(trace_args_t){.bytes = -1, .microbatch = m->trace_micro, .layer = layer, .peer = -1});
}

static double span_start(const model_t *m) { return m->trace ? trace_now() : 0.0; }

/* ---- tensors ------------------------------------------------------------------------- */

/* The named tensor in a buffer that starts at flat offset base_off. */
static float *tensor_at(const model_t *m, float *flat, size_t base_off, const char *fmt, int layer)
{
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    int i = param_table_find(&m->table, name);
    return i < 0 ? NULL : flat + (m->table.p[i].offset - base_off);
}

/* Where each of the stage's Ls local layers starts in table t: start[l]
 * (Ls + 1 entries) is the lowest offset of its tensors, numel where none;
 * start[Ls] is the final norm's and head's (layer n_layer) on the last
 * stage. */
static void layer_starts(const param_table_t *t, const param_layout_t *part, size_t *start)
{
    const int Ls = param_layout_blocks(part);
    for (int i = 0; i <= Ls; i++)
        start[i] = t->numel;
    for (int i = t->n - 1; i >= 0; i--) { /* lowest offset of each layer wins */
        /* a tensor of a layer this stage holds no block of is the head's (n_layer) */
        const int layer = t->p[i].layer, l = layer < 0 ? -1 : param_layout_local(part, layer);
        if (layer >= 0)
            start[l >= 0 ? l : Ls] = t->p[i].offset;
    }
}

/* Floats of the fp32 parameter and gradient buffers (start: layer_starts,
 * Ls + 1 entries): the whole flat table, or under lent blocks only the
 * tensors outside them, the embeddings below start[0] and the final norm
 * and head from start[Ls] up. */
static void state_floats(const param_table_t *t, const model_layout_t *lay, const size_t *start, size_t *params_n,
                         size_t *grads_n)
{
    const int Ls = param_layout_blocks(&lay->part);
    const size_t outside = start[0] + (t->numel - start[Ls]);
    *params_n = lay->lent_block_params ? outside : t->numel;
    *grads_n = lay->lent_block_grads ? outside : t->numel;
}

/* lay.params_host: whether tensor d is read in fp32 by an op other than
 * the matmuls (then the device keeps a copy of it): every tensor but the
 * matmul weights, which are read from params16 only, and a last stage's
 * tied embedding, which is only its head there. */
static int read_in_fp32(const param_desc_t *d, const model_layout_t *lay)
{
    static const char *const matmul[] = {"attn.wq", "attn.wk",  "attn.wv",   "attn.wo", "mlp.wfc",
                                         "mlp.wgate", "mlp.wup", "mlp.wproj", "moe.wfc", "moe.wproj"};
    const char *name = d->name;
    if (strcmp(name, "lm_head.w") == 0)
        return 0;
    if ((strcmp(name, "wte") == 0 || strcmp(name, "tok_emb") == 0) && !lay->part.has_embed)
        return 0;
    if (d->layer >= 0 && strncmp(name, "h.", 2) == 0) {
        const char *dot = strchr(name + 2, '.');
        for (size_t k = 0; dot && k < sizeof matmul / sizeof *matmul; k++)
            if (strcmp(dot + 1, matmul[k]) == 0)
                return 0;
    }
    return 1;
}

/* lay.params_host: the runs of tensors read in fp32 (read_in_fp32),
 * adjacent in params and in weights_dev, into runs (NULL: count only; at
 * most t->n); each run starts there at the same offset modulo 16 floats
 * (64 bytes) as in params, so that the copies keep params' alignment.
 * Returns the runs; *floats: weights_dev's length. */
static int weights_dev_runs(const param_table_t *t, const model_layout_t *lay, struct weights_run *runs,
                            size_t *floats)
{
    int n = 0;
    size_t at = 0, end = (size_t)-1;
    for (int i = 0; i < t->n; i++) {
        const param_desc_t *d = &t->p[i];
        if (d->numel == 0 || !read_in_fp32(d, lay))
            continue;
        if (n > 0 && d->offset == end) { /* extends the run */
            if (runs)
                runs[n - 1].n += d->numel;
        } else {
            at += (d->offset - at) % 16;
            if (runs)
                runs[n] = (struct weights_run){.flat = d->offset, .dev = at, .n = d->numel};
            n++;
        }
        at += d->numel;
        end = d->offset + d->numel;
    }
    *floats = at;
    return n;
}

/* Bytes of weights_dev for n floats: at least one, so it is never empty. */
static size_t weights_dev_bytes(size_t n) { return (n ? n : 1) * sizeof(float); }

/* A non-block tensor in a buffer laid out like the flat one (compact = 0),
 * or holding only the non-block tensors, the upper ones moved down to
 * follow the embeddings (compact = 1: the lent-gradient layout). */
static float *outside_ptr(const model_t *m, float *flat, int compact, const char *name)
{
    int i = param_table_find(&m->table, name);
    if (i < 0)
        return NULL;
    const size_t off = m->table.p[i].offset, hi = m->layer_start[m->n_local];
    return flat + (compact && off >= hi ? off - (hi - m->layer_start[0]) : off);
}

/* Block i's tensors in a buffer that starts at flat offset base_off.
 * Returns -1 if the fused GEMMs' adjacency assumptions do not hold. */
static int map_block(const model_t *m, float *flat, size_t base_off, int i, block_tensors_t *h)
{
    const model_config_t *c = &m->cfg;
    const int gpt = c->arch == ARCH_GPT2;
    const size_t C = (size_t)c->d_model, HS = (size_t)model_head_size(c);
    const size_t QD = (size_t)heads(m) * HS, KVD = (size_t)kv_heads(m) * HS;
    const int l = param_layout_layer(&m->lay.part, i);
    h->ln1w = tensor_at(m, flat, base_off, "h.%d.ln1.w", l);
    h->ln1b = tensor_at(m, flat, base_off, "h.%d.ln1.b", l);
    h->wqkv = tensor_at(m, flat, base_off, "h.%d.attn.wq", l);
    h->bqkv = tensor_at(m, flat, base_off, "h.%d.attn.bq", l);
    h->wo = tensor_at(m, flat, base_off, "h.%d.attn.wo", l);
    h->bo = tensor_at(m, flat, base_off, "h.%d.attn.bo", l);
    h->qnorm = tensor_at(m, flat, base_off, "h.%d.attn.qnorm", l);
    h->knorm = tensor_at(m, flat, base_off, "h.%d.attn.knorm", l);
    h->ln2w = tensor_at(m, flat, base_off, "h.%d.ln2.w", l);
    h->ln2b = tensor_at(m, flat, base_off, "h.%d.ln2.b", l);
    h->wfc = tensor_at(m, flat, base_off, gpt ? "h.%d.mlp.wfc" : "h.%d.mlp.wgate", l);
    h->bfc = tensor_at(m, flat, base_off, "h.%d.mlp.bfc", l);
    h->wproj = tensor_at(m, flat, base_off, "h.%d.mlp.wproj", l);
    h->bproj = tensor_at(m, flat, base_off, "h.%d.mlp.bproj", l);
    h->router = tensor_at(m, flat, base_off, "h.%d.moe.router", l);
    h->ewfc = tensor_at(m, flat, base_off, "h.%d.moe.wfc", l);
    h->ebfc = tensor_at(m, flat, base_off, "h.%d.moe.bfc", l);
    h->ewproj = tensor_at(m, flat, base_off, "h.%d.moe.wproj", l);
    h->ebproj = tensor_at(m, flat, base_off, "h.%d.moe.bproj", l);
    h->sgate = tensor_at(m, flat, base_off, "h.%d.moe.shared_gate", l);
    /* one GEMM computes q|k|v, and one computes gate|up */
    if (tensor_at(m, flat, base_off, "h.%d.attn.wk", l) != h->wqkv + QD * C ||
        tensor_at(m, flat, base_off, "h.%d.attn.wv", l) != h->wqkv + (QD + KVD) * C)
        return -1;
    if (h->bqkv && (tensor_at(m, flat, base_off, "h.%d.attn.bk", l) != h->bqkv + QD ||
                    tensor_at(m, flat, base_off, "h.%d.attn.bv", l) != h->bqkv + QD + KVD))
        return -1;
    if (!gpt && h->wfc && tensor_at(m, flat, base_off, "h.%d.mlp.wup", l) != h->wfc + (size_t)layer_ffn(m, i) * C)
        return -1;
    return 0;
}

/* Resolves the named tensors of the table into pointers into flat (laid
 * out like the flat buffer; compact: the lent-gradient layout, whose block
 * pointers are set per backward by model_backward). Returns -1 if the
 * fused GEMMs' adjacency assumptions do not hold. */
static int map_tensors(model_t *m, float *flat, model_tensors_t *t, int compact)
{
    const model_config_t *c = &m->cfg;
    const int gpt = c->arch == ARCH_GPT2;
    t->wte = outside_ptr(m, flat, compact, model_embed_name(c));
    t->wpe = gpt ? outside_ptr(m, flat, compact, "wpe") : NULL;
    t->lnfw = outside_ptr(m, flat, compact, "lnf.w");
    t->lnfb = gpt ? outside_ptr(m, flat, compact, "lnf.b") : NULL;
    t->head = outside_ptr(m, flat, compact, model_head_tied(c) ? model_embed_name(c) : "lm_head.w");
    if (!m->lay.part.has_head)
        t->head = NULL;
    if (!m->lay.part.has_embed)
        t->wte = NULL;
    for (int i = 0; i < m->n_local; i++) {
        if (compact)
            memset(&t->h[i], 0, sizeof t->h[i]);
        else if (map_block(m, flat, 0, i, &t->h[i]) != 0)
            return -1;
    }
    return 0;
}

/* lay.params_host: p at flat offset off, or its place in weights_dev when
 * its tensor is read in fp32 there (a run holds it). */
static float *dev_copy_of(const model_t *m, float *p)
{
    if (!p)
        return NULL;
    const size_t off = (size_t)(p - m->params);
    for (int k = 0; k < m->n_weights_runs; k++) {
        const struct weights_run *r = &m->weights_runs[k];
        if (off >= r->flat && off < r->flat + r->n)
            return m->weights_dev + r->dev + (off - r->flat);
    }
    return p;
}

/* lay.params_host: the pointers of the tensors read in fp32 at their
 * copies in weights_dev; the matmul weights' stay in params, where
 * weight16 finds their place in params16 (the head too, also when tied to
 * the embedding, whose lookup reads the copy). Returns -1 where the
 * layout cannot hold its parameters on the host. */
static int point_at_weights_dev(model_t *m)
{
    if (!m->lay.bf16 || m->lay.lent_block_params)
        return -1;
    model_tensors_t *t = &m->p;
    t->wte = dev_copy_of(m, t->wte);
    t->wpe = dev_copy_of(m, t->wpe);
    t->lnfw = dev_copy_of(m, t->lnfw);
    t->lnfb = dev_copy_of(m, t->lnfb);
    for (int i = 0; i < m->n_local; i++) {
        block_tensors_t *h = &t->h[i];
        float **fp32[] = {&h->ln1w, &h->ln1b,  &h->bqkv, &h->bo,   &h->qnorm,  &h->knorm, &h->ln2w,
                          &h->ln2b, &h->bfc,   &h->bproj, &h->router, &h->ebfc, &h->ebproj, &h->sgate};
        for (size_t k = 0; k < sizeof fp32 / sizeof *fp32; k++)
            *fp32[k] = dev_copy_of(m, *fp32[k]);
    }
    return 0;
}

/* lay.params_host: weights_dev from params, after a write of params
 * (ordered after the ops that wrote it) */
static void refresh_weights_dev(model_t *m)
{
    for (int k = 0; m->lay.params_host && k < m->n_weights_runs; k++) {
        const struct weights_run *r = &m->weights_runs[k];
        m->ops->copy(m->ops->ctx, m->weights_dev + r->dev, m->params + r->flat, r->n * sizeof(float));
    }
}

/* ---- activation arenas ----------------------------------------------------------------- */

/* Carves n floats out of the arena at *cursor (64-byte aligned pieces). */
static float *carve(char *base, size_t *cursor, size_t n)
{
    float *p = base ? (float *)(base + *cursor) : NULL;
    *cursor += (n * sizeof(float) + 63) & ~(size_t)63;
    return p;
}

/* Carves n bf16 values: h(n) = r(ceil(n/2)) bytes. */
static uint16_t *carve16(char *base, size_t *cursor, size_t n) { return (uint16_t *)carve(base, cursor, (n + 1) / 2); }

/* Carves one block's tensors: `core` (everything but fc_act, dropped only
 * by full recompute) and `act` (the activation function's output). Tensors
 * not carved stay NULL. Under --dtype bf16 the matmul-only inputs ln1,
 * ln2 and fc_act are carved as bf16. */
/* A MoE model's routing and expert tensors of one block (moe.h's shapes). */
static void carve_moe(const model_t *m, char *base, size_t *cursor, moe_acts_t *a)
{
    const size_t Nall = (size_t)m->B * (size_t)m->T, E = (size_t)m->cfg.moe.experts, K = (size_t)m->cfg.moe.top_k;
    const size_t N = (size_t)moe_tokens(m, (int)Nall), NK = N * K, C = (size_t)m->cfg.d_model;
    a->logits = carve(base, cursor, N * E);
    a->scores = carve(base, cursor, N * E);
    a->lse = carve(base, cursor, N);
    a->gate = carve(base, cursor, NK);
    a->idx = (int32_t *)carve(base, cursor, NK);
    a->perm = (int32_t *)carve(base, cursor, NK);
    a->where = (int32_t *)carve(base, cursor, NK);
    a->offs = (int32_t *)carve(base, cursor, E + 1);
    /* R: the expert rows this rank may compute, all of the EP group's
     * assignments at worst (every token routed to its experts) */
    const size_t R = ep_size(m) * NK;
    a->he = carve(base, cursor, R * (size_t)moe_fcw_local(m));
    a->ae = carve(base, cursor, R * (size_t)moe_ffn_local(m));
    a->ye = carve(base, cursor, NK * C);
    a->auxw = carve(base, cursor, E);
    a->xr = ep_size(m) > 1 ? carve(base, cursor, R * C) : NULL;
    a->sgate = m->cfg.moe.shared_gate ? carve(base, cursor, Nall) : NULL;
    a->sy = m->cfg.moe.shared_gate ? carve(base, cursor, Nall * C) : NULL;
}

static void carve_block(const model_t *m, char *base, size_t *cursor, block_acts_t *s, int core, int act)
{
    const int bf16 = m->lay.bf16;
    const size_t N = (size_t)m->B * (size_t)m->T, NR = (size_t)res_rows(m, (int)N), C = (size_t)m->cfg.d_model;
    const size_t QD = (size_t)heads(m) * (size_t)model_head_size(&m->cfg);
    const size_t LSE = (size_t)m->B * (size_t)heads(m) * (size_t)m->T;
    memset(s, 0, sizeof *s);
    if (core) {
        if (bf16)
            s->ln1_16 = carve16(base, cursor, N * C);
        else
            s->ln1 = carve(base, cursor, N * C);
        s->ln1_mean = carve(base, cursor, NR);
        s->ln1_rstd = carve(base, cursor, NR);
        s->qkv = carve(base, cursor, N * (size_t)qkv_width(m));
        if (m->cfg.qk_norm) {
            const size_t nqk = (size_t)heads(m) + (size_t)kv_heads(m);
            s->qk_in = carve(base, cursor, N * nqk * (size_t)model_head_size(&m->cfg));
            s->qk_rstd = carve(base, cursor, N * nqk);
        }
        s->lse = carve(base, cursor, LSE);
        s->atty = carve(base, cursor, N * QD);
        if (bf16)
            s->atty16 = carve16(base, cursor, N * QD);
        s->res2 = carve(base, cursor, NR * C);
        if (bf16)
            s->ln2_16 = carve16(base, cursor, N * C);
        if (!bf16 || has_moe(m)) /* the router and experts read it in fp32 */
            s->ln2 = carve(base, cursor, N * C);
        s->ln2_mean = carve(base, cursor, NR);
        s->ln2_rstd = carve(base, cursor, NR);
        s->fc = carve(base, cursor, N * (size_t)fc_width(m));
    }
    if (act && bf16)
        s->fc_act16 = carve16(base, cursor, N * (size_t)ffn(m));
    else if (act)
        s->fc_act = carve(base, cursor, N * (size_t)ffn(m));
}

/* Lays out every slot's activations and the shared workspace in two arenas.
 * Called once with base == NULL to size them, then with the allocated arenas.
 *
 * Bytes (what a planner must reproduce). Every piece is 64-byte aligned:
 * r(n) = 64 * ceil(4n / 64) for n floats. N = B*T (micro batch x seq len),
 * NR = N (N/P with sequence parallelism), Ls blocks on this stage, widths
 * as in model.h, FW = F (GPT-2) or 2F (Llama), big = max(QKV, FW, QD).
 *   core  = 2 r(N*C) + 4 r(NR) + r(N*QKV) + r(B*NH*T) + r(N*QD) + r(NR*C)
 *           + r(N*FW)
 *           + r(N*(NH+NKV)*HS) + r(N*(NH+NKV))  (qk_norm: q, k before their norms, rstd)
 *   act   = r(N*F)
 *   (--dtype bf16: 2 h(N*C) for ln1 and ln2 in core, + h(N*QD) for the
 *   attention output's bf16 copy, act = h(N*F), with h() below: the
 *   matmul-only inputs are kept in bf16)
 *   block = core + act  (--recompute none)
 *           core        (selective)
 *           0           (full)
 *   head  = r(N*C) + 2 r(NR) + r(N*Vl) + 2 r(N) + r(2N)  (last stage only;
 *           without the r(N*Vl) logits under the fused classifier)
 *   slot  = r((Ls+1)*NR*C) + Ls*block + head + 2 r(N)  (+ r(N) with doc_mask)
 *   activations = n_slots * slot
 *   workspace   = 3 r(NR*C) + 3 r(N*C) + 2 r(N*big) + r(HS/2) (Llama: RoPE's table)
 *                 + 0 (none, selective) | core (full)
 *                 + r(X*Vl) where X*Vl > 2 r(N*big)/4 (fused classifier, last
 *                   stage: X = model_logits_rows, the chunk's logits where
 *                   they do not fit over dbig and dbig2)
 *                 + h(N*IC) + h(N*OC)                (--dtype bf16 only)
 *                 + h(WMAX)        (--dtype bf16 with lent block params only)
 * where h(n) = r(ceil(n/2)) holds n bf16 values, IC = max(C, QD, F), OC =
 * max(C, big, Vl on the last stage; under the fused classifier N*OC is
 * max(N*max(C, big), X*Vl) on the last stage) and WMAX = max(QKV*C, FW*C): the bf16
 * copies of one GEMM's input and output gradient, and of a ZeRO-3 block's
 * weight (every other weight's bf16 copy is params16, counted as
 * parameters). A MoE model widens IC, OC to its experts' rows and WMAX to
 * a lent block's El local experts' fc weights (El*FWe*C), which one grouped
 * GEMM reads at once.
 * (dres, dlnr and lnr are the r(NR*C) terms; dfull, dln and tmp the
 * r(N*C) ones; r(B*NH*T) is attention's log-sum-exp: flash-style attention
 * keeps nothing T x T.) The recomputed fc_act needs no bytes of its own: it
 * lives in dbig2. So selective saves Ls*n_slots*act, full
 * Ls*n_slots*(core + act) - core. */
/* The most blocks one run (chunk) of the layout has: a slot's capacity. */
static int run_cap(const param_layout_t *p)
{
    int cap = 0;
    for (int r = 0; r < p->n_runs; r++)
        if (p->run_end[r] - p->run_begin[r] > cap)
            cap = p->run_end[r] - p->run_begin[r];
    return cap;
}

/* The split backward keeps each block's four matmul output gradients from
 * B for W: mlp proj [N,C], fc [N,fcw], attention proj [N,C], qkv
 * [N,qkvw]. Each waits in a slot buffer B has finished reading when it is
 * written, where the layout has one of its size, else in the slot's own
 * wdout; so without recomputation zb-h1 holds no more than a slot:
 *   proj -> x(i+1), the block's output: the block above (or the head)
 *           has run its backward [rows: no full recomputation]
 *   fc   -> fc, which B reads only before [no full recomputation; under
 *           selective B computes the MLP projection's weight gradient
 *           itself while its recomputed fc_act is there, so W needs no
 *           fc_act and no fc]
 *   o    -> res2, read last by the ln2 backward before it [rows]
 *   qkv  -> qkv, read last by the attention backward [no full recompute]
 * The two [N,C] ones are the residual stream's gradient, of which a rank
 * holds its NR rows under sequence parallelism: those rows are kept (they
 * fit x(i+1) and res2), and W all-gathers them over TP again, as B did.
 * Full recomputation keeps no block activations in the slot: all four
 * wait in wdout. */
typedef struct wdout_at {
    float *proj, *fc, *o, *qkv;
} wdout_at_t;

static void wdout_fits(const model_t *m, int *rows, int *fc, int *qkv)
{
    const model_recompute_t rc = m->lay.recompute;
    *rows = rc != MODEL_RECOMPUTE_FULL;
    *fc = rc != MODEL_RECOMPUTE_FULL;
    *qkv = rc != MODEL_RECOMPUTE_FULL;
}

/* The widest MLP first-matmul output of any layer: a dense layer's, or a
 * MoE layer's shared expert's (its experts' weight gradients are B's). */
static size_t max_fcw(const model_t *m)
{
    const int F = m->cfg.moe.shared_ffn > m->cfg.d_ff ? m->cfg.moe.shared_ffn : m->cfg.d_ff;
    return (size_t)((m->cfg.arch == ARCH_LLAMA ? 2 : 1) * (F / tp_size(m)));
}

/* Floats of one block's output gradients that wait in wdout. */
static size_t wdout_floats(const model_t *m, size_t N)
{
    int rows, fc, qkv;
    wdout_fits(m, &rows, &fc, &qkv);
    const size_t NR = (size_t)res_rows(m, (int)N);
    return (rows ? 0 : 2 * NR * (size_t)m->cfg.d_model) +
           N * ((fc ? 0 : max_fcw(m)) + (qkv ? 0 : (size_t)qkv_width(m)));
}

static void layout_acts(model_t *m, char *acts, size_t *acts_bytes, char *work, size_t *work_bytes)
{
    const size_t N = (size_t)m->B * (size_t)m->T, NR = (size_t)res_rows(m, (int)N);
    /* a slot holds one chunk's blocks: the longest run */
    const size_t C = (size_t)m->cfg.d_model, Ls = (size_t)run_cap(&m->lay.part), Vl = (size_t)m->v_rows;
    const size_t QKV = (size_t)qkv_width(m), QD = (size_t)heads(m) * (size_t)model_head_size(&m->cfg);
    const size_t FW = (size_t)fc_width(m);
    const model_recompute_t rc = m->lay.recompute;
    size_t a = 0, w = 0;
    /* sizing without a model (model_arena_bytes): the pointers land here */
    model_slot_t scratch_slot;
    block_acts_t scratch_acts;
    /* The head's buffers live from a forward to its backward. Under the
     * split backward the last stage runs each B right after its F
     * (zb-h1 has no warm-up there) and B computes the head's weight
     * gradient too, so one set serves every slot; else one per slot. */
    const int head_shared = m->lay.part.has_head && m->lay.split_backward;
    const int fused = m->lay.part.has_head && m->lay.logits_chunk != MODEL_LOGITS_WHOLE;
    const model_slot_t *head = NULL; /* the slot holding the shared set */
    for (int k = 0; k < m->lay.n_slots; k++) {
        model_slot_t *sl = m->slots ? &m->slots[k] : &scratch_slot;
        sl->x = carve(acts, &a, (Ls + 1) * NR * C);
        for (size_t l = 0; l < Ls; l++) {
            block_acts_t *ba = m->slots ? &sl->acts[l] : &scratch_acts;
            carve_block(m, acts, &a, ba, rc != MODEL_RECOMPUTE_FULL, rc == MODEL_RECOMPUTE_NONE);
            if (has_moe(m))
                carve_moe(m, acts, &a, &ba->moe);
            if (has_moe(m) && m->moffs_host)
                ba->moe.hoffs = m->moffs_host + ((size_t)k * Ls + l) * ((size_t)m->cfg.moe.experts + 1);
            if (has_moe(m) && m->mrcnt_host)
                ba->moe.hrcnt = m->mrcnt_host + ((size_t)k * Ls + l) * (size_t)m->cfg.moe.experts;
        }
        if (m->lay.part.has_head && (k == 0 || !head_shared)) {
            sl->lnf = carve(acts, &a, N * C);
            sl->lnf_mean = carve(acts, &a, NR);
            sl->lnf_rstd = carve(acts, &a, NR);
            sl->logits = fused ? NULL : carve(acts, &a, N * Vl);
            sl->losses = carve(acts, &a, N);
            sl->xmax = carve(acts, &a, N);
            sl->xstats = carve(acts, &a, 2 * N);
            head = sl;
        } else if (head_shared) {
            sl->lnf = head->lnf;
            sl->lnf_mean = head->lnf_mean;
            sl->lnf_rstd = head->lnf_rstd;
            sl->logits = head->logits;
            sl->losses = head->losses;
            sl->xmax = head->xmax;
            sl->xstats = head->xstats;
        }
        sl->tokens = (int32_t *)carve(acts, &a, N);
        sl->targets = (int32_t *)carve(acts, &a, N);
        sl->pos = m->lay.doc_mask || cp_on(m) ? (int32_t *)carve(acts, &a, N) : NULL;
        sl->qdoc = m->lay.doc_mask && cp_on(m) ? (int32_t *)carve(acts, &a, N) : NULL;
        sl->wdout = m->lay.split_backward ? carve(acts, &a, Ls * wdout_floats(m, N)) : NULL;
    }
    size_t big = QKV;
    if (FW > big)
        big = FW;
    if (QD > big)
        big = QD;
    m->dres = carve(work, &w, NR * C);
    m->dfull = carve(work, &w, N * C);
    m->dln = carve(work, &w, N * C);
    m->dlnr = carve(work, &w, NR * C);
    m->dbig = carve(work, &w, N * big);
    m->dbig2 = carve(work, &w, N * big);
    /* the fused classifier's chunk of logits: over dbig and dbig2 (one
     * run of 2 r(N*big) bytes) where it fits, else its own */
    const size_t scratch = 2 * (((N * big * sizeof(float) + 63) & ~(size_t)63) / sizeof(float));
    m->xrows = fused ? model_logits_rows(m->lay.logits_chunk, N, Vl, scratch) : 0;
    m->xlogits = NULL;
    if (fused)
        m->xlogits = (size_t)m->xrows * Vl <= scratch ? m->dbig : carve(work, &w, (size_t)m->xrows * Vl);
    m->tmp = carve(work, &w, N * C);
    m->lnr = carve(work, &w, NR * C);
    m->inv_freq = m->cfg.arch == ARCH_LLAMA ? carve(work, &w, (size_t)model_head_size(&m->cfg) / 2) : NULL;
    carve_block(m, work, &w, &m->racts, rc == MODEL_RECOMPUTE_FULL, 0);
    if (has_moe(m)) {
        const size_t K = (size_t)m->cfg.moe.top_k, E = (size_t)m->cfg.moe.experts, FWe = (size_t)moe_fcw_local(m);
        const size_t NM = (size_t)moe_tokens(m, (int)N); /* the tokens this rank routes */
        const size_t wide = FWe > C ? FWe : C, R = ep_size(m) * NM * K;
        m->mx = carve(work, &w, NM * K * C);
        m->md1 = carve(work, &w, R * wide);
        m->md2 = carve(work, &w, R * wide);
        m->mrecv = ep_size(m) > 1 ? carve(work, &w, R * C) : NULL;
        m->mperm = ep_size(m) > 1 ? (int32_t *)carve(work, &w, 2 * R) : NULL;
        m->mdgate = carve(work, &w, NM * K);
        m->mdlogits = carve(work, &w, NM * E);
        m->mstats = carve(work, &w, 2 * E + 2);
        m->mbias = model_moe_has_bias(&m->cfg) ? carve(work, &w, (size_t)param_layout_blocks(&m->lay.part) * E) : NULL;
        m->msdy = m->cfg.moe.shared_gate ? carve(work, &w, N * C) : NULL;
        m->msdz = m->cfg.moe.shared_gate ? carve(work, &w, N) : NULL;
    }
    if (m->lay.bf16) {
        /* bf16 GEMM operands: the widest input and output gradient of any
         * matmul on this stage (2 B each, carved as half as many floats) */
        size_t ic = C, oc = C, wmax = QKV * C;
        if (QD > ic)
            ic = QD;
        if ((size_t)ffn(m) > ic)
            ic = (size_t)ffn(m);
        if (big > oc)
            oc = big;
        if (FW * C > wmax)
            wmax = FW * C;
        if (m->lay.part.has_head && !fused && Vl > oc)
            oc = Vl;
        size_t rows_a = N * ic, rows_d = N * oc;     /* elements of a16 and d16 */
        if (fused && (size_t)m->xrows * Vl > rows_d) /* a chunk's dlogits */
            rows_d = (size_t)m->xrows * Vl;
        if (has_moe(m)) { /* the experts' R rows: xe [R,C] and ae [R,Fe] in, dhe [R,FWe] and dye [R,C] out */
            const size_t R = ep_size(m) * (size_t)moe_tokens(m, (int)N) * (size_t)m->cfg.moe.top_k;
            const size_t Fe = (size_t)moe_ffn_local(m);
            const size_t FWe = (size_t)moe_fcw_local(m);
            rows_a = R * (Fe > C ? Fe : C) > rows_a ? R * (Fe > C ? Fe : C) : rows_a;
            rows_d = R * (FWe > C ? FWe : C) > rows_d ? R * (FWe > C ? FWe : C) : rows_d;
            const size_t El = (size_t)m->cfg.moe.experts / ep_size(m); /* a lent block's experts, at once */
            if (El * FWe * C > wmax)
                wmax = El * FWe * C;
        }
        m->a16 = carve16(work, &w, rows_a);
        /* weights come from params16, except lent (ZeRO-3) block weights:
         * those are rounded per call, so only blocks need room here */
        if (m->lay.lent_block_params)
            m->w16 = carve16(work, &w, wmax);
        m->d16 = carve16(work, &w, rows_d);
    }
    /* --tp-comm-overlap's bf16 staging: the weight-gradient GEMM it runs
     * beside reads a16 and d16 */
    m->tpo16 = m->lay.tp_overlap && m->lay.tp_bf16 ? carve16(work, &w, N * C + NR * C) : NULL;
    m->dfull2 = m->lay.tp_overlap && m->lay.sequence_parallel ? carve(work, &w, N * C) : NULL;
    *acts_bytes = a;
    *work_bytes = w;
}

int model_logits_rows(int logits_chunk, size_t N, size_t Vl, size_t scratch)
{
    size_t rows = logits_chunk > 0 ? (size_t)logits_chunk : scratch / (Vl ? Vl : 1);
    if (logits_chunk == MODEL_LOGITS_AUTO && rows < MODEL_LOGITS_MIN_ROWS)
        rows = MODEL_LOGITS_MIN_ROWS;
    if (rows > N)
        rows = N;
    return rows > 0 ? (int)rows : 1;
}

static void *backend_alloc(const ops_t *ops, mem_category_t cat, size_t bytes)
{
    void *p = ops->alloc(ops->ctx, bytes);
    if (p) {
        ops->zero(ops->ctx, p, bytes);
        mem_track(cat, (long long)bytes);
    }
    return p;
}

static void backend_free(const ops_t *ops, mem_category_t cat, void *p, size_t bytes)
{
    if (p) {
        ops->free(ops->ctx, p);
        mem_track(cat, -(long long)bytes);
    }
}

const char *const model_recompute_names[] = {
    [MODEL_RECOMPUTE_NONE] = "none", [MODEL_RECOMPUTE_SELECTIVE] = "selective", [MODEL_RECOMPUTE_FULL] = "full", NULL};

void model_arena_bytes(const model_config_t *cfg, const model_layout_t *lay, int B, int T, size_t *acts, size_t *work)
{
    model_t m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    m.lay = *lay;
    m.B = B;
    m.T = T;
    m.n_local = param_layout_blocks(&lay->part);
    m.v_rows = (int)(param_padded_vocab(cfg->vocab_size, lay->part.tp_size) / lay->part.tp_size);
    layout_acts(&m, NULL, acts, NULL, work);
}

int model_state_bytes(const model_config_t *cfg, const model_layout_t *lay, size_t *params, size_t *grads, size_t *host,
                      char *err, size_t errlen)
{
    param_table_t t;
    if (param_table_build(&t, cfg, &lay->part, err, errlen) != 0)
        return -1;
    size_t *start = malloc(((size_t)param_layout_blocks(&lay->part) + 1) * sizeof *start);
    if (!start) {
        param_table_free(&t);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    layer_starts(&t, &lay->part, start);
    size_t params_n = 0, grads_n = 0;
    state_floats(&t, lay, start, &params_n, &grads_n);
    /* alloc_backend's buffers: params (or under params_host weights_dev),
     * params16 under bf16, grads */
    size_t dev_n = 0;
    if (lay->params_host)
        (void)weights_dev_runs(&t, lay, NULL, &dev_n);
    *params = (lay->params_host ? weights_dev_bytes(dev_n) : params_n * sizeof(float)) +
              (lay->bf16 ? params_n * sizeof(uint16_t) : 0);
    *grads = grads_n * sizeof(float);
    if (host)
        *host = lay->params_host ? params_n * sizeof(float) : 0;
    free(start);
    param_table_free(&t);
    return 0;
}

model_layout_t model_layout_single(const model_config_t *c)
{
    return (model_layout_t){.part = param_layout_whole(c), .tp = NULL, .sequence_parallel = 0, .n_slots = 1};
}

/* The run's shapes fit the model and the stage layout. 0, or -1 (err). */
static int check_shapes(const model_config_t *cfg, const model_layout_t *lay, int B, int T, char *err, size_t errlen)
{
    const int P = lay->part.tp_size;
    if (model_config_check(cfg, err, errlen) != 0)
        return -1;
    if (cfg->arch == ARCH_GPT2 && T > cfg->max_seq) {
        snprintf(err, errlen, "--seq-len %d exceeds the model's %d learned positions (--max-seq-len)", T, cfg->max_seq);
        return -1;
    }
    if (P > 1 && !lay->tp) {
        snprintf(err, errlen, "internal error: --tp %d without a TP communicator", P);
        return -1;
    }
    if (cfg->n_head % P || cfg->n_kv_head % P || cfg->d_ff % P) {
        snprintf(err, errlen, "--tp %d must divide the heads (%d), the KV heads (%d) and the FFN width (%d)", P,
                 cfg->n_head, cfg->n_kv_head, cfg->d_ff);
        return -1;
    }
    const int whole = lay->part.etp == 1 && P > 1; /* --etp 1: experts not split over TP */
    if (cfg->moe.experts && ((!whole && cfg->moe.ffn % P) || cfg->moe.shared_ffn % P)) {
        snprintf(err, errlen, "--tp %d must divide the experts' width --moe-ffn %d and the shared expert's %d", P,
                 cfg->moe.ffn, cfg->moe.shared_ffn);
        return -1;
    }
    const int EP = lay->part.ep_size > 1 ? lay->part.ep_size : 1;
    if (EP > 1 &&
        (!cfg->moe.experts || cfg->moe.experts % EP || !lay->ep || lay->ep->size != EP || !lay->ep->ops->alltoallv)) {
        snprintf(err, errlen,
                 "--ep %d needs a MoE model whose experts it divides and an EP group of %d ranks with an "
                 "all-to-all",
                 EP, EP);
        return -1;
    }
    if (lay->sequence_parallel && ((size_t)B * (size_t)T) % (size_t)P) {
        snprintf(err, errlen, "--sequence-parallel: micro batch x seq len (%d x %d) must be a multiple of --tp %d", B,
                 T, P);
        return -1;
    }
    if (whole && cfg->moe.experts && ((size_t)B * (size_t)T) % (size_t)P) {
        snprintf(err, errlen, "--etp 1: micro batch x seq len (%d x %d) must be a multiple of --tp %d", B, T, P);
        return -1;
    }
    if (lay->n_slots < 1 || param_layout_check(&lay->part, cfg->n_layer) != 0) {
        snprintf(err, errlen, "internal error: bad stage layout (%d runs of blocks from layer %d, %d slots)",
                 lay->part.n_runs, lay->part.run_begin[0], lay->n_slots);
        return -1;
    }
    return 0;
}

/* This stage's layers and this TP rank's slice of the (padded) vocabulary:
 * v_rows rows from v0, of which v_held are real tokens. */
static void set_local_ranges(model_t *m)
{
    const int P = m->lay.part.tp_size;
    m->n_local = param_layout_blocks(&m->lay.part);
    m->v_rows = (int)(param_padded_vocab(m->cfg.vocab_size, P) / P);
    m->v0 = m->v_rows * m->lay.part.tp_rank;
    m->v_held = m->cfg.vocab_size - m->v0 < 0           ? 0
                : m->cfg.vocab_size - m->v0 > m->v_rows ? m->v_rows
                                                        : m->cfg.vocab_size - m->v0;
}

/* Host tables: per-layer tensor views, per-slot activation records and
 * the offset where each local layer's parameters start (Ls + 1 entries).
 * Returns whether every slot got its records (the rest is checked by
 * the caller). */
static int alloc_host_tables(model_t *m)
{
    const model_layout_t *lay = &m->lay;
    const size_t Ls = (size_t)m->n_local, cap = (size_t)run_cap(&lay->part);
    m->p.h = calloc(Ls ? Ls : 1, sizeof *m->p.h);
    m->g.h = calloc(Ls ? Ls : 1, sizeof *m->g.h);
    m->slots = calloc((size_t)lay->n_slots, sizeof *m->slots);
    int slots_ok = m->slots != NULL;
    for (int k = 0; slots_ok && k < lay->n_slots; k++)
        slots_ok = (m->slots[k].acts = calloc(cap ? cap : 1, sizeof(block_acts_t))) != NULL;
    m->layer_start = calloc(Ls + 1, sizeof *m->layer_start);
    if (m->layer_start)
        layer_starts(&m->table, &lay->part, m->layer_start);
    if (has_moe(m)) { /* the routing's host side */
        const size_t E = (size_t)m->cfg.moe.experts;
        m->moffs_host = calloc((size_t)lay->n_slots * (cap ? cap : 1) * (E + 1), sizeof *m->moffs_host);
        m->mstats_host = calloc(2 * E + 2, sizeof *m->mstats_host);
        m->moe_stats = calloc(Ls ? Ls : 1, sizeof *m->moe_stats);
        m->mload_host = calloc((Ls ? Ls : 1) * E, sizeof *m->mload_host);
        slots_ok = slots_ok && m->moffs_host && m->mstats_host && m->moe_stats && m->mload_host;
        if (ep_size(m) > 1) {
            const size_t P = ep_size(m), R = P * (size_t)moe_tokens(m, m->B * m->T) * (size_t)m->cfg.moe.top_k;
            m->mrcnt_host = calloc((size_t)lay->n_slots * (cap ? cap : 1) * E, sizeof *m->mrcnt_host);
            m->mperm_host = calloc(2 * R, sizeof *m->mperm_host);
            m->meoffs_host = calloc(E + 1, sizeof *m->meoffs_host);
            m->mscnt_host = calloc(E, sizeof *m->mscnt_host);
            m->ma2a_host = calloc(4 * P, sizeof *m->ma2a_host);
            slots_ok = slots_ok && m->mrcnt_host && m->mperm_host && m->meoffs_host && m->mscnt_host && m->ma2a_host;
        }
    }
    return slots_ok;
}

/* Backend buffers: parameters and gradients (without lent ZeRO-3 blocks),
 * their bf16 copy, and, when the slots exist, the activation and
 * workspace arenas (*acts, *work: NULL when not allocated). */
static void alloc_backend(model_t *m, int slots_ok, char **acts, char **work)
{
    const ops_t *ops = m->ops;
    const model_layout_t *lay = &m->lay;
    if (m->layer_start) /* else model_create fails */
        state_floats(&m->table, lay, m->layer_start, &m->params_n, &m->grads_n);
    if (lay->params_host) { /* host memory, not the device's: not counted in MEM_PARAMS */
        m->params = ops_host_alloc(ops, m->params_n * sizeof(float));
        if (m->params)
            memset(m->params, 0, m->params_n * sizeof(float));
        m->n_weights_runs = weights_dev_runs(&m->table, lay, NULL, &m->weights_dev_n);
        m->weights_runs = malloc(((size_t)m->n_weights_runs + 1) * sizeof *m->weights_runs);
        if (m->weights_runs)
            weights_dev_runs(&m->table, lay, m->weights_runs, &m->weights_dev_n);
        m->weights_dev = backend_alloc(ops, MEM_PARAMS, weights_dev_bytes(m->weights_dev_n));
    } else {
        m->params = backend_alloc(ops, MEM_PARAMS, m->params_n * sizeof(float));
    }
    m->grads = backend_alloc(ops, MEM_GRADS, m->grads_n * sizeof(float));
    if (lay->bf16) {
        m->params16 = backend_alloc(ops, MEM_PARAMS, m->params_n * sizeof(uint16_t));
        m->params16_stale = 1;
    }
    if (slots_ok) {
        layout_acts(m, NULL, &m->act_bytes, NULL, &m->work_bytes);
        *acts = backend_alloc(ops, MEM_ACTS, m->act_bytes);
        *work = backend_alloc(ops, MEM_WORKSPACE, m->work_bytes);
    }
}

/* The RoPE table computed once on the host, as both backends then read it. */
static int fill_rope_table(model_t *m)
{
    const size_t n = (size_t)model_head_size(&m->cfg) / 2;
    float *host = malloc(n * sizeof *host);
    if (!host)
        return -1;
    model_rope_inv_freq(&m->cfg, host);
    m->ops->from_host(m->ops->ctx, m->inv_freq, host, n * sizeof *host);
    free(host);
    return 0;
}

int model_create(model_t *m, const model_config_t *cfg, const ops_t *ops, const model_layout_t *lay, int B, int T,
                 char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->ops = ops;
    m->lay = *lay;
    m->B = B;
    m->T = T;
    if (check_shapes(cfg, lay, B, T, err, errlen) != 0)
        return -1;
    if (cfg->moe.shared_gate && !ops->moe_shared_gate_fwd) {
        snprintf(err, errlen,
                 "--moe-shared-gate runs on the CPU backend for now (the %s backend has no kernel for it): use "
                 "--device cpu",
                 ops->name);
        return -1;
    }
    if (param_table_build(&m->table, cfg, &lay->part, err, errlen) != 0)
        return -1;
    set_local_ranges(m);
    const size_t pbytes = m->table.numel * sizeof(float);
    int slots_ok = alloc_host_tables(m);
    char *acts = NULL, *work = NULL;
    alloc_backend(m, slots_ok, &acts, &work);
    if (!m->p.h || !m->g.h || !slots_ok || !m->layer_start || (pbytes && (!m->params || !m->grads)) ||
        (lay->bf16 && m->params_n && !m->params16) || (lay->params_host && (!m->weights_runs || !m->weights_dev)) ||
        !acts || !work) {
        snprintf(err, errlen,
                 "out of memory: the model needs %.1f MiB of parameters+gradients and "
                 "%.1f MiB of activations at micro batch %d x seq %d; lower --micro-batch or --seq-len",
                 2.0 * (double)pbytes / 1048576.0, (double)(m->act_bytes + m->work_bytes) / 1048576.0, B, T);
        backend_free(ops, MEM_ACTS, acts, m->act_bytes);
        backend_free(ops, MEM_WORKSPACE, work, m->work_bytes);
        m->act_bytes = m->work_bytes = 0;
        model_destroy(m);
        return -1;
    }
    layout_acts(m, acts, &m->act_bytes, work, &m->work_bytes);
    if (m->mbias) /* no expert bias until model_moe_bias_set */
        ops->zero(ops->ctx, m->mbias, (size_t)param_layout_blocks(&lay->part) * cfg->moe.experts * sizeof(float));
    if (cp_on(m)) { /* the ring for this micro batch: T/cp local rows of a T-token sequence */
        const cp_ring_shape_t sh = {
            .B = B, .T = T * lay->cp_size, .NH = heads(m), .NKV = kv_heads(m), .HS = model_head_size(cfg)};
        if (!lay->cp || cp_ring_create(lay->cp, ops, &sh, &m->ring, err, errlen) != STATUS_OK) {
            if (!lay->cp)
                snprintf(err, errlen, "internal error: --cp %d without a CP communicator", lay->cp_size);
            model_destroy(m);
            return -1;
        }
        m->ring_bytes = cp_ring_bytes(&sh, lay->cp_size); /* counted as communication buffers */
        mem_track(MEM_COMM, (long long)m->ring_bytes);
    }
    if (m->inv_freq && fill_rope_table(m) != 0) {
        snprintf(err, errlen, "out of memory for RoPE's table of %d frequencies", model_head_size(cfg) / 2);
        model_destroy(m);
        return -1;
    }
    if (map_tensors(m, m->params, &m->p, lay->lent_block_params) != 0 ||
        map_tensors(m, m->grads, &m->g, lay->lent_block_grads) != 0) {
        snprintf(err, errlen, "internal error: parameter table does not keep fused tensors adjacent");
        model_destroy(m);
        return -1;
    }
    if (lay->params_host && point_at_weights_dev(m) != 0) {
        snprintf(err, errlen, "internal error: --offload optimizer under bf16 needs bf16 and every block's parameters");
        model_destroy(m);
        return -1;
    }
    return 0;
}

void model_destroy(model_t *m)
{
    const ops_t *ops = m->ops;
    if (m->lay.params_host) {
        if (m->params)
            ops->sync(ops->ctx); /* no copy may still read it */
        ops_host_free(ops, m->params);
        backend_free(ops, MEM_PARAMS, m->weights_dev, weights_dev_bytes(m->weights_dev_n));
        free(m->weights_runs);
    } else {
        backend_free(ops, MEM_PARAMS, m->params, m->params_n * sizeof(float));
    }
    backend_free(ops, MEM_PARAMS, m->params16, m->params_n * sizeof(uint16_t));
    backend_free(ops, MEM_GRADS, m->grads, m->grads_n * sizeof(float));
    if (m->slots && m->slots[0].x)
        backend_free(ops, MEM_ACTS, m->slots[0].x, m->act_bytes); /* the arena's first piece */
    if (m->dres)
        backend_free(ops, MEM_WORKSPACE, m->dres, m->work_bytes);
    for (int k = 0; m->slots && k < m->lay.n_slots; k++)
        free(m->slots[k].acts);
    free(m->slots);
    free(m->p.h);
    free(m->g.h);
    free(m->layer_start);
    free(m->moffs_host);
    free(m->mstats_host);
    free(m->moe_stats);
    free(m->mload_host);
    free(m->mrcnt_host);
    free(m->mperm_host);
    free(m->meoffs_host);
    free(m->mscnt_host);
    free(m->ma2a_host);
    cp_ring_destroy(m->ring);
    if (m->ring)
        mem_track(MEM_COMM, -(long long)m->ring_bytes);
    param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

int model_init_params(model_t *m, uint64_t seed)
{
    size_t bytes = m->table.numel * sizeof(float);
    float *host = malloc(bytes ? bytes : 1);
    if (!host)
        return -1;
    param_table_init(&m->table, host, seed);
    model_params_from_host(m, host);
    free(host);
    return 0;
}

/* With lent block parameters the buffer is the flat one without the
 * blocks' range [layer_start[0], layer_start[Ls]). */
void model_params_from_host(model_t *m, const float *host)
{
    m->params16_stale = 1;
    if (!m->lay.lent_block_params) {
        m->ops->from_host(m->ops->ctx, m->params, host, m->table.numel * sizeof(float));
        refresh_weights_dev(m);
        return;
    }
    const size_t lo = m->layer_start[0], hi = m->layer_start[m->n_local];
    m->ops->from_host(m->ops->ctx, m->params, host, lo * sizeof(float));
    m->ops->from_host(m->ops->ctx, m->params + lo, host + hi, (m->table.numel - hi) * sizeof(float));
}

float *model_params_in_place(model_t *m)
{
    if (!m->ops->host_readable || m->lay.lent_block_params)
        return NULL;
    m->ops->sync(m->ops->ctx); /* host_readable: readable, and writable, once sync has returned */
    return m->params;
}

void model_params_to_host(const model_t *m, float *host)
{
    if (!m->lay.lent_block_params) {
        m->ops->to_host(m->ops->ctx, host, m->params, m->table.numel * sizeof(float));
        return;
    }
    const size_t lo = m->layer_start[0], hi = m->layer_start[m->n_local];
    m->ops->to_host(m->ops->ctx, host, m->params, lo * sizeof(float));
    m->ops->to_host(m->ops->ctx, host + hi, m->params + lo, (m->table.numel - hi) * sizeof(float));
}

/* ---- forward --------------------------------------------------------------------------- */

/* ZeRO-3: points block i's parameter tensors at the buffer the lender
 * gathered them into. */
static status_t lend_params(model_t *m, int i, int next, char *err, size_t errlen)
{
    if (!m->lay.lent_block_params)
        return STATUS_OK;
    float *base = m->hook.block_params ? m->hook.block_params(m->hook.ctx, i, next) : NULL;
    if (!base || map_block(m, base, m->layer_start[i], i, &m->p.h[i]) != 0)
        return status_set(STATUS_FAIL, err, errlen, "no parameters for block %d (all-gather failed)", i);
    return STATUS_OK;
}

void model_params_written(model_t *m)
{
    m->params16_stale = 1;
    refresh_weights_dev(m);
}

void model_params_updated(model_t *m) { refresh_weights_dev(m); }

void model_moe_stats_reset(model_t *m)
{
    const size_t Ls = (size_t)(m->n_local ? m->n_local : 1);
    if (m->moe_stats)
        memset(m->moe_stats, 0, Ls * sizeof *m->moe_stats);
    if (m->mload_host)
        memset(m->mload_host, 0, Ls * (size_t)m->cfg.moe.experts * sizeof *m->mload_host);
}

void model_moe_bias_set(model_t *m, const float *bias)
{
    const size_t E = (size_t)m->cfg.moe.experts;
    for (int i = 0; m->mbias && i < m->n_local; i++)
        m->ops->from_host(m->ops->ctx, m->mbias + (size_t)i * E, bias + (size_t)param_layout_layer(&m->lay.part, i) * E,
                          E * sizeof(float));
}

/* The bf16 weights of w[OC*IC] (--dtype bf16): its place in params16,
 * brought up to date first if params were written since (one cast of
 * the whole buffer), or for a lent ZeRO-3 block weight, which lies outside
 * params, a copy rounded into the w16 workspace. */
static const uint16_t *weight16(model_t *m, const float *w, size_t n)
{
    if (w >= m->params && w < m->params + m->params_n) {
        if (m->params16_stale) {
            m->ops->cast_f32_to_bf16(m->ops->ctx, m->params16, m->params, m->params_n);
            m->params16_stale = 0;
        }
        return m->params16 + (w - m->params);
    }
    m->ops->cast_f32_to_bf16(m->ops->ctx, m->w16, w, n);
    return m->w16;
}

/* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b) in the model's GEMM precision:
 * fp32, or (--dtype bf16) in and w rounded to bf16, fp32 sums. The
 * weight's bf16 copy is params16's; the input is rounded into keep16, an
 * activation the backward reads again, or with keep16 NULL into the a16
 * workspace; in == NULL: keep16 holds it already, written by the op that
 * produced it (base/ops.h's bf16 outputs), and no cast runs. */
void model_mm_fwd(model_t *m, float *out, const float *in, uint16_t *keep16, const float *w, const float *b, int N,
                  int IC, int OC)
{
    const ops_t *o = m->ops;
    if (!m->lay.bf16) {
        o->matmul_fwd(o->ctx, out, in, w, b, N, IC, OC);
        return;
    }
    const uint16_t *w16 = weight16(m, w, (size_t)OC * IC);
    uint16_t *in16 = keep16 ? keep16 : m->a16;
    if (in)
        o->cast_f32_to_bf16(o->ctx, in16, in, (size_t)N * IC);
    o->matmul_fwd_bf16(o->ctx, out, in16, w16, b, N, IC, OC);
}

/* mm_fwd into pre[N,OC] with out[N,OC] = gelu(pre): GPT-2's fc and its
 * GELU as one op, which CUDA runs as one GEMM with a GELU epilogue; under
 * bf16 out16 receives gelu(pre)'s bf16 (the proj GEMM's input) and out
 * may be NULL. */
static void mm_gelu_fwd(model_t *m, float *out, uint16_t *out16, float *pre, const float *in, uint16_t *keep16,
                        const float *w, const float *b, int N, int IC, int OC)
{
    const ops_t *o = m->ops;
    if (!m->lay.bf16) {
        o->matmul_gelu_fwd(o->ctx, out, pre, in, w, b, N, IC, OC);
        return;
    }
    const uint16_t *w16 = weight16(m, w, (size_t)OC * IC);
    uint16_t *in16 = keep16 ? keep16 : m->a16;
    if (in)
        o->cast_f32_to_bf16(o->ctx, in16, in, (size_t)N * IC);
    o->matmul_gelu_fwd_bf16(o->ctx, out, out16, pre, in16, w16, b, N, IC, OC);
}

/* The bf16 output gradient of a matmul backward (--dtype bf16): dout16
 * when its producer wrote it, else dout[n] rounded into the d16 workspace
 * when a GEMM reads it (want). */
static const uint16_t *mm_bwd_dout16(model_t *m, const float *dout, const uint16_t *dout16, int want, size_t n)
{
    if (dout16)
        return dout16;
    if (want)
        m->ops->cast_f32_to_bf16(m->ops->ctx, m->d16, dout, n);
    return m->d16;
}

/* The input's bf16 copy when dw is wanted: in16 when the forward kept it
 * (in is then not read), else in[n] rounded into the a16 workspace. */
static const uint16_t *mm_bwd_in16(model_t *m, const float *in, const uint16_t *in16, int want_dw, size_t n)
{
    if (want_dw && !in16) {
        m->ops->cast_f32_to_bf16(m->ops->ctx, m->a16, in, n);
        in16 = m->a16;
    }
    return in16;
}

/* matmul_bwd in the model's GEMM precision: with bf16, dout, in and w are
 * rounded to bf16 for the two GEMMs (mixed precision's usual backward);
 * the bias gradient sums the fp32 dout. */
void model_mm_bwd(model_t *m, float *din, float *dw, float *db, const float *dout, const uint16_t *dout16,
                  const float *in, const uint16_t *in16, const float *w, int N, int IC, int OC, int accum_din,
                  int accum_dw)
{
    const ops_t *o = m->ops;
    if (!m->lay.bf16) {
        o->matmul_bwd(o->ctx, din, dw, db, dout, in, w, N, IC, OC, accum_din, accum_dw);
        return;
    }
    const uint16_t *w16 = din ? weight16(m, w, (size_t)OC * IC) : NULL;
    dout16 = mm_bwd_dout16(m, dout, dout16, din || dw, (size_t)N * OC);
    in16 = mm_bwd_in16(m, in, in16, dw != NULL, (size_t)N * IC);
    o->matmul_bwd_bf16(o->ctx, din, dw, db, dout16, dout, in16, w16, N, IC, OC, accum_din, accum_dw);
}

/* mm_bwd of a matmul whose input was gelu(pre), with din[N,IC] the
 * gradient at the GELU's input (written): GPT-2's proj backward and the
 * GELU's as one op (a GEMM with a DGELU epilogue on CUDA). */
void model_mm_dgelu_bwd(model_t *m, float *din, uint16_t *din16, float *dw, float *db, const float *dout,
                        const uint16_t *dout16, const float *in, const uint16_t *in16, const float *pre, const float *w,
                        int N, int IC, int OC, int accum_dw)
{
    const ops_t *o = m->ops;
    if (!m->lay.bf16) {
        o->matmul_dgelu_bwd(o->ctx, din, dw, db, dout, in, pre, w, N, IC, OC, accum_dw);
        return;
    }
    const uint16_t *w16 = weight16(m, w, (size_t)OC * IC);
    dout16 = mm_bwd_dout16(m, dout, dout16, 1, (size_t)N * OC);
    in16 = mm_bwd_in16(m, in, in16, dw != NULL, (size_t)N * IC);
    o->matmul_dgelu_bwd_bf16(o->ctx, din, din16, dw, db, dout16, dout, in16, pre, w16, N, IC, OC, accum_dw);
}

/* The grouped GEMMs (ops gmm_*) in the model's GEMM precision, for the
 * experts (moe.c): G groups of rows by offs (host, offs[0] = 0), weights
 * w[G,OC,IC] in one run (params16's copy, or a lent block's rounded into
 * w16). Under bf16 the rows' inputs are rounded into a16 (in == NULL:
 * a16 holds them, written by their producer) and the output gradient
 * into d16, all groups' at once. */
void model_gmm_fwd(model_t *m, float *out, const float *in, const float *w, const float *b, const int32_t *offs, int G,
                   int IC, int OC)
{
    const ops_t *o = m->ops;
    if (!m->lay.bf16) {
        o->gmm_fwd(o->ctx, out, in, w, b, offs, G, IC, OC);
        return;
    }
    const uint16_t *w16 = weight16(m, w, (size_t)G * OC * IC);
    if (in)
        o->cast_f32_to_bf16(o->ctx, m->a16, in, (size_t)offs[G] * IC);
    o->gmm_fwd_bf16(o->ctx, out, m->a16, w16, b, offs, G, IC, OC);
}

void model_gmm_bwd(model_t *m, float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                   const float *w, const int32_t *offs, int G, int IC, int OC, int accum_dw)
{
    const ops_t *o = m->ops;
    if (!m->lay.bf16) {
        o->gmm_bwd(o->ctx, din, dw, db, dout, in, pre, w, offs, G, IC, OC, 0, accum_dw);
        return;
    }
    const uint16_t *w16 = din ? weight16(m, w, (size_t)G * OC * IC) : NULL;
    const uint16_t *dout16 = mm_bwd_dout16(m, dout, NULL, din || dw, (size_t)offs[G] * OC);
    const uint16_t *in16 = mm_bwd_in16(m, in, NULL, dw != NULL, (size_t)offs[G] * IC);
    o->gmm_bwd_bf16(o->ctx, din, dw, db, dout16, dout, in16, pre, w16, offs, G, IC, OC, 0, accum_dw);
}

/* The model's norm of the NR rows of x into out[NR,C] and (NULL: not
 * wanted) its bf16 out16[NR,C]; out may be NULL when out16 is not. */
static void norm_rows(model_t *m, float *out, uint16_t *out16, float *mean, float *rstd, const float *x, const float *w,
                      const float *b, int NR)
{
    const model_config_t *c = &m->cfg;
    if (c->arch == ARCH_GPT2)
        m->ops->layernorm_fwd(m->ops->ctx, out, out16, mean, rstd, x, w, b, NR, c->d_model, c->norm_eps);
    else
        m->ops->rmsnorm_fwd(m->ops->ctx, out, out16, rstd, x, w, NR, c->d_model, c->norm_eps);
}

/* Norm of this rank's NR rows of x, then all N rows of the result in
 * out[N,C] and (bf16, NULL: not wanted) out16[N,C], gathered under
 * sequence parallelism; out NULL: only the bf16 copy is wanted. The norm
 * writes both itself, except under sequence parallelism with out wanted
 * too (a MoE model's ln2): the fp32 rows are gathered and out16 cast
 * from them, the one rounding pass left in the forward. */
static status_t norm_fwd_gather(model_t *m, float *out, uint16_t *out16, float *mean, float *rstd, const float *x,
                                const float *w, const float *b, int N, int NR, char *err, size_t errlen)
{
    const size_t nr = (size_t)NR * (size_t)m->cfg.d_model;
    if (!m->lay.sequence_parallel) {
        norm_rows(m, out, out16, mean, rstd, x, w, b, NR);
        return STATUS_OK;
    }
    if (!out && nr % 2 == 0) { /* the bf16 rows gathered as they are, two to a float */
        norm_rows(m, NULL, (uint16_t *)m->lnr, mean, rstd, x, w, b, NR);
        return tp_allgather(m, (float *)out16, m->lnr, nr / 2, err, errlen);
    }
    float *all = out ? out : m->dln; /* dln: free in the forward */
    norm_rows(m, m->lnr, NULL, mean, rstd, x, w, b, NR);
    CHECK(tp_act_gather(m, all, m->lnr, nr, err, errlen));
    if (out16)
        m->ops->cast_f32_to_bf16(m->ops->ctx, out16, all, (size_t)N * (size_t)m->cfg.d_model);
    return STATUS_OK;
}

/* out[NR,C] = res[NR,C] + (in[N,IC] . w^T + b) summed over TP ranks: the
 * row-parallel matmul (bias added once, by TP rank 0), then the
 * all-reduce, or the reduce-scatter to this rank's rows. */
static status_t row_parallel_fwd(model_t *m, float *out, const float *res, const float *in, uint16_t *keep16,
                                 const float *w, const float *b, int N, int NR, int IC, char *err, size_t errlen)
{
    const int C = m->cfg.d_model;
    const float *bias = m->lay.part.tp_rank == 0 ? b : NULL;
    if (m->lay.sequence_parallel) {
        model_mm_fwd(m, m->tmp, in, keep16, w, bias, N, IC, C);
        CHECK(tp_act_scatter(m, out, m->tmp, (size_t)NR * C, err, errlen));
    } else {
        model_mm_fwd(m, out, in, keep16, w, bias, N, IC, C);
        CHECK(tp_act_sum(m, out, (size_t)N * C, err, errlen));
    }
    m->ops->add(m->ops->ctx, out, out, res, (size_t)NR * C);
    return STATUS_OK;
}

/* The tensors block i of slot sl is computed into and its backward reads:
 * the slot's own, with the ones --recompute drops taken from the shared
 * workspace (fc_act from dbig2, which only a backward uses otherwise;
 * under --dtype bf16 its bf16 copy fc_act16, the only one then made). */
static block_acts_t block_view(const model_t *m, const model_slot_t *sl, int i)
{
    block_acts_t a = sl->acts[i - sl->first];
    const block_acts_t *r = &m->racts;
    if (m->lay.recompute == MODEL_RECOMPUTE_NONE)
        return a;
    if (m->lay.recompute == MODEL_RECOMPUTE_FULL) {
        const moe_acts_t moe = a.moe; /* the slot keeps the routing and the experts' tensors */
        a = *r;
        a.moe = moe;
    }
    if (m->lay.bf16) {
        a.fc_act = NULL;
        a.fc_act16 = (uint16_t *)m->dbig2;
    } else {
        a.fc_act = m->dbig2;
    }
    return a;
}

/* The document positions of the forward held in sl (backend), or NULL. */
static const int32_t *slot_pos(const model_slot_t *sl) { return sl->has_pos ? sl->pos : NULL; }
/* --cp with documents: the rows' global document starts, or NULL */
static const int32_t *slot_qdoc(const model_slot_t *sl) { return sl->has_pos ? sl->qdoc : NULL; }

/* Attention of a block's qkv into atty, its bf16 copy atty16 (--dtype
 * bf16) and lse: the ops' whole-sequence kernel, or under --cp the ring
 * over the CP group (qdoc: the rows' document starts), whose merged
 * output is then cast to bf16. */
static status_t attention_fwd(model_t *m, const block_acts_t *a, const int32_t *pos, const int32_t *qdoc, int b, int t,
                              char *err, size_t errlen)
{
    const int HS = model_head_size(&m->cfg);
    if (!cp_on(m)) {
        m->ops->attention_fwd(m->ops->ctx, a->atty, a->atty16, a->lse, a->qkv, pos, b, t, heads(m), kv_heads(m), HS);
        return STATUS_OK;
    }
    CHECK(cp_ring_forward(m->ring, a->atty, a->lse, a->qkv, qdoc, &m->cp_stats, err, errlen));
    if (a->atty16)
        m->ops->cast_f32_to_bf16(m->ops->ctx, a->atty16, a->atty, (size_t)b * t * heads(m) * HS);
    return STATUS_OK;
}

/* A MoE layer's feed-forward: xout[NR,C] = res[NR,C] + (the shared
 * expert's wproj . act[N,F] when F > 0, times its gate's sigmoid(ln2 .
 * w_gate) per token under --moe-shared-gate, + the experts' combine of
 * ln2[N,C]) summed over TP ranks, as row_parallel_fwd sums the dense
 * MLP's. The combine goes through dfull (backward-only workspace). */
static status_t moe_block_fwd(model_t *m, moe_acts_t *ma, const block_tensors_t *w, const float *ln2, const float *act,
                              uint16_t *act16, const float *res, float *xout, int F, int N, int NR, int t, float dloss,
                              int i, char *err, size_t errlen)
{
    const int C = m->cfg.d_model;
    float *part = m->lay.sequence_parallel ? m->tmp : xout; /* [N,C] this rank's partial sum */
    if (F > 0)                                              /* gated: the output before the gate kept in ma->sy */
        model_mm_fwd(m, w->sgate ? ma->sy : part, act, act16, w->wproj, m->lay.part.tp_rank == 0 ? w->bproj : NULL, N,
                     F, C);
    if (F > 0 && w->sgate)
        moe_shared_gate_fwd(m, ma, w, ln2, ma->sy, part, N);
    CHECK(moe_fwd(m, ma, w, ln2, F > 0 ? m->dfull : part, N, t, dloss, i, err, errlen));
    if (F > 0)
        m->ops->add(m->ops->ctx, part, part, m->dfull, (size_t)N * C);
    if (m->lay.sequence_parallel)
        CHECK(tp_act_scatter(m, xout, m->tmp, (size_t)NR * C, err, errlen));
    else
        CHECK(tp_act_sum(m, xout, (size_t)N * C, err, errlen));
    m->ops->add(m->ops->ctx, xout, xout, res, (size_t)NR * C);
    return STATUS_OK;
}

/* Block i's forward from x[NR,C] into the tensors of a, then xout[NR,C].
 * xout == NULL (full recompute in backward) stops after the activation
 * function: what backward needs, without the MLP's output projection and
 * its collective (which every TP rank then skips alike). pos: the slot's
 * document positions, or NULL. */
static status_t block_fwd(model_t *m, const block_acts_t *a, moe_acts_t *ma, float dloss, const int32_t *pos,
                          const int32_t *qdoc, const float *x, float *xout, int i, int b, int t, char *err,
                          size_t errlen)
{
    const ops_t *o = m->ops;
    const model_config_t *c = &m->cfg;
    const int N = b * t, NR = res_rows(m, N), C = c->d_model, HS = model_head_size(c);
    const int NH = heads(m), NKV = kv_heads(m), QD = NH * HS, F = layer_ffn(m, i);
    const block_tensors_t *w = &m->p.h[i];
    /* --dtype bf16 keeps ln1, ln2 and fc_act only as their bf16 copies
     * (a->*16), which the norms and the activation function write
     * themselves; their fp32 values are not written (NULL here), except
     * a MoE model's ln2, which its router and experts read in fp32 */
    float *ln2 = a->ln2, *act = a->fc_act;
    /* attention sub-block: res2 = x + wo . attn(norm1(x)) */
    CHECK(norm_fwd_gather(m, a->ln1, a->ln1_16, a->ln1_mean, a->ln1_rstd, x, w->ln1w, w->ln1b, N, NR, err, errlen));
    model_mm_fwd(m, a->qkv, a->ln1, a->ln1_16, w->wqkv, w->bqkv, N, C, qkv_width(m));
    /* Qwen3 normalises each q and k head before rotating it */
    if (c->qk_norm)
        o->qknorm_fwd(o->ctx, a->qkv, a->qk_in, a->qk_rstd, w->qnorm, w->knorm, N, NH, NKV, HS, c->norm_eps);
    if (c->arch == ARCH_LLAMA)
        o->rope_fwd(o->ctx, a->qkv, pos, b, t, NH, NKV, HS, m->inv_freq);
    CHECK(attention_fwd(m, a, pos, qdoc, b, t, err, errlen));
    CHECK(row_parallel_fwd(m, a->res2, x, a->atty16 ? NULL : a->atty, a->atty16, w->wo, w->bo, N, NR, QD, err, errlen));
    /* MLP sub-block: xout = res2 + wproj . act(fc(norm2(res2))) */
    CHECK(norm_fwd_gather(m, ln2, a->ln2_16, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, N, NR, err, errlen));
    /* GPT-2's GELU rides on the fc GEMM, except under selective recompute,
     * whose backward recomputes it with gelu_fwd: the forward uses the same
     * op, so that both give the same bits on every backend */
    if (F == 0) { /* a MoE layer without a shared expert */
    } else if (c->arch == ARCH_GPT2 && m->lay.recompute != MODEL_RECOMPUTE_SELECTIVE) {
        mm_gelu_fwd(m, act, a->fc_act16, a->fc, a->ln2_16 ? NULL : ln2, a->ln2_16, w->wfc, w->bfc, N, C, F);
    } else {
        model_mm_fwd(m, a->fc, a->ln2_16 ? NULL : ln2, a->ln2_16, w->wfc, w->bfc, N, C, layer_fcw(m, i));
        if (c->arch == ARCH_GPT2)
            o->gelu_fwd(o->ctx, act, a->fc_act16, a->fc, (size_t)N * F);
        else
            o->swiglu_fwd(o->ctx, act, a->fc_act16, a->fc, N, F);
    }
    /* xout is NULL only under full recompute, whose view keeps fc_act (or
     * its bf16 copy) in dbig2; a MoE layer's routing and experts are kept
     * in the slot, not recomputed */
    if (!xout)
        return STATUS_OK;
    if (layer_moe(m, i))
        return moe_block_fwd(m, ma, w, ln2, act, a->fc_act16, a->res2, xout, F, N, NR, t, dloss, i, err, errlen);
    return row_parallel_fwd(m, xout, a->res2, act, a->fc_act16, w->wproj, w->bproj, N, NR, F, err, errlen);
}

/* x0[NR,C] = embeddings of the tokens: each TP rank looks up the tokens of
 * its vocabulary slice (others give 0) and the ranks' rows are summed. */
static status_t embed_fwd(model_t *m, model_slot_t *sl, int b, int t, char *err, size_t errlen)
{
    const int N = b * t, NR = res_rows(m, N), C = m->cfg.d_model;
    const float *wpe = m->lay.part.tp_rank == 0 ? m->p.wpe : NULL; /* added once */
    if (m->lay.sequence_parallel) {
        m->ops->embedding_fwd(m->ops->ctx, m->tmp, sl->tokens, slot_pos(sl), m->p.wte, wpe, N, t, C, m->v0, m->v_held);
        return tp_act_scatter(m, sl->x, m->tmp, (size_t)NR * C, err, errlen);
    }
    m->ops->embedding_fwd(m->ops->ctx, sl->x, sl->tokens, slot_pos(sl), m->p.wte, wpe, N, t, C, m->v0, m->v_held);
    return tp_act_sum(m, sl->x, (size_t)N * C, err, errlen);
}

/* The head's logits of rows [r0, r0 + rows) of the slot into logits[rows,
 * Vl] and their cross-entropy: the row statistics (reduced over TP) and
 * losses at those rows of the slot's, and with dscale > 0 (the gradient
 * of dscale * the sum of the losses) dlogits in the logits' place. The
 * whole classifier is one such call over all N rows; the fused one, one
 * per chunk. */
static status_t xent_rows(model_t *m, model_slot_t *sl, float *logits, int r0, int rows, float dscale, char *err,
                          size_t errlen)
{
    const ops_t *o = m->ops;
    const int C = m->cfg.d_model, Vl = m->v_rows;
    float *xmax = sl->xmax + r0, *xstats = sl->xstats + 2 * (size_t)r0, *dlogits = dscale > 0 ? logits : NULL;
    const int32_t *tgt = sl->targets + r0;
    /* bf16: the final norm wrote lnf's bf16 rows into a16 (head_fwd), and
     * the fused classifier's dlogits go to d16 as well, which the chunk's
     * backward reads next (xent_chunk_bwd) */
    uint16_t *lnf16 = m->lay.bf16 ? m->a16 + (size_t)r0 * C : NULL;
    uint16_t *dlogits16 = m->lay.bf16 && m->xrows && dlogits ? m->d16 : NULL;
    model_mm_fwd(m, logits, lnf16 ? NULL : sl->lnf + (size_t)r0 * C, lnf16, m->p.head, NULL, rows, C, Vl);
    o->xent_max(o->ctx, xmax, logits, rows, m->v_held, Vl);
    CHECK(tp_allreduce(m, xmax, (size_t)rows, COMM_MAX, err, errlen));
    o->xent_sumexp(o->ctx, xstats, dlogits, logits, xmax, tgt, m->v0, rows, m->v_held, Vl);
    CHECK(tp_allreduce(m, xstats, 2 * (size_t)rows, COMM_SUM, err, errlen));
    o->xent_finish(o->ctx, sl->losses + r0, dlogits, dlogits16, xmax, xstats, tgt, m->v0, rows, m->v_held, Vl, dscale);
    return STATUS_OK;
}

/* The fused classifier's gradient of one chunk, rows [r0, r0 + rows),
 * from its dlogits[rows, Vl] (m->xlogits): the head's weight gradient
 * (=|+= by accum) dlogits^T . lnf rows, then dx = dlogits . head into the
 * same rows of lnf, which the chunk no longer needs. Under bf16 the
 * rows' bf16 copy the final norm left in a16 is the input (so lnf is
 * not read, and dx may overwrite it in the same call) and dlogits' bf16
 * copy xent_finish left in d16 the output gradient; in fp32 the weight
 * gradient comes first, since the GEMMs may not overlap. */
static void xent_chunk_bwd(model_t *m, model_slot_t *sl, int r0, int rows, int accum)
{
    const int C = m->cfg.d_model, Vl = m->v_rows;
    float *x = sl->lnf + (size_t)r0 * C;
    if (m->lay.bf16) {
        model_mm_bwd(m, x, m->g.head, NULL, m->xlogits, m->d16, NULL, m->a16 + (size_t)r0 * C, m->p.head, rows, C, Vl,
                     0, accum);
        return;
    }
    model_mm_bwd(m, NULL, m->g.head, NULL, m->xlogits, NULL, x, NULL, m->p.head, rows, C, Vl, 0, accum);
    model_mm_bwd(m, x, NULL, NULL, m->xlogits, NULL, NULL, NULL, m->p.head, rows, C, Vl, 0, 0);
}

/* Final norm, vocabulary-parallel head and cross-entropy (last stage):
 * *loss as model_forward's. */
static status_t head_fwd(model_t *m, model_slot_t *sl, const int32_t *targets, int b, int t, float dloss, float *loss,
                         char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    const int N = b * t, NR = res_rows(m, N), C = m->cfg.d_model, Vl = m->v_rows;
    const float *xL = sl->x + (size_t)sl->n_blocks * NR * C;
    *loss = 0.0f;
    /* bf16: lnf's bf16 copy in a16, the head GEMM's input; lnf itself only
     * where something reads it: the whole logits' backward, the fused
     * classifier's logits of a forward that keeps no gradient (sampling) */
    uint16_t *lnf16 = m->lay.bf16 ? m->a16 : NULL;
    float *lnf = lnf16 && m->xrows && dloss > 0 && targets ? NULL : sl->lnf;
    CHECK(norm_fwd_gather(m, lnf, lnf16, sl->lnf_mean, sl->lnf_rstd, xL, m->p.lnfw, m->p.lnfb, N, NR, err, errlen));
    if (!m->xrows)
        model_mm_fwd(m, sl->logits, lnf16 ? NULL : sl->lnf, lnf16, m->p.head, NULL, N, C, Vl);
    if (!targets)
        return STATUS_OK;
    /* The loss is the mean over the targets that count (>= 0); the
     * gradient must be of that same mean. */
    int counted = 0;
    for (int i = 0; i < N; i++)
        counted += targets[i] >= 0;
    o->from_host(o->ctx, sl->targets, targets, (size_t)N * sizeof(int32_t));
    const float dscale = dloss > 0 ? (counted ? dloss / (float)counted : 0.0f) : 0.0f;
    if (!m->xrows) {
        CHECK(xent_rows(m, sl, sl->logits, 0, N, dscale, err, errlen));
    } else {
        /* one chunk of logits at a time; the head's weight gradient is
         * written by the step's first training forward, added after */
        const int accum = m->head_open;
        for (int r0 = 0; r0 < N; r0 += m->xrows) {
            const int rows = N - r0 < m->xrows ? N - r0 : m->xrows;
            CHECK(xent_rows(m, sl, m->xlogits, r0, rows, dscale, err, errlen));
            if (dloss > 0)
                xent_chunk_bwd(m, sl, r0, rows, accum || r0 > 0);
        }
        if (dloss > 0) {
            sl->head_accum = accum;
            m->head_open = 1;
            m->head_pending++;
        }
    }
    sl->has_dlogits = dloss > 0;
    /* reduced on the host in double, in a fixed order */
    float *host = malloc((size_t)N * sizeof(float));
    if (!host)
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the losses of %d tokens", N);
    o->to_host(o->ctx, host, sl->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0)
            sum += host[i];
    free(host);
    *loss = counted ? (float)(sum / counted) : 0.0f;
    return STATUS_OK;
}

void model_token_losses(const model_t *m, int slot, float *out, int n)
{
    m->ops->to_host(m->ops->ctx, out, m->slots[slot].losses, (size_t)n * sizeof(float));
}

status_t model_forward(model_t *m, int slot, const int32_t *tokens, const int32_t *pos, const int32_t *targets, int b,
                       int t, float dloss, float *loss, char *err, size_t errlen)
{
    return model_forward_chunk(m, 0, slot, tokens, pos, targets, b, t, dloss, loss, err, errlen);
}

/* --cp with documents: the slot's qdoc (backend) from the rows' document
 * positions pos (host, [b*t]): global position minus position in the
 * document, the document's global start, which the ring's masks take. */
static status_t set_qdoc(model_t *m, model_slot_t *sl, const int32_t *pos, int b, int t, char *err, size_t errlen)
{
    const int32_t *gpos = cp_ring_positions(m->ring);
    int32_t *q = malloc((size_t)b * (size_t)t * sizeof *q + 1);
    if (!q)
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the document starts of %d rows", b * t);
    for (int r = 0; r < b; r++)
        for (int i = 0; i < t; i++)
            q[(size_t)r * t + i] = gpos[i] - pos[(size_t)r * t + i];
    m->ops->from_host(m->ops->ctx, sl->qdoc, q, (size_t)b * t * sizeof *q);
    free(q);
    return STATUS_OK;
}

status_t model_forward_chunk(model_t *m, int chunk, int slot, const int32_t *tokens, const int32_t *pos,
                             const int32_t *targets, int b, int t, float dloss, float *loss, char *err, size_t errlen)
{
    model_slot_t *sl = &m->slots[slot];
    const param_layout_t *part = &m->lay.part;
    const int N = b * t, first = param_layout_run_first(part, chunk), end = param_layout_run_first(part, chunk + 1);
    sl->b = b;
    sl->t = t;
    sl->chunk = chunk;
    sl->first = first;
    sl->n_blocks = end - first;
    sl->has_dlogits = 0;
    sl->has_pos = pos != NULL;
    sl->dloss = dloss;
    *loss = 0.0f;
    if (pos && !sl->pos)
        return status_set(STATUS_FAIL, err, errlen, "internal error: document positions without a --doc-mask layout");
    if (cp_on(m) && !pos)
        return status_set(STATUS_FAIL, err, errlen, "internal error: a --cp forward without its rows' positions");
    if (pos)
        m->ops->from_host(m->ops->ctx, sl->pos, pos, (size_t)N * sizeof(int32_t));
    if (pos && sl->qdoc)
        CHECK(set_qdoc(m, sl, pos, b, t, err, errlen));
    double t0 = span_start(m);
    if (part->has_embed && chunk == 0) {
        m->ops->from_host(m->ops->ctx, sl->tokens, tokens, (size_t)N * sizeof(int32_t));
        CHECK(embed_fwd(m, sl, b, t, err, errlen));
        span_end(m, "fwd embed", -1, t0);
    }
    const size_t nrc = model_stage_floats(m, b, t);
    for (int i = first; i < end; i++) {
        CHECK(lend_params(m, i, i + 1 < end ? i + 1 : -1, err, errlen));
        t0 = span_start(m);
        const block_acts_t a = block_view(m, sl, i);
        float *x = sl->x + (size_t)(i - first) * nrc;
        CHECK(block_fwd(m, &a, &sl->acts[i - first].moe, dloss, slot_pos(sl), slot_qdoc(sl), x, x + nrc, i, b, t, err,
                        errlen));
        span_end(m, "fwd", param_layout_layer(part, i), t0);
    }
    if (part->has_head && chunk == part->n_runs - 1) {
        t0 = span_start(m);
        CHECK(head_fwd(m, sl, targets, b, t, dloss, loss, err, errlen));
        span_end(m, "fwd head", -1, t0);
    }
    return STATUS_OK;
}

/* ---- backward -------------------------------------------------------------------------- */

/* *rows: all N rows of dres (the residual gradient) for a row-parallel
 * matmul's backward: dres itself, or its all-gather under sequence
 * parallelism (into dfull); *rows16 their bf16 copy where the norm
 * backward that last added into dres wrote it (m->dres16, taken), else
 * NULL. */
static status_t dres_all_rows(model_t *m, int NR, const float **rows, const uint16_t **rows16, char *err, size_t errlen)
{
    *rows16 = m->dres16;
    m->dres16 = NULL;
    *rows = m->lay.sequence_parallel ? m->dfull : m->dres;
    if (!m->lay.sequence_parallel)
        return STATUS_OK;
    return tp_act_gather(m, m->dfull, m->dres, (size_t)NR * m->cfg.d_model, err, errlen);
}

/* The norm's backward from its output gradient dout[NR, C], reduced, into
 * dres (this rank's rows). Under --dtype bf16 without sequence
 * parallelism (dres then holds all N rows) the norm also writes dres's
 * bf16 into d16 (m->dres16), the next matmul backward's output gradient;
 * under sequence parallelism that one casts instead. */
static void norm_bwd_apply(model_t *m, const float *dout, float *dw, float *db, const float *x, const float *w,
                           const float *mean, const float *rstd, int NR, int accum)
{
    const int C = m->cfg.d_model;
    uint16_t *dres16 = m->lay.bf16 && !m->lay.sequence_parallel ? m->d16 : NULL;
    if (m->cfg.arch == ARCH_GPT2)
        m->ops->layernorm_bwd(m->ops->ctx, m->dres, dres16, dw, db, dout, x, w, mean, rstd, NR, C, accum);
    else
        m->ops->rmsnorm_bwd(m->ops->ctx, m->dres, dres16, dw, dout, x, w, rstd, NR, C, accum);
    m->dres16 = dres16;
}

/* dln[N,C] holds this rank's partial dL/d(norm output) from a
 * column-parallel matmul: sum it over TP ranks (in place) and add the
 * norm's backward into dres (norm_bwd_apply). */
static status_t norm_bwd_reduce_from(model_t *m, float *dln, float *dw, float *db, const float *x, const float *w,
                                     const float *mean, const float *rstd, int N, int NR, int accum, char *err,
                                     size_t errlen)
{
    const int C = m->cfg.d_model;
    const float *dout = dln;
    if (m->lay.sequence_parallel) {
        CHECK(tp_act_scatter(m, m->dlnr, dln, (size_t)NR * C, err, errlen));
        dout = m->dlnr;
    } else {
        CHECK(tp_act_sum(m, dln, (size_t)N * C, err, errlen));
    }
    norm_bwd_apply(m, dout, dw, db, x, w, mean, rstd, NR, accum);
    return STATUS_OK;
}

/* norm_bwd_reduce_from the workspace's dln, where the blocks' backward
 * leaves it; or, where --tp-comm-overlap's reduction of it is pending
 * (tp_dgrad_begin), its end. */
static status_t norm_bwd_reduce(model_t *m, tp_dgrad_t *pending, float *dw, float *db, const float *x, const float *w,
                                const float *mean, const float *rstd, int N, int NR, int accum, char *err, size_t errlen)
{
    if (!pending->active)
        return norm_bwd_reduce_from(m, m->dln, dw, db, x, w, mean, rstd, N, NR, accum, err, errlen);
    CHECK(tp_dgrad_end(m, pending, N, NR, err, errlen));
    norm_bwd_apply(m, m->lay.sequence_parallel ? m->dlnr : m->dln, dw, db, x, w, mean, rstd, NR, accum);
    return STATUS_OK;
}

/* A row-parallel matmul's weight-gradient GEMM held back (the MLP's
 * second under --tp-comm-overlap with sequence parallelism) to run beside
 * the attention's gather: its arguments, as model_mm_bwd takes them. */
typedef struct tp_wgrad {
    int active;
    float *dw, *db;
    const float *dout, *in, *w;
    const uint16_t *dout16, *in16;
    int N, IC, OC, accum;
    /* Llama under recomputation: the input (the SwiGLU output, in the
     * dbig2 workspace) was overwritten by its backward since; recomputed
     * from gu[N, 2 IC] first, the same bits */
    const float *gu;
} tp_wgrad_t;

/* The block's attention output gradient gathered (dres_all_rows), with a
 * held-back weight-gradient GEMM run while the gather is in flight. */
static status_t dres_all_rows_beside(model_t *m, tp_wgrad_t *held, int N, int NR, const float **rows,
                                     const uint16_t **rows16, char *err, size_t errlen)
{
    if (!held->active)
        return dres_all_rows(m, NR, rows, rows16, err, errlen);
    tp_dgrad_t p = {0};
    CHECK(tp_gather_begin(m, &p, N, NR, err, errlen));
    if (held->gu)
        m->ops->swiglu_fwd(m->ops->ctx, (float *)held->in, (uint16_t *)held->in16, held->gu, held->N, held->IC);
    model_mm_bwd(m, NULL, held->dw, held->db, held->dout, held->dout16, held->in, held->in16, held->w, held->N,
                 held->IC, held->OC, 0, held->accum);
    held->active = 0;
    CHECK(tp_gather_end(m, &p, N, err, errlen));
    *rows = m->dfull2;
    *rows16 = NULL; /* as dres_all_rows under sequence parallelism */
    m->dres16 = NULL;
    return STATUS_OK;
}

/* The backward of a column-parallel matmul (qkv, an MLP's first): din
 * (dln, its TP partial sum) and, when wanted, the weight and bias
 * gradients. Under --tp-comm-overlap the input gradient's reduction is
 * posted between the two GEMMs (pending: norm_bwd_reduce ends it);
 * pending NULL: no overlap (a MoE layer, whose experts add to dln after). */
static status_t column_parallel_bwd(model_t *m, tp_dgrad_t *pending, float *dw, float *db, const float *dout,
                                    const uint16_t *dout16, const float *in, const uint16_t *in16, const float *w,
                                    int N, int NR, int IC, int OC, int accum, char *err, size_t errlen)
{
    if (!pending || !m->lay.tp_overlap || !dw) {
        model_mm_bwd(m, m->dln, dw, db, dout, dout16, in, in16, w, N, IC, OC, 0, accum);
        return STATUS_OK;
    }
    model_mm_bwd(m, m->dln, NULL, NULL, dout, dout16, in, in16, w, N, IC, OC, 0, accum);
    CHECK(tp_dgrad_begin(m, pending, N, NR, err, errlen));
    model_mm_bwd(m, NULL, dw, db, dout, dout16, in, in16, w, N, IC, OC, 0, accum);
    return STATUS_OK;
}

/* Under sequence parallelism a norm's weight (and bias) gradient is this
 * rank's rows' part: summed over TP once the step's last microbatch is in. */
static status_t norm_grads_reduce(model_t *m, float *dw, float *db, int last, char *err, size_t errlen)
{
    if (!m->lay.sequence_parallel || !last)
        return STATUS_OK;
    CHECK(tp_allreduce(m, dw, (size_t)m->cfg.d_model, COMM_SUM, err, errlen));
    return db ? tp_allreduce(m, db, (size_t)m->cfg.d_model, COMM_SUM, err, errlen) : STATUS_OK;
}

/* The q/k norm weights are replicated but each TP rank saw only its own
 * heads: their gradients are partial sums over TP, summed once the step's
 * last microbatch is in. */
static status_t qknorm_grads_reduce(model_t *m, const block_tensors_t *g, int last, char *err, size_t errlen)
{
    if (tp_size(m) == 1 || !last)
        return STATUS_OK;
    const size_t HS = (size_t)model_head_size(&m->cfg);
    CHECK(tp_allreduce(m, g->qnorm, HS, COMM_SUM, err, errlen));
    return tp_allreduce(m, g->knorm, HS, COMM_SUM, err, errlen);
}

/* The matmul output gradient dout[n] of B kept for W (the split
 * backward) at dst; no-op where dst is NULL (a whole backward, or a
 * gradient B uses itself). */
static void keep_dout(model_t *m, float *dst, const float *dout, size_t n)
{
    if (dst)
        m->ops->copy(m->ops->ctx, dst, dout, n * sizeof(float));
}

/* A MoE layer's experts and router backward from dout[N,C] (all rows):
 * their part of dL/d(ln2) into dln (added to the shared expert's when
 * dln_written), with dgate summed over TP between the two halves; then
 * the shared expert's gate's, from its logits' gradient (m->msdz, from
 * moe_shared_gate_bwd) summed over TP likewise. */
static status_t moe_block_bwd(model_t *m, const block_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                              const float *dout, int dln_written, int N, int accum, int last, char *err, size_t errlen)
{
    const int tp0 = m->lay.part.tp_rank == 0, whole = moe_etp_whole(m);
    CHECK(moe_bwd_experts(m, &a->moe, w, g, a->ln2, dout, m->dln, dln_written, accum, N, err, errlen));
    /* dgate is partial over TP where each rank holds a slice of every
     * expert; whole experts give each rank its own rows' whole dgate */
    if (!whole)
        CHECK(tp_allreduce(m, m->mdgate, (size_t)N * (size_t)m->cfg.moe.top_k, COMM_SUM, err, errlen));
    moe_bwd_router(m, &a->moe, w, g, a->ln2, m->dln, tp0 || whole, accum, N);
    /* whole experts: each TP rank's router gradient is its rows' part */
    if (whole && last)
        CHECK(tp_allreduce(m, g->router, (size_t)m->cfg.moe.experts * (size_t)m->cfg.d_model, COMM_SUM, err, errlen));
    if (!w->sgate)
        return STATUS_OK;
    CHECK(tp_allreduce(m, m->msdz, (size_t)N, COMM_SUM, err, errlen));
    moe_shared_gate_bwd_weight(m, w, g, a->ln2, m->dln, tp0, accum, N);
    return STATUS_OK;
}

/* keep != NULL: the split backward's B, which leaves the four matmuls'
 * weight and bias gradients to block_bwd_weight and keeps their output
 * gradients where keep says (slot_wdout) for it. */
static status_t block_bwd(model_t *m, model_slot_t *sl, int i, int accum, int last, const wdout_at_t *keep, char *err,
                          size_t errlen)
{
    const ops_t *o = m->ops;
    const model_config_t *c = &m->cfg;
    const int gpt = c->arch == ARCH_GPT2;
    const int b = sl->b, t = sl->t, N = b * t, NR = res_rows(m, N), C = c->d_model;
    const int NH = heads(m), NKV = kv_heads(m), HS = model_head_size(c), QD = NH * HS, F = layer_ffn(m, i);
    const block_tensors_t *w = &m->p.h[i];
    const block_tensors_t *g = &m->g.h[i];
    const block_acts_t view = block_view(m, sl, i), *a = &view;
    const float *x = sl->x + (size_t)(i - sl->first) * NR * C;
    const model_recompute_t rc = m->lay.recompute;
    /* recompute what the slot dropped, with the forward's kernels on the
     * forward's inputs: the same bits */
    if (rc == MODEL_RECOMPUTE_FULL)
        CHECK(block_fwd(m, a, NULL, 0.0f, slot_pos(sl), slot_qdoc(sl), x, NULL, i, b, t, err, errlen));
    else if (rc == MODEL_RECOMPUTE_SELECTIVE && gpt && F > 0)
        o->gelu_fwd(o->ctx, a->fc_act, a->fc_act16, a->fc, (size_t)N * F);
    else if (rc == MODEL_RECOMPUTE_SELECTIVE && F > 0)
        o->swiglu_fwd(o->ctx, a->fc_act, a->fc_act16, a->fc, N, F);
    /* MLP: dres = dL/dxout on entry, dL/dres2 after the norm backward */
    /* dfc[N, fc_width]: the gradient at the activation's input; GPT-2's
     * comes out of the proj GEMM's DGELU epilogue (dbig, which fc_act
     * never is), SwiGLU's from its own kernel */
    float *dfc = gpt ? m->dbig : m->dbig2;
    const int wg = keep == NULL; /* this pass writes the matmuls' weight gradients */
    /* ... and the MLP projection's under selective recomputation, where
     * the fc_act it needs is recomputed here (slot_wdout) */
    const int wg_proj = wg || rc == MODEL_RECOMPUTE_SELECTIVE;
    const float *dout;
    const uint16_t *dout16;
    CHECK(dres_all_rows(m, NR, &dout, &dout16, err, errlen));
    /* dsh: the dense MLP's (or shared expert's) output gradient, dout, or
     * under --moe-shared-gate dout times the gate (m->msdy), whose rows
     * of this rank W takes as it takes dres's */
    const float *dsh = dout, *dsh_rows = m->dres;
    const uint16_t *dsh16 = dout16;
    /* bf16: the fc matmul's output gradient as its producer writes it, the
     * DGELU epilogue into a16 (d16 is its input), SwiGLU's into d16 */
    uint16_t *dfc16 = m->lay.bf16 ? (gpt ? m->a16 : m->d16) : NULL;
    if (F > 0 && w->sgate) {
        moe_shared_gate_bwd(m, &a->moe, dout, N);
        dsh16 = NULL;
        dsh = m->msdy;
        dsh_rows = m->msdy + (m->lay.sequence_parallel ? (size_t)m->lay.part.tp_rank * NR * C : 0);
    }
    keep_dout(m, keep && !wg_proj ? keep->proj : NULL, dsh_rows, (size_t)NR * C); /* this rank's rows */
    /* --tp-comm-overlap under sequence parallelism: the MLP projection's
     * weight gradient waits for the attention's gather to run beside it */
    tp_wgrad_t held = {0};
    if (m->lay.tp_overlap && m->lay.sequence_parallel && wg && F > 0 && !layer_moe(m, i) && !w->sgate)
        held = (tp_wgrad_t){1,        g->wproj, g->bproj, dsh, a->fc_act, w->wproj, dsh16, a->fc_act16, N, F, C, accum,
                            !gpt && rc != MODEL_RECOMPUTE_NONE ? a->fc : NULL};
    float *dw_proj = wg_proj && !held.active ? g->wproj : NULL, *db_proj = wg_proj && !held.active ? g->bproj : NULL;
    if (F > 0 && gpt) {
        model_mm_dgelu_bwd(m, dfc, dfc16, dw_proj, db_proj, dsh, dsh16, a->fc_act, a->fc_act16, a->fc, w->wproj, N, F,
                           C, accum);
    } else if (F > 0) {
        model_mm_bwd(m, m->dbig, dw_proj, db_proj, dsh, dsh16, a->fc_act, a->fc_act16, w->wproj, N, F, C, 0, accum);
        o->swiglu_bwd(o->ctx, dfc, dfc16, a->fc, m->dbig, N, F);
    }
    keep_dout(m, keep ? keep->fc : NULL, dfc, (size_t)N * layer_fcw(m, i));
    /* a MoE layer's experts add to dln after the dense part: no overlap there */
    tp_dgrad_t pending = {0};
    if (F > 0)
        CHECK(column_parallel_bwd(m, layer_moe(m, i) ? NULL : &pending, wg ? g->wfc : NULL, wg ? g->bfc : NULL, dfc,
                                  dfc16, a->ln2, a->ln2_16, w->wfc, N, NR, C, layer_fcw(m, i), accum, err, errlen));
    if (layer_moe(m, i))
        CHECK(moe_block_bwd(m, a, w, g, dout, F > 0, N, accum, last, err, errlen));
    CHECK(norm_bwd_reduce(m, &pending, g->ln2w, g->ln2b, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd, N, NR, accum,
                          err, errlen));
    /* attention: dres becomes dL/dx */
    CHECK(dres_all_rows_beside(m, &held, N, NR, &dout, &dout16, err, errlen));
    keep_dout(m, keep ? keep->o : NULL, m->dres, (size_t)NR * C);
    model_mm_bwd(m, m->dbig, wg ? g->wo : NULL, wg ? g->bo : NULL, dout, dout16, a->atty, a->atty16, w->wo, N, QD, C, 0,
                 accum);
    /* bf16: dqkv's bf16 into d16 by its last producer, the attention
     * (GPT-2) or RoPE (Llama); Qwen3's q/k norms come after, and --cp's
     * ring has no bf16 output: the qkv matmul casts then */
    uint16_t *dqkv16 = m->lay.bf16 && !c->qk_norm && !(gpt && cp_on(m)) ? m->d16 : NULL;
    if (cp_on(m))
        CHECK(cp_ring_backward(m->ring, m->dbig2, m->dbig, a->qkv, a->atty, a->lse, slot_qdoc(sl), &m->cp_stats, err,
                               errlen));
    else
        o->attention_bwd(o->ctx, m->dbig2, gpt ? dqkv16 : NULL, m->dbig, a->qkv, a->atty, a->lse, slot_pos(sl), b, t,
                         NH, NKV, HS);
    if (!gpt)
        o->rope_bwd(o->ctx, m->dbig2, dqkv16, slot_pos(sl), b, t, NH, NKV, HS, m->inv_freq);
    if (c->qk_norm) {
        o->qknorm_bwd(o->ctx, m->dbig2, g->qnorm, g->knorm, a->qk_in, w->qnorm, w->knorm, a->qk_rstd, N, NH, NKV, HS,
                      accum);
        CHECK(qknorm_grads_reduce(m, g, last, err, errlen));
    }
    keep_dout(m, keep ? keep->qkv : NULL, m->dbig2, (size_t)N * qkv_width(m));
    CHECK(column_parallel_bwd(m, &pending, wg ? g->wqkv : NULL, wg ? g->bqkv : NULL, m->dbig2, dqkv16, a->ln1,
                              a->ln1_16, w->wqkv, N, NR, C, qkv_width(m), accum, err, errlen));
    CHECK(norm_bwd_reduce(m, &pending, g->ln1w, g->ln1b, x, w->ln1w, a->ln1_mean, a->ln1_rstd, N, NR, accum, err,
                          errlen));
    CHECK(norm_grads_reduce(m, g->ln1w, g->ln1b, last, err, errlen));
    return norm_grads_reduce(m, g->ln2w, g->ln2b, last, err, errlen);
}

/* Last stage: the output head's and final norm's backward, from the
 * slot's dlogits; dres then holds dL/d(the last block's output). */
static status_t head_bwd(model_t *m, model_slot_t *sl, int accum, int last, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    const int N = sl->b * sl->t, NR = res_rows(m, N), C = m->cfg.d_model;
    if (!sl->has_dlogits)
        return status_set(STATUS_FAIL, err, errlen, "internal error: backward without a training forward");
    double t0 = span_start(m);
    /* output head and final norm; dres accumulates dL/dx from here down */
    float *dln = m->dln;
    if (m->xrows) { /* the fused classifier left dx in lnf and wrote the head's weight gradient */
        dln = sl->lnf;
        m->head_pending--;
        if (accum != sl->head_accum)
            return status_set(STATUS_FAIL, err, errlen,
                              "internal error: the fused classifier %s the head's gradient in a forward whose "
                              "backward %s",
                              sl->head_accum ? "added to" : "wrote", accum ? "adds" : "writes");
        if (last && m->head_pending > 0)
            return status_set(STATUS_FAIL, err, errlen,
                              "internal error: the step's last backward while %d later fused forwards' head "
                              "gradients are pending",
                              m->head_pending);
        if (last)
            m->head_open = 0;
    } else {
        /* the head's weight gradient too under the split backward: B frees
         * the logits for the next microbatch (layout_acts shares them) */
        model_mm_bwd(m, m->dln, m->g.head, NULL, sl->logits, NULL, sl->lnf, NULL, m->p.head, N, C, m->v_rows, 0, accum);
    }
    o->zero(o->ctx, m->dres, (size_t)NR * C * sizeof(float));
    const float *xL = sl->x + (size_t)sl->n_blocks * NR * C;
    CHECK(norm_bwd_reduce_from(m, dln, m->g.lnfw, m->g.lnfb, xL, m->p.lnfw, sl->lnf_mean, sl->lnf_rstd, N, NR, accum,
                               err, errlen));
    CHECK(norm_grads_reduce(m, m->g.lnfw, m->g.lnfb, last, err, errlen));
    sl->has_dlogits = 0;
    span_end(m, "bwd head", -1, t0);
    return STATUS_OK;
}

/* First stage: the embeddings' backward from dres. GPT-2's wte gradient
 * already holds the output head's part when the head is on this stage,
 * so the embedding adds to it; wpe is cleared here on the first
 * microbatch. */
static status_t embed_bwd(model_t *m, model_slot_t *sl, int accum, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    const model_config_t *c = &m->cfg;
    const int gpt = c->arch == ARCH_GPT2, t = sl->t, N = sl->b * t, NR = res_rows(m, N), C = c->d_model;
    const int wte_has_head = model_head_tied(c) && m->lay.part.has_head;
    double t0 = span_start(m);
    if (gpt && !accum)
        o->zero(o->ctx, m->g.wpe, (size_t)c->max_seq * C * sizeof(float));
    const float *dout;
    const uint16_t *dout16; /* unused: the embedding is no GEMM */
    CHECK(dres_all_rows(m, NR, &dout, &dout16, err, errlen));
    o->embedding_bwd(o->ctx, m->g.wte, m->g.wpe, dout, sl->tokens, slot_pos(sl), N, t, C, m->v0, m->v_held,
                     wte_has_head ? 1 : accum);
    span_end(m, "bwd embed", -1, t0);
    return STATUS_OK;
}

status_t model_backward(model_t *m, int slot, int accum, int last, char *err, size_t errlen)
{
    return model_backward_chunk(m, slot, accum, last, err, errlen);
}

size_t model_chunk_top(const model_t *m, int chunk)
{
    return chunk >= m->lay.part.n_runs - 1 ? m->table.numel
                                           : m->layer_start[param_layout_run_first(&m->lay.part, chunk + 1)];
}

static status_t backward_pass(model_t *m, int slot, int accum, int last, int split, char *err, size_t errlen);

/* Where block i's kept matmul output gradients wait in slot sl (split
 * backward; wdout_at_t). */
static wdout_at_t slot_wdout(const model_t *m, const model_slot_t *sl, int i)
{
    const size_t N = (size_t)m->B * (size_t)m->T, NR = (size_t)res_rows(m, (int)N), C = (size_t)m->cfg.d_model;
    int rows, fc, qkv;
    wdout_fits(m, &rows, &fc, &qkv);
    float *own = sl->wdout + (size_t)(i - sl->first) * wdout_floats(m, N);
    const block_acts_t a = block_view(m, sl, i);
    wdout_at_t d;
    if (rows) {
        d.proj = sl->x + (size_t)(i + 1 - sl->first) * NR * C;
        d.o = a.res2;
    } else {
        d.proj = own;
        d.o = own + NR * C;
        own += 2 * NR * C;
    }
    d.fc = fc ? a.fc : own;
    if (!fc)
        own += N * max_fcw(m);
    d.qkv = qkv ? a.qkv : own;
    return d;
}

/* The split backward's W of block i: the four matmuls' weight and bias
 * gradients from the output gradients B kept and the slot's inputs (the
 * MLP projection's is B's under selective recomputation: it reads the
 * recomputed activation). Under full recomputation the block's forward
 * runs again first, as B ran it (its activations live in a scratch later
 * Bs overwrite; its parameters lent again under ZeRO-3), with the
 * forward's kernels on the forward's inputs, so the same bits. */
static status_t block_bwd_weight(model_t *m, model_slot_t *sl, int i, int next, int accum, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int b = sl->b, t = sl->t, N = b * t, C = c->d_model, QD = heads(m) * model_head_size(c), F = layer_ffn(m, i);
    const int NR = res_rows(m, N);
    const block_tensors_t *w = &m->p.h[i], *g = &m->g.h[i];
    const block_acts_t view = block_view(m, sl, i), *a = &view;
    const model_recompute_t rc = m->lay.recompute;
    /* under selective recomputation the MLP projection's weight gradient
     * was B's (block_bwd), so W needs no recomputed activation */
    const int proj_here = F > 0 && rc != MODEL_RECOMPUTE_SELECTIVE;
    if (rc == MODEL_RECOMPUTE_FULL) {
        CHECK(lend_params(m, i, next, err, errlen));
        const float *x = sl->x + (size_t)(i - sl->first) * NR * C;
        CHECK(block_fwd(m, a, NULL, 0.0f, slot_pos(sl), slot_qdoc(sl), x, NULL, i, b, t, err, errlen));
    }
    const wdout_at_t d = slot_wdout(m, sl, i);
    const float *d_proj = d.proj, *d_o = d.o; /* all rows: gathered again under sequence parallelism */
    if (proj_here && m->lay.sequence_parallel) {
        CHECK(tp_act_gather(m, m->dfull, d.proj, (size_t)NR * C, err, errlen));
        d_proj = m->dfull;
    }
    /* the kept output gradients are fp32: each is cast here (the split
     * backward's rounding passes, doc/design.md) */
    if (proj_here)
        model_mm_bwd(m, NULL, g->wproj, g->bproj, d_proj, NULL, a->fc_act, a->fc_act16, w->wproj, N, F, C, 0, accum);
    if (F > 0) /* a dense MLP, or a MoE layer's shared expert */
        model_mm_bwd(m, NULL, g->wfc, g->bfc, d.fc, NULL, a->ln2, a->ln2_16, w->wfc, N, C, layer_fcw(m, i), 0, accum);
    if (m->lay.sequence_parallel) {
        CHECK(tp_act_gather(m, m->dfull, d.o, (size_t)NR * C, err, errlen));
        d_o = m->dfull;
    }
    model_mm_bwd(m, NULL, g->wo, g->bo, d_o, NULL, a->atty, a->atty16, w->wo, N, QD, C, 0, accum);
    model_mm_bwd(m, NULL, g->wqkv, g->bqkv, d.qkv, NULL, a->ln1, a->ln1_16, w->wqkv, N, C, qkv_width(m), 0, accum);
    return STATUS_OK;
}

status_t model_backward_chunk(model_t *m, int slot, int accum, int last, char *err, size_t errlen)
{
    return backward_pass(m, slot, accum, last, 0, err, errlen);
}

status_t model_backward_input(model_t *m, int slot, int accum, int last, char *err, size_t errlen)
{
    if (!m->lay.split_backward)
        return status_set(STATUS_FAIL, err, errlen, "internal error: a split backward without a split layout");
    return backward_pass(m, slot, accum, last, 1, err, errlen);
}

status_t model_backward_weight(model_t *m, int slot, int accum, char *err, size_t errlen)
{
    model_slot_t *sl = &m->slots[slot];
    const param_layout_t *part = &m->lay.part;
    const int chunk = sl->chunk, first = sl->first, end = first + sl->n_blocks;
    if (!m->lay.split_backward)
        return status_set(STATUS_FAIL, err, errlen, "internal error: a weight backward without a split layout");
    double t0 = span_start(m);
    if (m->hook.grads_ready)
        m->hook.grads_ready(m->hook.ctx, m->layer_start[end]);
    for (int i = end - 1; i >= first; i--) {
        CHECK(block_bwd_weight(m, sl, i, i > first ? i - 1 : -1, accum, err, errlen));
        if (m->hook.grads_ready)
            m->hook.grads_ready(m->hook.ctx, m->layer_start[i]);
    }
    if (part->has_embed && chunk == 0 && m->hook.grads_ready)
        m->hook.grads_ready(m->hook.ctx, 0);
    span_end(m, "bwd weights", -1, t0);
    return STATUS_OK;
}

/* The whole backward of the slot's chunk, or (split) its B half: the
 * hook hears of finished gradients only from a whole backward (a split
 * one's are final after W). */
static status_t backward_pass(model_t *m, int slot, int accum, int last, int split, char *err, size_t errlen)
{
    model_slot_t *sl = &m->slots[slot];
    const param_layout_t *part = &m->lay.part;
    const int chunk = sl->chunk, first = sl->first, end = first + sl->n_blocks;
    void (*ready)(void *, size_t) = split ? NULL : m->hook.grads_ready;
    m->dres16 = NULL; /* dres came from elsewhere (the next stage) or is set below */
    if (part->has_head && chunk == part->n_runs - 1)
        CHECK(head_bwd(m, sl, accum, last, err, errlen));
    /* GPT-2's head is wte, which is not final until the embedding's part;
     * the chunks above this one finished their backwards before it */
    if (ready)
        ready(m->hook.ctx, m->layer_start[end]);
    for (int i = end - 1; i >= first; i--) {
        if (m->lay.lent_block_grads) {
            float *base = m->hook.block_grads ? m->hook.block_grads(m->hook.ctx, i) : NULL;
            if (!base || map_block(m, base, m->layer_start[i], i, &m->g.h[i]) != 0)
                return status_set(STATUS_FAIL, err, errlen, "no gradient buffer for block %d", i);
        }
        CHECK(lend_params(m, i, i > first ? i - 1 : -1, err, errlen));
        double t0 = span_start(m);
        const wdout_at_t keep = split ? slot_wdout(m, sl, i) : (wdout_at_t){0};
        CHECK(block_bwd(m, sl, i, accum, last, split ? &keep : NULL, err, errlen));
        span_end(m, "bwd", param_layout_layer(&m->lay.part, i), t0);
        if (ready)
            ready(m->hook.ctx, m->layer_start[i]);
    }
    if (part->has_embed && chunk == 0) {
        CHECK(embed_bwd(m, sl, accum, err, errlen));
        if (ready)
            ready(m->hook.ctx, 0);
    }
    return STATUS_OK;
}

size_t model_params_total(const model_config_t *c)
{
    param_table_t whole;
    char err[256];
    if (param_table_build(&whole, c, NULL, err, sizeof err) != 0)
        return 0;
    size_t n = whole.logical_numel;
    param_table_free(&whole);
    return n;
}

/* ---- stage interface and sampling ---------------------------------------------------- */

float *model_stage_input(model_t *m, int slot) { return m->slots[slot].x; }

float *model_stage_output(model_t *m, int slot)
{
    const model_slot_t *sl = &m->slots[slot];
    return m->slots[slot].x + (size_t)sl->n_blocks * model_stage_floats(m, sl->b, sl->t);
}

float *model_stage_grad(model_t *m) { return m->dres; }

size_t model_stage_floats(const model_t *m, int b, int t)
{
    return (size_t)res_rows(m, b * t) * (size_t)m->cfg.d_model;
}

/* The fused classifier's logits of row n of the slot's forward: the
 * chunk holding it, by the training forward's GEMM, into m->xlogits;
 * returns the row there. */
static const float *fused_logits_row(model_t *m, const model_slot_t *sl, int n)
{
    const int C = m->cfg.d_model, r0 = n - n % m->xrows, N = sl->b * sl->t;
    const int rows = N - r0 < m->xrows ? N - r0 : m->xrows;
    model_mm_fwd(m, m->xlogits, sl->lnf + (size_t)r0 * C, NULL, m->p.head, NULL, rows, C, m->v_rows);
    return m->xlogits + (size_t)(n - r0) * m->v_rows;
}

status_t model_logits_row(model_t *m, int slot, int n, float *host_out, char *err, size_t errlen)
{
    const size_t Vl = (size_t)m->v_rows, P = (size_t)tp_size(m);
    const model_slot_t *sl = &m->slots[slot];
    if (m->xrows && sl->has_dlogits)
        return status_set(STATUS_FAIL, err, errlen, "internal error: logits asked of a fused training forward");
    const float *row = m->xrows ? fused_logits_row(m, sl, n) : sl->logits + (size_t)n * Vl;
    if (P == 1) {
        m->ops->to_host(m->ops->ctx, host_out, row, (size_t)m->cfg.vocab_size * sizeof(float));
        return STATUS_OK;
    }
    float *all = malloc(P * Vl * sizeof *all), *mine = malloc(Vl * sizeof *mine);
    status_t rc;
    if (all && mine) {
        m->ops->to_host(m->ops->ctx, mine, row, Vl * sizeof(float));
        rc = tp_allgather(m, all, mine, Vl, err, errlen);
        /* rank r's slice starts at logical column r*Vl: the padded layout */
        if (rc == STATUS_OK)
            memcpy(host_out, all, (size_t)m->cfg.vocab_size * sizeof(float));
    } else {
        rc = status_set(STATUS_FAIL, err, errlen, "out of memory for a row of %zu logits", P * Vl);
    }
    free(all);
    free(mine);
    return rc;
}
