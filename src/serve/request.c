#include "src/serve/request.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The fields a request may hold; anything else is refused, never ignored. */
static const char *const known[] = {"model", "prompt", "echo",  "logprobs", "max_tokens", "temperature", "top_k",
                                    "top_p", "stop",   "seed",  "n",        "best_of",    "stream",      NULL};

/* One line in err; returns 400 (the caller's status for a bad request). */
__attribute__((format(printf, 3, 4))) static int refuse(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 400;
}

/* At most 64 bytes of a client's string for a message: printable ASCII
 * kept, any other byte as '?', so the message stays one line. */
static const char *quoted(const char *s, size_t len, char *buf, size_t buflen)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < buflen && n < 64; i++)
        buf[n++] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    buf[n] = '\0';
    return buf;
}

static int check_known(json_t *root, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(key, known[i]) == 0;
        char q[80];
        if (!ok)
            return refuse(err, errlen,
                          "unknown field '%s': the request takes model, prompt, echo, logprobs, max_tokens, "
                          "temperature, top_k, top_p (1), stop, seed, n (1), best_of (1), stream (false)",
                          quoted(key, strlen(key), q, sizeof q));
    }
    return 0;
}

/* An integer field (absent or null: def) within lo..hi. */
static int get_int(json_t *root, const char *key, long long def, long long lo, long long hi, long long *out, char *err,
                   size_t errlen)
{
    json_t *v = json_object_get(root, key);
    *out = def;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return refuse(err, errlen, "'%s' must be an integer", key);
    const long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return refuse(err, errlen, "'%s' %lld is out of range (%lld to %lld)", key, x, lo, hi);
    *out = x;
    return 0;
}

/* A number field (absent or null: def) within lo..hi. */
static int get_real(json_t *root, const char *key, double def, double lo, double hi, double *out, char *err,
                    size_t errlen)
{
    json_t *v = json_object_get(root, key);
    *out = def;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return refuse(err, errlen, "'%s' must be a number", key);
    const double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return refuse(err, errlen, "'%s' %g is out of range (%g to %g)", key, x, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(json_t *root, const char *key, int *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return refuse(err, errlen, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* "model": absent, null or this server's. */
static int check_model(json_t *root, const char *name, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, "model");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return refuse(err, errlen, "'model' must be a string");
    if (strcmp(json_string_value(v), name) != 0 || strlen(name) != json_string_length(v)) {
        char q[80];
        snprintf(err, errlen, "model '%s' is not served here: this server serves '%s' (GET /v1/models)",
                 quoted(json_string_value(v), json_string_length(v), q, sizeof q), name);
        return 404;
    }
    return 0;
}

/* Options OpenAI's API has that this server takes only at their neutral
 * value: anything else is refused rather than ignored. */
static int check_neutral(json_t *root, char *err, size_t errlen)
{
    long long x;
    double p;
    int st;
    if (get_int(root, "n", 1, 1, 1, &x, err, errlen) != 0 || get_int(root, "best_of", 1, 1, 1, &x, err, errlen) != 0)
        return refuse(err, errlen, "'n' and 'best_of' must be 1: one completion per prompt is served");
    if (get_real(root, "top_p", 1.0, 1.0, 1.0, &p, err, errlen) != 0)
        return refuse(err, errlen, "'top_p' must be 1: nucleus sampling is not served; use top_k");
    if (get_bool(root, "stream", &st, err, errlen) != 0 || st)
        return refuse(err, errlen, "'stream' must be false: streaming is not served");
    return 0;
}

/* "stop": null, a string or a list of at most SERVE_MAX_STOP strings, none
 * empty or holding NUL. */
static int get_stop(json_t *root, serve_req_t *r, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v))
        return 0;
    const int list = json_is_array(v);
    const size_t n = list ? json_array_size(v) : 1;
    if (n > SERVE_MAX_STOP)
        return refuse(err, errlen, "'stop' holds %zu sequences: at most %d", n, SERVE_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *s = list ? json_array_get(v, i) : v;
        if (!json_is_string(s))
            return refuse(err, errlen, "'stop' must be a string or a list of strings");
        const size_t len = json_string_length(s);
        if (len == 0 || memchr(json_string_value(s), 0, len))
            return refuse(err, errlen, "'stop' sequence %zu is empty or holds a NUL character", i);
        if (!(r->stop[r->n_stop] = malloc(len + 1)))
            return refuse(err, errlen, "out of memory");
        memcpy(r->stop[r->n_stop], json_string_value(s), len + 1);
        r->stop_len[r->n_stop++] = len;
    }
    return 0;
}

/* The special token whose text begins text[0..len) (the longest), or -1. */
static int special_at(const tokenizer_t *tk, const char *text, size_t len, size_t *name_len)
{
    int best = -1;
    *name_len = 0;
    for (int i = 0; i < tk->n_special; i++) {
        const size_t n = strlen(tk->special_name[i]);
        if (n > *name_len && n <= len && memcmp(text, tk->special_name[i], n) == 0) {
            best = i;
            *name_len = n;
        }
    }
    return best;
}

int serve_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen)
{
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        size_t n = 0;
        const int sp = i < len ? special_at(tk, text + i, len - i, &n) : -1;
        if (sp < 0 && i < len)
            continue;
        if (i > start && tokenizer_encode(tk, text + start, i - start, out, err, errlen) != 0)
            return -1;
        if (sp >= 0 && tok_ids_push(out, tk->special_id[sp]) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        start = i + n;
        i = sp >= 0 ? i + n - 1 : i;
    }
    return 0;
}

