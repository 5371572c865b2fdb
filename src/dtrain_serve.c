/* dtrain-serve: a trained model behind OpenAI's legacy completions API, for
 * lm-evaluation-harness's local-completions model and anything else that
 * speaks it.
 *
 *   mpirun -np 4 dtrain-serve --init-from ckpt.h5 --tp 2 --pp 2 --port 8000
 *
 * Every rank holds its stage and tensor-parallel slice of the model
 * (src/serve/serve_model.h); rank 0 answers HTTP (src/serve/http.h) and
 * deals each request out to the others, and all compute it together
 * (src/serve/engine.h). SIGTERM (or SIGUSR1) on any rank stops every rank:
 * the queued requests are answered 503, exit status 0. Exit status 2 for
 * bad options or an unusable model, 1 when a computation failed. See
 * doc/eval.md and doc/dtrain-serve.1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "mpi/agree.h"
#include "mpi/launch.h"
#include "src/serve/http.h"
#include "src/serve/loop.h"
#include "src/serve/response.h"
#include "src/serve/serve_model.h"
#include "src/serve/serve_options.h"
#include "src/serve/tokenize.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

#define PROG "dtrain-serve"

static void banner(const serve_model_t *sm, const serve_opts_t *o, const launch_env_t *env)
{
    const grid_t *g = &sm->grid;
    const model_config_t *c = &sm->cfg;
    printf(PROG " %s | %d rank%s: tp %d x pp %d | %d thread%s per rank\n", PACKAGE_VERSION, g->world_size,
           g->world_size == 1 ? "" : "s", g->tp_size, g->pp_size, sm->threads, sm->threads == 1 ? "" : "s");
    launch_describe(env, stdout);
    printf("model %s: %s %s (%s): L=%d C=%d heads=%d kv_heads=%d ffn=%d vocab=%d | %zu parameters, read in %.2f s\n",
           o->model_name, sm->source, o->init_from, model_arch_name(c->arch), c->n_layer, c->d_model, c->n_head,
           c->n_kv_head, c->d_ff, c->vocab_size, model_params_total(c), sm->load_s);
    printf("tokenizer: %s (%s)\n", sm->tk->spec, sm->tk_from);
    printf("context: %d tokens (prompt + max_tokens); batch: %d prompts per forward\n", sm->T, sm->B);
    printf("backend: %s\n", sm->backend.desc);
    char att[320];
    backend_attention_desc(&sm->backend, model_head_size(c), att, sizeof att);
    printf("attention: %s\n", att);
    printf("configuration:\n");
    serve_opts_print(o, stdout);
}

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    serve_opts_t o;
    char err[1024] = "";
    const serve_opts_status_t st = serve_opts_parse(&o, argc, argv, env.world_rank == 0, err, sizeof err);
    if (st == SERVE_OPTS_EXIT_OK)
        launch_exit(&env, 0);
    if (st == SERVE_OPTS_ERROR) {
        if (env.world_rank == 0)
            fprintf(stderr, PROG ": error: %s\n", err);
        launch_exit(&env, 2);
    }
    /* a stop signal is a request to stop serving, taken between requests */
    if (launch_any_failed(&env, PROG, launch_catch_stop_signals() != 0,
                          "cannot install the SIGUSR1/SIGTERM handlers or ignore SIGPIPE: sigaction failed"))
        launch_exit(&env, 1);

    static serve_model_t sm;
    if (launch_any_failed(&env, PROG, serve_model_open(&sm, &o, &env, err, sizeof err) != 0, err)) {
        serve_model_close(&sm);
        launch_exit(&env, 2);
    }
    char *models = NULL, *tk_info = NULL;
    serve_http_t *http = NULL;
    int port = 0, rc = 0;
    if (env.world_rank == 0) {
        banner(&sm, &o, &env);
        models = serve_models_json(o.model_name, sm.T, (long long)time(NULL));
        tk_info = serve_tokenizer_info_json(sm.tk, sm.T);
        const serve_http_config_t hc = {.host = o.host,
                                        .port = o.port,
                                        .max_body = (size_t)o.max_body,
                                        .max_queue = o.max_queue,
                                        .models_json = models,
                                        .tokenizer_info_json = tk_info};
        rc = models && tk_info ? serve_http_start(&http, &hc, &port, err, sizeof err) : -1;
        if (!models || !tk_info)
            snprintf(err, sizeof err, "out of memory");
    }
    if (launch_any_failed(&env, PROG, rc, err)) {
        free(models);
        free(tk_info);
        serve_model_close(&sm);
        launch_exit(&env, 2);
    }
    if (env.world_rank == 0) {
        const int v6 = strchr(o.host, ':') != NULL;
        printf(PROG ": listening on http://%s%s%s:%d (POST /v1/completions, GET /v1/models, GET /health, "
                    "GET /tokenizer_info, POST /tokenize, POST /detokenize)\n",
               v6 ? "[" : "", o.host, v6 ? "]" : "", port);
        fflush(stdout);
    }
    serve_stats_t stats = {0};
    rc = env.world_rank == 0 ? serve_lead(&sm, http, &o, &stats, err, sizeof err) : serve_follow(&sm, err, sizeof err);
    if (env.world_rank == 0) {
        serve_http_stop(http, 5.0);
        printf(PROG ": %s: %llu requests (%llu refused), %llu prompts, %llu prompt tokens, %llu generated, %.1f s "
                    "computing\n",
               rc == 0 ? "stopped" : "failed", stats.requests, stats.refused, stats.prompts, stats.prompt_tokens,
               stats.generated, stats.busy_s);
        fflush(stdout);
    }
    free(models);
    free(tk_info);
    const int failed = launch_any_failed(&env, PROG, rc, err) != STATUS_OK;
    serve_model_close(&sm);
    launch_exit(&env, failed ? 1 : 0);
    return failed ? 1 : 0;
}
