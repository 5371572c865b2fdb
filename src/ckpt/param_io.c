#include "src/ckpt/param_io.h"

#include "mpi/agree.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int param_io_tokenizer_attrs(const char *spec, const char *sha256, h5store_attr_t *out)
{
    if (!spec || !*spec)
        return 0;
    out[0] = (h5store_attr_t){.key = "tokenizer", .type = H5STORE_STR, .s = spec};
    out[1] = (h5store_attr_t){.key = "tokenizer_sha256", .type = H5STORE_STR, .s = sha256 ? sha256 : ""};
    return 2;
}

int param_io_model_attrs(const model_config_t *cfg, h5store_attr_t *out)
{
    int n = 0;
    out[n++] = (h5store_attr_t){.key = "arch", .type = H5STORE_STR, .s = model_arch_name(cfg->arch)};
    out[n++] = (h5store_attr_t){.key = "vocab_size", .type = H5STORE_INT, .i = cfg->vocab_size};
    out[n++] = (h5store_attr_t){.key = "n_layer", .type = H5STORE_INT, .i = cfg->n_layer};
    out[n++] = (h5store_attr_t){.key = "n_head", .type = H5STORE_INT, .i = cfg->n_head};
    out[n++] = (h5store_attr_t){.key = "n_kv_head", .type = H5STORE_INT, .i = cfg->n_kv_head};
    out[n++] = (h5store_attr_t){.key = "d_model", .type = H5STORE_INT, .i = cfg->d_model};
    out[n++] = (h5store_attr_t){.key = "d_ff", .type = H5STORE_INT, .i = cfg->d_ff};
    out[n++] = (h5store_attr_t){.key = "max_seq", .type = H5STORE_INT, .i = cfg->max_seq};
    out[n++] = (h5store_attr_t){.key = "norm_eps", .type = H5STORE_DOUBLE, .d = cfg->norm_eps};
    out[n++] = (h5store_attr_t){.key = "rope_theta", .type = H5STORE_DOUBLE, .d = cfg->rope_theta};
    /* written only where they differ from the models that came before
     * them, so files of those models keep the attributes they had */
    if (cfg->head_dim)
        out[n++] = (h5store_attr_t){.key = "head_dim", .type = H5STORE_INT, .i = cfg->head_dim};
    if (cfg->attn_bias)
        out[n++] = (h5store_attr_t){.key = "attn_bias", .type = H5STORE_INT, .i = cfg->attn_bias};
    if (cfg->qk_norm)
        out[n++] = (h5store_attr_t){.key = "qk_norm", .type = H5STORE_INT, .i = cfg->qk_norm};
    if (cfg->tie_embed)
        out[n++] = (h5store_attr_t){.key = "tie_embed", .type = H5STORE_INT, .i = cfg->tie_embed};
    const moe_config_t *e = &cfg->moe;
    if (e->experts) { /* the mixture's shape; its loss coefficients and capacity are the run's */
        out[n++] = (h5store_attr_t){.key = "moe_experts", .type = H5STORE_INT, .i = e->experts};
        out[n++] = (h5store_attr_t){.key = "moe_top_k", .type = H5STORE_INT, .i = e->top_k};
        out[n++] = (h5store_attr_t){.key = "moe_ffn", .type = H5STORE_INT, .i = e->ffn};
        out[n++] = (h5store_attr_t){.key = "moe_every", .type = H5STORE_INT, .i = e->every};
        out[n++] = (h5store_attr_t){.key = "moe_first_dense", .type = H5STORE_INT, .i = e->first_dense};
        out[n++] = (h5store_attr_t){.key = "moe_router", .type = H5STORE_STR, .s = model_moe_router_name(e->router)};
        out[n++] = (h5store_attr_t){.key = "moe_norm_topk", .type = H5STORE_INT, .i = e->norm_topk};
        out[n++] = (h5store_attr_t){.key = "moe_shared_ffn", .type = H5STORE_INT, .i = e->shared_ffn};
        if (e->shared_gate) /* only when set: files of ungated mixtures keep the attributes they had */
            out[n++] = (h5store_attr_t){.key = "moe_shared_gate", .type = H5STORE_INT, .i = e->shared_gate};
    }
    if (cfg->rope_scaling != ROPE_SCALING_NONE) {
        out[n++] = (h5store_attr_t){
            .key = "rope_scaling", .type = H5STORE_STR, .s = model_rope_scaling_name(cfg->rope_scaling)};
        out[n++] = (h5store_attr_t){.key = "rope_factor", .type = H5STORE_DOUBLE, .d = cfg->rope_factor};
    }
    if (cfg->rope_scaling == ROPE_SCALING_LLAMA3) {
        out[n++] =
            (h5store_attr_t){.key = "rope_low_freq_factor", .type = H5STORE_DOUBLE, .d = cfg->rope_low_freq_factor};
        out[n++] =
            (h5store_attr_t){.key = "rope_high_freq_factor", .type = H5STORE_DOUBLE, .d = cfg->rope_high_freq_factor};
        out[n++] =
            (h5store_attr_t){.key = "rope_original_max_seq", .type = H5STORE_INT, .i = cfg->rope_original_max_seq};
    }
    return n;
}

