#include "src/serve/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "src/serve/response.h"

typedef enum {
    R_COMPLETIONS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_MODELS,
    R_TOKENIZER_INFO,
    R_HEALTH,
    R_NOT_FOUND,
    R_BAD_METHOD
} route_t;
/* the routes queued for the main thread (a body to read) */
static int queued(route_t r) { return r == R_COMPLETIONS || r == R_TOKENIZE || r == R_DETOKENIZE; }
typedef enum { S_RECEIVING, S_QUEUED, S_ANSWERED } call_state_t;

struct serve_call {
    struct MHD_Connection *conn;
    route_t route;
    call_state_t state;
    int too_big;
    char *body;
    size_t len, cap;
    int status;
    char *answer; /* the main thread's, until MHD takes it */
};

struct serve_http {
    struct MHD_Daemon *d;
    size_t max_body;
    int max_queue;
    const char *models_json, *tokenizer_info_json;
    pthread_mutex_t lock;
    pthread_cond_t ready;
    serve_call_t **queue; /* ring of max_queue */
    int head, count;
    int stopping;
    int live; /* calls not yet completed */
};

static void http_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fprintf(stderr, "dtrain-serve: http: ");
    vfprintf(stderr, fmt, ap);
    fflush(stderr);
}

/* A JSON answer now (MHD takes json; NULL: a fixed 500). */
static enum MHD_Result send_json(struct MHD_Connection *conn, int status, char *json)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":500}}";
    struct MHD_Response *resp =
        json ? MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(json);
        return MHD_NO;
    }
    if (!json)
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
    enum MHD_Result rc = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json") == MHD_YES
                             ? MHD_queue_response(conn, (unsigned)status, resp)
                             : MHD_NO;
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *conn, int status, const char *msg)
{
    return send_json(conn, status, serve_error_json(status, msg));
}

static route_t route_of(const char *url, const char *method)
{
    const int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0, post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    if (strcmp(url, "/v1/completions") == 0)
        return post ? R_COMPLETIONS : R_BAD_METHOD;
    if (strcmp(url, "/tokenize") == 0)
        return post ? R_TOKENIZE : R_BAD_METHOD;
    if (strcmp(url, "/detokenize") == 0)
        return post ? R_DETOKENIZE : R_BAD_METHOD;
    if (strcmp(url, "/v1/models") == 0)
        return get ? R_MODELS : R_BAD_METHOD;
    if (strcmp(url, "/tokenizer_info") == 0)
        return get ? R_TOKENIZER_INFO : R_BAD_METHOD;
    if (strcmp(url, "/health") == 0)
        return get ? R_HEALTH : R_BAD_METHOD;
    return R_NOT_FOUND;
}

/* The first call of a request: its record; a declared body over the limit
 * is refused before it is read. */
static enum MHD_Result begin(serve_http_t *h, struct MHD_Connection *conn, const char *url, const char *method,
                             void **con_cls)
{
    serve_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return MHD_NO;
    c->conn = conn;
    c->route = route_of(url, method);
    *con_cls = c;
    pthread_mutex_lock(&h->lock);
    h->live++;
    pthread_mutex_unlock(&h->lock);
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (queued(c->route) && cl && strtoull(cl, NULL, 10) > h->max_body) {
        char msg[160];
        snprintf(msg, sizeof msg, "the body of %s bytes exceeds this server's --max-body of %zu bytes", cl,
                 h->max_body);
        c->state = S_ANSWERED;
        return send_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, msg);
    }
    return MHD_YES;
}

static void take_body(serve_http_t *h, serve_call_t *c, const char *data, size_t n)
{
    if (c->too_big || !queued(c->route))
        return;
    if (c->len + n > h->max_body) {
        c->too_big = 1;
        return;
    }
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : 4096;
        while (cap < c->len + n)
            cap *= 2;
        char *b = realloc(c->body, cap);
        if (!b) {
            c->too_big = 1; /* answered as over the limit: the memory to hold it is not there */
            return;
        }
        c->body = b;
        c->cap = cap;
    }
    memcpy(c->body + c->len, data, n);
    c->len += n;
}

