#include "src/serve/serve_model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <mpi.h>

#include "io/h5store.h"
#include "mpi/agree.h"
#include "mpi/clock.h"
#include "src/backend/ops_cpu.h"
#include "src/ckpt/param_io.h"
#include "src/convert/hf_import.h"
#include "src/train/options.h"
#include "src/train/train.h"

/* What the path holds, by content: an HDF5 file (a dtrain checkpoint or
 * parameter file), else whatever dtrain --init-from takes. */
typedef enum { SRC_H5, SRC_IMPORT } src_kind_t;

static int is_hdf5(const char *path)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    const int yes = fread(head, 1, sizeof head, f) == sizeof head && memcmp(head, sig, sizeof sig) == 0;
    fclose(f);
    return yes;
}

/* The HDF5 file's content and model, with the tokenizer it records
 * (tok: spec, tok_sha: its vocabulary's sha256; "" when none). */
static int h5_model(h5store_t *h, const char *path, model_config_t *cfg, char *source, size_t srclen, char *tok,
                    char *tok_sha, char *err, size_t errlen)
{
    char content[64] = "";
    tok[0] = tok_sha[0] = '\0';
    if (h5store_get_str(h, "content", content, sizeof content, err, errlen) != 0)
        return -1;
    if (strcmp(content, "params") != 0 && strcmp(content, "checkpoint") != 0) {
        snprintf(err, errlen,
                 "--init-from %s holds content '%s': dtrain-serve reads dtrain checkpoints and parameter files "
                 "(content checkpoint or params), Hugging Face directories and llm.c files",
                 path, content);
        return -1;
    }
    snprintf(source, srclen, "dtrain %s", strcmp(content, "params") == 0 ? "parameter file" : "checkpoint");
    if (h5store_has_attr(h, "tokenizer") && h5store_get_str(h, "tokenizer", tok, TOK_PATH_MAX, err, errlen) != 0)
        return -1;
    if (h5store_has_attr(h, "tokenizer_sha256") &&
        h5store_get_str(h, "tokenizer_sha256", tok_sha, 80, err, errlen) != 0)
        return -1;
    return param_io_read_model(h, cfg, path, err, errlen);
}

/* The model's shape from --init-from, checked against the layout and the
 * context length. Collective (the HDF5 store opens on every rank). */
static int probe(serve_model_t *sm, const serve_opts_t *o, src_kind_t kind, h5store_t **h, char *tok, char *tok_sha,
                 char *err, size_t errlen)
{
    int rc = 0;
    tok[0] = tok_sha[0] = '\0';
    if (kind == SRC_H5) {
        *h = h5store_open(o->init_from, MPI_COMM_WORLD, err, errlen);
        if (!*h)
            return -1;
        rc = h5_model(*h, o->init_from, &sm->cfg, sm->source, sizeof sm->source, tok, tok_sha, err, errlen);
    } else {
        init_from_kind_t k;
        char dir[TOK_PATH_MAX - 8];
        rc = init_from_probe(o->init_from, &k, dir, sizeof dir, &sm->cfg, err, errlen);
        if (rc == 0 && k == INIT_FROM_HF) {
            snprintf(sm->source, sizeof sm->source, "Hugging Face");
            snprintf(tok, TOK_PATH_MAX, "hf:%s", dir);
            char tj[SERVE_PATH_MAX + 32];
            struct stat st;
            snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
            if (stat(tj, &st) != 0)
                tok[0] = '\0';
        } else if (rc == 0) {
            snprintf(sm->source, sizeof sm->source, "llm.c");
            snprintf(tok, TOK_PATH_MAX, "gpt2");
        }
    }
    if (rc == 0)
        rc = options_check_grid(&sm->cfg, o->tp, o->pp, err, errlen);
    sm->T = o->seq_len ? o->seq_len : sm->cfg.max_seq;
    if (rc == 0 && sm->cfg.arch == ARCH_GPT2 && sm->T > sm->cfg.max_seq) {
        snprintf(err, errlen, "--seq-len %d exceeds the model's %d positions (GPT-2 learns one embedding per position)",
                 sm->T, sm->cfg.max_seq);
        rc = -1;
    }
    sm->B = o->batch;
    return rc;
}

/* Rank 0's tokenizer: --tokenizer, else the one the file names (a dtrain
 * file's must be the vocabulary it was trained with), else byte for 256
 * tokens. */
