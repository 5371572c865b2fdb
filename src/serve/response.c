#include "src/serve/response.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/serve/utf8.h"

/* A real, or null where it is not finite (JSON has no NaN or inf). */
static json_t *real_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Adds v to a (stealing it); 0, or -1 when v is NULL or the add fails. */
static int put(json_t *a, json_t *v) { return v && json_array_append_new(a, v) == 0 ? 0 : -1; }

static int set(json_t *o, const char *key, json_t *v) { return v && json_object_set_new(o, key, v) == 0 ? 0 : -1; }

int serve_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out)
{
    char why[256], mark[32];
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && ids[j] >= 0 && ids[j] < tk->vocab_size)
            j++;
        if (j > i && tokenizer_decode(tk, ids + i, j - i, out, why, sizeof why) != 0)
            return -1;
        if (j < n) {
            const int k = snprintf(mark, sizeof mark, "[token %d]", (int)ids[j++]);
            if (tok_bytes_append(out, mark, (size_t)k) != 0)
                return -1;
        }
        i = j;
    }
    return 0;
}

/* A token as OpenAI names it: its text when that is UTF-8 without NUL,
 * else "bytes:" and each byte as \xNN. NULL when out of memory. */
static char *token_text(tokenizer_t *tk, int32_t id, size_t *len)
{
    tok_bytes_t b = {0};
    char *out = NULL;
    if (serve_decode(tk, &id, 1, &b) != 0) {
        free(b.data);
        return NULL;
    }
    if (utf8_valid((const unsigned char *)b.data, b.n)) {
        out = malloc(b.n + 1);
        if (out) {
            memcpy(out, b.data ? b.data : "", b.n);
            out[b.n] = '\0';
            *len = b.n;
        }
    } else {
        out = malloc(6 + 4 * b.n + 1);
        if (out) {
            size_t k = (size_t)sprintf(out, "bytes:");
            for (size_t i = 0; i < b.n; i++)
                k += (size_t)sprintf(out + k, "\\x%02x", (unsigned char)b.data[i]);
            *len = k;
        }
    }
    free(b.data);
    return out;
}

static json_t *token_json(tokenizer_t *tk, int32_t id)
{
    size_t len;
    char *t = token_text(tk, id, &len);
    json_t *s = t ? json_stringn(t, len) : NULL;
    free(t);
    return s;
}

/* {token: log p} of one position: the top k, then the position's own
 * token when it is not among them (as OpenAI's API adds the sampled
 * token); a name already present (two ids of one text) keeps its first,
 * higher value. */
static json_t *top_json(tokenizer_t *tk, const int32_t *ids, const double *lps, int k, int32_t own, double own_lp)
{
    json_t *d = json_object();
    int has_own = 0;
    for (int j = 0; d && j <= k; j++) {
        const int32_t id = j < k ? ids[j] : own;
        const double lp = j < k ? lps[j] : own_lp;
        if (id < 0 || (j == k && has_own))
            continue;
        has_own |= id == own;
        size_t len;
        char *t = token_text(tk, id, &len);
        json_t *v = real_or_null(lp);
        if (!t || !v || (!json_object_get(d, t) && json_object_set_new(d, t, json_incref(v)) != 0)) {
            json_decref(d);
            d = NULL;
        }
        json_decref(v);
        free(t);
    }
    return d;
}

/* The bytes of ids[0..n), each token's start in start[0..n) (token i's
 * own decoding's bytes, one after the other). */
static int token_bytes(tokenizer_t *tk, const int32_t *ids, int n, tok_bytes_t *all, size_t *start)
{
    for (int i = 0; i < n; i++) {
        start[i] = all->n;
        if (serve_decode(tk, ids + i, 1, all) != 0)
            return -1;
    }
    return 0;
}

/* The logprobs object of prompt i: tokens, token_logprobs, top_logprobs,
 * text_offset (characters of the tokens' texts before each). */
static json_t *logprobs_json(const serve_req_t *r, const serve_out_t *o, tokenizer_t *tk, int i)
{
    const int P = r->echo ? r->off[i + 1] - r->off[i] : 0, G = o->gen_n[i], n = P + G, k = o->k;
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    size_t *start = malloc(((size_t)n + 1) * sizeof *start);
    tok_bytes_t all = {0}, text = {0};
    json_t *lp = json_object(), *toks = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
    int rc = ids && start && lp && toks && tlp && top && off ? 0 : -1;
    if (rc == 0) {
        memcpy(ids, r->tok + r->off[i], (size_t)P * sizeof *ids);
        memcpy(ids + P, o->gen + (size_t)i * r->max_tokens, (size_t)G * sizeof *ids);
        rc = token_bytes(tk, ids, n, &all, start);
    }
    size_t *at = rc == 0 ? malloc((all.n + 1) * sizeof *at) : NULL;
    if (rc == 0 && (!at || utf8_lossy((const unsigned char *)all.data, all.n, &text, at) != 0))
        rc = -1;
    for (int j = 0; j < n && rc == 0; j++) {
        const int prompt = j < P;
        const size_t g = prompt ? 0 : (size_t)i * r->max_tokens + (size_t)(j - P);
        const size_t pj = (size_t)r->off[i] + (size_t)j;
        const double own = prompt ? o->plp[pj] : o->glp[g];
        rc = put(toks, token_json(tk, ids[j]));
        if (rc == 0)
            rc = put(tlp, prompt && j == 0 ? json_null() : real_or_null(own));
        if (rc == 0)
            rc = put(top, prompt && j == 0 ? json_null()
                          : prompt         ? top_json(tk, o->ptop_id + pj * k, o->ptop_lp + pj * k, k, ids[j], own)
                                           : top_json(tk, o->gtop_id + g * k, o->gtop_lp + g * k, k, ids[j], own));
        if (rc == 0)
            rc = put(off, json_integer((json_int_t)at[start[j]]));
    }
    if (rc == 0 && (set(lp, "tokens", toks) || set(lp, "token_logprobs", tlp) || set(lp, "top_logprobs", top) ||
                    set(lp, "text_offset", off)))
        rc = -1;
    else if (rc != 0) {
        json_decref(toks);
        json_decref(tlp);
        json_decref(top);
        json_decref(off);
    }
    free(ids);
    free(start);
    free(at);
    free(all.data);
    free(text.data);
    if (rc != 0) {
        json_decref(lp);
        return NULL;
    }
    return lp;
}

