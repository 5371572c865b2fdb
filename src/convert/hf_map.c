#include "src/convert/hf_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/llmc_model.h"
#include "mpi/status.h"

typedef struct map_builder {
    hf_map_t *m;
    int n, cap;
} map_builder_t;

/* A new zeroed entry, or NULL when out of memory. */
static hf_map_t *push(map_builder_t *b)
{
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        hf_map_t *nm = realloc(b->m, (size_t)cap * sizeof *nm);
        if (!nm)
            return NULL;
        b->m = nm;
        b->cap = cap;
    }
    hf_map_t *e = &b->m[b->n++];
    memset(e, 0, sizeof *e);
    e->llmc_id = -1;
    return e;
}

/* dtrain tensor name [d0, d1] (d1 = 0: 1-D) from source src [s0, s1]
 * (s1 = 0: 1-D) at row offset off; *out (when out is not NULL): the new
 * entry. STATUS_FAIL when out of memory (hf_map_build says so). */
static status_t add(map_builder_t *b, const char *name, int64_t d0, int64_t d1, const char *src, int64_t s0, int64_t s1,
                    int64_t off, unsigned flags, hf_map_t **out)
{
    hf_map_t *e = push(b);
    if (!e)
        return STATUS_FAIL;
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->src, sizeof e->src, "%s", src);
    e->ndim = d1 ? 2 : 1;
    e->shape[0] = d0;
    e->shape[1] = d1 ? d1 : 1;
    e->src_ndim = s1 ? 2 : 1;
    e->src_shape[0] = s0;
    e->src_shape[1] = s1 ? s1 : 1;
    e->off = off;
    e->flags = flags;
    e->row0 = 0;
    e->nrows = e->shape[0];
    if (out)
        *out = e;
    return STATUS_OK;
}

/* Hugging Face GPT2LMHeadModel: Conv1D weights [in, out], fused c_attn. */
static status_t map_gpt2_hf(map_builder_t *b, const model_config_t *c, const char *p)
{
    const int64_t C = c->d_model, F = c->d_ff, V = c->vocab_size;
    char d[PARAM_NAME_MAX], s[HF_SRC_NAME_MAX];
#define SRC(fmt, ...) (snprintf(s, sizeof s, "%s" fmt, p, __VA_ARGS__), s)
#define DST(fmt, ...) (snprintf(d, sizeof d, fmt, __VA_ARGS__), d)
    CHECK(add(b, "wte", V, C, SRC("%s", "wte.weight"), V, C, 0, HF_MAP_VOCAB, NULL));
    CHECK(add(b, "wpe", c->max_seq, C, SRC("%s", "wpe.weight"), c->max_seq, C, 0, 0, NULL));
    for (int l = 0; l < c->n_layer; l++) {
        CHECK(add(b, DST("h.%d.ln1.w", l), C, 0, SRC("h.%d.ln_1.weight", l), C, 0, 0, 0, NULL));
        CHECK(add(b, DST("h.%d.ln1.b", l), C, 0, SRC("h.%d.ln_1.bias", l), C, 0, 0, 0, NULL));
        static const char qkv[] = "qkv";
        for (int k = 0; k < 3; k++)
            CHECK(add(b, DST("h.%d.attn.w%c", l, qkv[k]), C, C, SRC("h.%d.attn.c_attn.weight", l), C, 3 * C, k * C,
                      HF_MAP_TRANSPOSE, NULL));
        for (int k = 0; k < 3; k++)
            CHECK(add(b, DST("h.%d.attn.b%c", l, qkv[k]), C, 0, SRC("h.%d.attn.c_attn.bias", l), 3 * C, 0, k * C, 0,
                      NULL));
        CHECK(add(b, DST("h.%d.attn.wo", l), C, C, SRC("h.%d.attn.c_proj.weight", l), C, C, 0, HF_MAP_TRANSPOSE, NULL));
        CHECK(add(b, DST("h.%d.attn.bo", l), C, 0, SRC("h.%d.attn.c_proj.bias", l), C, 0, 0, 0, NULL));
        CHECK(add(b, DST("h.%d.ln2.w", l), C, 0, SRC("h.%d.ln_2.weight", l), C, 0, 0, 0, NULL));
        CHECK(add(b, DST("h.%d.ln2.b", l), C, 0, SRC("h.%d.ln_2.bias", l), C, 0, 0, 0, NULL));
        CHECK(add(b, DST("h.%d.mlp.wfc", l), F, C, SRC("h.%d.mlp.c_fc.weight", l), C, F, 0, HF_MAP_TRANSPOSE, NULL));
        CHECK(add(b, DST("h.%d.mlp.bfc", l), F, 0, SRC("h.%d.mlp.c_fc.bias", l), F, 0, 0, 0, NULL));
        CHECK(
            add(b, DST("h.%d.mlp.wproj", l), C, F, SRC("h.%d.mlp.c_proj.weight", l), F, C, 0, HF_MAP_TRANSPOSE, NULL));
        CHECK(add(b, DST("h.%d.mlp.bproj", l), C, 0, SRC("h.%d.mlp.c_proj.bias", l), C, 0, 0, 0, NULL));
    }
    CHECK(add(b, "lnf.w", C, 0, SRC("%s", "ln_f.weight"), C, 0, 0, 0, NULL));
    CHECK(add(b, "lnf.b", C, 0, SRC("%s", "ln_f.bias"), C, 0, 0, 0, NULL));
    return STATUS_OK;
}