enum { BIAS_KEY = 24, BIAS_NUM = 20 }; /* "moe_bias_<layer>"; one "%a" float and its space */

int param_io_moe_bias_attrs(const model_config_t *cfg, const float *bias, h5store_attr_t *out, char **text)
{
    *text = NULL;
    if (!bias || !model_moe_has_bias(cfg))
        return 0;
    const int L = cfg->n_layer, E = cfg->moe.experts;
    const size_t each = BIAS_KEY + (size_t)E * BIAS_NUM + 1;
    char *t = malloc((size_t)L * each);
    if (!t)
        return -1;
    int n = 0;
    for (int l = 0; l < L; l++) {
        if (!model_layer_moe(cfg, l))
            continue;
        char *key = t + (size_t)n * each, *v = key + BIAS_KEY, *at = v;
        snprintf(key, BIAS_KEY, "moe_bias_%d", l);
        for (int x = 0; x < E; x++)
            at += snprintf(at, BIAS_NUM, x ? " %a" : "%a", (double)bias[(size_t)l * E + x]);
        out[n++] = (h5store_attr_t){.key = key, .type = H5STORE_STR, .s = v};
    }
    *text = t;
    return n;
}

int param_io_read_moe_bias(h5store_t *h, const model_config_t *cfg, float *bias, const char *path, char *err,
                           size_t errlen)
{
    const int L = cfg->n_layer, E = cfg->moe.experts;
    memset(bias, 0, (size_t)L * (size_t)E * sizeof *bias);
    const size_t len = (size_t)E * BIAS_NUM + 1;
    char *v = malloc(len);
    if (!v) {
        snprintf(err, errlen, "out of memory reading the expert bias of %s", path);
        return -1;
    }
    int rc = 0;
    for (int l = 0; rc == 0 && l < L; l++) {
        char key[BIAS_KEY];
        snprintf(key, sizeof key, "moe_bias_%d", l);
        if (!model_layer_moe(cfg, l) || !h5store_has_attr(h, key))
            continue;
        if ((rc = h5store_get_str(h, key, v, len, err, errlen)) != 0)
            break;
        const char *p = v;
        for (int x = 0; rc == 0 && x < E; x++) {
            char *end;
            bias[(size_t)l * E + x] = strtof(p, &end);
            if (end == p) {
                snprintf(err, errlen, "%s: attribute %s holds fewer than the model's %d experts' biases", path, key,
                         E);
                rc = -1;
            }
            p = end;
        }
        while (rc == 0 && *p == ' ')
            p++;
        if (rc == 0 && *p) {
            snprintf(err, errlen, "%s: attribute %s holds more than the model's %d experts' biases", path, key, E);
            rc = -1;
        }
    }
    free(v);
    return rc;
}