static int open_tokenizer(serve_model_t *sm, const serve_opts_t *o, const char *tok, const char *tok_sha, char *err,
                          size_t errlen)
{
    char why[768];
    const char *spec = strcmp(o->tokenizer, "auto") != 0 ? o->tokenizer : tok[0] ? tok : NULL;
    if (!spec && sm->cfg.vocab_size == 256)
        spec = "byte";
    if (!spec) {
        snprintf(err, errlen,
                 "--tokenizer auto: %s records no tokenizer and its vocabulary is %d tokens: give --tokenizer SPEC "
                 "(gpt2, hf:DIR, tiktoken:FILE, spm:MODEL, byte)",
                 o->init_from, sm->cfg.vocab_size);
        return -1;
    }
    if (tokenizer_open(&sm->tk, spec, 0, why, sizeof why) != 0) {
        snprintf(err, errlen, "--tokenizer %s%s: %s", spec, spec == o->tokenizer ? "" : " (auto)", why);
        return -1;
    }
    snprintf(sm->tk_from, sizeof sm->tk_from, "%s",
             spec == o->tokenizer ? "--tokenizer"
             : spec == tok        ? (strncmp(sm->source, "dtrain", 6) == 0 ? "recorded in the file" : "the model's")
                                  : "a 256-token vocabulary");
    if (spec == tok && tok_sha[0] && strcmp(tok_sha, sm->tk->vocab_sha256) != 0) {
        snprintf(err, errlen,
                 "--tokenizer auto: %s was trained with tokenizer %s of sha256 %.12s..., but that file now has "
                 "%.12s...: give --tokenizer SPEC with the original vocabulary",
                 o->init_from, spec, tok_sha, sm->tk->vocab_sha256);
        return -1;
    }
    if (sm->tk->vocab_size > sm->cfg.vocab_size) {
        snprintf(err, errlen, "--tokenizer %s has %d tokens, more than the model's vocabulary of %d", spec,
                 sm->tk->vocab_size, sm->cfg.vocab_size);
        return -1;
    }
    return 0;
}

/* This rank's stage and slice: balanced stages, the remainder to the
 * first ones (dtrain's default split); one slot; full recompute, so a
 * forward keeps no block's activations but the residual stream. */
static model_layout_t stage_layout(const serve_model_t *sm)
{
    const grid_t *g = &sm->net;
    model_layout_t lay = model_layout_single(&sm->cfg);
    const int L = sm->cfg.n_layer, pp = g->pp_size;
    int begin = 0;
    for (int s = 0; s < g->pp_rank; s++)
        begin += L / pp + (s < L % pp);
    lay.part = param_layout_range(g->tp_size, g->tp_rank, begin, begin + L / pp + (g->pp_rank < L % pp),
                                  g->pp_rank == 0, g->pp_rank == pp - 1);
    lay.tp = g->tp;
    lay.n_slots = 1;
    lay.recompute = MODEL_RECOMPUTE_FULL;
    return lay;
}

/* The file's expert bias (param_io_read_moe_bias) into the model. */
static int moe_bias_load(serve_model_t *sm, h5store_t *h, char *err, size_t errlen)
{
    float *bias = malloc((size_t)sm->cfg.n_layer * (size_t)sm->cfg.moe.experts * sizeof *bias);
    if (!bias) {
        snprintf(err, errlen, "out of memory for the expert bias");
        return -1;
    }
    const int rc = param_io_read_moe_bias(h, &sm->cfg, bias, "the parameters file", err, errlen);
    if (rc == 0)
        model_moe_bias_set(&sm->model, bias);
    free(bias);
    return rc;
}

/* The parameters into this rank's model. Collective. */
static int load_params(serve_model_t *sm, const serve_opts_t *o, src_kind_t kind, h5store_t *h, char *err,
                       size_t errlen)
{
    model_t *m = &sm->model;
    float *in_place = model_params_in_place(m);
    float *host = in_place ? in_place : malloc(m->table.numel * sizeof *host + 1);
    int rc = host ? 0 : -1;
    if (!host)
        snprintf(err, errlen, "out of memory for the parameters (%zu floats)", m->table.numel);
    rc = agree(sm->grid.world, rc, err, errlen);
    const double t0 = now_s();
    if (rc == 0 && kind == SRC_H5) {
        const param_io_group_t g = {"params", host};
        rc = param_io_read(sm->grid.world, h, &sm->cfg, &m->table, &g, 1, err, errlen);
        if (rc == 0 && model_moe_has_bias(&sm->cfg)) /* the trained expert bias routes as in training */
            rc = agree(sm->grid.world, moe_bias_load(sm, h, err, errlen), err, errlen);
    } else if (rc == 0) {
        init_from_report_t rep;
        rc = agree(sm->grid.world,
                   init_from_load(o->init_from, &sm->cfg, &m->table, host, !in_place, &rep, err, errlen), err, errlen);
    }
    double t = now_s() - t0;
    char cerr[COMM_ERR_MAX];
    if (rc == 0 && sm->grid.world->ops->allreduce(sm->grid.world, &t, 1, COMM_FP64, COMM_MAX, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "the all-reduce of the load time failed: %s", cerr);
        rc = -1;
    }
    sm->load_s = t;
    if (rc == 0) {
        if (in_place)
            model_params_written(m);
        else
            model_params_from_host(m, host);
    }
    if (!in_place)
        free(host);
    return rc;
}

