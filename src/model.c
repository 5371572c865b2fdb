#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

static size_t qkv_width(const model_config_t *c)
{
    return (size_t)(c->n_head + 2 * c->n_kv_head) * (size_t)model_head_size(c);
}

/* Width of the MLP's first matmul output: F (GPT-2) or 2F (Llama gate|up). */
static size_t fc_width(const model_config_t *c)
{
    return (size_t)(c->arch == ARCH_LLAMA ? 2 : 1) * (size_t)c->d_ff;
}

static float *tensor_ptr(const model_t *m, float *flat, const char *fmt, int layer)
{
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    int i = param_table_find(&m->table, name);
    return i < 0 ? NULL : flat + m->table.p[i].offset;
}

/* Resolves the named tensors of the table into pointers into flat. Returns
 * -1 if the fused GEMMs' adjacency assumptions do not hold. */
static int map_tensors(model_t *m, float *flat, model_tensors_t *t)
{
    const model_config_t *c = &m->cfg;
    const int gpt = c->arch == ARCH_GPT2;
    t->wte = tensor_ptr(m, flat, gpt ? "wte" : "tok_emb", 0);
    t->wpe = gpt ? tensor_ptr(m, flat, "wpe", 0) : NULL;
    t->lnfw = tensor_ptr(m, flat, "lnf.w", 0);
    t->lnfb = gpt ? tensor_ptr(m, flat, "lnf.b", 0) : NULL;
    t->head = gpt ? t->wte : tensor_ptr(m, flat, "lm_head.w", 0);
    const size_t C = (size_t)c->d_model, HS = (size_t)model_head_size(c);
    const size_t QD = (size_t)c->n_head * HS, KVD = (size_t)c->n_kv_head * HS;
    for (int l = 0; l < c->n_layer; l++) {
        block_tensors_t *h = &t->h[l];
        h->ln1w = tensor_ptr(m, flat, "h.%d.ln1.w", l);
        h->ln1b = tensor_ptr(m, flat, "h.%d.ln1.b", l);
        h->wqkv = tensor_ptr(m, flat, "h.%d.attn.wq", l);
        h->bqkv = tensor_ptr(m, flat, "h.%d.attn.bq", l);
        h->wo = tensor_ptr(m, flat, "h.%d.attn.wo", l);
        h->bo = tensor_ptr(m, flat, "h.%d.attn.bo", l);
        h->ln2w = tensor_ptr(m, flat, "h.%d.ln2.w", l);
        h->ln2b = tensor_ptr(m, flat, "h.%d.ln2.b", l);
        h->wfc = tensor_ptr(m, flat, gpt ? "h.%d.mlp.wfc" : "h.%d.mlp.wgate", l);
        h->bfc = tensor_ptr(m, flat, "h.%d.mlp.bfc", l);
        h->wproj = tensor_ptr(m, flat, "h.%d.mlp.wproj", l);
        h->bproj = tensor_ptr(m, flat, "h.%d.mlp.bproj", l);
        /* one GEMM computes q|k|v, and one computes gate|up */
        if (tensor_ptr(m, flat, "h.%d.attn.wk", l) != h->wqkv + QD * C ||
            tensor_ptr(m, flat, "h.%d.attn.wv", l) != h->wqkv + (QD + KVD) * C)
            return -1;
        if (gpt && (tensor_ptr(m, flat, "h.%d.attn.bk", l) != h->bqkv + QD ||
                    tensor_ptr(m, flat, "h.%d.attn.bv", l) != h->bqkv + QD + KVD))
            return -1;
        if (!gpt && tensor_ptr(m, flat, "h.%d.mlp.wup", l) != h->wfc + (size_t)c->d_ff * C)
            return -1;
    }
    return 0;
}

/* Carves n floats out of the arena at *cursor (64-byte aligned pieces). */
static float *carve(char *base, size_t *cursor, size_t n)
{
    float *p = base ? (float *)(base + *cursor) : NULL;
    *cursor += (n * sizeof(float) + 63) & ~(size_t)63;
    return p;
}

/* Lays out activations and workspace in two arenas. Called once with
 * base == NULL to size them, then with the allocated arenas. */
