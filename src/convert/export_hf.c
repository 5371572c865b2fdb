/* Export target: a Hugging Face model directory, as transformers'
 * save_pretrained writes one and AutoModelForCausalLM.from_pretrained reads
 * it:
 *   model.safetensors, or model-0000i-of-0000n.safetensors with
 *     model.safetensors.index.json (io/safetensors.h's plan: shards of
 *     --max-shard-size, 5 GB by default)
 *   config.json             GPT2LMHeadModel, LlamaForCausalLM (Qwen2/Qwen3), or
 *                           MixtralForCausalLM / Qwen2MoeForCausalLM (hf_moe_family)
 *   generation_config.json  the tokenizer's BOS/EOS ids when known
 *   tokenizer files         gpt2: vocab.json + merges.txt (GPT2Tokenizer) and
 *                           tokenizer.json; tiktoken: tokenizer.json
 *                           (PreTrainedTokenizerFast, io/tok_hf.h); spm:
 *                           tokenizer.model (LlamaTokenizer); each with
 *                           tokenizer_config.json and special_tokens_map.json;
 *                           hf: the tokenizer.json it was read from, byte
 *                           for byte (its sha256 checked against the one
 *                           recorded), with the tokenizer_config.json that
 *                           was beside it, or one written as for tiktoken
 * GPT-2's head is tied to wte, so lm_head.weight is not written (as
 * save_pretrained leaves tied weights out). Dropout is written as 0: dtrain
 * trains without it. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "io/publish.h"
#include "io/safetensors.h"
#include "io/tok_hf.h"
#include "io/tok_hfjson.h"
#include "io/tokenizer.h"
#include "src/convert/export.h"

typedef struct hf_state {
    st_plan_t *plan;
    tokenizer_t *tok;      /* NULL: no tokenizer files */
    int32_t bos, eos, unk; /* TOK_NO_ID when unknown */
    /* the tokenizer, opened and checked and its files written by a thread
     * of rank 0 while the tiles are written (gpt2's vocabulary took 43 ms
     * to open and tokenizer.json 0.1 s to make, a third of a gpt2-124m
     * export's time before the tiles when both ran first) */
    pthread_t tok_thread;
    int tok_running, tok_rc, tok_input_failed; /* tok_rc: the thread's status; the tokenizer was at fault */
    char tok_err[1024];
    export_ctx_t *tok_x;
} hf_state_t;

static st_dtype_t st_dtype(export_dtype_t d) { return d == EXPORT_BF16 ? ST_BF16 : d == EXPORT_F16 ? ST_F16 : ST_F32; }

static const char *torch_dtype(export_dtype_t d)
{
    return d == EXPORT_BF16 ? "bfloat16" : d == EXPORT_F16 ? "float16" : "float32";
}

/* ---- the tokenizer ------------------------------------------------------------ */

/* The special ids by role. gpt2/tiktoken: <|endoftext|> is BOS, EOS and
 * UNK (as GPT-2's tokenizer_config says), tiktoken's first special token
 * (Llama 3's <|begin_of_text|>) is BOS and EOS unless there is an
 * <|end_of_text|>; spm: list_specials gives <unk>, <s>, </s> in that
 * order, each only when the model has it; hf: the document tokens the
 * data was framed with, else tokenizer_config.json's bos_token and
 * eos_token (Qwen frames no start: its BOS is null, as its own
 * config.json has it; DeepSeek-V3 no end: EOS <｜end▁of▁sentence｜>). */
static void special_roles(hf_state_t *s, const tokenizer_t *tk)
{
    s->bos = tk->doc_start; /* TOK_NO_ID for byte, which has no special tokens */
    s->eos = s->unk = TOK_NO_ID;
    if (strcmp(tk->ops->kind, "hf") == 0) {
        int read;
        int32_t bos, eos;
        tok_hfjson_config(tk, &read, &bos, &eos);
        if (s->bos == TOK_NO_ID)
            s->bos = bos;
        s->eos = tk->doc_end != TOK_NO_ID ? tk->doc_end : eos;
        return;
    }
    if (strcmp(tk->ops->kind, "gpt2") == 0) {
        s->eos = s->unk = tk->doc_start;
        return;
    }
    if (strcmp(tk->ops->kind, "tiktoken") == 0) { /* Llama 3 ends text with its own token; no UNK */
        s->eos = tk->doc_start;
        for (int i = 0; i < tk->n_special; i++)
            if (strcmp(tk->special_name[i], "<|end_of_text|>") == 0)
                s->eos = tk->special_id[i];
        return;
    }
    for (int i = 0; i < tk->n_special; i++) {
        const int32_t id = tk->special_id[i];
        if (i == 0)
            s->unk = id; /* SentencePiece models always define <unk> */
        else if (id != s->bos)
            s->eos = id;
    }
}

