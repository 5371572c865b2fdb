#include "src/convert/hf_config.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "mpi/status.h"

typedef struct cfg_reader {
    json_t *root;
    const char *path; /* for messages: DIR/config.json */
    char *err;
    size_t errlen;
} cfg_reader_t;

/* Errors are one line: what they quote from the file (an architecture
 * name may hold "\n", Jansson's excerpt near a syntax error any control
 * byte) or the path must not break it. */
static void one_line(char *err)
{
    for (; *err; err++)
        if ((unsigned char)*err < 0x20 || *err == 0x7f)
            *err = '?';
}

/* Reading stops at the first failure, the one reported: later fields
 * may only be odd because of it. */
static status_t cfg_fail(cfg_reader_t *r, const char *field, const char *what)
{
    status_set(STATUS_FAIL, r->err, r->errlen, "%s: %s: %s", r->path, field, what);
    one_line(r->err);
    return STATUS_FAIL;
}

/* *out: a positive integer field (def < 0: required). */
static status_t cfg_int(cfg_reader_t *r, const char *key, int def, int *out)
{
    json_t *v = json_object_get(r->root, key);
    *out = def;
    if (!v || json_is_null(v))
        return def < 0 ? cfg_fail(r, key, "missing") : STATUS_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
        return cfg_fail(r, key, "not a positive integer below 2^30");
    *out = (int)json_integer_value(v);
    return STATUS_OK;
}

/* A positive number, kept as a float: one that would round to 0 (an
 * epsilon of 1e-50 would then divide by zero on a zero row) or to inf is
 * refused rather than changed. */
/* *out: a positive number (def when absent), kept as a float: one that
 * would round to 0 (an epsilon of 1e-50 would then divide by zero on a
 * zero row) or to inf is refused rather than changed. */
static status_t cfg_real(cfg_reader_t *r, const char *key, double def, float *out)
{
    json_t *v = json_object_get(r->root, key);
    *out = (float)def;
    if (!v || json_is_null(v))
        return STATUS_OK;
    double x = json_number_value(v);
    if (!json_is_number(v) || !(x > 0) || !isfinite(x))
        return cfg_fail(r, key, "not a positive number");
    if (x < FLT_MIN || x > FLT_MAX)
        return cfg_fail(r, key, "outside a float's range (dtrain keeps it as a float)");
    *out = (float)x;
    return STATUS_OK;
}

/* Fails when the boolean field key is present and equals bad (0 or 1), or
 * is not a boolean; absent or null passes. */
static status_t cfg_refuse_bool(cfg_reader_t *r, const char *key, int bad, const char *why)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return STATUS_OK;
    if (!json_is_boolean(v))
        return cfg_fail(r, key, "not true or false");
    return json_is_true(v) == bad ? cfg_fail(r, key, why) : STATUS_OK;
}

/* *out: a string field (def when absent). */
static status_t cfg_str(cfg_reader_t *r, const char *key, const char *def, const char **out)
{
    json_t *v = json_object_get(r->root, key);
    *out = def;
    if (!v || json_is_null(v))
        return STATUS_OK;
    if (!json_is_string(v))
        return cfg_fail(r, key, "not a string");
    *out = json_string_value(v);
    return STATUS_OK;
}

/* *inner: Hugging Face's default n_inner, 4 * n_embd, which obeys the same
 * bound as a given one: above n_embd 2^28 it would not fit an int (and
 * came out as the negative that cfg_int takes for "required"). */
static status_t gpt2_default_inner(cfg_reader_t *r, int d_model, int *inner)
{
    *inner = d_model <= (1 << 28) ? 4 * d_model : 1; /* 1: unused, n_inner is then given */
    if (d_model <= (1 << 28))
        return STATUS_OK;
    json_t *v = json_object_get(r->root, "n_inner");
    if (!v || json_is_null(v))
        return cfg_fail(r, "n_inner", "missing, and its default 4 * n_embd is not below 2^30");
    return STATUS_OK;
}