/* The mixture's shape (all zero in a file without moe_experts). */
static int read_moe(h5store_t *h, moe_config_t *e, const char *path, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    if (!h5store_has_attr(h, "moe_experts"))
        return 0;
    const char *keys[] = {"moe_experts", "moe_top_k", "moe_ffn", "moe_every", "moe_first_dense", "moe_norm_topk",
                          "moe_shared_ffn"};
    int *dst[] = {&e->experts, &e->top_k, &e->ffn, &e->every, &e->first_dense, &e->norm_topk, &e->shared_ffn};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int64_t v;
        if (h5store_get_int(h, keys[i], &v, err, errlen) != 0)
            return -1;
        if (v < 0 || v > INT32_MAX) {
            snprintf(err, errlen, "%s: attribute %s = %lld is not a model size", path, keys[i], (long long)v);
            return -1;
        }
        *dst[i] = (int)v;
    }
    char name[32];
    if (h5store_get_str(h, "moe_router", name, sizeof name, err, errlen) != 0)
        return -1;
    const int r = model_moe_router_of(name);
    if (r < 0) {
        snprintf(err, errlen, "%s: attribute moe_router '%s' is not softmax or sigmoid", path, name);
        return -1;
    }
    e->router = (moe_router_t)r;
    if (h5store_has_attr(h, "moe_shared_gate")) {
        int64_t v;
        if (h5store_get_int(h, "moe_shared_gate", &v, err, errlen) != 0)
            return -1;
        if (v != 0 && v != 1) {
            snprintf(err, errlen, "%s: attribute moe_shared_gate = %lld is not 0 or 1", path, (long long)v);
            return -1;
        }
        e->shared_gate = (int)v;
    }
    return 0;
}

/* The optional model attributes (param_io_model_attrs writes them only
 * when set; a file without them holds a model without them). */
static int read_model_options(h5store_t *h, model_config_t *cfg, const char *path, char *err, size_t errlen)
{
    int64_t v;
    double d;
    char name[32];
    if (h5store_has_attr(h, "head_dim") && h5store_get_int(h, "head_dim", &v, err, errlen) != 0)
        return -1;
    cfg->head_dim = h5store_has_attr(h, "head_dim") ? (int)v : 0;
    if (h5store_has_attr(h, "attn_bias") && h5store_get_int(h, "attn_bias", &v, err, errlen) != 0)
        return -1;
    cfg->attn_bias = h5store_has_attr(h, "attn_bias") ? (int)v : 0;
    if (h5store_has_attr(h, "qk_norm") && h5store_get_int(h, "qk_norm", &v, err, errlen) != 0)
        return -1;
    cfg->qk_norm = h5store_has_attr(h, "qk_norm") ? (int)v : 0;
    if (h5store_has_attr(h, "tie_embed") && h5store_get_int(h, "tie_embed", &v, err, errlen) != 0)
        return -1;
    cfg->tie_embed = h5store_has_attr(h, "tie_embed") ? (int)v : 0;
    if (read_moe(h, &cfg->moe, path, err, errlen) != 0)
        return -1;
    if (!h5store_has_attr(h, "rope_scaling"))
        return 0;
    if (h5store_get_str(h, "rope_scaling", name, sizeof name, err, errlen) != 0)
        return -1;
    const int kind = model_rope_scaling_of(name);
    if (kind <= ROPE_SCALING_NONE) {
        snprintf(err, errlen, "%s: attribute rope_scaling '%s' is not linear or llama3", path, name);
        return -1;
    }
    cfg->rope_scaling = (rope_scaling_t)kind;
    if (h5store_get_double(h, "rope_factor", &d, err, errlen) != 0)
        return -1;
    cfg->rope_factor = (float)d;
    if (kind != ROPE_SCALING_LLAMA3)
        return 0;
    if (h5store_get_double(h, "rope_low_freq_factor", &d, err, errlen) != 0)
        return -1;
    cfg->rope_low_freq_factor = (float)d;
    if (h5store_get_double(h, "rope_high_freq_factor", &d, err, errlen) != 0)
        return -1;
    cfg->rope_high_freq_factor = (float)d;
    if (h5store_get_int(h, "rope_original_max_seq", &v, err, errlen) != 0)
        return -1;
    if (v <= 0 || v > INT32_MAX) {
        snprintf(err, errlen, "%s: attribute rope_original_max_seq = %lld is not a length", path, (long long)v);
        return -1;
    }
    cfg->rope_original_max_seq = (int)v;
    return 0;
}

