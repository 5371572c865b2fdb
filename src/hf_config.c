#include "src/hf_config.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "src/options.h"

typedef struct cfg_reader {
    json_t *root;
    const char *path; /* for messages: DIR/config.json */
    char *err;
    size_t errlen;
    int failed;
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

/* The first failure is the one reported: later fields may only be odd
 * because of it. */
static void cfg_fail(cfg_reader_t *r, const char *field, const char *what)
{
    if (!r->failed) {
        snprintf(r->err, r->errlen, "%s: %s: %s", r->path, field, what);
        one_line(r->err);
    }
    r->failed = 1;
}

/* A positive integer field (def < 0: required). */
static int cfg_int(cfg_reader_t *r, const char *key, int def)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) {
        if (def < 0)
            cfg_fail(r, key, "missing");
        return def < 0 ? 1 : def;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30)) {
        cfg_fail(r, key, "not a positive integer below 2^30");
        return 1;
    }
    return (int)json_integer_value(v);
}

/* A positive number, kept as a float: one that would round to 0 (an
 * epsilon of 1e-50 would then divide by zero on a zero row) or to inf is
 * refused rather than changed. */
static float cfg_real(cfg_reader_t *r, const char *key, double def)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return (float)def;
    double x = json_number_value(v);
    if (!json_is_number(v) || !(x > 0) || !isfinite(x)) {
        cfg_fail(r, key, "not a positive number");
        return (float)def;
    }
    if (x < FLT_MIN || x > FLT_MAX) {
        cfg_fail(r, key, "outside a float's range (dtrain keeps it as a float)");
        return (float)def;
    }
    return (float)x;
}

/* -1 absent/null, else 0/1; anything else fails */
static int cfg_bool(cfg_reader_t *r, const char *key)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return -1;
    if (!json_is_boolean(v)) {
        cfg_fail(r, key, "not true or false");
        return -1;
    }
    return json_is_true(v);
}

static const char *cfg_str(cfg_reader_t *r, const char *key, const char *def)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return def;
    if (!json_is_string(v)) {
        cfg_fail(r, key, "not a string");
        return def;
    }
    return json_string_value(v);
}

/* Hugging Face's default n_inner, 4 * n_embd, obeys the same bound as a
 * given one: above n_embd 2^28 it would not fit an int (and came out as
 * the negative that cfg_int takes for "required"). */
static int gpt2_default_inner(cfg_reader_t *r, int d_model)
{
    if (d_model <= (1 << 28))
        return 4 * d_model;
    json_t *v = json_object_get(r->root, "n_inner");
    if (!v || json_is_null(v))
        cfg_fail(r, "n_inner", "missing, and its default 4 * n_embd is not below 2^30");
    return 1;
}

static void cfg_gpt2(cfg_reader_t *r, model_config_t *c)
{
    c->arch = ARCH_GPT2;
    c->d_model = cfg_int(r, "n_embd", -1);
    c->n_layer = cfg_int(r, "n_layer", -1);
    c->n_head = c->n_kv_head = cfg_int(r, "n_head", -1);
    c->vocab_size = cfg_int(r, "vocab_size", -1);
    c->max_seq = cfg_int(r, "n_positions", json_object_get(r->root, "n_ctx") ? cfg_int(r, "n_ctx", -1) : -1);
    c->d_ff = cfg_int(r, "n_inner", gpt2_default_inner(r, c->d_model));
    c->norm_eps = cfg_real(r, "layer_norm_epsilon", 1e-5);
    c->rope_theta = 0;
    const char *act = cfg_str(r, "activation_function", "gelu_new");
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        cfg_fail(r, "activation_function", "dtrain's GPT-2 has the tanh GELU only (gelu_new, gelu_pytorch_tanh)");
    if (cfg_bool(r, "tie_word_embeddings") == 0)
        cfg_fail(r, "tie_word_embeddings", "false: dtrain's GPT-2 ties the head to wte");
    if (cfg_bool(r, "scale_attn_weights") == 0)
        cfg_fail(r, "scale_attn_weights", "false: dtrain scales attention by 1/sqrt(head size)");
    if (cfg_bool(r, "scale_attn_by_inverse_layer_idx") == 1)
        cfg_fail(r, "scale_attn_by_inverse_layer_idx", "true: not implemented in dtrain");
    if (cfg_bool(r, "add_cross_attention") == 1)
        cfg_fail(r, "add_cross_attention", "true: dtrain has no cross-attention");
}