static const char *special_name(const tokenizer_t *tk, int32_t id)
{
    for (int i = 0; i < tk->n_special; i++)
        if (tk->special_id[i] == id)
            return tk->special_name[i];
    return NULL;
}

/* --tokenizer auto|none|SPEC against what the input records. */
static int open_tokenizer(export_ctx_t *x, hf_state_t *s, char *err, size_t errlen)
{
    const export_opts_t *o = x->opt;
    const int is_auto = strcmp(o->tokenizer, "auto") == 0;
    const char *spec = is_auto ? o->tok_recorded : strcmp(o->tokenizer, "none") == 0 ? "" : o->tokenizer;
    if (!*spec) {
        snprintf(x->note, sizeof x->note, "no tokenizer files (%s)",
                 is_auto ? "the input does not record its data's tokenizer: pass --tokenizer SPEC to add them"
                         : "--tokenizer none");
        return 0;
    }
    char why[1024];
    if (tokenizer_open(&s->tok, spec, 0, why, sizeof why) != 0) {
        snprintf(err, errlen, "tokenizer %s%s: %s", spec, is_auto ? " (recorded in the input)" : "", why);
        return -1;
    }
    if (is_auto && *o->tok_sha256 && strcmp(o->tok_sha256, s->tok->vocab_sha256) != 0) {
        snprintf(err, errlen,
                 "the input was trained with tokenizer %s whose vocabulary file had sha256 %.12s..., "
                 "but %s now has %.12s...: pass --tokenizer SPEC naming the original files, or --tokenizer none",
                 spec, o->tok_sha256, s->tok->vocab_path, s->tok->vocab_sha256);
        return -1;
    }
    if (s->tok->vocab_size > x->cfg->vocab_size) {
        snprintf(err, errlen, "tokenizer %s has %d tokens, more than the model's vocabulary of %d", spec,
                 s->tok->vocab_size, x->cfg->vocab_size);
        return -1;
    }
    const char *kind = s->tok->ops->kind;
    if (strcmp(kind, "spm") != 0 && strcmp(kind, "byte") != 0 && strcmp(kind, "hf") != 0 &&
        !tok_hf_pattern(s->tok)) {
        snprintf(x->note, sizeof x->note,
                 "no tokenizer files: dreshard writes Hugging Face tokenizer files for "
                 "byte, gpt2, tiktoken, spm and hf tokenizers, not for %s (%s)",
                 kind, spec);
        tokenizer_close(s->tok);
        s->tok = NULL;
        return 0;
    }
    special_roles(s, s->tok);
    return 0;
}

/* ---- files ------------------------------------------------------------------------ */

/* dir/name, written whole through io/publish.h (synced, then renamed into
 * place inside the temporary export directory). */
static int write_file(const char *dir, const char *name, const void *data, size_t len, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    publish_t p;
    if (publish_open(&p, path, 0644, err, errlen) != 0)
        return -1;
    if (publish_write(&p, data, len, err, errlen) != 0) {
        publish_abort(&p, err, errlen);
        return -1;
    }
    return publish_commit(&p, err, errlen);
}

/* j (reference taken) as indented JSON with a final newline. */
static int write_json(const char *dir, const char *name, json_t *j, char *err, size_t errlen)
{
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!text) {
        snprintf(err, errlen, "out of memory writing %s", name);
        return -1;
    }
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        snprintf(err, errlen, "out of memory writing %s", name);
        return -1;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    int rc = write_file(dir, name, line, n + 1, err, errlen);
    free(line);
    return rc;
}