int hf_moe_family(const model_config_t *c, char *err, size_t errlen)
{
    const moe_config_t *e = &c->moe;
    const char *why = NULL;
    if (!e->experts)
        return HF_MOE_NONE;
    if (c->arch != ARCH_LLAMA)
        why = "Hugging Face has no GPT-2 mixture of experts (dtrain's Llama-style ones are MixtralForCausalLM or "
              "Qwen2MoeForCausalLM)";
    else if (e->router != MOE_ROUTER_SOFTMAX)
        why = "its sigmoid router (DeepSeek-V3's) is neither MixtralForCausalLM's nor Qwen2MoeForCausalLM's "
              "(softmax)";
    else if (c->qk_norm || c->head_dim)
        why = "q/k norms or a head_dim of its own: MixtralForCausalLM and Qwen2MoeForCausalLM have neither";
    else if (e->shared_ffn && !e->shared_gate)
        why = "a shared expert without --moe-shared-gate: Qwen2MoeForCausalLM's shared expert always has its "
              "sigmoid gate";
    else if (e->shared_ffn && !c->attn_bias)
        why = "a shared expert without q/k/v biases: Qwen2MoeForCausalLM has the biases";
    else if (!e->shared_ffn && c->attn_bias)
        why = "q/k/v biases without a shared expert: MixtralForCausalLM has no biases, Qwen2MoeForCausalLM has a "
              "gated shared expert";
    else if (!e->shared_ffn && !e->norm_topk)
        why = "top-k scores not renormalised without a shared expert: MixtralForCausalLM renormalises, "
              "Qwen2MoeForCausalLM has a gated shared expert";
    else if (!e->shared_ffn && model_moe_layers(c) != c->n_layer)
        why = "dense layers without a shared expert: every MixtralForCausalLM layer is a MoE layer, "
              "Qwen2MoeForCausalLM has a gated shared expert";
    if (why) {
        snprintf(err, errlen, "this mixture of experts has no Hugging Face architecture dtrain maps: %s", why);
        return -1;
    }
    return e->shared_ffn ? HF_MOE_QWEN2 : HF_MOE_MIXTRAL;
}

/* One expert's matrix of a dtrain stack: rows [row0, row0 + n) of
 * dtrain's name [d0, d1] from source src [n, d1]. */
static status_t add_piece(map_builder_t *b, const char *name, int64_t d0, int64_t d1, const char *src, int64_t row0,
                          int64_t n)
{
    hf_map_t *e;
    CHECK(add(b, name, d0, d1, src, n, d1, 0, 0, &e));
    e->row0 = row0;
    e->nrows = n;
    return STATUS_OK;
}

/* MoE layer l of MixtralForCausalLM or Qwen2MoeForCausalLM (hf_map.h's
 * table): the router, each expert's gate, up and down projections, and
 * Qwen2-MoE's shared expert and its gate. */
