#include "src/serve/serve_options.h"

#include <string.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/cli/optable.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

#define PROG "dtrain-serve"

#define F(field) offsetof(serve_opts_t, field)
#define S(field) sizeof(((serve_opts_t *)0)->field)
/* clang-format off */
static const opt_def_t opt_defs[] = {
    {"init-from", OPT_STR, F(init_from), S(init_from), "", 0, 0, NULL,
     "the model: a dtrain checkpoint or --save-params file (HDF5), a Hugging\n"
     "Face model directory (GPT2LMHeadModel, LlamaForCausalLM, ...) or an\n"
     "llm.c GPT-2 model file; each rank reads only its slices (required)",
     "PATH", NULL, 0},
    {"tp", OPT_INT, F(tp), 0, "1", 1, 4096, NULL, "tensor-parallel ranks (divides the heads, KV heads and FFN width)",
     "N", NULL, 0},
    {"pp", OPT_INT, F(pp), 0, "1", 1, 4096, NULL, "pipeline stages (at most the layers); tp x pp = the ranks", "N", NULL,
     0},
    {"host", OPT_STR, F(host), S(host), "127.0.0.1", 0, 0, NULL,
     "the address rank 0 listens on (0.0.0.0 or :: for every interface)", "ADDR", NULL, 0},
    {"port", OPT_INT, F(port), 0, "8000", 0, 65535, NULL, "the TCP port (0: any free one; the port taken is printed)",
     "N", NULL, 0},
    {"model-name", OPT_STR, F(model_name), S(model_name), "", 0, 0, NULL,
     "the model's id in /v1/models and in requests' \"model\" (default: the\n"
     "base name of --init-from)",
     "NAME", NULL, 0},
    {"tokenizer", OPT_STR, F(tokenizer), S(tokenizer), "auto", 0, 0, NULL,
     "text <-> ids: auto (the one a dtrain file records, a Hugging Face\n"
     "directory's tokenizer.json, gpt2 for an llm.c file, byte for a\n"
     "256-token vocabulary) or a spec as dtrain --tokenizer takes it",
     "SPEC", NULL, 0},
    {"seq-len", OPT_INT, F(seq_len), 0, "0", 0, 1 << 24, NULL,
     "the context length: prompt plus max_tokens (0: the model's; GPT-2 at\n"
     "most its positions)",
     "N", NULL, 0},
    {"batch", OPT_INT, F(batch), 0, "8", 1, 65536, NULL,
     "prompts computed together in one forward (a request's prompts are cut\n"
     "into batches of at most N; memory grows with N x --seq-len)",
     "N", NULL, 0},
    {"max-body", OPT_LLONG, F(max_body), 0, "16777216", 1024, 1LL << 40, NULL,
     "the largest request body in bytes (larger: 413)", "BYTES", NULL, 0},
    {"max-queue", OPT_INT, F(max_queue), 0, "1024", 1, 1 << 20, NULL,
     "requests waiting for the model at most (more: 503, retry later)", "N", NULL, 0},
    {"seed", OPT_LLONG, F(seed), 0, "1337", 0, 9.2e18, NULL,
     "a request without \"seed\" samples with this plus its number", "N", NULL, 0},
    {"threads", OPT_INT, F(threads), 0, "0", 0, 4096, NULL,
     "OpenMP/OpenBLAS threads per rank (0: OMP_NUM_THREADS, else the node's\n"
     "cores shared by its ranks)",
     "N", NULL, 0},
    {"device", OPT_ENUM, F(device), 0, "auto", 0, 0, backend_device_names,
     "auto|cpu|cuda (auto: cuda when built with it and a GPU is visible)", "NAME", NULL, 0},
    {"dtype", OPT_ENUM, F(dtype), 0, "auto", 0, 0, backend_dtype_names,
     "auto|fp32|bf16: the matmuls' precision (auto: bf16 on cuda, fp32 on cpu)", "NAME", NULL, 0},
};
/* clang-format on */
#undef F
#undef S
static const opt_table_t opt_table = {.prog = PROG, .defs = opt_defs, .n = sizeof opt_defs / sizeof opt_defs[0]};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: mpirun -np TPxPP " PROG " --init-from PATH [--tp N] [--pp N] [--port N] [OPTION]...\n"
            "Serve a model over HTTP as OpenAI's legacy completions API, the way lm-evaluation-harness's\n"
            "local-completions model calls it: POST /v1/completions (prompts as text or token ids, batched;\n"
            "echo, logprobs, max_tokens, temperature, top_k, stop, seed), GET /v1/models, GET /health.\n"
            "Rank 0 answers HTTP; every rank computes its part of each batch. SIGTERM stops every rank.\n"
            "See doc/eval.md.\n"
            "\n");
    opt_print_help(&opt_table, f, 20, 1);
}

serve_opts_status_t serve_opts_parse(serve_opts_t *o, int argc, char **argv, int print, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (opt_answer_help(argc, argv, print, usage, PROG " " PACKAGE_VERSION))
        return SERVE_OPTS_EXIT_OK;
    if (opt_defaults(&opt_table, o, err, errlen) != 0 ||
        opt_parse_argv(&opt_table, argc, argv, o, NULL, NULL, NULL, err, errlen) != 0)
        return SERVE_OPTS_ERROR;
    if (!o->init_from[0]) {
        snprintf(err, errlen, "--init-from PATH is required: the checkpoint, parameter file or model directory to serve");
        return SERVE_OPTS_ERROR;
    }
    if (!o->host[0]) {
        snprintf(err, errlen, "--host '': give an address to listen on (127.0.0.1, 0.0.0.0, ::)");
        return SERVE_OPTS_ERROR;
    }
    if (!o->model_name[0]) {
        const char *p = o->init_from + strlen(o->init_from);
        while (p > o->init_from && p[-1] == '/')
            p--;
        const char *end = p;
        while (p > o->init_from && p[-1] != '/')
            p--;
        snprintf(o->model_name, sizeof o->model_name, "%.*s", (int)(end - p), p);
    }
    return SERVE_OPTS_OK;
}

void serve_opts_print(const serve_opts_t *o, FILE *out) { opt_print_values(&opt_table, o, out); }
