#include "src/model/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/status.h"
#include "src/model/rng.h"

typedef struct table_builder {
    param_table_t *t;
    int cap;
    int tp_size, tp_rank;
    int ep_size, ep_rank;
    int ep_spans_tp; /* --etp 1 at tp > 1: whole experts */
    int64_t padded_vocab;
    int n_layer;
    char *err;
    size_t errlen;
} table_builder_t;

static status_t add_param_groups(table_builder_t *b, int layer, const char *suffix, int ndim, int64_t d0, int64_t d1,
                                 tp_split_t split, int groups, param_init_t init, float std)
{
    param_table_t *t = b->t;
    if (t->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        param_desc_t *np = realloc(t->p, (size_t)b->cap * sizeof *np);
        if (!np)
            return status_set(STATUS_FAIL, b->err, b->errlen, "out of memory building the parameter table");
        t->p = np;
    }
    param_desc_t *d = &t->p[t->n];
    memset(d, 0, sizeof *d);
    if (layer >= 0 && layer < b->n_layer)
        snprintf(d->name, sizeof d->name, "h.%d.%s", layer, suffix);
    else
        snprintf(d->name, sizeof d->name, "%s", suffix);
    d->ndim = ndim;
    d->shape[0] = d0;
    d->shape[1] = ndim == 2 ? d1 : 1;
    d->tp_split = split;
    d->groups = groups;
    d->layer = layer;
    d->decay = ndim == 2;
    d->init = init;
    d->init_std = std;
    d->count[0] = d->shape[0];
    d->count[1] = d->shape[1];
    d->norm = init == INIT_ONES || (ndim == 1 && strstr(suffix, "ln") == suffix);
    d->held = 1;
    if (split == TP_SPLIT_VOCAB) {
        d->local_rows = b->padded_vocab / b->tp_size;
        int64_t v0 = d->local_rows * b->tp_rank;
        d->start[0] = v0 < d0 ? v0 : d0;
        d->count[0] = v0 >= d0 ? 0 : d0 - v0 < d->local_rows ? d0 - v0 : d->local_rows;
    } else {
        int dim = split == TP_SPLIT_ROWS ? 0 : split == TP_SPLIT_COLS ? 1 : -1;
        const int64_t g = dim == 0 ? groups : 1; /* blocks split apart */
        if (dim >= 0) {
            if (d->shape[dim] % (g * b->tp_size) != 0)
                return status_set(STATUS_FAIL, b->err, b->errlen,
                                  "tensor %s dimension %d (%lld) is not divisible by --tp %d", d->name, dim,
                                  (long long)(d->shape[dim] / g), b->tp_size);
            d->count[dim] = d->shape[dim] / g / b->tp_size;
            d->start[dim] = d->count[dim] * b->tp_rank;
        }
        d->held = (int)g;
        d->local_rows = d->count[0] * g;
    }
    d->numel = (size_t)d->local_rows * (size_t)d->count[1];
    d->offset = t->numel;
    t->numel += d->numel;
    t->logical_numel += (size_t)d->shape[0] * (size_t)d->shape[1];
    t->n++;
    return STATUS_OK;
}

static status_t add_param(table_builder_t *b, int layer, const char *suffix, int ndim, int64_t d0, int64_t d1,
                          tp_split_t split, param_init_t init, float std)
{
    return add_param_groups(b, layer, suffix, ndim, d0, d1, split, 1, init, std);
}

param_layout_t param_layout_range(int tp_size, int tp_rank, int begin, int end, int has_embed, int has_head)
{
    return (param_layout_t){.tp_size = tp_size,
                            .tp_rank = tp_rank,
                            .n_runs = 1,
                            .run_begin = {begin},
                            .run_end = {end},
                            .has_embed = has_embed,
                            .has_head = has_head};
}

param_layout_t param_layout_whole(const model_config_t *c) { return param_layout_range(1, 0, 0, c->n_layer, 1, 1); }

int param_layout_blocks(const param_layout_t *p)
{
    return param_layout_run_first(p, p->n_runs);
}

int param_layout_run_first(const param_layout_t *p, int k)
{
    int n = 0;
    for (int r = 0; r < k && r < p->n_runs; r++)
        n += p->run_end[r] - p->run_begin[r];
    return n;
}

int param_layout_layer(const param_layout_t *p, int i)
{
    for (int r = 0; r < p->n_runs; r++) {
        const int len = p->run_end[r] - p->run_begin[r];
        if (i < len)
            return p->run_begin[r] + i;
        i -= len;
    }
    return -1;
}

