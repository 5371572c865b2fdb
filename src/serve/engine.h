/* dtrain-serve's compute: one request's prompts through the model on
 * every rank together. Rank 0 deals the job out (serve_job_send), the
 * other ranks wait for it (serve_job_recv); then every rank runs
 * serve_engine_run, which cuts the prompts into batches of at most B rows
 * (longest first, so a batch's rows are of similar length and little of
 * it is padding), runs each batch's forward through the pipeline, scores
 * the echoed prompt (log-probabilities of its tokens and the most likely
 * alternatives, model_token_logprobs) and generates up to max_tokens
 * tokens per row, one forward per token (no cache of keys and values:
 * each step recomputes the whole row, as dtrain's sampler does). The
 * last stage picks each row's next token with dtrain's sampler
 * (sample_next) and sends its picks to rank 0, which decides where a stop
 * sequence ends a row and tells every rank. */
#ifndef DTRAIN_SERVE_ENGINE_H
#define DTRAIN_SERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "src/serve/request.h"
#include "src/serve/result.h"
#include "src/serve/serve_model.h"

/* What rank 0 tells the others: a job to run, a poll of their stop
 * signals, or the end. */
typedef enum { SERVE_JOB_RUN = 1, SERVE_JOB_POLL = 2, SERVE_JOB_STOP = 3 } serve_job_kind_t;

typedef struct serve_job {
    int32_t kind;
    int32_t n, total; /* prompts, their tokens */
    int32_t echo, logprobs, max_tokens, top_k, pad;
    double temperature;
    uint64_t seed;
} serve_job_t;

/* Rank 0's part in generation: whether prompt `row`'s completion, its
 * ids gen[0..n) so far, is ended by a stop sequence (then *cut: the bytes
 * of its text to keep). */
typedef int (*serve_stop_fn)(void *ctx, int row, const int32_t *gen, int n, long *cut);

/* Rank 0: r's job as the other ranks need it. Collective over the world
 * (the job's header to each rank, then its prompts broadcast). */
int serve_job_send(serve_model_t *sm, serve_job_kind_t kind, const serve_req_t *r, uint64_t seed, char *err,
                   size_t errlen);

/* The other ranks: waits (sleeping between polls, not spinning) for rank
 * 0's next job; for a run, its prompts into r (off, tok). */
int serve_job_recv(serve_model_t *sm, serve_job_t *job, serve_req_t *r, char *err, size_t errlen);

/* Every rank: the POLL job's agreement on the stop signals. *stop: some
 * rank has one. */
int serve_job_poll(serve_model_t *sm, int *stop, char *err, size_t errlen);

/* Every rank, after a run job reached all (r: the prompts, job: its
 * settings): computes it. On rank 0 out (allocated with serve_out_alloc)
 * receives the results and stop is asked after each token. Collective;
 * -1 with one line in err on every rank that failed (the caller agrees). */
int serve_engine_run(serve_model_t *sm, const serve_job_t *job, const serve_req_t *r, serve_out_t *out,
                     serve_stop_fn stop, void *stop_ctx, char *err, size_t errlen);

/* serve_job_t of a request (what serve_job_send sends). */
serve_job_t serve_job_of(const serve_req_t *r, uint64_t seed);


#endif
