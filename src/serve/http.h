/* dtrain-serve's HTTP side, on rank 0: Debian's libmicrohttpd answers the
 * connections on its own thread (epoll or poll, suspend/resume: a request
 * waiting for the model holds no thread). GET /health, GET /v1/models and
 * GET /tokenizer_info are answered there; a POST body (/v1/completions,
 * /tokenize, /detokenize: tokenize.h) is queued whole for the main thread, which computes it with the other ranks and answers it
 * (serve_http_answer); its connection is suspended meanwhile. Bodies over
 * max_body get 413, a full queue 503, other paths 404, other methods 405,
 * each with a one-line JSON error (response.h). */
#ifndef DTRAIN_SERVE_HTTP_H
#define DTRAIN_SERVE_HTTP_H

#include <stddef.h>

typedef struct serve_http serve_http_t;
typedef struct serve_call serve_call_t;

/* What a queued request asks for. */
typedef enum { SERVE_CALL_COMPLETIONS, SERVE_CALL_TOKENIZE, SERVE_CALL_DETOKENIZE } serve_call_kind_t;

typedef struct serve_http_config {
    const char *host;        /* address to listen on */
    int port;                /* 0: any free port */
    size_t max_body;         /* bytes */
    int max_queue;           /* requests waiting for the main thread */
    const char *models_json; /* GET /v1/models's answer */
    const char *tokenizer_info_json; /* GET /tokenizer_info's */
} serve_http_config_t;

/* Listens; *bound_port: the port taken. 0, or -1 with one line in err. */
int serve_http_start(serve_http_t **h, const serve_http_config_t *c, int *bound_port, char *err, size_t errlen);

/* The oldest queued request, waiting at most timeout_ms for one; NULL when
 * none came. */
serve_call_t *serve_http_next(serve_http_t *h, int timeout_ms);

/* The request's body (not NUL-terminated) and what it asks for. */
const char *serve_call_body(const serve_call_t *c, size_t *len);
serve_call_kind_t serve_call_kind(const serve_call_t *c);

/* Answers a request serve_http_next gave: status and json (malloc'd, taken
 * over; NULL: out of memory, answered 500). c is not to be used after. */
void serve_http_answer(serve_http_t *h, serve_call_t *c, int status, char *json);

/* Stops taking requests: the listening socket closes, every queued request
 * is answered 503, the answers in flight are waited for (at most wait_s),
 * then the daemon stops and h is freed. */
void serve_http_stop(serve_http_t *h, double wait_s);

#endif