static int copy_file(const char *src, const char *dir, const char *name, char *err, size_t errlen)
{
    FILE *f = fopen(src, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", src, strerror(errno));
        return -1;
    }
    char *data = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 20;
            char *p = realloc(data, cap);
            if (!p) {
                snprintf(err, errlen, "out of memory copying %s", src);
                rc = -1;
                break;
            }
            data = p;
        }
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "cannot read %s", src);
        rc = -1;
    }
    fclose(f);
    if (rc == 0)
        rc = write_file(dir, name, data, n, err, errlen);
    free(data);
    return rc;
}

/* A float32 configuration value as the decimal it was given as (1e-05,
 * not 9.9999997473787516e-06): the shortest that reads back to the same
 * float. */
static json_t *json_float(float v)
{
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    return json_real(strtod(buf, NULL));
}

/* id as a JSON integer, or null when unknown */
static json_t *id_or_null(int32_t id) { return id == TOK_NO_ID ? json_null() : json_integer(id); }

static json_t *gpt2_config(const model_config_t *c, const hf_state_t *s, export_dtype_t d)
{
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", "GPT2LMHeadModel"));
    json_object_set_new(j, "model_type", json_string("gpt2"));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "n_positions", json_integer(c->max_seq));
    json_object_set_new(j, "n_ctx", json_integer(c->max_seq));
    json_object_set_new(j, "n_embd", json_integer(c->d_model));
    json_object_set_new(j, "n_layer", json_integer(c->n_layer));
    json_object_set_new(j, "n_head", json_integer(c->n_head));
    json_object_set_new(j, "n_inner", json_integer(c->d_ff));
    json_object_set_new(j, "activation_function", json_string("gelu_new"));
    json_object_set_new(j, "layer_norm_epsilon", json_float(c->norm_eps));
    json_object_set_new(j, "resid_pdrop", json_real(0.0));
    json_object_set_new(j, "embd_pdrop", json_real(0.0));
    json_object_set_new(j, "attn_pdrop", json_real(0.0));
    json_object_set_new(j, "initializer_range", json_real(0.02));
    json_object_set_new(j, "scale_attn_weights", json_true());
    json_object_set_new(j, "tie_word_embeddings", json_true());
    json_object_set_new(j, "bos_token_id", id_or_null(s->bos));
    json_object_set_new(j, "eos_token_id", id_or_null(s->eos));
    json_object_set_new(j, "torch_dtype", json_string(torch_dtype(d)));
    json_object_set_new(j, "use_cache", json_true());
    return j;
}

/* Hugging Face's rope_scaling object of c's scaling, or null. */
static json_t *rope_scaling_json(const model_config_t *c)
{
    if (c->rope_scaling == ROPE_SCALING_NONE)
        return json_null();
    json_t *j = json_object();
    json_object_set_new(j, "rope_type", json_string(model_rope_scaling_name(c->rope_scaling)));
    json_object_set_new(j, "factor", json_float(c->rope_factor));
    if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
        json_object_set_new(j, "low_freq_factor", json_float(c->rope_low_freq_factor));
        json_object_set_new(j, "high_freq_factor", json_float(c->rope_high_freq_factor));
        json_object_set_new(j, "original_max_position_embeddings", json_integer(c->rope_original_max_seq));
    }
    return j;
}

static json_t *moe_config(const model_config_t *c, json_t *j, int family);