static status_t map_moe_layer(map_builder_t *b, const model_config_t *c, int l)
{
    const int64_t C = c->d_model, E = c->moe.experts, F = c->moe.ffn, FS = c->moe.shared_ffn;
    const int qwen = FS > 0;
    const char *blk = qwen ? "mlp" : "block_sparse_moe";
    static const char *const proj[2][3] = {{"w1", "w3", "w2"}, {"gate_proj", "up_proj", "down_proj"}};
    char d[PARAM_NAME_MAX], s[HF_SRC_NAME_MAX];
#define MSRC(fmt, ...) (snprintf(s, sizeof s, "model.layers.%d.%s." fmt, l, blk, __VA_ARGS__), s)
#define MDST(what) (snprintf(d, sizeof d, "h.%d.%s", l, what), d)
    CHECK(add(b, MDST("moe.router"), E, C, MSRC("%s", "gate.weight"), E, C, 0, 0, NULL));
    for (int64_t x = 0; x < E; x++) {
        CHECK(add_piece(b, MDST("moe.wfc"), E * 2 * F, C, MSRC("experts.%lld.%s.weight", (long long)x, proj[qwen][0]),
                        x * 2 * F, F));
        CHECK(add_piece(b, MDST("moe.wfc"), E * 2 * F, C, MSRC("experts.%lld.%s.weight", (long long)x, proj[qwen][1]),
                        x * 2 * F + F, F));
        CHECK(add_piece(b, MDST("moe.wproj"), E * C, F, MSRC("experts.%lld.%s.weight", (long long)x, proj[qwen][2]),
                        x * C, C));
    }
    if (!qwen)
        return STATUS_OK;
    CHECK(add(b, MDST("mlp.wgate"), FS, C, MSRC("%s", "shared_expert.gate_proj.weight"), FS, C, 0, 0, NULL));
    CHECK(add(b, MDST("mlp.wup"), FS, C, MSRC("%s", "shared_expert.up_proj.weight"), FS, C, 0, 0, NULL));
    CHECK(add(b, MDST("mlp.wproj"), C, FS, MSRC("%s", "shared_expert.down_proj.weight"), C, FS, 0, 0, NULL));
    CHECK(add(b, MDST("moe.shared_gate"), 1, C, MSRC("%s", "shared_expert_gate.weight"), 1, C, 0, 0, NULL));
#undef MSRC
#undef MDST
    return STATUS_OK;
}

/* Hugging Face LlamaForCausalLM: nn.Linear [out, in], rotate-half q/k rows. */
static status_t map_llama_hf(map_builder_t *b, const model_config_t *c)
{
    const int64_t C = c->d_model, F = c->d_ff, V = c->vocab_size, HS = model_head_size(c);
    const int64_t QD = c->n_head * HS, KVD = c->n_kv_head * HS;
    char d[PARAM_NAME_MAX], s[HF_SRC_NAME_MAX];
    const char *p = "model.";
    CHECK(add(b, "tok_emb", V, C, SRC("%s", "embed_tokens.weight"), V, C, 0, HF_MAP_VOCAB, NULL));
    for (int l = 0; l < c->n_layer; l++) {
        CHECK(add(b, DST("h.%d.ln1.w", l), C, 0, SRC("layers.%d.input_layernorm.weight", l), C, 0, 0, 0, NULL));
        /* each entry is set before the next add, whose realloc may move it */
        hf_map_t *e;
        CHECK(add(b, DST("h.%d.attn.wq", l), QD, C, SRC("layers.%d.self_attn.q_proj.weight", l), QD, C, 0, HF_MAP_ROPE,
                  &e));
        e->head_size = (int)HS;
        CHECK(add(b, DST("h.%d.attn.wk", l), KVD, C, SRC("layers.%d.self_attn.k_proj.weight", l), KVD, C, 0,
                  HF_MAP_ROPE, &e));
        e->head_size = (int)HS;
        CHECK(add(b, DST("h.%d.attn.wv", l), KVD, C, SRC("layers.%d.self_attn.v_proj.weight", l), KVD, C, 0, 0, NULL));
        /* Qwen2's biases and Qwen3's norm weights are indexed by the
         * rows (head elements) RoPE pairs up: they move with them */
        if (c->attn_bias) {
            CHECK(add(b, DST("h.%d.attn.bq", l), QD, 0, SRC("layers.%d.self_attn.q_proj.bias", l), QD, 0, 0,
                      HF_MAP_ROPE, &e));
            e->head_size = (int)HS;
            CHECK(add(b, DST("h.%d.attn.bk", l), KVD, 0, SRC("layers.%d.self_attn.k_proj.bias", l), KVD, 0, 0,
                      HF_MAP_ROPE, &e));
            e->head_size = (int)HS;
            CHECK(
                add(b, DST("h.%d.attn.bv", l), KVD, 0, SRC("layers.%d.self_attn.v_proj.bias", l), KVD, 0, 0, 0, NULL));
        }
        if (c->qk_norm) {
            CHECK(add(b, DST("h.%d.attn.qnorm", l), HS, 0, SRC("layers.%d.self_attn.q_norm.weight", l), HS, 0, 0,
                      HF_MAP_ROPE, &e));
            e->head_size = (int)HS;
            CHECK(add(b, DST("h.%d.attn.knorm", l), HS, 0, SRC("layers.%d.self_attn.k_norm.weight", l), HS, 0, 0,
                      HF_MAP_ROPE, &e));
            e->head_size = (int)HS;
        }
        CHECK(add(b, DST("h.%d.attn.wo", l), C, QD, SRC("layers.%d.self_attn.o_proj.weight", l), C, QD, 0, 0, NULL));
        CHECK(
            add(b, DST("h.%d.ln2.w", l), C, 0, SRC("layers.%d.post_attention_layernorm.weight", l), C, 0, 0, 0, NULL));
        if (model_layer_moe(c, l)) {
            CHECK(map_moe_layer(b, c, l));
            continue;
        }
        CHECK(add(b, DST("h.%d.mlp.wgate", l), F, C, SRC("layers.%d.mlp.gate_proj.weight", l), F, C, 0, 0, NULL));
        CHECK(add(b, DST("h.%d.mlp.wup", l), F, C, SRC("layers.%d.mlp.up_proj.weight", l), F, C, 0, 0, NULL));
        CHECK(add(b, DST("h.%d.mlp.wproj", l), C, F, SRC("layers.%d.mlp.down_proj.weight", l), C, F, 0, 0, NULL));
    }
    CHECK(add(b, "lnf.w", C, 0, SRC("%s", "norm.weight"), C, 0, 0, 0, NULL));
    if (!c->tie_embed) /* tied: the head is tok_emb, and lm_head.weight, if stored, must equal it */
        CHECK(add(b, "lm_head.w", V, C, "lm_head.weight", V, C, 0, HF_MAP_VOCAB, NULL));
#undef SRC
#undef DST
    return STATUS_OK;
}

