#include "src/serve/tokenize.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "src/serve/request.h"
#include "src/serve/response.h"
#include "src/serve/utf8.h"

/* Only these fields: anything else is refused, never ignored. */
static int only(json_t *root, const char *a, const char *b, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, a) != 0 && (!b || strcmp(key, b) != 0)) {
            snprintf(err, errlen, "unknown field: this endpoint takes %s%s%s", a, b ? " and " : "", b ? b : "");
            return 400;
        }
    }
    return 0;
}

static json_t *load(const char *body, size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        snprintf(err, errlen, "malformed JSON at line %d, column %d", je.line, je.column);
    else if (!json_is_object(root)) {
        snprintf(err, errlen, "the request must be a JSON object");
        json_decref(root);
        root = NULL;
    }
    return root;
}

/* The name of a special id, or NULL. */
static const char *special_name(const tokenizer_t *tk, int32_t id)
{
    for (int i = 0; id != TOK_NO_ID && i < tk->n_special; i++)
        if (tk->special_id[i] == id)
            return tk->special_name[i];
    return NULL;
}

int serve_tokenize(const char *body, size_t len, tokenizer_t *tk, int ctx, char **json, char *err, size_t errlen)
{
    *json = NULL;
    json_t *root = load(body, len, err, errlen);
    if (!root)
        return 400;
    json_t *p = json_object_get(root, "prompt"), *add = json_object_get(root, "add_special_tokens");
    int rc = only(root, "prompt", "add_special_tokens", err, errlen);
    if (rc == 0 && !json_is_string(p))
        rc = (snprintf(err, errlen, "'prompt' must be a string"), 400);
    if (rc == 0 && add && !json_is_boolean(add))
        rc = (snprintf(err, errlen, "'add_special_tokens' must be true or false"), 400);
    tok_ids_t ids = {0};
    char why[512];
    /* add_special_tokens: the document start, as a Hugging Face tokenizer
     * puts its BOS first */
    if (rc == 0 && json_is_true(add) && tk->doc_start != TOK_NO_ID && tok_ids_push(&ids, tk->doc_start) != 0)
        rc = (snprintf(err, errlen, "out of memory"), 400);
    if (rc == 0 && serve_encode(tk, json_string_value(p), json_string_length(p), &ids, why, sizeof why) != 0)
        rc = (snprintf(err, errlen, "%s", why), 400);
    if (rc == 0) {
        json_t *t = json_array();
        for (size_t i = 0; t && i < ids.n; i++)
            if (json_array_append_new(t, json_integer(ids.id[i])) != 0) {
                json_decref(t);
                t = NULL;
            }
        json_t *a = t ? json_pack("{s:o,s:I,s:i}", "tokens", t, "count", (json_int_t)ids.n, "max_model_len", ctx) : NULL;
        *json = a ? json_dumps(a, JSON_COMPACT) : NULL;
        json_decref(a);
    }
    free(ids.id);
    json_decref(root);
    return rc;
}

int serve_detokenize(const char *body, size_t len, tokenizer_t *tk, int vocab, char **json, char *err, size_t errlen)
{
    *json = NULL;
    json_t *root = load(body, len, err, errlen);
    if (!root)
        return 400;
    json_t *t = json_object_get(root, "tokens");
    int rc = only(root, "tokens", NULL, err, errlen);
    if (rc == 0 && !json_is_array(t))
        rc = (snprintf(err, errlen, "'tokens' must be a list of token ids"), 400);
    const size_t n = rc == 0 ? json_array_size(t) : 0;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    if (rc == 0 && !ids)
        rc = (snprintf(err, errlen, "out of memory"), 400);
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
            rc = (snprintf(err, errlen, "token %zu: ids are integers from 0 to %d", i, vocab - 1), 400);
        else
            ids[i] = (int32_t)json_integer_value(v);
    }
    tok_bytes_t raw = {0}, text = {0};
    if (rc == 0 && (serve_decode(tk, ids, n, &raw) != 0 ||
                    utf8_lossy((const unsigned char *)raw.data, raw.n, &text, NULL) != 0))
        rc = (snprintf(err, errlen, "out of memory"), 400);
    if (rc == 0) {
        json_t *a = json_pack("{s:s%}", "prompt", text.data ? text.data : "", text.n);
        *json = a ? json_dumps(a, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        json_decref(a);
    }
    free(ids);
    free(raw.data);
    free(text.data);
    json_decref(root);
    return rc;
}

char *serve_tokenizer_info_json(const tokenizer_t *tk, int ctx)
{
    const char *bos = special_name(tk, tk->doc_start);
    const char *eos = special_name(tk, tk->doc_end != TOK_NO_ID ? tk->doc_end : tk->doc_start);
    json_t *a = json_pack("{s:o,s:o,s:n,s:i,s:s}", "eos_token", eos ? json_string(eos) : json_null(), "bos_token",
                          bos ? json_string(bos) : json_null(), "pad_token", "model_max_length", ctx,
                          "tokenizer_class", tk->spec);
    char *s = a ? json_dumps(a, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(a);
    return s;
}
