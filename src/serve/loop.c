#include "src/serve/loop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "mpi/agree.h"
#include "mpi/clock.h"
#include "mpi/launch.h"
#include "src/serve/engine.h"
#include "src/serve/response.h"
#include "src/serve/tokenize.h"

#define POLL_S 0.5   /* how often rank 0 asks for the stop signals */
#define WAIT_MS 100  /* how long it waits for a request between checks of its own */

/* The stop sequences of rank 0's request, for the engine. */
typedef struct stop_ctx {
    const serve_req_t *r;
    tokenizer_t *tk;
} stop_ctx_t;

static int stop_check(void *ctx, int row, const int32_t *gen, int n, long *cut)
{
    const stop_ctx_t *s = ctx;
    (void)row;
    if (s->r->n_stop == 0)
        return 0;
    tok_bytes_t b = {0};
    long at = -1;
    if (serve_decode(s->tk, gen, (size_t)n, &b) == 0)
        at = serve_stop_find(s->r, b.data ? b.data : "", b.n);
    free(b.data);
    *cut = at;
    return at >= 0;
}

/* A failure outside a job's agreement (dealing a job out or taking one,
 * the stop poll): the ranks no longer meet in the same calls, so the job
 * ends here rather than hang. */
static void abort_job(const serve_model_t *sm, const char *err)
{
    fprintf(stderr, "dtrain-serve: error: rank %d: %s\n", sm->grid.world_rank, err);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One request: checked (refused with its 4xx), computed with every rank,
 * answered. -1 when the computation failed on some rank (then answered
 * 500): the ranks cannot be trusted to agree any more. */
static int handle(serve_model_t *sm, serve_http_t *h, serve_call_t *c, const serve_opts_t *o, serve_stats_t *st,
                  char *err, size_t errlen)
{
    size_t len;
    const char *body = serve_call_body(c, &len);
    if (serve_call_kind(c) != SERVE_CALL_COMPLETIONS) { /* rank 0's tokenizer alone */
        char *json, why[1024];
        const int code = serve_call_kind(c) == SERVE_CALL_TOKENIZE
                           ? serve_tokenize(body, len, sm->tk, sm->T, &json, why, sizeof why)
                           : serve_detokenize(body, len, sm->tk, sm->cfg.vocab_size, &json, why, sizeof why);
        st->requests++;
        st->refused += code != 0;
        serve_http_answer(h, c, code ? code : json ? 200 : 500, code ? serve_error_json(code, why) : json);
        return 0;
    }
    const serve_limits_t lim = {.vocab = sm->cfg.vocab_size, .ctx = sm->T, .model_name = o->model_name};
    serve_req_t r;
    serve_out_t out;
    char why[1024];
    const unsigned long long id = ++st->requests;
    const int status = serve_req_parse(&r, body, len, &lim, sm->tk, why, sizeof why);
    if (status != 0) {
        st->refused++;
        serve_http_answer(h, c, status, serve_error_json(status, why));
        serve_req_free(&r);
        return 0;
    }
    if (serve_out_alloc(&out, &r) != 0) {
        st->refused++;
        serve_http_answer(h, c, 503, serve_error_json(503, "out of memory for the results: send fewer prompts"));
        serve_req_free(&r);
        return 0;
    }
    const uint64_t seed = r.has_seed ? r.seed : (uint64_t)o->seed + id;
    const serve_job_t job = serve_job_of(&r, seed);
    stop_ctx_t sc = {.r = &r, .tk = sm->tk};
    const double t0 = now_s();
    if (serve_job_send(sm, SERVE_JOB_RUN, &r, seed, err, errlen) != 0)
        abort_job(sm, err);
    int rc = serve_engine_run(sm, &job, &r, &out, stop_check, &sc, err, errlen);
    rc = agree(sm->grid.world, rc, err, errlen) == STATUS_OK ? 0 : -1;
    st->busy_s += now_s() - t0;
    if (rc == 0) {
        st->prompts += (unsigned long long)r.n;
        st->prompt_tokens += (unsigned long long)r.off[r.n];
        for (int i = 0; i < r.n; i++)
            st->generated += (unsigned long long)out.gen_n[i];
        char *json = serve_completion_json(&r, &out, sm->tk, o->model_name, id, (long long)time(NULL));
        serve_http_answer(h, c, json ? 200 : 500, json);
    } else {
        serve_http_answer(h, c, 500, serve_error_json(500, err));
    }
    serve_out_free(&out);
    serve_req_free(&r);
    return rc;
}

/* Every rank's stop signals, through a POLL job; *stop: some rank has one. */
static int poll_stop(serve_model_t *sm, int *stop, char *err, size_t errlen)
{
    if (serve_job_send(sm, SERVE_JOB_POLL, NULL, 0, err, errlen) != 0)
        return -1;
    return serve_job_poll(sm, stop, err, errlen);
}

int serve_lead(serve_model_t *sm, serve_http_t *h, const serve_opts_t *o, serve_stats_t *st, char *err,
               size_t errlen)
{
    double last_poll = now_s();
    for (;;) {
        serve_call_t *c = serve_http_next(h, WAIT_MS);
        if (c && handle(sm, h, c, o, st, err, errlen) != 0) {
            char e2[256];
            serve_job_send(sm, SERVE_JOB_STOP, NULL, 0, e2, sizeof e2);
            return -1;
        }
        if (launch_stop_signal() || now_s() - last_poll >= POLL_S) {
            int stop = 0;
            if (poll_stop(sm, &stop, err, errlen) != 0)
                abort_job(sm, err);
            last_poll = now_s();
            if (stop)
                return serve_job_send(sm, SERVE_JOB_STOP, NULL, 0, err, errlen);
        }
    }
}

int serve_follow(serve_model_t *sm, char *err, size_t errlen)
{
    for (;;) {
        serve_job_t job;
        serve_req_t r;
        if (serve_job_recv(sm, &job, &r, err, errlen) != 0)
            abort_job(sm, err);
        int rc = 0, stop = 0;
        if (job.kind == SERVE_JOB_STOP)
            return 0;
        if (job.kind == SERVE_JOB_POLL) {
            if (serve_job_poll(sm, &stop, err, errlen) != 0)
                abort_job(sm, err);
        } else {
            rc = serve_engine_run(sm, &job, &r, NULL, NULL, NULL, err, errlen);
            rc = agree(sm->grid.world, rc, err, errlen) == STATUS_OK ? 0 : -1;
        }
        serve_req_free(&r);
        if (rc != 0) {
            /* rank 0 says STOP after a failed job */
            char e2[256];
            serve_job_recv(sm, &job, &r, e2, sizeof e2);
            serve_req_free(&r);
            return -1;
        }
    }
}