int param_io_read_model(h5store_t *h, model_config_t *cfg, const char *path, char *err, size_t errlen)
{
    char arch[64];
    int64_t v[6];
    double eps, theta;
    const char *ikeys[6] = {"vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff"};
    memset(cfg, 0, sizeof *cfg);
    if (h5store_get_str(h, "arch", arch, sizeof arch, err, errlen) != 0)
        return -1;
    if (strcmp(arch, model_arch_name(ARCH_GPT2)) == 0) {
        cfg->arch = ARCH_GPT2;
    } else if (strcmp(arch, model_arch_name(ARCH_LLAMA)) == 0) {
        cfg->arch = ARCH_LLAMA;
    } else {
        snprintf(err, errlen, "%s holds a model of arch '%s': this program knows %s and %s", path, arch,
                 model_arch_name(ARCH_GPT2), model_arch_name(ARCH_LLAMA));
        return -1;
    }
    for (int i = 0; i < 6; i++) {
        if (h5store_get_int(h, ikeys[i], &v[i], err, errlen) != 0)
            return -1;
        if (v[i] <= 0 || v[i] > INT32_MAX) {
            snprintf(err, errlen, "%s: attribute %s = %lld is not a model size", path, ikeys[i], (long long)v[i]);
            return -1;
        }
    }
    int64_t max_seq;
    if (h5store_get_int(h, "max_seq", &max_seq, err, errlen) != 0 ||
        h5store_get_double(h, "norm_eps", &eps, err, errlen) != 0 ||
        h5store_get_double(h, "rope_theta", &theta, err, errlen) != 0)
        return -1;
    if (max_seq <= 0 || max_seq > INT32_MAX) {
        snprintf(err, errlen, "%s: attribute max_seq = %lld is not a model size", path, (long long)max_seq);
        return -1;
    }
    cfg->vocab_size = (int)v[0];
    cfg->n_layer = (int)v[1];
    cfg->n_head = (int)v[2];
    cfg->n_kv_head = (int)v[3];
    cfg->d_model = (int)v[4];
    cfg->d_ff = (int)v[5];
    cfg->max_seq = (int)max_seq;
    cfg->norm_eps = (float)eps;
    cfg->rope_theta = (float)theta;
    if (read_model_options(h, cfg, path, err, errlen) != 0)
        return -1;
    char why[512];
    if (model_config_check(cfg, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s holds an inconsistent model: %s", path, why);
        return -1;
    }
    return 0;
}

int param_io_check_model(h5store_t *h, const model_config_t *cfg, const char *path, char *err, size_t errlen)
{
    h5store_attr_t want[PARAM_IO_MODEL_ATTRS];
    const int n = param_io_model_attrs(cfg, want);
    /* the optional attributes both ways: a file's model may have one this
     * run's lacks, which the loop below would not look for */
    model_config_t in_file = *cfg;
    if (read_model_options(h, &in_file, path, err, errlen) != 0)
        return -1;
    if (in_file.moe.experts != cfg->moe.experts) {
        snprintf(err, errlen, "%s holds a model with %d experts per MoE layer, this run's has %d (same --model and --moe-* options as the run that wrote it?)",
                 path, in_file.moe.experts, cfg->moe.experts);
        return -1;
    }
    if (in_file.moe.shared_gate != cfg->moe.shared_gate) {
        snprintf(err, errlen,
                 "%s holds a model with moe_shared_gate %d, this run's has %d (same --model and --moe-* options as the "
                 "run that wrote it?)",
                 path, in_file.moe.shared_gate, cfg->moe.shared_gate);
        return -1;
    }
    if (in_file.head_dim != cfg->head_dim || in_file.attn_bias != cfg->attn_bias || in_file.qk_norm != cfg->qk_norm ||
        in_file.rope_scaling != cfg->rope_scaling || in_file.tie_embed != cfg->tie_embed) {
        snprintf(err, errlen,
                 "%s holds a model with head_dim %d, attn_bias %d, qk_norm %d, tie_embed %d, rope scaling %s; this "
                 "run's has %d, %d, %d, %d, %s (same --model as the run that wrote it?)",
                 path, in_file.head_dim, in_file.attn_bias, in_file.qk_norm, in_file.tie_embed,
                 model_rope_scaling_name(in_file.rope_scaling), cfg->head_dim, cfg->attn_bias, cfg->qk_norm,
                 cfg->tie_embed, model_rope_scaling_name(cfg->rope_scaling));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const h5store_attr_t *a = &want[i];
        if (a->type == H5STORE_STR) {
            char got[64];
            if (h5store_get_str(h, a->key, got, sizeof got, err, errlen) != 0)
                return -1;
            if (strcmp(got, a->s) != 0) {
                snprintf(err, errlen,
                         "%s holds a model with %s %s, this run's model has %s %s (same --model "
                         "and shape options as the run that wrote it?)",
                         path, a->key, got, a->key, a->s);
                return -1;
            }
        } else if (a->type == H5STORE_INT) {
            int64_t got;
            if (h5store_get_int(h, a->key, &got, err, errlen) != 0)
                return -1;
            if (got != a->i) {
                snprintf(err, errlen,
                         "%s holds a model with %s %lld, this run's model has %s %lld (same --model "
                         "and shape options as the run that wrote it?)",
                         path, a->key, (long long)got, a->key, (long long)a->i);
                return -1;
            }
        } else {
            double got;
            if (h5store_get_double(h, a->key, &got, err, errlen) != 0)
                return -1;
            if ((float)got != (float)a->d) {
                snprintf(err, errlen, "%s holds a model with %s %g, this run's model has %s %g", path, a->key, got,
                         a->key, a->d);
                return -1;
            }
        }
    }
    return 0;
}

/* The table of the whole model on one rank, so the list is the same on
 * every rank. Vocabulary chunks hold padding rows' worth, so every chunk of
 * a tensor has one shape. */
int param_io_tensors(const model_config_t *cfg, const param_io_group_t *groups, int n_groups, int tp_size,
                     h5store_tensor_t **out, int *n_out, char *err, size_t errlen)
{
    param_table_t whole;
    if (param_table_build(&whole, cfg, NULL, err, errlen) != 0)
        return -1;
    h5store_tensor_t *t = calloc((size_t)whole.n * (size_t)n_groups, sizeof *t);
    if (!t) {
        param_table_free(&whole);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int64_t vrows = param_padded_vocab(cfg->vocab_size, tp_size) / tp_size;
    for (int g = 0; g < n_groups; g++)
        for (int i = 0; i < whole.n; i++) {
            const param_desc_t *d = &whole.p[i];
            h5store_tensor_t *x = &t[g * whole.n + i];
            snprintf(x->name, sizeof x->name, "%s/%s", groups[g].prefix, d->name);
            x->ndim = d->ndim;
            x->shape[0] = d->shape[0];
            x->shape[1] = d->shape[1];
            x->chunk[0] = d->shape[0];
            x->chunk[1] = d->shape[1];
            if (d->tp_split == TP_SPLIT_ROWS) /* a stack of experts: each block's slice */
                x->chunk[0] = d->shape[0] / (d->groups > 1 ? d->groups : 1) / tp_size;
            else if (d->tp_split == TP_SPLIT_COLS)
                x->chunk[1] = d->shape[1] / tp_size;
            if (d->expert && d->groups <= 1) /* one expert's rows: the part --ep splits */
                x->chunk[0] = d->shape[0] / cfg->moe.experts;
            else if (d->tp_split == TP_SPLIT_VOCAB)
                x->chunk[0] = vrows < d->shape[0] ? vrows : d->shape[0];
        }
    *out = t;
    *n_out = whole.n * n_groups;
    param_table_free(&whole);
    return 0;
}

/* Shards a table's tensors can need, over n_groups groups (a stack of
 * experts needs one per block). */
static size_t shard_slots(const param_table_t *t, int n_groups)
{
    size_t n = 1;
    for (int i = 0; i < t->n; i++)
        n += (size_t)(t->p[i].groups > 1 ? t->p[i].groups : 1) * (size_t)n_groups;
    return n;
}

static int tensor_index(const h5store_tensor_t *t, int n, const char *prefix, const char *name)
{
    char full[H5STORE_NAME_MAX];
    snprintf(full, sizeof full, "%s/%s", prefix, name);
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, full) == 0)
            return i;
    return -1;
}