/* The kinds of "prompt": one text, texts, one token list, token lists. */
typedef enum { P_TEXT, P_TEXTS, P_IDS, P_ID_LISTS } prompt_kind_t;

static int prompt_kind(json_t *p, prompt_kind_t *kind, size_t *n, char *err, size_t errlen)
{
    static const char *shape =
        "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids";
    if (json_is_string(p)) {
        *kind = P_TEXT;
        *n = 1;
        return 0;
    }
    if (!json_is_array(p))
        return refuse(err, errlen, "%s", shape);
    *n = json_array_size(p);
    if (*n == 0)
        return refuse(err, errlen, "'prompt' is an empty list: give at least one prompt");
    json_t *first = json_array_get(p, 0);
    if (json_is_string(first))
        *kind = P_TEXTS;
    else if (json_is_integer(first))
        *kind = P_IDS;
    else if (json_is_array(first))
        *kind = P_ID_LISTS;
    else
        return refuse(err, errlen, "%s", shape);
    if (*kind == P_IDS)
        *n = 1;
    if (*n > SERVE_MAX_PROMPTS)
        return refuse(err, errlen, "'prompt' holds %zu prompts: at most %d per request", *n, SERVE_MAX_PROMPTS);
    return 0;
}

static int push(tok_ids_t *ids, int32_t id, char *err, size_t errlen)
{
    if (tok_ids_push(ids, id) == 0)
        return 0;
    snprintf(err, errlen, "out of memory for the prompts' tokens");
    return 400;
}