/* Choice i's text: the prompt's (with echo), then the completion's up to
 * its stop sequence, as UTF-8. */
static json_t *text_json(const serve_req_t *r, const serve_out_t *o, tokenizer_t *tk, int i)
{
    tok_bytes_t raw = {0}, text = {0};
    int rc = 0;
    if (r->echo)
        rc = serve_decode(tk, r->tok + r->off[i], (size_t)(r->off[i + 1] - r->off[i]), &raw);
    const size_t p = raw.n;
    if (rc == 0)
        rc = serve_decode(tk, o->gen + (size_t)i * r->max_tokens, (size_t)o->gen_n[i], &raw);
    if (rc == 0 && o->stop_at[i] >= 0 && p + (size_t)o->stop_at[i] < raw.n)
        raw.n = p + (size_t)o->stop_at[i];
    json_t *s = NULL;
    if (rc == 0 && utf8_lossy((const unsigned char *)raw.data, raw.n, &text, NULL) == 0)
        s = json_stringn(text.data ? text.data : "", text.n);
    free(raw.data);
    free(text.data);
    return s;
}

static json_t *choice_json(const serve_req_t *r, const serve_out_t *o, tokenizer_t *tk, int i)
{
    json_t *c = json_object();
    if (!c || set(c, "index", json_integer(i)) || set(c, "text", text_json(r, o, tk, i)) ||
        set(c, "logprobs", r->logprobs >= 0 ? logprobs_json(r, o, tk, i) : json_null()) ||
        set(c, "finish_reason", json_string(o->stop_at[i] >= 0 ? "stop" : "length"))) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* json_dumps, one line, then the object freed. */
static char *dump(json_t *root)
{
    char *s = root ? json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(root);
    return s;
}

char *serve_completion_json(const serve_req_t *r, const serve_out_t *o, tokenizer_t *tk, const char *model,
                            unsigned long long id, long long created)
{
    char sid[48];
    snprintf(sid, sizeof sid, "cmpl-%llu", id);
    json_t *root = json_object(), *choices = json_array(), *usage = json_object();
    long long gen = 0;
    int rc = root && choices && usage ? 0 : -1;
    for (int i = 0; i < r->n && rc == 0; i++) {
        rc = put(choices, choice_json(r, o, tk, i));
        gen += o->gen_n[i];
    }
    if (rc == 0 && (set(usage, "prompt_tokens", json_integer(r->off[r->n])) ||
                    set(usage, "completion_tokens", json_integer(gen)) ||
                    set(usage, "total_tokens", json_integer(r->off[r->n] + gen))))
        rc = -1;
    if (rc == 0 && (set(root, "id", json_string(sid)) || set(root, "object", json_string("text_completion")) ||
                    set(root, "created", json_integer(created)) || set(root, "model", json_string(model)) ||
                    set(root, "choices", json_incref(choices)) || set(root, "usage", json_incref(usage))))
        rc = -1;
    json_decref(choices);
    json_decref(usage);
    if (rc != 0) {
        json_decref(root);
        return NULL;
    }
    return dump(root);
}

char *serve_error_json(int status, const char *message)
{
    const char *type = status == 404   ? "not_found_error"
                       : status == 413 ? "request_too_large"
                       : status == 503 ? "server_busy"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    /* an invalid UTF-8 message (a field name quoted from the request) as U+FFFD */
    tok_bytes_t m = {0};
    json_t *e = NULL;
    if (utf8_lossy((const unsigned char *)message, strlen(message), &m, NULL) == 0)
        e = json_pack("{s:{s:s%,s:s,s:i}}", "error", "message", m.data ? m.data : "", m.n, "type", type, "code",
                      status);
    free(m.data);
    return dump(e);
}

char *serve_models_json(const char *model, int ctx, long long created)
{
    return dump(json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:i}]}", "object", "list", "data", "id", model, "object", "model",
                          "created", (json_int_t)created, "owned_by", "dtrain", "max_model_len", ctx));
}

long serve_stop_find(const serve_req_t *r, const char *text, size_t n)
{
    long best = -1;
    for (int s = 0; s < r->n_stop; s++) {
        const size_t L = r->stop_len[s];
        for (size_t i = 0; i + L <= n && (best < 0 || (long)i < best); i++)
            if (memcmp(text + i, r->stop[s], L) == 0) {
                best = (long)i;
                break;
            }
    }
    return best;
}