static status_t cfg_gpt2(cfg_reader_t *r, model_config_t *c)
{
    c->arch = ARCH_GPT2;
    CHECK(cfg_int(r, "n_embd", -1, &c->d_model));
    CHECK(cfg_int(r, "n_layer", -1, &c->n_layer));
    CHECK(cfg_int(r, "n_head", -1, &c->n_head));
    c->n_kv_head = c->n_head;
    CHECK(cfg_int(r, "vocab_size", -1, &c->vocab_size));
    int n_ctx = -1, inner;
    if (json_object_get(r->root, "n_ctx"))
        CHECK(cfg_int(r, "n_ctx", -1, &n_ctx));
    CHECK(cfg_int(r, "n_positions", n_ctx, &c->max_seq));
    CHECK(gpt2_default_inner(r, c->d_model, &inner));
    CHECK(cfg_int(r, "n_inner", inner, &c->d_ff));
    CHECK(cfg_real(r, "layer_norm_epsilon", 1e-5, &c->norm_eps));
    c->rope_theta = 0;
    const char *act;
    CHECK(cfg_str(r, "activation_function", "gelu_new", &act));
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        return cfg_fail(r, "activation_function",
                        "dtrain's GPT-2 has the tanh GELU only (gelu_new, gelu_pytorch_tanh)");
    CHECK(cfg_refuse_bool(r, "tie_word_embeddings", 0, "false: dtrain's GPT-2 ties the head to wte"));
    CHECK(cfg_refuse_bool(r, "scale_attn_weights", 0, "false: dtrain scales attention by 1/sqrt(head size)"));
    CHECK(cfg_refuse_bool(r, "scale_attn_by_inverse_layer_idx", 1, "true: not implemented in dtrain"));
    return cfg_refuse_bool(r, "add_cross_attention", 1, "true: dtrain has no cross-attention");
}

/* *out: a number field of the rope_scaling object (required), kept as a
 * float like rope_theta; min_exclusive: the bound it must exceed. */
static status_t scaling_real(cfg_reader_t *r, json_t *rs, const char *key, double min_exclusive, float *out)
{
    json_t *v = json_object_get(rs, key);
    char field[64];
    snprintf(field, sizeof field, "rope_scaling.%s", key);
    if (!v || !json_is_number(v))
        return cfg_fail(r, field, "missing, or not a number");
    double x = json_number_value(v);
    if (!(x > min_exclusive) || !isfinite(x) || x > FLT_MAX)
        return cfg_fail(r, field, min_exclusive > 0 ? "must exceed low_freq_factor" : "not a positive number");
    *out = (float)x;
    return STATUS_OK;
}

/* rope_scaling: null, or {rope_type (older files: type): linear | llama3,
 * factor, and for llama3 low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}. The other types change more than the
 * frequencies (attention scaling, per-length tables) and are refused. */
static status_t cfg_rope_scaling(cfg_reader_t *r, model_config_t *c)
{
    json_t *rs = json_object_get(r->root, "rope_scaling");
    if (!rs || json_is_null(rs))
        return STATUS_OK;
    if (!json_is_object(rs))
        return cfg_fail(r, "rope_scaling", "not an object or null");
    json_t *ty = json_object_get(rs, "rope_type");
    if (!ty || json_is_null(ty))
        ty = json_object_get(rs, "type");
    const char *name = json_string_value(ty);
    if (!name)
        return cfg_fail(r, "rope_scaling.rope_type", "missing, or not a string");
    if (strcmp(name, "default") == 0)
        return STATUS_OK;
    const int kind = model_rope_scaling_of(name);
    if (kind != ROPE_SCALING_LINEAR && kind != ROPE_SCALING_LLAMA3) {
        char what[160];
        snprintf(what, sizeof what,
                 "'%.40s': dtrain implements llama3 and linear scaling only (not dynamic, yarn, longrope)", name);
        return cfg_fail(r, "rope_scaling.rope_type", what);
    }
    c->rope_scaling = (rope_scaling_t)kind;
    CHECK(scaling_real(r, rs, "factor", 0, &c->rope_factor));
    if (kind != ROPE_SCALING_LLAMA3)
        return STATUS_OK;
    CHECK(scaling_real(r, rs, "low_freq_factor", 0, &c->rope_low_freq_factor));
    CHECK(scaling_real(r, rs, "high_freq_factor", (double)c->rope_low_freq_factor, &c->rope_high_freq_factor));
    json_t *om = json_object_get(rs, "original_max_position_embeddings");
    if (!om || !json_is_integer(om) || json_integer_value(om) < 1 || json_integer_value(om) > (1 << 30))
        return cfg_fail(r, "rope_scaling.original_max_position_embeddings", "missing, or not a positive integer");
    c->rope_original_max_seq = (int)json_integer_value(om);
    return STATUS_OK;
}