static void layout_acts(model_t *m, char *acts, size_t *acts_bytes, char *work, size_t *work_bytes)
{
    const model_config_t *c = &m->cfg;
    const size_t N = (size_t)m->B * (size_t)m->T, C = (size_t)c->d_model;
    const size_t L = (size_t)c->n_layer, V = (size_t)c->vocab_size;
    const size_t QKV = qkv_width(c), QD = (size_t)c->n_head * (size_t)model_head_size(c);
    const size_t FW = fc_width(c), F = (size_t)c->d_ff;
    const size_t ATT = (size_t)m->B * (size_t)c->n_head * (size_t)m->T * (size_t)m->T;
    size_t a = 0, w = 0;
    m->x = carve(acts, &a, (L + 1) * N * C);
    for (size_t l = 0; l < L; l++) {
        block_acts_t *s = &m->acts[l];
        s->ln1 = carve(acts, &a, N * C);
        s->ln1_mean = carve(acts, &a, N);
        s->ln1_rstd = carve(acts, &a, N);
        s->qkv = carve(acts, &a, N * QKV);
        s->att = carve(acts, &a, ATT);
        s->atty = carve(acts, &a, N * QD);
        s->res2 = carve(acts, &a, N * C);
        s->ln2 = carve(acts, &a, N * C);
        s->ln2_mean = carve(acts, &a, N);
        s->ln2_rstd = carve(acts, &a, N);
        s->fc = carve(acts, &a, N * FW);
        s->fc_act = carve(acts, &a, N * F);
    }
    m->lnf = carve(acts, &a, N * C);
    m->lnf_mean = carve(acts, &a, N);
    m->lnf_rstd = carve(acts, &a, N);
    m->logits = carve(acts, &a, N * V);
    m->losses = carve(acts, &a, N);
    m->tokens = (int32_t *)carve(acts, &a, N);
    m->targets = (int32_t *)carve(acts, &a, N);
    size_t big = QKV;
    if (FW > big)
        big = FW;
    if (QD > big)
        big = QD;
    m->dres = carve(work, &w, N * C);
    m->dln = carve(work, &w, N * C);
    m->dbig = carve(work, &w, N * big);
    m->dbig2 = carve(work, &w, N * big);
    m->datt = carve(work, &w, ATT);
    *acts_bytes = a;
    *work_bytes = w;
}

static void *backend_alloc(const ops_t *ops, mem_category_t cat, size_t bytes)
{
    void *p = ops->alloc(bytes);
    if (p) {
        ops->zero(p, bytes);
        mem_track(cat, (long long)bytes);
    }
    return p;
}

static void backend_free(const ops_t *ops, mem_category_t cat, void *p, size_t bytes)
{
    if (p) {
        ops->free(p);
        mem_track(cat, -(long long)bytes);
    }
}

int model_create(model_t *m, const model_config_t *cfg, const ops_t *ops, int B, int T,
                 char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->ops = ops;
    m->B = B;
    m->T = T;
    if (model_config_check(cfg, err, errlen) != 0)
        return -1;
    if (cfg->arch == ARCH_GPT2 && T > cfg->max_seq) {
        snprintf(err, errlen, "--seq-len %d exceeds the model's %d learned positions (--max-seq-len)",
                 T, cfg->max_seq);
        return -1;
    }
    if (param_table_build(&m->table, cfg, 1, 0, err, errlen) != 0)
        return -1;
    const size_t L = (size_t)cfg->n_layer, pbytes = m->table.numel * sizeof(float);
    m->p.h = calloc(L, sizeof *m->p.h);
    m->g.h = calloc(L, sizeof *m->g.h);
    m->acts = calloc(L, sizeof *m->acts);
    m->layer_start = calloc(L + 1, sizeof *m->layer_start);
    if (m->layer_start)
        for (int i = m->table.n - 1; i >= 0; i--) /* lowest offset of each layer wins */
            if (m->table.p[i].layer >= 0)
                m->layer_start[m->table.p[i].layer] = m->table.p[i].offset;
    m->params = backend_alloc(ops, MEM_PARAMS, pbytes);
    m->grads = backend_alloc(ops, MEM_GRADS, pbytes);
    layout_acts(m, NULL, &m->act_bytes, NULL, &m->work_bytes);
    char *acts = backend_alloc(ops, MEM_ACTS, m->act_bytes);
    char *work = backend_alloc(ops, MEM_WORKSPACE, m->work_bytes);
    if (!m->p.h || !m->g.h || !m->acts || !m->layer_start || !m->params || !m->grads || !acts || !work) {
        snprintf(err, errlen, "out of memory: the model needs %.1f MiB of parameters+gradients and "
                 "%.1f MiB of activations at micro batch %d x seq %d; lower --micro-batch or --seq-len",
                 2.0 * (double)pbytes / 1048576.0, (double)(m->act_bytes + m->work_bytes) / 1048576.0, B, T);
        backend_free(ops, MEM_ACTS, acts, m->act_bytes);
        backend_free(ops, MEM_WORKSPACE, work, m->work_bytes);
        m->act_bytes = m->work_bytes = 0;
        model_destroy(m);
        return -1;
    }
    layout_acts(m, acts, &m->act_bytes, work, &m->work_bytes);
    if (map_tensors(m, m->params, &m->p) != 0 || map_tensors(m, m->grads, &m->g) != 0) {
        snprintf(err, errlen, "internal error: parameter table does not keep fused tensors adjacent");
        model_destroy(m);
        return -1;
    }
    return 0;
}