/* One llm.c entry: tensor id, layer l of it. */
static status_t add_llmc(map_builder_t *b, const char *name, int64_t d0, int64_t d1, int id, int l, int64_t s0,
                         int64_t s1, int64_t off, unsigned flags)
{
    hf_map_t *e;
    CHECK(add(b, name, d0, d1, llmc_tensor_name((llmc_tensor_t)id), s0, s1, off, flags, &e));
    e->llmc_id = id;
    e->layer = l;
    return STATUS_OK;
}

/* llm.c: [out, in] like dtrain, layer-stacked, fused qkv rows, Vp rows of wte. */
static status_t map_llmc(map_builder_t *b, const model_config_t *c)
{
    const int64_t C = c->d_model, F = c->d_ff, V = c->vocab_size, Vp = (V + 127) / 128 * 128;
    char d[PARAM_NAME_MAX];
    CHECK(add_llmc(b, "wte", V, C, LLMC_WTE, 0, Vp, C, 0, HF_MAP_VOCAB));
    CHECK(add_llmc(b, "wpe", c->max_seq, C, LLMC_WPE, 0, c->max_seq, C, 0, 0));
    for (int l = 0; l < c->n_layer; l++) {
        static const char qkv[] = "qkv";
#define D(fmt) (snprintf(d, sizeof d, "h.%d." fmt, l), d)
        CHECK(add_llmc(b, D("ln1.w"), C, 0, LLMC_LN1W, l, C, 0, 0, 0));
        CHECK(add_llmc(b, D("ln1.b"), C, 0, LLMC_LN1B, l, C, 0, 0, 0));
        for (int k = 0; k < 3; k++) {
            snprintf(d, sizeof d, "h.%d.attn.w%c", l, qkv[k]);
            CHECK(add_llmc(b, d, C, C, LLMC_QKVW, l, 3 * C, C, k * C, 0));
        }
        for (int k = 0; k < 3; k++) {
            snprintf(d, sizeof d, "h.%d.attn.b%c", l, qkv[k]);
            CHECK(add_llmc(b, d, C, 0, LLMC_QKVB, l, 3 * C, 0, k * C, 0));
        }
        CHECK(add_llmc(b, D("attn.wo"), C, C, LLMC_ATTPROJW, l, C, C, 0, 0));
        CHECK(add_llmc(b, D("attn.bo"), C, 0, LLMC_ATTPROJB, l, C, 0, 0, 0));
        CHECK(add_llmc(b, D("ln2.w"), C, 0, LLMC_LN2W, l, C, 0, 0, 0));
        CHECK(add_llmc(b, D("ln2.b"), C, 0, LLMC_LN2B, l, C, 0, 0, 0));
        CHECK(add_llmc(b, D("mlp.wfc"), F, C, LLMC_FCW, l, F, C, 0, 0));
        CHECK(add_llmc(b, D("mlp.bfc"), F, 0, LLMC_FCB, l, F, 0, 0, 0));
        CHECK(add_llmc(b, D("mlp.wproj"), C, F, LLMC_FCPROJW, l, C, F, 0, 0));
        CHECK(add_llmc(b, D("mlp.bproj"), C, 0, LLMC_FCPROJB, l, C, 0, 0, 0));
#undef D
    }
    CHECK(add_llmc(b, "lnf.w", C, 0, LLMC_LNFW, 0, C, 0, 0, 0));
    CHECK(add_llmc(b, "lnf.b", C, 0, LLMC_LNFB, 0, C, 0, 0, 0));
    return STATUS_OK;
}