/* head_dim: absent, d_model / n_head, or (Qwen3) a head size of its own,
 * which must be even for RoPE's pairs. */
static status_t cfg_head_dim(cfg_reader_t *r, model_config_t *c)
{
    json_t *hd = json_object_get(r->root, "head_dim");
    if (!hd || json_is_null(hd))
        return STATUS_OK;
    if (!json_is_integer(hd) || json_integer_value(hd) < 2 || json_integer_value(hd) > (1 << 20) ||
        json_integer_value(hd) % 2 != 0)
        return cfg_fail(r, "head_dim", "not an even integer in [2, 2^20]");
    const int h = (int)json_integer_value(hd);
    if (c->d_model % c->n_head != 0 || h != c->d_model / c->n_head)
        c->head_dim = h;
    return STATUS_OK;
}

/* *out: a boolean field (def when absent or null). */
static status_t cfg_bool(cfg_reader_t *r, const char *key, int def, int *out)
{
    json_t *v = json_object_get(r->root, key);
    *out = def;
    if (!v || json_is_null(v))
        return STATUS_OK;
    if (!json_is_boolean(v))
        return cfg_fail(r, key, "not true or false");
    *out = json_is_true(v);
    return STATUS_OK;
}

/* A number field that must be absent, null or 0 (a training-time option
 * dtrain does not implement, such as Mixtral's router_jitter_noise). */
static status_t cfg_zero(cfg_reader_t *r, const char *key, const char *why)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return STATUS_OK;
    if (!json_is_number(v))
        return cfg_fail(r, key, "not a number");
    return json_number_value(v) != 0 ? cfg_fail(r, key, why) : STATUS_OK;
}

/* MixtralForCausalLM (transformers' MixtralConfig defaults): every layer
 * a MoE layer of num_local_experts experts as wide as intermediate_size,
 * num_experts_per_tok per token, softmax scores renormalised over them. */
static status_t cfg_mixtral(cfg_reader_t *r, model_config_t *c)
{
    moe_config_t *e = &c->moe;
    CHECK(cfg_int(r, "num_local_experts", 8, &e->experts));
    CHECK(cfg_int(r, "num_experts_per_tok", 2, &e->top_k));
    CHECK(cfg_zero(r, "router_jitter_noise", "nonzero: dtrain's router adds no noise to its logits"));
    e->ffn = c->d_ff;
    e->every = 1;
    e->router = MOE_ROUTER_SOFTMAX;
    e->norm_topk = 1;
    return STATUS_OK;
}

/* Qwen2-MoE's MoE layers: l is one when (l + 1) % decoder_sparse_step ==
 * 0 and l is not in mlp_only_layers (modeling_qwen2_moe); dtrain's are
 * every `every`-th from first_dense. The one pair that gives the same
 * set, or a refusal. */
static status_t qwen_moe_layers(cfg_reader_t *r, model_config_t *c)
{
    int step;
    CHECK(cfg_int(r, "decoder_sparse_step", 1, &step));
    json_t *only = json_object_get(r->root, "mlp_only_layers");
    if (only && !json_is_null(only) && !json_is_array(only))
        return cfg_fail(r, "mlp_only_layers", "not a list of layer indices");
    const int L = c->n_layer;
    int first = -1, second = -1;
    for (int pass = 0; pass < 2; pass++) /* pass 0 finds the first two MoE layers, pass 1 checks the pattern */
        for (int l = 0; l < L; l++) {
            int sparse = (l + 1) % step == 0;
            for (size_t k = 0; only && json_is_array(only) && k < json_array_size(only); k++) {
                json_t *v = json_array_get(only, k);
                if (!json_is_integer(v))
                    return cfg_fail(r, "mlp_only_layers", "not a list of layer indices");
                sparse = sparse && json_integer_value(v) != l;
            }
            if (pass == 0 && sparse && first < 0)
                first = l;
            else if (pass == 0 && sparse && second < 0)
                second = l;
            const int every = second > 0 ? second - first : L;
            if (pass == 1 && sparse != (first >= 0 && l >= first && (l - first) % every == 0))
                return cfg_fail(r, "mlp_only_layers",
                                "with decoder_sparse_step, its MoE layers are not every N-th layer from a first one, "
                                "the only pattern dtrain has (--moe-every, --moe-first-dense)");
        }
    if (first < 0)
        return cfg_fail(r, "mlp_only_layers", "with decoder_sparse_step, no layer is a MoE layer");
    c->moe.first_dense = first;
    c->moe.every = second > 0 ? second - first : L;
    return STATUS_OK;
}