static json_t *llama_config(const model_config_t *c, const hf_state_t *s, export_dtype_t d)
{
    json_t *j = json_object();
    /* Qwen2 is Llama with q/k/v biases, Qwen3 Llama with q/k norms */
    const char *arch = c->attn_bias ? "Qwen2ForCausalLM" : c->qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
    const char *type = c->attn_bias ? "qwen2" : c->qk_norm ? "qwen3" : "llama";
    json_object_set_new(j, "architectures", json_pack("[s]", arch));
    json_object_set_new(j, "model_type", json_string(type));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->d_model));
    json_object_set_new(j, "intermediate_size", json_integer(c->d_ff));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->n_layer));
    json_object_set_new(j, "num_attention_heads", json_integer(c->n_head));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->n_kv_head));
    json_object_set_new(j, "head_dim", json_integer(model_head_size(c)));
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_seq));
    json_object_set_new(j, "rms_norm_eps", json_float(c->norm_eps));
    json_object_set_new(j, "rope_theta", json_float(c->rope_theta));
    json_object_set_new(j, "rope_scaling", rope_scaling_json(c));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    if (!c->attn_bias) /* Qwen2's q/k/v biases are implied by its architecture */
        json_object_set_new(j, "attention_bias", json_false());
    if (c->attn_bias || c->qk_norm)
        json_object_set_new(j, "use_sliding_window", json_false());
    json_object_set_new(j, "mlp_bias", json_false());
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    json_object_set_new(j, "initializer_range", json_real(0.02));
    json_object_set_new(j, "pretraining_tp", json_integer(1));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_embed));
    json_object_set_new(j, "bos_token_id", id_or_null(s->bos));
    json_object_set_new(j, "eos_token_id", id_or_null(s->eos));
    json_object_set_new(j, "torch_dtype", json_string(torch_dtype(d)));
    json_object_set_new(j, "use_cache", json_true());
    char why[256];
    const int family = hf_moe_family(c, why, sizeof why); /* hf_map_build refused the rest */
    return family == HF_MOE_MIXTRAL || family == HF_MOE_QWEN2 ? moe_config(c, j, family) : j;
}

/* MixtralForCausalLM's or Qwen2MoeForCausalLM's config.json (family:
 * hf_moe_family's), the Llama keys of llama_config with the mixture's:
 * Mixtral's experts are intermediate_size wide; Qwen2-MoE's MoE layers
 * are every layer but mlp_only_layers (decoder_sparse_step 1), the others
 * dense MLPs of intermediate_size. */
static json_t *moe_config(const model_config_t *c, json_t *j, int family)
{
    const moe_config_t *e = &c->moe;
    const int qwen = family == HF_MOE_QWEN2;
    json_object_set_new(j, "architectures", json_pack("[s]", qwen ? "Qwen2MoeForCausalLM" : "MixtralForCausalLM"));
    json_object_set_new(j, "model_type", json_string(qwen ? "qwen2_moe" : "mixtral"));
    json_object_del(j, "head_dim"); /* d_model / n_head: hf_moe_family refuses one of its own */
    json_object_del(j, "attention_bias");
    json_object_del(j, "mlp_bias");
    json_object_del(j, "pretraining_tp");
    json_object_set_new(j, "num_experts_per_tok", json_integer(e->top_k));
    json_object_set_new(j, "router_aux_loss_coef", json_float(e->aux_coef));
    json_object_set_new(j, "output_router_logits", json_false());
    if (!qwen) {
        json_object_set_new(j, "intermediate_size", json_integer(e->ffn));
        json_object_set_new(j, "num_local_experts", json_integer(e->experts));
        json_object_set_new(j, "router_jitter_noise", json_real(0.0));
        json_object_set_new(j, "sliding_window", json_null());
        return j;
    }
    json_object_set_new(j, "num_experts", json_integer(e->experts));
    json_object_set_new(j, "moe_intermediate_size", json_integer(e->ffn));
    json_object_set_new(j, "shared_expert_intermediate_size", json_integer(e->shared_ffn));
    json_object_set_new(j, "norm_topk_prob", json_boolean(e->norm_topk));
    json_object_set_new(j, "decoder_sparse_step", json_integer(1));
    json_t *dense = json_array();
    for (int l = 0; l < c->n_layer; l++)
        if (!model_layer_moe(c, l))
            json_array_append_new(dense, json_integer(l));
    json_object_set_new(j, "mlp_only_layers", dense);
    return j;
}

static json_t *generation_config(const hf_state_t *s)
{
    json_t *j = json_object();
    json_object_set_new(j, "_from_model_config", json_true());
    if (s->bos != TOK_NO_ID)
        json_object_set_new(j, "bos_token_id", json_integer(s->bos));
    if (s->eos != TOK_NO_ID)
        json_object_set_new(j, "eos_token_id", json_integer(s->eos));
    return j;
}

/* role -> token text, for tokenizer_config.json and special_tokens_map.json */
static void set_special(json_t *j, const char *key, const tokenizer_t *tk, int32_t id)
{
    const char *name = id == TOK_NO_ID ? NULL : special_name(tk, id);
    if (name)
        json_object_set_new(j, key, json_string(name));
}