int hf_map_build(const model_config_t *c, hf_format_t fmt, const char *prefix, hf_map_t **out, int *n_out, char *err,
                 size_t errlen)
{
    map_builder_t b = {0};
    *out = NULL;
    *n_out = 0;
    if (fmt == HF_FMT_LLMC && (c->arch != ARCH_GPT2 || c->d_ff != 4 * c->d_model || c->moe.experts)) {
        snprintf(err, errlen,
                 "llm.c model files hold GPT-2 models with d_ff = 4 d_model only, and no experts (this is %s, d_ff "
                 "%d%s)",
                 model_arch_name(c->arch), c->d_ff, c->moe.experts ? ", a mixture of experts" : "");
        return -1;
    }
    if (fmt == HF_FMT_HF && hf_moe_family(c, err, errlen) < 0)
        return -1;
    const status_t st = fmt == HF_FMT_LLMC     ? map_llmc(&b, c)
                        : c->arch == ARCH_GPT2 ? map_gpt2_hf(&b, c, prefix ? prefix : "")
                                               : map_llama_hf(&b, c);
    if (st != STATUS_OK) {
        free(b.m);
        snprintf(err, errlen, "out of memory building the tensor map");
        return -1;
    }
    *out = b.m;
    *n_out = b.n;
    return 0;
}

const hf_map_t *hf_map_find(const hf_map_t *m, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(m[i].name, name) == 0)
            return &m[i];
    return NULL;
}

void hf_map_src_block(const hf_map_t *e, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int64_t *sr0, int64_t *snr,
                      int64_t *sc0, int64_t *snc, int *transpose)
{
    r0 -= e->row0; /* the entry's own rows */
    if (e->ndim == 1) { /* a row vector: dtrain element i is column off + i */
        *sr0 = 0;
        *snr = 1;
        *sc0 = e->off + r0;
        *snc = nr;
        *transpose = 0;
        return;
    }
    /* st_read_f32's transpose takes the block in the transposed tensor's
     * coordinates, which are dtrain's */
    *sr0 = e->off + r0;
    *snr = nr;
    *sc0 = c0;
    *snc = nc;
    *transpose = (e->flags & HF_MAP_TRANSPOSE) != 0;
}

/* rows[nr][cols], whole heads of hs rows: row `to(k)` of each head gets old row k. */
static void rope_permute(float *rows, int64_t nr, int64_t cols, int64_t hs, float *tmp, int to_dtrain)
{
    const size_t rb = (size_t)cols * sizeof *rows;
    for (int64_t h0 = 0; h0 + hs <= nr; h0 += hs) {
        float *head = rows + h0 * cols;
        memcpy(tmp, head, (size_t)hs * rb);
        for (int64_t k = 0; k < hs; k++) {
            const int64_t to = to_dtrain ? hf_rope_dtrain_row(k, hs) : hf_rope_src_row(k, hs);
            memcpy(head + to * cols, tmp + k * cols, rb);
        }
    }
}

void hf_rope_to_dtrain(float *rows, int64_t nr, int64_t cols, int64_t hs, float *tmp)
{
    rope_permute(rows, nr, cols, hs, tmp, 1);
}

void hf_rope_to_hf(float *rows, int64_t nr, int64_t cols, int64_t hs, float *tmp)
{
    rope_permute(rows, nr, cols, hs, tmp, 0);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int hf_map_ignorable(const char *src_name)
{
    return ends_with(src_name, ".attn.bias") || ends_with(src_name, ".attn.masked_bias") ||
           ends_with(src_name, ".rotary_emb.inv_freq");
}