int param_layout_local(const param_layout_t *p, int l)
{
    int first = 0;
    for (int r = 0; r < p->n_runs; r++) {
        if (l >= p->run_begin[r] && l < p->run_end[r])
            return first + l - p->run_begin[r];
        first += p->run_end[r] - p->run_begin[r];
    }
    return -1;
}

int param_layout_check(const param_layout_t *p, int n_layer)
{
    if (p->n_runs < 1 || p->n_runs > PARAM_MAX_RUNS)
        return -1;
    int lo = 0;
    for (int r = 0; r < p->n_runs; r++) {
        if (p->run_begin[r] < lo || p->run_end[r] < p->run_begin[r] || p->run_end[r] > n_layer)
            return -1;
        lo = p->run_end[r];
    }
    return 0;
}

int64_t param_padded_vocab(int64_t V, int tp_size)
{
    int64_t q = 128 * (int64_t)tp_size;
    return (V + q - 1) / q * q;
}

/* The tensors of the first stage, of block l and of the last stage, in
 * table order. std: the init's standard deviation; std_out: the scaled one
 * of GPT-2's projections into the residual stream. */
static status_t add_embed(table_builder_t *b, const model_config_t *c, float std)
{
    const int64_t C = c->d_model, V = c->vocab_size;
    if (c->arch == ARCH_GPT2) {
        CHECK(add_param(b, -1, "wte", 2, V, C, TP_SPLIT_VOCAB, INIT_NORMAL, std));
        CHECK(add_param(b, -1, "wpe", 2, c->max_seq, C, TP_SPLIT_NONE, INIT_NORMAL, std));
    } else {
        CHECK(add_param(b, -1, "tok_emb", 2, V, C, TP_SPLIT_VOCAB, INIT_NORMAL, std));
    }
    return STATUS_OK;
}

static status_t add_mlp(table_builder_t *b, const model_config_t *c, int l, int64_t F, float std, float std_out);

/* The last tensor added is a routed expert's: under --ep this rank keeps
 * its experts' part, E/ep of the blocks (a stack of groups) or of the rows
 * (a tensor of one group, [E * rows, cols]). */
static status_t add_expert_mlp(table_builder_t *b, const model_config_t *c, int l, float std, float std_out);

static void split_experts(table_builder_t *b)
{
    param_desc_t *d = &b->t->p[b->t->n - 1];
    d->expert = 1;
    d->ep_spans_tp = b->ep_spans_tp;
    if (b->ep_size <= 1)
        return;
    b->t->numel -= d->numel;
    if (d->groups > 1) {
        d->held = d->groups / b->ep_size;
        d->group0 = b->ep_rank * d->held;
        d->local_rows = d->count[0] * d->held;
    } else {
        d->count[0] = d->shape[0] / b->ep_size;
        d->start[0] = d->count[0] * b->ep_rank;
        d->local_rows = d->count[0];
    }
    d->numel = (size_t)d->local_rows * (size_t)d->count[1];
    b->t->numel += d->numel;
}

/* A MoE layer's router and routed experts, each tensor the E experts'
 * stacked along dim 0 (logical [E, ...] as [E * rows, cols]): the router
 * [E, C] replicated over TP, and each expert's MLP split over TP as the
 * dense one is (expert TP = TP), or with --etp 1 whole (built as at tp 1,
 * the EP split alone cutting them). Llama's wfc holds each expert's gate
 * rows then its up rows, [E * 2F, C], so one GEMM computes an expert's
 * gate|up. */
static status_t add_experts(table_builder_t *b, const model_config_t *c, int l, float std, float std_out)
{
    const int64_t C = c->d_model, E = c->moe.experts;
    if (E % (b->ep_size > 1 ? b->ep_size : 1) != 0)
        return status_set(STATUS_FAIL, b->err, b->errlen, "--ep %d does not divide the %lld experts", b->ep_size,
                          (long long)E);
    CHECK(add_param(b, l, "moe.router", 2, E, C, TP_SPLIT_NONE, INIT_NORMAL, std));
    const int tp_size = b->tp_size, tp_rank = b->tp_rank;
    if (b->ep_spans_tp) {
        b->tp_size = 1;
        b->tp_rank = 0;
    }
    status_t st = add_expert_mlp(b, c, l, std, std_out);
    b->tp_size = tp_size;
    b->tp_rank = tp_rank;
    return st;
}