/* tokenizer.json of a byte-level BPE tokenizer (io/tok_hf.h) */
static int write_tokenizer_json(const char *dir, const tokenizer_t *tk, char *err, size_t errlen)
{
    char *json, why[512];
    if (tok_hf_tokenizer_json(tk, tok_hf_pattern(tk), &json, why, sizeof why) != 0) {
        snprintf(err, errlen, "tokenizer.json of %.300s: %s", tk->spec, why);
        return -1;
    }
    int rc = write_file(dir, "tokenizer.json", json, strlen(json), err, errlen);
    free(json);
    return rc;
}

/* The tokenizer's own files: spm's model; GPT-2's encoder.json and
 * vocab.bpe (side by side, tok_gpt2.c) as vocab.json and merges.txt, and
 * tokenizer.json for the fast tokenizer; tiktoken's as tokenizer.json. */
static int write_vocabulary(const char *dir, const tokenizer_t *tk, char *err, size_t errlen)
{
    if (strcmp(tk->ops->kind, "spm") == 0)
        return copy_file(tk->vocab_path, dir, "tokenizer.model", err, errlen);
    if (strcmp(tk->ops->kind, "gpt2") == 0) {
        char merges[TOK_PATH_MAX + 16];
        snprintf(merges, sizeof merges, "%s", tk->vocab_path);
        char *slash = strrchr(merges, '/');
        snprintf(slash ? slash + 1 : merges, sizeof merges - (size_t)(slash ? slash + 1 - merges : 0), "vocab.bpe");
        if (copy_file(tk->vocab_path, dir, "vocab.json", err, errlen) != 0 ||
            copy_file(merges, dir, "merges.txt", err, errlen) != 0)
            return -1;
    }
    return write_tokenizer_json(dir, tk, err, errlen);
}

/* hf: the tokenizer.json dtrain read, copied byte for byte, and the
 * copy's sha256 checked against the one taken when the tokenizer was
 * opened (which --tokenizer auto checked against the input's record): a
 * file that changed in between is never exported. The tokenizer_config.json
 * that was read beside it, when one was, is copied too (*config: 1). */
static int copy_hf_files(const char *dir, const tokenizer_t *tk, int *config, char *err, size_t errlen)
{
    char copy[4200], sha[65];
    snprintf(copy, sizeof copy, "%s/tokenizer.json", dir);
    if (copy_file(tk->vocab_path, dir, "tokenizer.json", err, errlen) != 0 ||
        tok_file_sha256(copy, sha, err, errlen) != 0)
        return -1;
    if (strcmp(sha, tk->vocab_sha256) != 0) {
        snprintf(err, errlen,
                 "%.1000s changed while it was exported (sha256 %.12s... when opened, %.12s... as copied): "
                 "export again once it no longer changes",
                 tk->vocab_path, tk->vocab_sha256, sha);
        return -1;
    }
    int32_t bos, eos;
    tok_hfjson_config(tk, config, &bos, &eos);
    if (!*config)
        return 0;
    char src[TOK_PATH_MAX + 32];
    const char *slash = strrchr(tk->vocab_path, '/'); /* vocab_path is absolute */
    snprintf(src, sizeof src, "%.*s/tokenizer_config.json", (int)(slash - tk->vocab_path), tk->vocab_path);
    return copy_file(src, dir, "tokenizer_config.json", err, errlen);
}

static const char *tokenizer_class(const tokenizer_t *tk)
{
    return strcmp(tk->ops->kind, "spm") == 0    ? "LlamaTokenizer"
           : strcmp(tk->ops->kind, "gpt2") == 0 ? "GPT2Tokenizer"
                                                : "PreTrainedTokenizerFast";
}