/* This rank's shards: all = every tensor of the table (reading), else only
 * those it writes (writer: PARAM_IO_WRITE_*). */
static int table_shards(const param_table_t *t, const param_io_group_t *groups, int n_groups,
                        const h5store_tensor_t *tensors, int nt, int all, int writer, int tp_rank,
                        h5store_shard_t *shards, int *ns, char *err, size_t errlen)
{
    int n = 0;
    for (int g = 0; g < n_groups; g++)
        for (int i = 0; i < t->n; i++) {
            const param_desc_t *d = &t->p[i];
            if (d->count[0] == 0)
                continue;
            if (!all && (d->tied_copy || (d->tp_split == TP_SPLIT_NONE && !d->ep_spans_tp && tp_rank != 0) ||
                         !(writer & (d->expert ? PARAM_IO_WRITE_EXPERTS : PARAM_IO_WRITE_DENSE))))
                continue;
            int k = tensor_index(tensors, nt, groups[g].prefix, d->name);
            if (k < 0) {
                snprintf(err, errlen, "internal error: tensor %s is not in the model's table", d->name);
                return -1;
            }
            /* the real rows come first in the buffer, padding rows after;
             * a stack of experts is one hyperslab per block of rows held */
            const int64_t blk = d->shape[0] / (d->groups > 1 ? d->groups : 1);
            for (int j = 0; j < d->held; j++)
                shards[n++] = (h5store_shard_t){
                    .tensor = k,
                    .start = {(d->group0 + j) * blk + d->start[0], d->start[1]},
                    .count = {d->count[0], d->count[1]},
                    .buf = groups[g].buf + d->offset + (size_t)j * (size_t)d->count[0] * (size_t)d->count[1]};
        }
    *ns = n;
    return 0;
}