void model_destroy(model_t *m)
{
    const ops_t *ops = m->ops;
    size_t pbytes = m->table.numel * sizeof(float);
    backend_free(ops, MEM_PARAMS, m->params, pbytes);
    backend_free(ops, MEM_GRADS, m->grads, pbytes);
    if (m->x)
        backend_free(ops, MEM_ACTS, m->x, m->act_bytes); /* x is the arena's first piece */
    if (m->dres)
        backend_free(ops, MEM_WORKSPACE, m->dres, m->work_bytes);
    free(m->p.h);
    free(m->g.h);
    free(m->acts);
    free(m->layer_start);
    param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

int model_init_params(model_t *m, uint64_t seed)
{
    size_t bytes = m->table.numel * sizeof(float);
    float *host = malloc(bytes);
    if (!host)
        return -1;
    param_table_init(&m->table, host, seed);
    m->ops->from_host(m->params, host, bytes);
    free(host);
    return 0;
}

float model_forward(model_t *m, const int32_t *tokens, const int32_t *targets, int b, int t,
                    float dloss)
{
    const ops_t *o = m->ops;
    const model_config_t *c = &m->cfg;
    const int gpt = c->arch == ARCH_GPT2;
    const int N = b * t, C = c->d_model, L = c->n_layer, V = c->vocab_size;
    const int NH = c->n_head, NKV = c->n_kv_head, HS = model_head_size(c);
    const int QKV = (int)qkv_width(c), QD = NH * HS, F = c->d_ff, FW = (int)fc_width(c);
    m->cur_B = b;
    m->cur_T = t;
    m->has_dlogits = 0;

    o->from_host(m->tokens, tokens, (size_t)N * sizeof(int32_t));
    o->embedding_fwd(m->x, m->tokens, m->p.wte, m->p.wpe, N, t, C);

    for (int l = 0; l < L; l++) {
        const block_tensors_t *w = &m->p.h[l];
        block_acts_t *a = &m->acts[l];
        float *x = m->x + (size_t)l * N * C, *xout = x + (size_t)N * C;
        /* attention sub-block: res2 = x + wo . attn(norm1(x)) */
        if (gpt)
            o->layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1w, w->ln1b, N, C, c->norm_eps);
        else
            o->rmsnorm_fwd(a->ln1, a->ln1_rstd, x, w->ln1w, N, C, c->norm_eps);
        o->matmul_fwd(a->qkv, a->ln1, w->wqkv, w->bqkv, N, C, QKV);
        if (!gpt)
            o->rope_fwd(a->qkv, b, t, NH, NKV, HS, c->rope_theta);
        o->attention_fwd(a->atty, a->att, a->qkv, b, t, NH, NKV, HS);
        o->matmul_fwd(a->res2, a->atty, w->wo, w->bo, N, QD, C);
        o->add(a->res2, a->res2, x, (size_t)N * C);
        /* MLP sub-block: xout = res2 + wproj . act(fc(norm2(res2))) */
        if (gpt)
            o->layernorm_fwd(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, N, C, c->norm_eps);
        else
            o->rmsnorm_fwd(a->ln2, a->ln2_rstd, a->res2, w->ln2w, N, C, c->norm_eps);
        o->matmul_fwd(a->fc, a->ln2, w->wfc, w->bfc, N, C, FW);
        if (gpt)
            o->gelu_fwd(a->fc_act, a->fc, (size_t)N * F);
        else
            o->swiglu_fwd(a->fc_act, a->fc, N, F);
        o->matmul_fwd(xout, a->fc_act, w->wproj, w->bproj, N, F, C);
        o->add(xout, xout, a->res2, (size_t)N * C);
    }

    float *xL = m->x + (size_t)L * N * C;
    if (gpt)
        o->layernorm_fwd(m->lnf, m->lnf_mean, m->lnf_rstd, xL, m->p.lnfw, m->p.lnfb, N, C, c->norm_eps);
    else
        o->rmsnorm_fwd(m->lnf, m->lnf_rstd, xL, m->p.lnfw, N, C, c->norm_eps);
    o->matmul_fwd(m->logits, m->lnf, m->p.head, NULL, N, C, V);
    if (!targets)
        return 0.0f;

    /* The loss is the mean over the targets that count (>= 0); the
     * gradient must be of that same mean. */
    int counted = 0;
    for (int i = 0; i < N; i++)
        counted += targets[i] >= 0;
    o->from_host(m->targets, targets, (size_t)N * sizeof(int32_t));
    float *dlogits = dloss > 0 ? m->logits : NULL;
    o->cross_entropy(m->losses, dlogits, m->logits, m->targets, N, V, V,
                     counted ? dloss / (float)counted : 0.0f);
    m->has_dlogits = dloss > 0;
    /* reduced on the host in double, in a fixed order */
    float *host = malloc((size_t)N * sizeof(float));
    if (!host)
        return NAN;
    o->to_host(host, m->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0)
            sum += host[i];
    free(host);
    return counted ? (float)(sum / counted) : 0.0f;
}