static int write_tokenizer(const char *dir, const model_config_t *c, const hf_state_t *s, char *err, size_t errlen)
{
    const tokenizer_t *tk = s->tok;
    const int spm = strcmp(tk->ops->kind, "spm") == 0;
    int rc, config = 0;
    if (strcmp(tk->ops->kind, "hf") == 0) {
        if ((rc = copy_hf_files(dir, tk, &config, err, errlen)) != 0 || config)
            return rc; /* its own tokenizer_config.json names its special tokens */
    } else
        rc = write_vocabulary(dir, tk, err, errlen);
    json_t *map = json_object(), *cfg = json_object();
    set_special(map, "bos_token", tk, s->bos);
    set_special(map, "eos_token", tk, s->eos);
    set_special(map, "unk_token", tk, s->unk);
    json_object_set_new(cfg, "tokenizer_class", json_string(tokenizer_class(tk)));
    json_object_update(cfg, map);
    json_object_set_new(cfg, "model_max_length", json_integer(c->max_seq));
    if (spm) {
        json_object_set_new(cfg, "add_bos_token", json_boolean(tk->doc_start != TOK_NO_ID));
        json_object_set_new(cfg, "add_eos_token", json_false());
        json_object_set_new(cfg, "legacy", json_true()); /* plain SentencePiece encoding, as dtrain-prepare's */
    } else {
        json_object_set_new(cfg, "add_prefix_space", json_false());
        json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false()); /* decode gives the bytes back */
    }
    if (rc == 0)
        rc = write_json(dir, "special_tokens_map.json", map, err, errlen);
    else
        json_decref(map);
    if (rc == 0)
        rc = write_json(dir, "tokenizer_config.json", cfg, err, errlen);
    else
        json_decref(cfg);
    return rc;
}

/* ---- the tokenizer thread -------------------------------------------------------- */

/* The tokenizer checked against the input and the model, and its files
 * into the export's directory. */
static int tokenizer_files(export_ctx_t *x, hf_state_t *s, char *err, size_t errlen)
{
    if (open_tokenizer(x, s, err, errlen) != 0) {
        s->tok_input_failed = 1;
        return -1;
    }
    return s->tok ? write_tokenizer(x->tmp, x->cfg, s, err, errlen) : 0;
}

static void *tokenizer_thread(void *arg)
{
    hf_state_t *s = arg;
    s->tok_rc = tokenizer_files(s->tok_x, s, s->tok_err, sizeof s->tok_err);
    return NULL;
}

/* tokenizer_files on a thread when one starts, else here. */
static int start_tokenizer(export_ctx_t *x, hf_state_t *s, char *err, size_t errlen)
{
    s->tok_x = x;
    s->tok_rc = 0;
    if (pthread_create(&s->tok_thread, NULL, tokenizer_thread, s) == 0) {
        s->tok_running = 1;
        return 0;
    }
    const int rc = tokenizer_files(x, s, err, errlen);
    x->input_failed = rc != 0 && s->tok_input_failed;
    return rc;
}

/* Waits for the tokenizer thread, if one runs; its result (its message
 * into err unless err is NULL). */
static int join_tokenizer(hf_state_t *s, char *err, size_t errlen)
{
    if (!s->tok_running)
        return 0;
    pthread_join(s->tok_thread, NULL);
    s->tok_running = 0;
    if (s->tok_rc != 0 && err)
        snprintf(err, errlen, "%s", s->tok_err);
    return s->tok_rc;
}

/* ---- the target ----------------------------------------------------------------- */

static int hf_prepare(export_ctx_t *x, char *err, size_t errlen)
{
    hf_state_t *s = calloc(1, sizeof *s);
    st_out_tensor_t *t = calloc((size_t)x->n_out + 1, sizeof *t);
    x->impl = s;
    if (!s || !t) {
        free(t);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < x->n_out; i++) {
        const export_out_t *o = &x->out[i];
        t[i] = (st_out_tensor_t){.name = o->name,
                                 .dtype = st_dtype(x->opt->dtype),
                                 .ndim = o->ndim,
                                 .shape = {o->ndim == 1 ? o->cols : o->rows, o->ndim == 1 ? 0 : o->cols}};
    }
    s->bos = s->eos = s->unk = TOK_NO_ID;
    const int rc = st_plan_make(t, x->n_out, x->opt->max_shard_bytes, NULL, &s->plan, err, errlen);
    free(t);
    return rc;
}

static int hf_create(export_ctx_t *x, char *err, size_t errlen)
{
    if (mkdir(x->tmp, 0755) != 0) {
        snprintf(err, errlen, "cannot create directory %s: %s", x->tmp, strerror(errno));
        return -1;
    }
    hf_state_t *s = x->impl;
    if (st_plan_create_files(s->plan, x->tmp, err, errlen) != 0)
        return -1;
    return start_tokenizer(x, s, err, errlen);
}