/* Qwen2MoeForCausalLM (transformers' Qwen2MoeConfig defaults): Qwen2's
 * attention, MoE layers of num_experts experts of moe_intermediate_size,
 * softmax scores renormalised only with norm_topk_prob, a shared expert
 * of shared_expert_intermediate_size under its sigmoid gate; the other
 * layers dense MLPs of intermediate_size. */
static status_t cfg_qwen2_moe(cfg_reader_t *r, model_config_t *c)
{
    moe_config_t *e = &c->moe;
    CHECK(cfg_int(r, "num_experts", 60, &e->experts));
    CHECK(cfg_int(r, "num_experts_per_tok", 4, &e->top_k));
    CHECK(cfg_int(r, "moe_intermediate_size", 1408, &e->ffn));
    CHECK(cfg_int(r, "shared_expert_intermediate_size", 5632, &e->shared_ffn));
    CHECK(cfg_bool(r, "norm_topk_prob", 0, &e->norm_topk));
    e->router = MOE_ROUTER_SOFTMAX;
    e->shared_gate = 1;
    return qwen_moe_layers(r, c);
}

/* Llama-shaped configs: Llama (2, 3, 3.1: rope_scaling), Mistral, Qwen2
 * (q/k/v biases), Qwen3 (per-head q/k norms), and the mixtures Mixtral
 * (Mistral's attention) and Qwen2-MoE (Qwen2's). */
static status_t cfg_llama(cfg_reader_t *r, model_config_t *c, const char *arch)
{
    const int qwen2_moe = strcmp(arch, "Qwen2MoeForCausalLM") == 0, mixtral = strcmp(arch, "MixtralForCausalLM") == 0;
    const int qwen2 = strcmp(arch, "Qwen2ForCausalLM") == 0 || qwen2_moe, qwen3 = strcmp(arch, "Qwen3ForCausalLM") == 0;
    c->arch = ARCH_LLAMA;
    CHECK(cfg_int(r, "hidden_size", -1, &c->d_model));
    CHECK(cfg_int(r, "intermediate_size", -1, &c->d_ff));
    CHECK(cfg_int(r, "num_hidden_layers", -1, &c->n_layer));
    CHECK(cfg_int(r, "num_attention_heads", -1, &c->n_head));
    CHECK(cfg_int(r, "num_key_value_heads", c->n_head, &c->n_kv_head));
    CHECK(cfg_int(r, "vocab_size", -1, &c->vocab_size));
    CHECK(cfg_int(r, "max_position_embeddings", 2048, &c->max_seq));
    CHECK(cfg_real(r, "rms_norm_eps", 1e-6, &c->norm_eps));
    CHECK(cfg_real(r, "rope_theta", 10000.0, &c->rope_theta));
    const char *act;
    CHECK(cfg_str(r, "hidden_act", "silu", &act));
    if (strcmp(act, "silu") != 0)
        return cfg_fail(r, "hidden_act", "dtrain's Llama MLP is SwiGLU with silu only");
    CHECK(cfg_rope_scaling(r, c));
    /* tied (the small Llama 3.2 and Qwen models): the head is tok_emb */
    json_t *tie = json_object_get(r->root, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie))
        return cfg_fail(r, "tie_word_embeddings", "not true or false");
    c->tie_embed = json_is_true(tie);
    /* Llama's and Qwen3's attention_bias also biases o_proj; Qwen2's q, k
     * and v always have biases and o never */
    CHECK(cfg_refuse_bool(r, "attention_bias", 1,
                          "true: it biases o_proj as well, and dtrain's Llama has q/k/v biases only (Qwen2's)"));
    c->attn_bias = qwen2;
    c->qk_norm = qwen3;
    if (mixtral)
        CHECK(cfg_mixtral(r, c));
    if (qwen2_moe)
        CHECK(cfg_qwen2_moe(r, c));
    CHECK(cfg_refuse_bool(r, "mlp_bias", 1, "true: dtrain's Llama MLP has no biases"));
    CHECK(cfg_head_dim(r, c));
    /* Qwen's sliding_window applies only with use_sliding_window true */
    json_t *use_sw = json_object_get(r->root, "use_sliding_window");
    json_t *sw = json_object_get(r->root, "sliding_window");
    if ((qwen2 || qwen3) && use_sw && !json_is_null(use_sw) && !json_is_boolean(use_sw))
        return cfg_fail(r, "use_sliding_window", "not true or false");
    if ((qwen2 || qwen3) && !json_is_true(use_sw))
        sw = NULL;
    if (sw && !json_is_null(sw) && !json_is_integer(sw))
        return cfg_fail(r, "sliding_window", "not an integer or null");
    /* a window as long as the context never slides; a shorter one would,
     * and the model dtrain trains and exports would be another */
    if (sw && json_is_integer(sw) && json_integer_value(sw) < c->max_seq) {
        char what[256];
        snprintf(what, sizeof what,
                 "%lld%s, shorter than max_position_embeddings (%d): sliding-window attention, which dtrain does "
                 "not implement (it attends to the whole sequence): use a model without it",
                 (long long)json_integer_value(sw), qwen2 || qwen3 ? " with use_sliding_window true" : "",
                 c->max_seq);
        return cfg_fail(r, "sliding_window", what);
    }
    return STATUS_OK;
}