/* The routed experts' MLP tensors of layer l (add_experts). */
static status_t add_expert_mlp(table_builder_t *b, const model_config_t *c, int l, float std, float std_out)
{
    const int64_t C = c->d_model, E = c->moe.experts, F = c->moe.ffn;
    const int gpt = c->arch == ARCH_GPT2, per = gpt ? 1 : 2;
    CHECK(add_param_groups(b, l, "moe.wfc", 2, E * per * F, C, TP_SPLIT_ROWS, (int)(E * per), INIT_NORMAL, std));
    split_experts(b);
    if (gpt) {
        CHECK(add_param_groups(b, l, "moe.bfc", 1, E * F, 1, TP_SPLIT_ROWS, (int)E, INIT_ZEROS, 0));
        split_experts(b);
    }
    CHECK(add_param(b, l, "moe.wproj", 2, E * C, F, TP_SPLIT_COLS, INIT_NORMAL, std_out));
    split_experts(b);
    if (gpt) {
        CHECK(add_param(b, l, "moe.bproj", 1, E * C, 1, TP_SPLIT_NONE, INIT_ZEROS, 0));
        split_experts(b);
    }
    return STATUS_OK;
}

static status_t add_block(table_builder_t *b, const model_config_t *c, int l, float std, float std_out)
{
    const int64_t C = c->d_model, F = model_layer_ffn(c, l);
    const int64_t HS = model_head_size(c), QD = c->n_head * HS, KVD = c->n_kv_head * HS;
    CHECK(add_param(b, l, "ln1.w", 1, C, 1, TP_SPLIT_NONE, INIT_ONES, 0));
    if (c->arch == ARCH_GPT2)
        CHECK(add_param(b, l, "ln1.b", 1, C, 1, TP_SPLIT_NONE, INIT_ZEROS, 0));
    CHECK(add_param(b, l, "attn.wq", 2, QD, C, TP_SPLIT_ROWS, INIT_NORMAL, std));
    CHECK(add_param(b, l, "attn.wk", 2, KVD, C, TP_SPLIT_ROWS, INIT_NORMAL, std));
    CHECK(add_param(b, l, "attn.wv", 2, KVD, C, TP_SPLIT_ROWS, INIT_NORMAL, std));
    /* GPT-2's and Qwen2's q, k, v biases: split with their weights' rows */
    if (c->arch == ARCH_GPT2 || c->attn_bias) {
        CHECK(add_param(b, l, "attn.bq", 1, QD, 1, TP_SPLIT_ROWS, INIT_ZEROS, 0));
        CHECK(add_param(b, l, "attn.bk", 1, KVD, 1, TP_SPLIT_ROWS, INIT_ZEROS, 0));
        CHECK(add_param(b, l, "attn.bv", 1, KVD, 1, TP_SPLIT_ROWS, INIT_ZEROS, 0));
    }
    /* Qwen3's per-head q and k norms: one [HS] weight each, shared by the
     * heads, so every TP rank holds all of it */
    if (c->qk_norm) {
        CHECK(add_param(b, l, "attn.qnorm", 1, HS, 1, TP_SPLIT_NONE, INIT_ONES, 0));
        CHECK(add_param(b, l, "attn.knorm", 1, HS, 1, TP_SPLIT_NONE, INIT_ONES, 0));
    }
    CHECK(add_param(b, l, "attn.wo", 2, C, QD, TP_SPLIT_COLS, INIT_NORMAL, std_out));
    if (c->arch == ARCH_GPT2)
        CHECK(add_param(b, l, "attn.bo", 1, C, 1, TP_SPLIT_NONE, INIT_ZEROS, 0));
    CHECK(add_param(b, l, "ln2.w", 1, C, 1, TP_SPLIT_NONE, INIT_ONES, 0));
    if (c->arch == ARCH_GPT2)
        CHECK(add_param(b, l, "ln2.b", 1, C, 1, TP_SPLIT_NONE, INIT_ZEROS, 0));
    if (F > 0)
        CHECK(add_mlp(b, c, l, F, std, std_out));
    /* the shared expert's gate [1, C] (Qwen2-MoE's shared_expert_gate):
     * replicated over TP like the router, which every TP rank's full ln2
     * rows let each rank apply alike */
    if (model_layer_moe(c, l) && c->moe.shared_gate)
        CHECK(add_param(b, l, "moe.shared_gate", 2, 1, C, TP_SPLIT_NONE, INIT_NORMAL, std));
    return model_layer_moe(c, l) ? add_experts(b, c, l, std, std_out) : STATUS_OK;
}

/* The dense MLP of width F: a dense layer's, or a MoE layer's shared
 * expert. */