int serve_model_open(serve_model_t *sm, const serve_opts_t *o, const launch_env_t *env, char *err, size_t errlen)
{
    memset(sm, 0, sizeof *sm);
    if (env->world_size != o->tp * o->pp) {
        snprintf(err, errlen,
                 "%d rank%s for --tp %d x --pp %d: dtrain-serve runs one copy of the model, start tp x pp = %d ranks",
                 env->world_size, env->world_size == 1 ? "" : "s", o->tp, o->pp, o->tp * o->pp);
        return agree(env->world, -1, err, errlen) == STATUS_OK ? 0 : -1;
    }
    /* rank 0 looks at the path; the verdict is everyone's */
    int kind = SRC_IMPORT, rc = 0;
    struct stat st;
    if (env->world_rank == 0) {
        if (stat(o->init_from, &st) != 0) {
            snprintf(err, errlen, "--init-from %s: %s", o->init_from, strerror(errno));
            rc = -1;
        }
        kind = rc == 0 && S_ISREG(st.st_mode) && is_hdf5(o->init_from) ? SRC_H5 : SRC_IMPORT;
    }
    char cerr[COMM_ERR_MAX];
    if (agree(env->world, rc, err, errlen) != 0)
        return -1;
    if (env->world->ops->broadcast(env->world, &kind, 1, COMM_INT32, 0, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "broadcasting the model's kind failed: %s", cerr);
        return -1;
    }
    char gerr[COMM_ERR_MAX] = "";
    rc = grid_create(&sm->grid, o->tp, o->pp, 1, gerr, sizeof gerr) != STATUS_OK ? -1 : 0;
    if (agree(env->world, rc, gerr, sizeof gerr) != 0) {
        snprintf(err, errlen, "%s", gerr);
        return -1;
    }
    sm->has_grid = 1;
    h5store_t *h = NULL;
    char tok[TOK_PATH_MAX], tok_sha[80];
    rc = probe(sm, o, (src_kind_t)kind, &h, tok, tok_sha, err, errlen);
    if (rc == 0 && env->world_rank == 0)
        rc = open_tokenizer(sm, o, tok, tok_sha, err, errlen);
    if (rc == 0)
        sm->threads = ops_cpu_threads(trainer_default_threads(o->threads, env));
    if (agree(env->world, rc, err, errlen) == 0 &&
        agree(env->world, backend_open(&sm->backend, o->device, o->dtype, env->local_rank, err, errlen), err, errlen) ==
            0 &&
        agree(env->world, backend_comm_open(&sm->backend, BACKEND_COMM_AUTO, &sm->grid, &sm->net, 0, err, errlen), err,
              errlen) == 0) {
        sm->has_net = 1;
        model_layout_t lay = stage_layout(sm);
        lay.bf16 = backend_bf16(&sm->backend);
        rc = 0;
        if (lay.bf16 && !sm->backend.ops->matmul_fwd_bf16) {
            snprintf(err, errlen, "--dtype bf16: the %s backend has no bf16 GEMM; use --dtype fp32",
                     sm->backend.ops->name);
            rc = -1;
        }
        if (rc == 0)
            rc = model_create(&sm->model, &sm->cfg, sm->backend.ops, &lay, sm->B, sm->T, err, errlen);
        if (agree(env->world, rc, err, errlen) == 0)
            rc = load_params(sm, o, (src_kind_t)kind, h, err, errlen);
        else
            rc = -1;
    } else {
        rc = -1;
    }
    if (h && h5store_close(h, cerr, sizeof cerr) != 0 && rc == 0) {
        snprintf(err, errlen, "closing %s: %s", o->init_from, cerr);
        rc = -1;
    }
    return agree(env->world, rc, err, errlen) == STATUS_OK ? 0 : -1;
}

void serve_model_close(serve_model_t *sm)
{
    if (sm->model.ops)
        model_destroy(&sm->model);
    backend_close(&sm->backend);
    if (sm->has_grid)
        grid_destroy(&sm->grid);
    tokenizer_close(sm->tk);
    memset(sm, 0, sizeof *sm);
}
