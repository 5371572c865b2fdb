/* dtrain-serve's main loops: rank 0 takes the queued requests one at a
 * time (serve_lead), checks each (request.h), deals it out and computes
 * it with the others (engine.h) and answers it (response.h); every other
 * rank follows (serve_follow). Twice a second, and at once when its own
 * arrives, rank 0 asks every rank whether a stop signal came (a SIGTERM
 * may reach any of them, or all); then every rank leaves its loop. */
#ifndef DTRAIN_SERVE_LOOP_H
#define DTRAIN_SERVE_LOOP_H

#include <stddef.h>

#include "src/serve/http.h"
#include "src/serve/serve_model.h"
#include "src/serve/serve_options.h"

typedef struct serve_stats {
    unsigned long long requests, refused, prompts, prompt_tokens, generated;
    double busy_s; /* computing */
} serve_stats_t;

/* Rank 0. Returns 0 after a stop signal, -1 with one line in err when a
 * job failed (its request was answered 500). Collective with serve_follow. */
int serve_lead(serve_model_t *sm, serve_http_t *h, const serve_opts_t *o, serve_stats_t *st, char *err,
               size_t errlen);

/* Every other rank: the same outcome as rank 0's. */
int serve_follow(serve_model_t *sm, char *err, size_t errlen);

#endif
