/* libFuzzer harness: dtrain-serve's request bodies (src/serve/request.c),
 * which any client on the network sends, and the answers built from them
 * (src/serve/response.c, src/serve/utf8.c).
 *
 * Sources: src/serve/request.c, response.c, result.c, utf8.c and the
 * tokenizers (io/tokenizer.c with every C kind, fuzz/no_spm.c); Jansson.
 *
 * Input: 1 flag byte, then the body, parsed by serve_req_parse from a
 * private heap copy of exactly its length, with the byte tokenizer, a
 * vocabulary of 300 (ids 256 to 299 have no text: a model's padded rows)
 * and a context of 64 tokens.
 *   - refused: status 400 or 404, exactly one non-empty line, and its
 *     serve_error_json is one line of valid JSON
 *   - accepted: n >= 1 prompts lying end to end, each 1 to 64 - max_tokens
 *     ids below 300; logprobs -1 to 20; at most 4 stop sequences, none
 *     empty; then an answer is built as if the model had generated
 *     max_tokens tokens per prompt (ids from the input bytes, flag bit 0:
 *     stopped at a stop sequence found in them), with fuzzed log
 *     probabilities (NaN and infinities included), and it must be one line
 *     of valid JSON holding n choices, each with echo's tokens and
 *     logprobs where asked
 *   - utf8_lossy of the body: valid UTF-8 (utf8_valid), offsets that never
 *     decrease and end at the character count
 *   - flag bit 1: the body as a POST /tokenize, bit 2 as a POST
 *     /detokenize (src/serve/tokenize.c): refused with 400 and one line, or
 *     answered with one line of valid JSON. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/serve/request.h"
#include "src/serve/response.h"
#include "src/serve/tokenize.h"
#include "src/serve/utf8.h"

static tokenizer_t *tk;

static void one_line_json(const char *s)
{
    if (!s || strchr(s, '\n'))
        abort();
    json_error_t je;
    json_t *v = json_loads(s, JSON_ALLOW_NUL, &je); /* a NUL token travels as \u0000 */
    if (!v)
        abort();
    json_decref(v);
}

static void check_lossy(const unsigned char *d, size_t n)
{
    tok_bytes_t out = {0};
    size_t *at = malloc((n + 1) * sizeof *at);
    if (!at || utf8_lossy(d, n, &out, at) != 0)
        abort();
    /* valid UTF-8 once NULs (valid, but refused by utf8_valid) are set aside */
    for (size_t i = 0; i < out.n; i++)
        if (out.data[i] == 0)
            out.data[i] = 'x';
    if (!utf8_valid((const unsigned char *)out.data, out.n))
        abort();
    for (size_t i = 0; i < n; i++)
        if (at[i + 1] < at[i])
            abort();
    free(at);
    free(out.data);
}

/* An answer for r as if every prompt generated max_tokens ids. */
static void check_answer(const serve_req_t *r, const uint8_t *d, size_t n, int stop_flag)
{
    serve_out_t o;
    if (serve_out_alloc(&o, r) != 0)
        abort();
    static const double odd[] = {-1.5, 0.0, -INFINITY, NAN, -1e300, INFINITY};
    const int k = o.k, M = r->max_tokens;
    for (int i = 0; i < r->off[r->n]; i++)
        if (r->echo && r->logprobs >= 0) {
            o.plp[i] = odd[(size_t)i % 6];
            for (int j = 0; j < k; j++) {
                o.ptop_id[(size_t)i * k + j] = n ? (int32_t)(d[(size_t)(i + j) % n] + (j % 2) * 44) : j - 1;
                o.ptop_lp[(size_t)i * k + j] = odd[(size_t)(i + j) % 6];
            }
        }
    for (int i = 0; i < r->n; i++) {
        for (int g = 0; g < M; g++) {
            const size_t at = (size_t)i * M + g;
            o.gen[at] = n ? (int32_t)d[(at * 31) % n] + (int32_t)(at % 3 == 0) * 43 : 0;
            o.glp[at] = odd[at % 6];
            for (int j = 0; j < k; j++) {
                o.gtop_id[at * k + j] = (int32_t)((at + j) % 300);
                o.gtop_lp[at * k + j] = odd[(at + j) % 6];
            }
        }
        o.gen_n[i] = M;
        if (stop_flag && r->n_stop) {
            tok_bytes_t b = {0};
            if (serve_decode(tk, o.gen + (size_t)i * M, (size_t)M, &b) == 0)
                o.stop_at[i] = serve_stop_find(r, b.data ? b.data : "", b.n);
            free(b.data);
        }
    }
    char *s = serve_completion_json(r, &o, tk, "m", 1, 2);
    one_line_json(s);
    json_t *v = json_loads(s, JSON_ALLOW_NUL, NULL);
    json_t *ch = json_object_get(v, "choices");
    if (json_array_size(ch) != (size_t)r->n)
        abort();
    for (int i = 0; i < r->n; i++) {
        json_t *lp = json_object_get(json_array_get(ch, (size_t)i), "logprobs");
        const size_t want = (size_t)(r->echo ? r->off[i + 1] - r->off[i] : 0) + (size_t)M;
        if (r->logprobs >= 0 ? json_array_size(json_object_get(lp, "tokens")) != want : !json_is_null(lp))
            abort();
    }
    json_decref(v);
    free(s);
    serve_out_free(&o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char why[256];
    if (!tk && tokenizer_open(&tk, "byte", 0, why, sizeof why) != 0)
        abort();
    const int flags = data[0];
    const size_t n = size - 1;
    char *body = malloc(n ? n : 1);
    if (!body)
        return 0;
    memcpy(body, data + 1, n);
    check_lossy((const unsigned char *)body, n);
    const serve_limits_t lim = {.vocab = 300, .ctx = 64, .model_name = "m"};
    serve_req_t r;
    char err[1024] = "";
    const int st = serve_req_parse(&r, body, n, &lim, tk, err, sizeof err);
    if (st != 0) {
        if ((st != 400 && st != 404) || !err[0] || strchr(err, '\n'))
            abort();
        char *e = serve_error_json(st, err);
        one_line_json(e);
        free(e);
    } else {
        if (r.n < 1 || r.off[0] != 0 || r.logprobs < -1 || r.logprobs > SERVE_MAX_LOGPROBS || r.n_stop > SERVE_MAX_STOP ||
            r.max_tokens < 0 || r.max_tokens > lim.ctx || !(r.temperature >= 0))
            abort();
        for (int i = 0; i < r.n; i++) {
            const int len = r.off[i + 1] - r.off[i];
            if (len < 1 || len + r.max_tokens > lim.ctx)
                abort();
            for (int j = r.off[i]; j < r.off[i + 1]; j++)
                if (r.tok[j] < 0 || r.tok[j] >= lim.vocab)
                    abort();
        }
        for (int s = 0; s < r.n_stop; s++)
            if (r.stop_len[s] == 0 || strlen(r.stop[s]) != r.stop_len[s])
                abort();
        check_answer(&r, data + 1, n, flags & 1);
    }
    serve_req_free(&r);
    for (int which = 1; which <= 2; which++) {
        if (!(flags & (1 << which)))
            continue;
        char *json = NULL;
        const int t = which == 1 ? serve_tokenize(body, n, tk, 64, &json, err, sizeof err)
                                 : serve_detokenize(body, n, tk, 300, &json, err, sizeof err);
        if (t != 0 && (t != 400 || json || !err[0] || strchr(err, '\n')))
            abort();
        if (t == 0)
            one_line_json(json);
        free(json);
    }
    free(body);
    return 0;
}