static int hf_write_rows(export_ctx_t *x, int i, int64_t r0, int64_t nr, const float *rows, char *err, size_t errlen)
{
    /* fp16 tops out at 65504: a larger finite weight would be written as inf */
    const int64_t n = nr * x->out[i].cols;
    for (int64_t k = 0; x->opt->dtype == EXPORT_F16 && k < n; k++)
        if (isfinite(rows[k]) && fabsf(rows[k]) >= 65520.0f) {
            snprintf(err, errlen,
                     "tensor %s: element %lld is %g, beyond fp16's range (65504): export as bf16 or "
                     "fp32",
                     x->out[i].name, (long long)(k + r0 * x->out[i].cols), (double)rows[k]);
            return -1;
        }
    return st_plan_write_f32(((hf_state_t *)x->impl)->plan, x->tmp, i, r0, nr, rows, err, errlen);
}

static int hf_sync(export_ctx_t *x, char *err, size_t errlen)
{
    hf_state_t *s = x->impl;
    if (st_plan_sync(s->plan, x->tmp, err, errlen) != 0)
        return -1;
    x->input_failed = join_tokenizer(s, err, errlen) != 0 && s->tok_input_failed;
    return s->tok_rc;
}

/* The index, the configs and the tokenizer; then the directory as
 * --init-from would open it (every shard's header parsed and checked
 * against the file's size, the index against the shards) before it takes
 * the final name. */
static int hf_publish(export_ctx_t *x, char *err, size_t errlen)
{
    hf_state_t *s = x->impl;
    const model_config_t *c = x->cfg;
    int rc = join_tokenizer(s, err, errlen);
    if (rc == 0)
        rc = st_plan_write_index(s->plan, x->tmp, err, errlen);
    if (rc == 0)
        rc = write_json(x->tmp, "config.json",
                        c->arch == ARCH_GPT2 ? gpt2_config(c, s, x->opt->dtype) : llama_config(c, s, x->opt->dtype),
                        err, errlen);
    if (rc == 0)
        rc = write_json(x->tmp, "generation_config.json", generation_config(s), err, errlen);
    if (rc == 0 && s->tok) {
        snprintf(x->note, sizeof x->note, "tokenizer files of %.400s (%s)", s->tok->spec,
                 strcmp(s->tok->ops->kind, "spm") == 0    ? "tokenizer.model"
                 : strcmp(s->tok->ops->kind, "gpt2") == 0 ? "vocab.json, merges.txt, tokenizer.json"
                 : strcmp(s->tok->ops->kind, "hf") == 0   ? "tokenizer.json as read, sha256 verified"
                                                          : "tokenizer.json");
    }
    st_model_t back;
    if (rc == 0 && (rc = st_model_open(&back, x->tmp, err, errlen)) == 0)
        st_model_close(&back);
    char config[4200]; /* the directory holding config.json is the export's own */
    snprintf(config, sizeof config, "%s/config.json", x->tmp);
    if (rc == 0)
        rc = publish_sync_dir_of(config, err, errlen);
    return rc == 0 ? export_commit(x->tmp, x->opt->dest, err, errlen) : -1;
}

static void hf_discard(export_ctx_t *x)
{
    join_tokenizer(x->impl, NULL, 0); /* it writes into x->tmp */
    export_remove(x->tmp);
}

static void hf_destroy(export_ctx_t *x)
{
    hf_state_t *s = x->impl;
    if (s) {
        join_tokenizer(s, NULL, 0);
        st_plan_free(s->plan);
        if (s->tok)
            tokenizer_close(s->tok);
        free(s);
    }
    x->impl = NULL;
}

const export_target_t export_target_hf = {
    .name = "Hugging Face",
    .map_format = HF_FMT_HF,
    .map_prefix = "transformer.", /* GPT2LMHeadModel's names */
    .prepare = hf_prepare,
    .create = hf_create,
    .write_rows = hf_write_rows,
    .sync = hf_sync,
    .publish = hf_publish,
    .discard = hf_discard,
    .destroy = hf_destroy,
};