/* Prompt i's ids appended to ids. */
static int one_prompt(json_t *item, prompt_kind_t kind, size_t i, const serve_limits_t *lim, tokenizer_t *tk,
                      tok_ids_t *ids, char *err, size_t errlen)
{
    if (kind == P_TEXT || kind == P_TEXTS) {
        if (!json_is_string(item)) {
            snprintf(err, errlen, "prompt %zu: a list of texts must hold only strings", i);
            return 400;
        }
        if (!tk) {
            snprintf(err, errlen, "prompt %zu: text prompts need a tokenizer: send token ids", i);
            return 400;
        }
        char why[512];
        if (serve_encode(tk, json_string_value(item), json_string_length(item), ids, why, sizeof why) != 0) {
            snprintf(err, errlen, "prompt %zu: %s", i, why);
            return 400;
        }
        return 0;
    }
    if (!json_is_array(item)) {
        snprintf(err, errlen, "prompt %zu: a list of token lists must hold only lists of integers", i);
        return 400;
    }
    for (size_t j = 0; j < json_array_size(item); j++) {
        json_t *t = json_array_get(item, j);
        if (!json_is_integer(t)) {
            snprintf(err, errlen, "prompt %zu, token %zu: token ids are integers", i, j);
            return 400;
        }
        const long long id = json_integer_value(t);
        if (id < 0 || id >= lim->vocab) {
            snprintf(err, errlen, "prompt %zu, token %zu: id %lld is outside the vocabulary (0 to %d)", i, j, id,
                     lim->vocab - 1);
            return 400;
        }
        int rc = push(ids, (int32_t)id, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

static int get_prompts(json_t *root, serve_req_t *r, const serve_limits_t *lim, tokenizer_t *tk, char *err,
                       size_t errlen)
{
    json_t *p = json_object_get(root, "prompt");
    if (!p)
        return refuse(err, errlen, "'prompt' is missing: give a text, texts or token ids");
    prompt_kind_t kind = P_TEXT;
    size_t n = 0;
    int rc = prompt_kind(p, &kind, &n, err, errlen);
    if (rc)
        return rc;
    r->off = malloc((n + 1) * sizeof *r->off);
    if (!r->off)
        return refuse(err, errlen, "out of memory");
    tok_ids_t ids = {0};
    r->off[0] = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *item = kind == P_TEXT || kind == P_IDS ? p : json_array_get(p, i);
        rc = one_prompt(item, kind, i, lim, tk, &ids, err, errlen);
        const size_t len = rc == 0 ? ids.n - (size_t)r->off[i] : 0;
        if (rc == 0 && len == 0) {
            snprintf(err, errlen, "prompt %zu is empty: give at least one token", i);
            rc = 400;
        }
        if (rc == 0 && len + (size_t)r->max_tokens > (size_t)lim->ctx) {
            snprintf(err, errlen,
                     "prompt %zu: %zu tokens plus max_tokens %d exceed the context length of %d: shorten the "
                     "prompt or lower max_tokens",
                     i, len, r->max_tokens, lim->ctx);
            rc = 400;
        }
        if (rc == 0)
            r->off[i + 1] = (int)ids.n;
        r->n = rc == 0 ? (int)i + 1 : r->n;
    }
    r->tok = ids.id;
    return rc;
}

/* The answer's size: generated tokens and log-probabilities. */
static int check_size(const serve_req_t *r, char *err, size_t errlen)
{
    const long long gen = (long long)r->n * r->max_tokens;
    const long long scored = (r->echo ? r->off[r->n] : 0) + gen;
    if (gen > SERVE_MAX_GENERATED)
        return refuse(err, errlen, "%d prompts x max_tokens %d: more than %d tokens to generate in one request: "
                      "send fewer prompts a request", r->n, r->max_tokens, SERVE_MAX_GENERATED);
    if (r->logprobs >= 0 && scored * (r->logprobs + 1) > SERVE_MAX_LOGPROB_ENTRIES)
        return refuse(err, errlen, "%lld positions x (logprobs %d + 1): more than %d log-probabilities in one "
                      "answer: send fewer prompts a request or a lower logprobs", scored, r->logprobs,
                      SERVE_MAX_LOGPROB_ENTRIES);
    return 0;
}

int serve_req_parse(serve_req_t *r, const char *body, size_t len, const serve_limits_t *lim, tokenizer_t *tk,
                    char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err, errlen, "malformed JSON at line %d, column %d: %s", je.line, je.column, je.text);
        for (char *c = err; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        return 400;
    }
    long long x;
    int rc = json_is_object(root) ? 0 : refuse(err, errlen, "the request must be a JSON object");
    if (rc == 0)
        rc = check_known(root, err, errlen);
    if (rc == 0)
        rc = check_model(root, lim->model_name, err, errlen);
    if (rc == 0)
        rc = check_neutral(root, err, errlen);
    if (rc == 0)
        rc = get_bool(root, "echo", &r->echo, err, errlen);
    if (rc == 0 && (rc = get_int(root, "logprobs", -1, 0, SERVE_MAX_LOGPROBS, &x, err, errlen)) == 0)
        r->logprobs = (int)x;
    if (rc == 0 && (rc = get_int(root, "max_tokens", SERVE_DEFAULT_MAX_TOKENS, 0, lim->ctx, &x, err, errlen)) == 0)
        r->max_tokens = (int)x;
    if (rc == 0)
        rc = get_real(root, "temperature", 1.0, 0.0, 100.0, &r->temperature, err, errlen);
    if (rc == 0 && (rc = get_int(root, "top_k", 0, -1, lim->vocab, &x, err, errlen)) == 0)
        r->top_k = x < 0 ? 0 : (int)x;
    json_t *seed = json_object_get(root, "seed");
    if (rc == 0 && seed && !json_is_null(seed)) {
        if (!json_is_integer(seed))
            rc = refuse(err, errlen, "'seed' must be an integer");
        r->has_seed = rc == 0;
        r->seed = (uint64_t)json_integer_value(seed);
    }
    if (rc == 0)
        rc = get_stop(root, r, err, errlen);
    if (rc == 0)
        rc = get_prompts(root, r, lim, tk, err, errlen);
    if (rc == 0)
        rc = check_size(r, err, errlen);
    json_decref(root);
    /* one line, whatever the parser or the tokenizer quoted of the body */
    for (char *c = err; rc != 0 && *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return rc;
}

void serve_req_free(serve_req_t *r)
{
    free(r->tok);
    free(r->off);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    memset(r, 0, sizeof *r);
}