void model_backward(model_t *m, int accum)
{
    const ops_t *o = m->ops;
    const model_config_t *c = &m->cfg;
    const int gpt = c->arch == ARCH_GPT2;
    const int b = m->cur_B, t = m->cur_T, N = b * t, C = c->d_model, L = c->n_layer;
    const int V = c->vocab_size, NH = c->n_head, NKV = c->n_kv_head, HS = model_head_size(c);
    const int QKV = (int)qkv_width(c), QD = NH * HS, F = c->d_ff, FW = (int)fc_width(c);
    if (!m->has_dlogits)
        return;

    /* output head and final norm; dres accumulates dL/dx from here down */
    o->matmul_bwd(m->dln, m->g.head, NULL, m->logits, m->lnf, m->p.head, N, C, V, 0, accum);
    o->zero(m->dres, (size_t)N * C * sizeof(float));
    float *xL = m->x + (size_t)L * N * C;
    if (gpt)
        o->layernorm_bwd(m->dres, m->g.lnfw, m->g.lnfb, m->dln, xL, m->p.lnfw, m->lnf_mean,
                         m->lnf_rstd, N, C, accum);
    else
        o->rmsnorm_bwd(m->dres, m->g.lnfw, m->dln, xL, m->p.lnfw, m->lnf_rstd, N, C, accum);
    /* GPT-2's head is wte, which is not final until the embedding's part */
    if (m->grads_ready)
        m->grads_ready(m->grads_ready_ctx, m->layer_start[L]);

    for (int l = L - 1; l >= 0; l--) {
        const block_tensors_t *w = &m->p.h[l];
        const block_tensors_t *g = &m->g.h[l];
        const block_acts_t *a = &m->acts[l];
        const float *x = m->x + (size_t)l * N * C;
        /* MLP: dres = dL/dxout on entry, dL/dres2 after the norm backward */
        o->matmul_bwd(m->dbig, g->wproj, g->bproj, m->dres, a->fc_act, w->wproj, N, F, C, 0, accum);
        if (gpt)
            o->gelu_bwd(m->dbig2, a->fc, m->dbig, (size_t)N * F);
        else
            o->swiglu_bwd(m->dbig2, a->fc, m->dbig, N, F);
        o->matmul_bwd(m->dln, g->wfc, g->bfc, m->dbig2, a->ln2, w->wfc, N, C, FW, 0, accum);
        if (gpt)
            o->layernorm_bwd(m->dres, g->ln2w, g->ln2b, m->dln, a->res2, w->ln2w, a->ln2_mean,
                             a->ln2_rstd, N, C, accum);
        else
            o->rmsnorm_bwd(m->dres, g->ln2w, m->dln, a->res2, w->ln2w, a->ln2_rstd, N, C, accum);
        /* attention: dres becomes dL/dx */
        o->matmul_bwd(m->dbig, g->wo, g->bo, m->dres, a->atty, w->wo, N, QD, C, 0, accum);
        o->attention_bwd(m->dbig2, m->datt, m->dbig, a->qkv, a->att, b, t, NH, NKV, HS);
        if (!gpt)
            o->rope_bwd(m->dbig2, b, t, NH, NKV, HS, c->rope_theta);
        o->matmul_bwd(m->dln, g->wqkv, g->bqkv, m->dbig2, a->ln1, w->wqkv, N, C, QKV, 0, accum);
        if (gpt)
            o->layernorm_bwd(m->dres, g->ln1w, g->ln1b, m->dln, x, w->ln1w, a->ln1_mean,
                             a->ln1_rstd, N, C, accum);
        else
            o->rmsnorm_bwd(m->dres, g->ln1w, m->dln, x, w->ln1w, a->ln1_rstd, N, C, accum);
        if (m->grads_ready)
            m->grads_ready(m->grads_ready_ctx, m->layer_start[l]);
    }
    /* GPT-2's wte gradient already holds the output head's part, so the
     * embedding adds to it; wpe is cleared here on the first microbatch. */
    if (gpt && !accum)
        o->zero(m->g.wpe, (size_t)c->max_seq * C * sizeof(float));
    o->embedding_bwd(m->g.wte, m->g.wpe, m->dres, m->tokens, N, t, C, V, gpt ? 1 : accum);
    if (m->grads_ready)
        m->grads_ready(m->grads_ready_ctx, 0);
    m->has_dlogits = 0;
}

void model_logits_row(const model_t *m, int n, float *host_out)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    m->ops->to_host(host_out, m->logits + (size_t)n * V, V * sizeof(float));
}