int param_io_write(comm_t *world, const char *path, const model_config_t *cfg, const param_table_t *t,
                   const param_io_group_t *groups, int n_groups, int writer, int tp_size, int tp_rank,
                   const h5store_attr_t *attrs, int n_attrs, char *err, size_t errlen)
{
    h5store_tensor_t *tensors = NULL;
    h5store_shard_t *shards = calloc(shard_slots(t, n_groups), sizeof *shards);
    int nt = 0, ns = 0, rc = 0;
    if (!shards) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    if (rc == 0)
        rc = param_io_tensors(cfg, groups, n_groups, tp_size, &tensors, &nt, err, errlen);
    if (rc == 0 && writer)
        rc = table_shards(t, groups, n_groups, tensors, nt, 0, writer, tp_rank, shards, &ns, err, errlen);
    /* a failure above is agreed on, so every rank skips the write together */
    rc = agree(world, rc, err, errlen);
    /* the file is written over world's own MPI communicator (a writer
     * thread's is not the main thread's) */
    MPI_Comm mc = MPI_COMM_WORLD;
    if (rc == 0 && comm_mpi_handle(world, &mc) != 0)
        mc = MPI_COMM_WORLD;
    if (rc == 0)
        rc = h5store_write(path, mc, tensors, nt, shards, ns, attrs, n_attrs, err, errlen);
    free(tensors);
    free(shards);
    return rc;
}

int param_io_read(comm_t *world, h5store_t *h, const model_config_t *cfg, const param_table_t *t,
                  const param_io_group_t *groups, int n_groups, char *err, size_t errlen)
{
    h5store_tensor_t *tensors = NULL;
    h5store_shard_t *shards = calloc(shard_slots(t, n_groups), sizeof *shards);
    int nt = 0, ns = 0, rc = 0;
    if (!shards) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    if (rc == 0)
        rc = param_io_tensors(cfg, groups, n_groups, 1, &tensors, &nt, err, errlen);
    if (rc == 0)
        rc = table_shards(t, groups, n_groups, tensors, nt, 1, 0, 0, shards, &ns, err, errlen);
    /* h5store_read_verify checks every listed tensor's shape (the chunk
     * field is not compared, so the reader's layout is free) and every
     * checksum in the file, reading the file once where the ranks' reads
     * cover it */
    rc = agree(world, rc, err, errlen);
    if (rc == 0)
        rc = h5store_read_verify(h, tensors, nt, shards, ns, err, errlen);
    free(tensors);
    free(shards);
    return rc;
}