/* The whole body is in: queue it for the main thread and suspend. */
static enum MHD_Result enqueue(serve_http_t *h, serve_call_t *c)
{
    pthread_mutex_lock(&h->lock);
    const int stopping = h->stopping, full = h->count == h->max_queue;
    if (!stopping && !full) {
        h->queue[(h->head + h->count) % h->max_queue] = c;
        h->count++;
        c->state = S_QUEUED;
        MHD_suspend_connection(c->conn);
        pthread_cond_signal(&h->ready);
    }
    pthread_mutex_unlock(&h->lock);
    if (stopping)
        return send_error(c->conn, MHD_HTTP_SERVICE_UNAVAILABLE, "the server is stopping");
    if (full) {
        char msg[128];
        snprintf(msg, sizeof msg, "%d requests are waiting for the model (--max-queue): retry later", h->max_queue);
        return send_error(c->conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
    serve_http_t *h = cls;
    (void)version;
    serve_call_t *c = *con_cls;
    if (!c)
        return begin(h, conn, url, method, con_cls);
    if (*upload_size) {
        take_body(h, c, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->state == S_ANSWERED) {
        char *a = c->answer;
        c->answer = NULL;
        return send_json(conn, c->status, a);
    }
    if (c->state == S_QUEUED) /* not reached: a queued call is suspended until answered */
        return MHD_YES;
    switch (c->route) {
    case R_HEALTH:
        return send_json(conn, MHD_HTTP_OK, strdup("{\"status\":\"ok\"}"));
    case R_MODELS:
        return send_json(conn, MHD_HTTP_OK, strdup(h->models_json));
    case R_TOKENIZER_INFO:
        return send_json(conn, MHD_HTTP_OK, strdup(h->tokenizer_info_json));
    case R_NOT_FOUND:
        return send_error(conn, MHD_HTTP_NOT_FOUND,
                          "no such path: this server answers POST /v1/completions, GET /v1/models, GET /health, "
                          "GET /tokenizer_info, POST /tokenize, POST /detokenize");
    case R_BAD_METHOD:
        return send_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                          "method not allowed: POST /v1/completions, /tokenize and /detokenize; GET /v1/models, "
                          "/health and /tokenizer_info");
    case R_COMPLETIONS:
    case R_TOKENIZE:
    case R_DETOKENIZE:
        break;
    }
    if (c->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body exceeds this server's --max-body of %zu bytes", h->max_body);
        return send_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, msg);
    }
    return enqueue(h, c);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode why)
{
    serve_http_t *h = cls;
    serve_call_t *c = *con_cls;
    (void)conn;
    (void)why;
    if (!c)
        return;
    free(c->body);
    free(c->answer);
    free(c);
    *con_cls = NULL;
    pthread_mutex_lock(&h->lock);
    h->live--;
    pthread_mutex_unlock(&h->lock);
}

/* host:port as a socket address (the first getaddrinfo gives). */
static int resolve(const char *host, int port, struct sockaddr_storage *sa, int *v6, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "--host %s: %s", host, gai_strerror(rc));
        return -1;
    }
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

int serve_http_start(serve_http_t **out, const serve_http_config_t *cfg, int *bound_port, char *err, size_t errlen)
{
    *out = NULL;
    struct sockaddr_storage sa;
    int v6;
    if (resolve(cfg->host, cfg->port, &sa, &v6, err, errlen) != 0)
        return -1;
    serve_http_t *h = calloc(1, sizeof *h);
    if (!h || !(h->queue = calloc((size_t)cfg->max_queue, sizeof *h->queue))) {
        free(h);
        snprintf(err, errlen, "out of memory for the request queue");
        return -1;
    }
    h->max_body = cfg->max_body;
    h->max_queue = cfg->max_queue;
    h->models_json = cfg->models_json;
    h->tokenizer_info_json = cfg->tokenizer_info_json;
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->ready, NULL);
    const unsigned flags =
        MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    errno = 0;
    h->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
                            http_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, h, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errlen, "cannot listen on %s port %d%s%s: another server may hold the port (try another "
                 "--port, or --port 0 for any free one)",
                 cfg->host, cfg->port, errno ? ": " : "", errno ? strerror(errno) : "");
        pthread_mutex_destroy(&h->lock);
        pthread_cond_destroy(&h->ready);
        free(h->queue);
        free(h);
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = info ? (int)info->port : cfg->port;
    *out = h;
    return 0;
}

serve_call_t *serve_http_next(serve_http_t *h, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    serve_call_t *c = NULL;
    pthread_mutex_lock(&h->lock);
    while (h->count == 0 && pthread_cond_timedwait(&h->ready, &h->lock, &until) == 0)
        ;
    if (h->count > 0) {
        c = h->queue[h->head];
        h->head = (h->head + 1) % h->max_queue;
        h->count--;
    }
    pthread_mutex_unlock(&h->lock);
    return c;
}

const char *serve_call_body(const serve_call_t *c, size_t *len)
{
    *len = c->len;
    return c->body ? c->body : "";
}

serve_call_kind_t serve_call_kind(const serve_call_t *c)
{
    return c->route == R_TOKENIZE     ? SERVE_CALL_TOKENIZE
           : c->route == R_DETOKENIZE ? SERVE_CALL_DETOKENIZE
                                      : SERVE_CALL_COMPLETIONS;
}

void serve_http_answer(serve_http_t *h, serve_call_t *c, int status, char *json)
{
    (void)h;
    c->status = status;
    c->answer = json;
    c->state = S_ANSWERED;
    MHD_resume_connection(c->conn);
}

void serve_http_stop(serve_http_t *h, double wait_s)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->lock);
    h->stopping = 1;
    pthread_mutex_unlock(&h->lock);
    const MHD_socket listen_fd = MHD_quiesce_daemon(h->d);
    for (serve_call_t *c; (c = serve_http_next(h, 0));)
        serve_http_answer(h, c, MHD_HTTP_SERVICE_UNAVAILABLE,
                          serve_error_json(MHD_HTTP_SERVICE_UNAVAILABLE, "the server is stopping"));
    /* the answers just given, and any in flight, go out before the daemon stops */
    for (double waited = 0.0; waited < wait_s; waited += 0.01) {
        pthread_mutex_lock(&h->lock);
        const int live = h->live;
        pthread_mutex_unlock(&h->lock);
        if (live == 0)
            break;
        const struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(h->d);
    if (listen_fd != MHD_INVALID_SOCKET)
        close(listen_fd);
    pthread_mutex_destroy(&h->lock);
    pthread_cond_destroy(&h->ready);
    free(h->queue);
    free(h);
}