/* The model of a parsed config.json; root may be any JSON value. */
static int config_of_json(json_t *root, const char *path, model_config_t *c, char *err, size_t errlen)
{
    cfg_reader_t r = {.root = root, .path = path, .err = err, .errlen = errlen};
    memset(c, 0, sizeof *c);
    if (!json_is_object(root))
        return cfg_fail(&r, "(top level)", "not a JSON object");
    json_t *archs = json_object_get(root, "architectures");
    const char *arch =
        json_is_array(archs) && json_array_size(archs) == 1 ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (!arch)
        return cfg_fail(&r, "architectures", "missing, or not a list of one name");
    if (strcmp(arch, "GPT2LMHeadModel") == 0 || strcmp(arch, "GPT2Model") == 0) {
        CHECK(cfg_gpt2(&r, c));
    } else if (strcmp(arch, "LlamaForCausalLM") == 0 || strcmp(arch, "MistralForCausalLM") == 0 ||
               strcmp(arch, "Qwen2ForCausalLM") == 0 || strcmp(arch, "Qwen3ForCausalLM") == 0 ||
               strcmp(arch, "MixtralForCausalLM") == 0 || strcmp(arch, "Qwen2MoeForCausalLM") == 0) {
        CHECK(cfg_llama(&r, c, arch));
    } else {
        char what[160];
        snprintf(what, sizeof what,
                 "'%s': dtrain imports GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
                 "Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM and Qwen2MoeForCausalLM",
                 arch);
        return cfg_fail(&r, "architectures", what);
    }
    char why[512];
    if (model_config_check(c, why, sizeof why) != 0)
        return cfg_fail(&r, "(model)", why);
    return STATUS_OK;
}

/* Jansson's error for text that is not JSON (je: from a json_load*). */
static int not_json(const json_error_t *je, const char *path, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s (line %d)", path, je->text, je->line);
    one_line(err);
    return -1;
}

int hf_config_parse(const char *json, size_t len, const char *path, model_config_t *c, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return not_json(&je, path, err, errlen);
    int rc = config_of_json(root, path, c, err, errlen);
    json_decref(root);
    return rc;
}

/* Jansson reads the file itself (rather than hf_config_parse on its bytes)
 * so that an unreadable config.json keeps the message users have seen; past
 * the reading it is the code the fuzzer runs. */
int hf_config_read(const char *dir, model_config_t *c, char *err, size_t errlen)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return not_json(&je, path, err, errlen);
    int rc = config_of_json(root, path, c, err, errlen);
    json_decref(root);
    return rc;
}