static void cfg_llama(cfg_reader_t *r, model_config_t *c, const char *arch)
{
    c->arch = ARCH_LLAMA;
    c->d_model = cfg_int(r, "hidden_size", -1);
    c->d_ff = cfg_int(r, "intermediate_size", -1);
    c->n_layer = cfg_int(r, "num_hidden_layers", -1);
    c->n_head = cfg_int(r, "num_attention_heads", -1);
    c->n_kv_head = cfg_int(r, "num_key_value_heads", c->n_head);
    c->vocab_size = cfg_int(r, "vocab_size", -1);
    c->max_seq = cfg_int(r, "max_position_embeddings", 2048);
    c->norm_eps = cfg_real(r, "rms_norm_eps", 1e-6);
    c->rope_theta = cfg_real(r, "rope_theta", 10000.0);
    if (strcmp(cfg_str(r, "hidden_act", "silu"), "silu") != 0)
        cfg_fail(r, "hidden_act", "dtrain's Llama MLP is SwiGLU with silu only");
    json_t *rs = json_object_get(r->root, "rope_scaling");
    if (rs && !json_is_null(rs))
        cfg_fail(r, "rope_scaling", "dtrain implements plain RoPE only (rope_scaling must be null)");
    if (cfg_bool(r, "tie_word_embeddings") == 1)
        cfg_fail(r, "tie_word_embeddings", "true: dtrain's Llama has an untied lm_head");
    if (cfg_bool(r, "attention_bias") == 1)
        cfg_fail(r, "attention_bias", "true: dtrain's Llama attention has no biases");
    if (cfg_bool(r, "mlp_bias") == 1)
        cfg_fail(r, "mlp_bias", "true: dtrain's Llama MLP has no biases");
    /* head_dim * n_head == d_model, without the product (a huge head_dim
     * would overflow it) */
    json_t *hd = json_object_get(r->root, "head_dim");
    if (hd && !json_is_null(hd) && c->n_head > 0 &&
        (!json_is_integer(hd) || c->d_model % c->n_head != 0 || json_integer_value(hd) != c->d_model / c->n_head))
        cfg_fail(r, "head_dim", "differs from hidden_size / num_attention_heads, which dtrain requires");
    json_t *sw = json_object_get(r->root, "sliding_window");
    if (sw && !json_is_null(sw) && (!json_is_integer(sw) || json_integer_value(sw) < c->max_seq))
        cfg_fail(r, "sliding_window",
                 "a window shorter than max_position_embeddings: dtrain attends to the "
                 "whole sequence");
    if (strcmp(arch, "Qwen2ForCausalLM") == 0)
        cfg_fail(r, "architectures", "Qwen2ForCausalLM has q/k/v projection biases, which dtrain's Llama lacks");
}

/* The model of a parsed config.json; root may be any JSON value. */
static int config_of_json(json_t *root, const char *path, model_config_t *c, char *err, size_t errlen)
{
    cfg_reader_t r = {.root = root, .path = path, .err = err, .errlen = errlen};
    memset(c, 0, sizeof *c);
    if (!json_is_object(root))
        cfg_fail(&r, "(top level)", "not a JSON object");
    json_t *archs = json_object_get(root, "architectures");
    const char *arch =
        json_is_array(archs) && json_array_size(archs) == 1 ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (!r.failed && !arch)
        cfg_fail(&r, "architectures", "missing, or not a list of one name");
    if (r.failed) {
    } else if (strcmp(arch, "GPT2LMHeadModel") == 0 || strcmp(arch, "GPT2Model") == 0) {
        cfg_gpt2(&r, c);
    } else if (strcmp(arch, "LlamaForCausalLM") == 0 || strcmp(arch, "MistralForCausalLM") == 0 ||
               strcmp(arch, "Qwen2ForCausalLM") == 0) {
        cfg_llama(&r, c, arch);
    } else {
        char what[160];
        snprintf(what, sizeof what, "'%s': dtrain imports GPT2LMHeadModel, LlamaForCausalLM and MistralForCausalLM",
                 arch);
        cfg_fail(&r, "architectures", what);
    }
    char why[512];
    if (!r.failed && model_config_check(c, why, sizeof why) != 0)
        cfg_fail(&r, "(model)", why);
    return r.failed ? -1 : 0;
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
    char path[OPT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return not_json(&je, path, err, errlen);
    int rc = config_of_json(root, path, c, err, errlen);
    json_decref(root);
    return rc;
}