static status_t add_mlp(table_builder_t *b, const model_config_t *c, int l, int64_t F, float std, float std_out)
{
    const int64_t C = c->d_model;
    if (c->arch == ARCH_GPT2) {
        CHECK(add_param(b, l, "mlp.wfc", 2, F, C, TP_SPLIT_ROWS, INIT_NORMAL, std));
        CHECK(add_param(b, l, "mlp.bfc", 1, F, 1, TP_SPLIT_ROWS, INIT_ZEROS, 0));
        CHECK(add_param(b, l, "mlp.wproj", 2, C, F, TP_SPLIT_COLS, INIT_NORMAL, std_out));
        CHECK(add_param(b, l, "mlp.bproj", 1, C, 1, TP_SPLIT_NONE, INIT_ZEROS, 0));
    } else {
        CHECK(add_param(b, l, "mlp.wgate", 2, F, C, TP_SPLIT_ROWS, INIT_NORMAL, std));
        CHECK(add_param(b, l, "mlp.wup", 2, F, C, TP_SPLIT_ROWS, INIT_NORMAL, std));
        CHECK(add_param(b, l, "mlp.wproj", 2, C, F, TP_SPLIT_COLS, INIT_NORMAL, std_out));
    }
    return STATUS_OK;
}

static status_t add_head(table_builder_t *b, const model_config_t *c, int has_embed, float std)
{
    const int64_t C = c->d_model, V = c->vocab_size, L = c->n_layer;
    CHECK(add_param(b, (int)L, "lnf.w", 1, C, 1, TP_SPLIT_NONE, INIT_ONES, 0));
    if (c->arch == ARCH_GPT2)
        CHECK(add_param(b, (int)L, "lnf.b", 1, C, 1, TP_SPLIT_NONE, INIT_ZEROS, 0));
    if (!model_head_tied(c))
        return add_param(b, (int)L, "lm_head.w", 2, V, C, TP_SPLIT_VOCAB, INIT_NORMAL, std);
    /* the tied head: a copy of the embedding when that is on another stage */
    if (!has_embed) {
        CHECK(add_param(b, (int)L, model_embed_name(c), 2, V, C, TP_SPLIT_VOCAB, INIT_NORMAL, std));
        b->t->p[b->t->n - 1].tied_copy = 1;
    }
    return STATUS_OK;
}

int param_table_build(param_table_t *t, const model_config_t *c, const param_layout_t *lay, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    param_layout_t whole = param_layout_whole(c);
    if (!lay)
        lay = &whole;
    table_builder_t b = {.t = t,
                         .tp_size = lay->tp_size,
                         .tp_rank = lay->tp_rank,
                         .ep_size = lay->ep_size > 1 ? lay->ep_size : 1,
                         .ep_rank = lay->ep_size > 1 ? lay->ep_rank : 0,
                         .ep_spans_tp = lay->etp == 1 && lay->tp_size > 1,
                         .padded_vocab = param_padded_vocab(c->vocab_size, lay->tp_size),
                         .n_layer = c->n_layer,
                         .err = err,
                         .errlen = errlen};
    const float std = 0.02f;
    /* GPT-2's scaled init of the projections that write into the residual
     * stream keeps its variance from growing with depth. */
    const float std_out = 0.02f / sqrtf(2.0f * (float)c->n_layer);
    status_t st = lay->has_embed ? add_embed(&b, c, std) : STATUS_OK;
    for (int r = 0; r < lay->n_runs; r++)
        for (int l = lay->run_begin[r]; l < lay->run_end[r] && st == STATUS_OK; l++)
            st = add_block(&b, c, l, std, std_out);
    if (st == STATUS_OK && lay->has_head)
        st = add_head(&b, c, lay->has_embed, std);
    if (st != STATUS_OK)
        param_table_free(t);
    return st;
}

void param_table_free(param_table_t *t)
{
    free(t->p);
    memset(t, 0, sizeof *t);
}

int param_table_find(const param_table_t *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->p[i].name, name) == 0)
            return i;
    return -1;
}

float param_init_value(const param_desc_t *d, uint64_t seed, int64_t i, int64_t j)
{
    switch (d->init) {
    case INIT_ZEROS: return 0.0f;
    case INIT_ONES: return 1.0f;
    case INIT_NORMAL:
    default: return d->init_std * rng_normal(seed, rng_stream_of(d->name), (uint64_t)(i * d->shape[1] + j));
    }
}

void param_table_init(const param_table_t *t, float *flat, uint64_t seed)
{
    for (int k = 0; k < t->n; k++) {
        const param_desc_t *d = &t->p[k];
        float *dst = flat + d->offset;
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < d->local_rows; r++)
            for (int64_t s = 0; s < d->count[1]; s++)
                dst[r * d->count[1] + s] = r < d->count[0] * d->held
                                               ? param_init_value(d, seed, param_logical_row(d, r), d->start[1] + s)
                                               : 0.0f;
    }
}
