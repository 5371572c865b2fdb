/* The hf tokenizer: a Hugging Face tokenizer.json holding a byte-level BPE
 * (GPT-2, Llama 3.x, Qwen2/Qwen3, DeepSeek-V3 and the like), run on the
 * shared BPE core (io/tok_bpe.c) in its merges-list mode.
 *
 * What is read, and what the ids then follow (Hugging Face's tokenizers, and
 * transformers.js, whose fork @lenml/tokenizers the tests compare with):
 *   added_tokens   matched in the text first, leftmost and then longest,
 *                  literally (no normalisation); the text between them is
 *                  encoded as below. Special ones are skipped when
 *                  tokenizer_config.json says split_special_tokens.
 *   normalizer     null, NFC, or a Sequence of those (NFC by utf8proc)
 *   pre_tokenizer  ByteLevel, alone or last in a Sequence after Split
 *                  steps (Regex pattern, behavior Isolated, not inverted);
 *                  each Split cuts the pieces of the one before; ByteLevel's
 *                  use_regex adds GPT-2's pattern as one more cut
 *   model          BPE: vocab (tokens in GPT-2's byte alphabet), merges
 *                  ("a b" strings or ["a", "b"] pairs; a pair's place is
 *                  its priority), ignore_merges
 *   decoder        ByteLevel (ids -> the bytes their tokens spell)
 * Patterns run with ECMAScript's \s (TOK_JS_SPACE) and transformers.js's
 * rewrite of the (?i:'s|...) group, as the JavaScript reference does.
 *
 * The document tokens come from tokenizer_config.json beside the file:
 * doc_start = bos_token unless add_bos_token is false; doc_end = eos_token
 * when add_eos_token is true, else the vocabulary's end-of-text token
 * (<|end_of_text|> or <|endoftext|>) when it has one.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "io/tok_hfjson.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <utf8proc.h>

#include "io/tok_bpe.h"

#define FIX_KIND "the hf kind reads byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen2/3, DeepSeek-V3)"

/* An added token, for the matcher (contents sorted bytewise). */
typedef struct added {
    const char *text; /* NUL-terminated; points into the bpe's special names */
    size_t len;
    int32_t id;
} added_t;

typedef struct hf_tok {
    tok_bpe_t *bpe;
    int nfc;
    added_t *added; /* [n_added] sorted by text */
    int n_added;
    uint8_t first[32]; /* bit c: some added token starts with byte c */
    tok_bytes_t norm;  /* NFC scratch */
    /* tokenizer_config.json, for dreshard --to-hf: whether one was read,
     * and the ids of its bos_token and eos_token (TOK_NO_ID: none) */
    int config_read;
    int32_t config_bos, config_eos;
} hf_tok_t;

static int hf_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen);
static int hf_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen);
static void hf_destroy(tokenizer_t *tk);

static const tokenizer_ops_t hf_ops = {
    .kind = "hf",
    .encode = hf_encode,
    .decode = hf_decode,
    .destroy = hf_destroy,
};

/* ---- GPT-2's byte alphabet ---- */

/* byte_of[cp] for cp < 0x144: the byte code point cp spells, or -1. */
static void alphabet(int byte_of[0x144])
{
    int next = 0x100;
    for (int cp = 0; cp < 0x144; cp++)
        byte_of[cp] = -1;
    for (int c = 0; c < 256; c++) {
        const int printable = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff);
        byte_of[printable ? c : next++] = c;
    }
}

/* Alphabet text s[0..n) -> bytes in out (at most n); the byte count, or
 * -1 when s holds a character outside the alphabet (every one is below
 * U+0800: one or two UTF-8 bytes). */
static long unspell(const int byte_of[0x144], const char *s, size_t n, unsigned char *out)
{
    const unsigned char *u = (const unsigned char *)s, *end = u + n;
    long k = 0;
    while (u < end) {
        unsigned cp;
        if (u[0] < 0x80) {
            cp = *u++;
        } else if ((u[0] & 0xe0) == 0xc0 && u + 1 < end && (u[1] & 0xc0) == 0x80) {
            cp = (unsigned)(u[0] & 0x1f) << 6 | (u[1] & 0x3f);
            u += 2;
        } else {
            return -1;
        }
        if (cp >= 0x144 || byte_of[cp] < 0)
            return -1;
        out[k++] = (unsigned char)byte_of[cp];
    }
    return k;
}

/* ---- reading tokenizer.json ---- */

/* An error line quotes the file (token texts, type names, Jansson's
 * excerpt), which may hold "\n" or other control bytes: write them as
 * \xNN so the error stays one line (cut to errlen). */
static void one_line(char *err, size_t errlen)
{
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", err);
    size_t k = 0;
    for (const unsigned char *c = (const unsigned char *)copy; *c && k + 5 < errlen; c++) {
        if (*c < 0x20 || *c == 0x7f)
            k += (size_t)snprintf(err + k, errlen - k, "\\x%02x", *c);
        else
            err[k++] = (char)*c;
    }
    if (errlen > 0)
        err[k < errlen ? k : errlen - 1] = '\0';
}

static const char *type_of(const json_t *o)
{
    const char *t = json_string_value(json_object_get(o, "type"));
    return t ? t : "(none)";
}

/* Whether o's key is absent, null, false, or "" (a field a byte-level BPE
 * leaves unset). */
static int unset(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v == NULL || json_is_null(v) || json_is_false(v) || (json_is_string(v) && json_string_length(v) == 0) ||
           (json_is_real(v) && json_real_value(v) == 0.0);
}

static int check_model(const json_t *model, const char *label, char *err, size_t errlen)
{
    if (!json_is_object(model)) {
        snprintf(err, errlen, "%s: no \"model\" object: not a tokenizer.json; %s", label, FIX_KIND);
        return -1;
    }
    if (strcmp(type_of(model), "BPE") != 0) {
        snprintf(err, errlen,
                 "%s: tokenizer.json model type '%s' is not byte-level BPE: %s; use spm:MODEL for a "
                 "SentencePiece model",
                 label, type_of(model), FIX_KIND);
        return -1;
    }
    static const char *const keys[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!unset(model, keys[i])) {
            snprintf(err, errlen, "%s: the BPE model sets '%s', which byte-level BPE does not use: %s", label, keys[i],
                     FIX_KIND);
            return -1;
        }
    if (!json_is_object(json_object_get(model, "vocab")) || !json_is_array(json_object_get(model, "merges"))) {
        snprintf(err, errlen, "%s: the BPE model needs a \"vocab\" object and a \"merges\" array: fix the file", label);
        return -1;
    }
    return 0;
}

/* The normalizer: null, NFC, or a Sequence of NFCs (empty included).
 * *nfc = whether to normalise. */
static int check_normalizer(const json_t *n, int *nfc, const char *label, char *err, size_t errlen)
{
    if (n == NULL || json_is_null(n))
        return 0;
    if (strcmp(type_of(n), "NFC") == 0) {
        *nfc = 1;
        return 0;
    }
    const json_t *seq = json_object_get(n, "normalizers");
    if (strcmp(type_of(n), "Sequence") == 0 && json_is_array(seq)) {
        for (size_t i = 0; i < json_array_size(seq); i++)
            if (check_normalizer(json_array_get(seq, i), nfc, label, err, errlen) != 0)
                return -1;
        return 0;
    }
    snprintf(err, errlen, "%s: normalizer '%s' is not supported (only none or NFC): %s", label, type_of(n), FIX_KIND);
    return -1;
}

/* Rewrite a tokenizer.json pattern for PCRE2 with the reference's
 * semantics: \s and \S as ECMAScript's (TOK_JS_SPACE), and the case-
 * insensitive contractions group as transformers.js spells it (its
 * PROBLEMATIC_REGEX_MAP: ASCII case only, where PCRE2's (?i) would also
 * match U+017F for 's' and U+212A for 'k'). Other escapes keep PCRE2's
 * Unicode meaning (\d is \p{Nd}, as in Hugging Face's Oniguruma; none of
 * the known files uses \d or \w). -1: out of room; -2: \S in a class. */
static int js_pattern(const char *in, char *out, size_t cap)
{
    static const char contractions[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    static const char js_contractions[] = "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";
    size_t k = 0;
    int in_class = 0;
#define PUT(s)                                                                                                         \
    do {                                                                                                               \
        size_t n_ = strlen(s);                                                                                         \
        if (k + n_ >= cap)                                                                                             \
            return -1;                                                                                                 \
        memcpy(out + k, s, n_);                                                                                        \
        k += n_;                                                                                                       \
    } while (0)
    for (size_t i = 0; in[i];) {
        if (!in_class && strncmp(in + i, contractions, sizeof contractions - 1) == 0) {
            PUT(js_contractions);
            i += sizeof contractions - 1;
        } else if (in[i] == '\\' && (in[i + 1] == 's' || in[i + 1] == 'S')) {
            if (in_class && in[i + 1] == 'S')
                return -2; /* [^...] of a negated set: not needed by any known file */
            PUT(in_class ? TOK_JS_SPACE : in[i + 1] == 's' ? "[" TOK_JS_SPACE "]" : "[^" TOK_JS_SPACE "]");
            i += 2;
        } else if (in[i] == '\\' && in[i + 1]) {
            char esc[3] = {in[i], in[i + 1], '\0'};
            PUT(esc);
            i += 2;
        } else {
            char c[2] = {in[i], '\0'};
            if (!in_class && in[i] == '[') {
                in_class = 1;
                PUT(c);
                i++;
                if (in[i] == '^') {
                    PUT("^");
                    i++;
                }
                if (in[i] == ']') { /* a leading ']' is a member */
                    PUT("]");
                    i++;
                }
                continue;
            }
            if (in_class && in[i] == ']')
                in_class = 0;
            PUT(c);
            i++;
        }
    }
#undef PUT
    out[k] = '\0';
    return 0;
}

static int add_split(tok_bpe_t *b, const json_t *split, const char *label, char *err, size_t errlen)
{
    const char *re = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    if (re == NULL || behavior == NULL || strcmp(behavior, "Isolated") != 0 ||
        json_is_true(json_object_get(split, "invert"))) {
        snprintf(err, errlen,
                 "%s: a Split pre-tokenizer must have a Regex pattern, behavior Isolated and invert "
                 "false (this one has %s, %s): %s",
                 label, re ? "a Regex" : "no Regex", behavior ? behavior : "none", FIX_KIND);
        return -1;
    }
    /* \s (2 bytes) grows the most: into "[" TOK_JS_SPACE "]" */
    size_t cap = (sizeof TOK_JS_SPACE + 2) * strlen(re) + 256;
    char *js = malloc(cap), why[512];
    int rc = js ? js_pattern(re, js, cap) : -1;
    if (rc == 0 && tok_bpe_compile(b, js, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: Split %s", label, why);
        rc = -3;
    } else if (rc == -2) {
        snprintf(err, errlen,
                 "%s: Split pattern has \\S inside a character class, which the hf kind does not "
                 "translate: write it as a negated class",
                 label);
    } else if (rc == -1) {
        snprintf(err, errlen, "out of memory reading %s", label);
    }
    free(js);
    return rc == 0 ? 0 : -1;
}

static int add_byte_level(tok_bpe_t *b, const json_t *bl, const char *label, char *err, size_t errlen)
{
    if (json_is_true(json_object_get(bl, "add_prefix_space"))) {
        snprintf(err, errlen,
                 "%s: ByteLevel add_prefix_space is true, which the hf kind does not do: set it to "
                 "false (Llama 3, Qwen and DeepSeek-V3 files have false)",
                 label);
        return -1;
    }
    const json_t *use_regex = json_object_get(bl, "use_regex");
    if (use_regex && !json_is_false(use_regex) && !json_is_true(use_regex)) {
        snprintf(err, errlen, "%s: ByteLevel use_regex is not a boolean: fix the file", label);
        return -1;
    }
    /* absent means true, as in both implementations */
    return json_is_false(use_regex) ? 0 : tok_bpe_compile(b, TOK_PAT_GPT2, err, errlen);
}

/* The pre-tokenizer: ByteLevel, or a Sequence of Splits ending in ByteLevel. */
static int read_pre_tokenizer(tok_bpe_t *b, const json_t *pt, const char *label, char *err, size_t errlen)
{
    const char *t = type_of(pt);
    if (strcmp(t, "ByteLevel") == 0)
        return add_byte_level(b, pt, label, err, errlen);
    const json_t *seq = json_object_get(pt, "pretokenizers");
    size_t n = json_array_size(seq);
    if (strcmp(t, "Sequence") == 0 && n > 0 && strcmp(type_of(json_array_get(seq, n - 1)), "ByteLevel") == 0) {
        for (size_t i = 0; i + 1 < n; i++) {
            const json_t *step = json_array_get(seq, i);
            if (strcmp(type_of(step), "Split") != 0) {
                t = type_of(step);
                goto refuse;
            }
            if (add_split(b, step, label, err, errlen) != 0)
                return -1;
        }
        return add_byte_level(b, json_array_get(seq, n - 1), label, err, errlen);
    }
    for (size_t i = 0; i < n; i++)
        if (strcmp(type_of(json_array_get(seq, i)), "Metaspace") == 0)
            t = "Metaspace";
refuse:
    snprintf(err, errlen, "%s: pre-tokenizer '%s' is not byte-level (ByteLevel, after Split steps)%s: %s", label, t,
             strcmp(t, "Metaspace") == 0 ? "; a Metaspace BPE is SentencePiece-style: use spm:MODEL" : "", FIX_KIND);
    return -1;
}

static int check_decoder(const json_t *d, const char *label, char *err, size_t errlen)
{
    if (d == NULL || json_is_null(d) || strcmp(type_of(d), "ByteLevel") == 0)
        return 0;
    const json_t *seq = json_object_get(d, "decoders");
    for (size_t i = 0; strcmp(type_of(d), "Sequence") == 0 && i < json_array_size(seq); i++)
        if (strcmp(type_of(json_array_get(seq, i)), "ByteLevel") == 0)
            return 0;
    snprintf(err, errlen, "%s: decoder '%s' is not ByteLevel: %s", label, type_of(d), FIX_KIND);
    return -1;
}

/* The added tokens' contents, for the vocabulary check (a token outside
 * the byte alphabet must be one of them). */
static int is_added(const json_t *added, const char *s)
{
    for (size_t i = 0; i < json_array_size(added); i++) {
        const char *c = json_string_value(json_object_get(json_array_get(added, i), "content"));
        if (c && strcmp(c, s) == 0)
            return 1;
    }
    return 0;
}

/* vocab -> rank table (id = rank; ids of added tokens spelled outside the
 * alphabet stay holes, decoded as added tokens). */
static tok_bpe_t *read_vocab(const json_t *vocab, const json_t *added, const char *label, char *err, size_t errlen)
{
    int byte_of[0x144];
    alphabet(byte_of);
    json_int_t top = -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 28)) {
            snprintf(err, errlen, "%s: vocab id of '%.60s' is not an integer in 0..2^28-1: fix the file", label, key);
            return NULL;
        }
        top = json_integer_value(v) > top ? json_integer_value(v) : top;
    }
    /* ids are dense but for added tokens' (DeepSeek-V3's first three are
     * both); a sparse file would size the tables by its largest id */
    const size_t dense = json_object_size(vocab) + json_array_size(added);
    if ((size_t)(top + 1) > dense) {
        snprintf(err, errlen, "%s: vocab id %lld with %zu vocab and added tokens: ids must be 0..N-1: fix the file",
                 label, (long long)top, dense);
        return NULL;
    }
    tok_bpe_t *b = tok_bpe_new((int32_t)(top + 1));
    unsigned char *bytes = malloc(4096);
    if (b == NULL || bytes == NULL) {
        snprintf(err, errlen, "out of memory reading %s", label);
        goto fail;
    }
    json_object_foreach((json_t *)vocab, key, v)
    {
        const int32_t id = (int32_t)json_integer_value(v);
        long n = strlen(key) < 4096 ? unspell(byte_of, key, strlen(key), bytes) : -1;
        if (n <= 0 && is_added(added, key))
            continue;
        int32_t other = -1;
        int rc = n > 0 ? tok_bpe_set(b, id, bytes, (size_t)n, &other) : TOK_BPE_BAD;
        if (rc == 0)
            continue;
        if (rc < 0)
            snprintf(err, errlen, "out of memory reading %s", label);
        else if (rc == TOK_BPE_BAD)
            snprintf(err, errlen,
                     "%s: vocab token %d '%.60s' is not spelled in GPT-2's byte alphabet (nor an added "
                     "token): %s",
                     label, (int)id, key, FIX_KIND);
        else
            snprintf(err, errlen, "%s: vocab token '%.60s' has id %d, which token %d also has: fix the file", label,
                     key, (int)id, (int)other);
        goto fail;
    }
    for (int c = 0; c < 256; c++) {
        const unsigned char byte = (unsigned char)c;
        if (tok_bpe_rank(b, &byte, 1) < 0) {
            snprintf(err, errlen, "%s: no vocab token for the byte 0x%02x: a byte-level BPE needs all 256: %s", label,
                     c, FIX_KIND);
            goto fail;
        }
    }
    free(bytes);
    return b;
fail:
    free(bytes);
    tok_bpe_free(b);
    return NULL;
}

/* merge_ids's verdicts on one merge */
enum { MERGE_OK = 0, MERGE_FORM = -1, MERGE_LEFT = -2, MERGE_RIGHT = -3, MERGE_JOINED = -4 };

/* The parts of one merge, "a b" or ["a", "b"]: 0, or -1 when it is
 * neither form. */
static int merge_parts(const json_t *m, const char **l, size_t *llen, const char **r, size_t *rlen)
{
    if (json_is_string(m)) {
        *l = json_string_value(m);
        const char *space = strchr(*l, ' ');
        if (space == NULL || strchr(space + 1, ' ') != NULL)
            return -1;
        *llen = (size_t)(space - *l);
        *r = space + 1;
    } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        *l = json_string_value(json_array_get(m, 0));
        *r = json_string_value(json_array_get(m, 1));
        *llen = strlen(*l);
    } else {
        return -1;
    }
    *rlen = strlen(*r);
    return 0;
}

/* One merge: the ids of both parts and of the result, looked up in the
 * rank table b by their bytes (faster than Jansson's object, 280,000
 * merges of three lookups each for Llama 3). A part spelled outside
 * GPT-2's byte alphabet is no vocab token either. */
static int merge_ids(const tok_bpe_t *b, const int byte_of[0x144], const json_t *m, int32_t id[3], unsigned char *bytes,
                     size_t cap)
{
    const char *l, *r;
    size_t llen, rlen;
    if (merge_parts(m, &l, &llen, &r, &rlen) != 0)
        return MERGE_FORM;
    if (llen + rlen > cap)
        return llen > cap / 2 ? MERGE_LEFT : MERGE_RIGHT;
    const long nl = unspell(byte_of, l, llen, bytes);
    if (nl <= 0 || (id[0] = tok_bpe_rank(b, bytes, (size_t)nl)) < 0)
        return MERGE_LEFT;
    const long nr = unspell(byte_of, r, rlen, bytes + nl);
    if (nr <= 0 || (id[1] = tok_bpe_rank(b, bytes + nl, (size_t)nr)) < 0)
        return MERGE_RIGHT;
    id[2] = tok_bpe_rank(b, bytes, (size_t)(nl + nr));
    return id[2] >= 0 ? MERGE_OK : MERGE_JOINED;
}

/* n cut to at most max bytes, not inside a UTF-8 sequence of s */
static int utf8_cut(const char *s, size_t n, size_t max)
{
    if (n <= max)
        return (int)n;
    while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
        max--;
    return (int)max;
}

/* One line naming merge i of the file and what is wrong with it. */
static void merge_error(const json_t *m, size_t i, int why, const char *label, char *err, size_t errlen)
{
    const char *l, *r;
    size_t llen, rlen;
    if (why == MERGE_FORM || merge_parts(m, &l, &llen, &r, &rlen) != 0) {
        snprintf(err, errlen, "%s: model.merges[%zu] is not \"a b\" or [\"a\", \"b\"]: fix the file", label, i);
        return;
    }
    const int ll = utf8_cut(l, llen, 80), rl = utf8_cut(r, rlen, 80);
    if (why == MERGE_JOINED)
        snprintf(err, errlen,
                 "%s: model.merges[%zu] \"%.*s %.*s\": the merged token \"%.*s%.*s\" is not in the vocab: fix the "
                 "file",
                 label, i, ll, l, rl, r, ll, l, rl, r);
    else
        snprintf(err, errlen, "%s: model.merges[%zu] \"%.*s %.*s\": \"%.*s\" is not a vocab token: fix the file",
                 label, i, ll, l, rl, r, why == MERGE_LEFT ? ll : rl, why == MERGE_LEFT ? l : r);
}

static int read_merges(tok_bpe_t *b, const json_t *model, const char *label, char *err, size_t errlen)
{
    const json_t *merges = json_object_get(model, "merges");
    const size_t n = json_array_size(merges);
    if (n > (1 << 28) ||
        tok_bpe_use_merges(b, (int32_t)n, json_is_true(json_object_get(model, "ignore_merges"))) != 0) {
        snprintf(err, errlen, "out of memory reading %s (%zu merges)", label, n);
        return -1;
    }
    int byte_of[0x144];
    alphabet(byte_of);
    unsigned char bytes[8192];
    for (size_t i = 0; i < n; i++) {
        int32_t id[3];
        const json_t *m = json_array_get(merges, i);
        const int why = merge_ids(b, byte_of, m, id, bytes, sizeof bytes);
        if (why != MERGE_OK) {
            merge_error(m, i, why, label, err, errlen);
            return -1;
        }
        if (tok_bpe_set_merge(b, (int32_t)i, id[0], id[1], id[2]) != 0) {
            snprintf(err, errlen, "%s: model.merges[%zu] has an id out of range: fix the file", label, i);
            return -1;
        }
    }
    return 0;
}

/* ---- added tokens ---- */

static int by_text(const void *x, const void *y)
{
    const added_t *a = x, *b = y;
    const size_t n = a->len < b->len ? a->len : b->len;
    const int c = memcmp(a->text, b->text, n);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* The vocab's text of id (for an error line), or "?". */
static const char *vocab_text(const json_t *vocab, json_int_t id)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v)
    {
        if (json_integer_value(v) == id)
            return key;
    }
    return "?";
}

/* An added token's id must be its own: free in the vocab, or the vocab's
 * id of the same text; and no other added token's (decoding is by id). */
static int check_added_id(const hf_tok_t *h, const json_t *vocab, const json_t *added, size_t i, const char *label,
                          char *err, size_t errlen)
{
    const json_t *t = json_array_get(added, i);
    const char *text = json_string_value(json_object_get(t, "content"));
    const json_int_t id = json_integer_value(json_object_get(t, "id"));
    const json_t *own = json_object_get(vocab, text);
    size_t len;
    if (tok_bpe_token(h->bpe, (int32_t)id, &len) != NULL && (own == NULL || json_integer_value(own) != id)) {
        snprintf(err, errlen, "%s: added token '%.60s' has id %d, which vocab token '%.60s' has: fix the file", label,
                 text, (int)id, vocab_text(vocab, id));
        return -1;
    }
    for (size_t j = 0; j < i; j++)
        if (json_integer_value(json_object_get(json_array_get(added, j), "id")) == id) {
            snprintf(err, errlen, "%s: added tokens %zu and %zu both have id %d: fix the file", label, j, i, (int)id);
            return -1;
        }
    return 0;
}

/* Each added token: special for decoding, and matched in text (unless
 * split_special and it is special). */
static int read_added(hf_tok_t *h, const json_t *vocab, const json_t *added, int split_special, const char *label,
                      char *err, size_t errlen)
{
    const size_t n = json_array_size(added);
    h->added = calloc(n + 1, sizeof *h->added);
    if (h->added == NULL) {
        snprintf(err, errlen, "out of memory reading %s", label);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(added, i);
        const char *text = json_string_value(json_object_get(t, "content"));
        const json_t *id = json_object_get(t, "id");
        if (text == NULL || *text == '\0' || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 28)) {
            snprintf(err, errlen,
                     "%s: added token %zu needs a non-empty \"content\" and an \"id\" in 0..2^28-1: fix "
                     "the file",
                     label, i);
            return -1;
        }
        if (check_added_id(h, vocab, added, i, label, err, errlen) != 0)
            return -1;
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (size_t f = 0; f < sizeof flags / sizeof *flags; f++)
            if (json_is_true(json_object_get(t, flags[f]))) {
                snprintf(err, errlen, "%s: added token '%.60s' sets %s, which the hf kind does not implement: %s",
                         label, text, flags[f], FIX_KIND);
                return -1;
            }
        if (tok_bpe_add_special(h->bpe, text, (int32_t)json_integer_value(id)) != 0) {
            snprintf(err, errlen, "out of memory reading %s", label);
            return -1;
        }
        if (split_special && json_is_true(json_object_get(t, "special")))
            continue;
        h->added[h->n_added++] = (added_t){NULL, strlen(text), (int32_t)json_integer_value(id)};
        h->added[h->n_added - 1].text = text; /* re-pointed below at the bpe's copy */
    }
    return 0;
}

/* The matcher's table: the bpe's copies of the texts, sorted, and the
 * first-byte set. */
static void index_added(hf_tok_t *h, const tokenizer_t *tk)
{
    for (int i = 0; i < h->n_added; i++)
        for (int s = 0; s < tk->n_special; s++)
            if (tk->special_id[s] == h->added[i].id && strcmp(tk->special_name[s], h->added[i].text) == 0) {
                h->added[i].text = tk->special_name[s];
                break;
            }
    qsort(h->added, (size_t)h->n_added, sizeof *h->added, by_text);
    for (int i = 0; i < h->n_added; i++) {
        const unsigned char c = (unsigned char)h->added[i].text[0];
        h->first[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
}

/* The longest added token that t[0..n) starts with: its index, or -1. The
 * tokens sharing t's first d bytes are the sorted range [lo, hi); a token
 * of exactly d bytes sorts first in it. */
static int longest_added(const hf_tok_t *h, const unsigned char *t, size_t n)
{
    int lo = 0, hi = h->n_added, best = -1;
    size_t d = 0;
    while (lo < hi) {
        if (h->added[lo].len == d) {
            best = lo++;
            continue;
        }
        if (d == n)
            break;
        /* narrow to the tokens whose byte d is t[d] (all have > d bytes) */
        int a = lo, b = hi;
        while (a < b) {
            int mid = (a + b) / 2;
            if ((unsigned char)h->added[mid].text[d] < t[d])
                a = mid + 1;
            else
                b = mid;
        }
        lo = a;
        for (b = hi; a < b;) {
            int mid = (a + b) / 2;
            if ((unsigned char)h->added[mid].text[d] <= t[d])
                a = mid + 1;
            else
                b = mid;
        }
        hi = a;
        d++;
    }
    return best;
}

/* ---- encoding ---- */

/* NFC of valid UTF-8 runs of t[0..n), appended to h->norm; invalid bytes
 * are kept as they are (they stop any composition, as U+FFFD would). */
static int nfc_span(hf_tok_t *h, const char *t, size_t n)
{
    for (size_t run = 0; run < n;) {
        size_t end = run;
        utf8proc_int32_t cp;
        utf8proc_ssize_t len;
        while (end < n &&
               (len = utf8proc_iterate((const utf8proc_uint8_t *)t + end, (utf8proc_ssize_t)(n - end), &cp)) > 0)
            end += (size_t)len;
        if (end > run) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)t + run, (utf8proc_ssize_t)(end - run), &dst,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            const int rc = m < 0 ? -1 : tok_bytes_append(&h->norm, dst, (size_t)m);
            free(dst);
            if (rc != 0)
                return -1;
        }
        if (end < n && tok_bytes_append(&h->norm, t + end, 1) != 0)
            return -1;
        run = end + (end < n);
    }
    return 0;
}

/* NFC of t[0..n). Code points below U+0300 (lead bytes below 0xCC) are
 * their own NFC, and NFC never joins across an ASCII character's start (it
 * is a starter nothing before composes with), so only the stretches
 * between ASCII characters that hold a byte from 0xCC up go through
 * utf8proc, each with the ASCII character before it (an 'e' before U+0301).
 * *out is t itself when nothing needs it, else h->norm. */
static int nfc(hf_tok_t *h, const char *t, size_t n, const char **out, size_t *outn)
{
    const unsigned char *u = (const unsigned char *)t;
    size_t i = 0, done = 0;
    while (i < n && u[i] < 0xcc)
        i++;
    if (i == n) {
        *out = t, *outn = n;
        return 0;
    }
    h->norm.n = 0;
    while (i < n) {
        size_t a = i, b = i;
        while (a > done && u[a - 1] >= 0x80)
            a--;
        if (a > done)
            a--; /* the ASCII character before */
        while (b < n && u[b] >= 0x80)
            b++;
        if (tok_bytes_append(&h->norm, t + done, a - done) != 0 || nfc_span(h, t + a, b - a) != 0)
            return -1;
        done = i = b;
        while (i < n && u[i] < 0xcc)
            i++;
    }
    if (tok_bytes_append(&h->norm, t + done, n - done) != 0)
        return -1;
    *out = h->norm.data, *outn = h->norm.n;
    return 0;
}

/* Text between added tokens: normalise, pre-tokenise, BPE. */
static int section(hf_tok_t *h, const char *t, size_t n, tok_ids_t *out, char *err, size_t errlen)
{
    if (n == 0)
        return 0;
    if (h->nfc && nfc(h, t, n, &t, &n) != 0) {
        snprintf(err, errlen, "out of memory normalising (NFC) %zu bytes", n);
        return -1;
    }
    return tok_bpe_encode_bytes(h->bpe, t, n, out, err, errlen);
}

static int hf_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen)
{
    hf_tok_t *h = tk->impl;
    const unsigned char *t = (const unsigned char *)text;
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        const int k = h->first[t[i] >> 3] & (1u << (t[i] & 7)) ? longest_added(h, t + i, len - i) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        if (section(h, text + start, i - start, out, err, errlen) != 0)
            return -1;
        if (tok_ids_push(out, h->added[k].id) != 0) {
            snprintf(err, errlen, "out of memory encoding %zu bytes", len);
            return -1;
        }
        i += h->added[k].len;
        start = i;
    }
    return section(h, text + start, len - start, out, err, errlen);
}

static int hf_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen)
{
    return tok_bpe_decode_ids(((hf_tok_t *)tk->impl)->bpe, ids, n, out, err, errlen);
}

static void hf_free(hf_tok_t *h)
{
    if (h == NULL)
        return;
    tok_bpe_free(h->bpe);
    free(h->added);
    free(h->norm.data);
    free(h);
}

static void hf_destroy(tokenizer_t *tk)
{
    hf_free(tk->impl);
    tk->impl = NULL;
}

/* ---- tokenizer_config.json: the document tokens ---- */

/* A config token: "text", or {"content": "text", ...} (AddedToken). */
static const char *config_token(const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    return json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
}

static int32_t special_id(const tokenizer_t *tk, const char *name)
{
    for (int i = 0; name && i < tk->n_special; i++)
        if (strcmp(tk->special_name[i], name) == 0)
            return tk->special_id[i];
    return TOK_NO_ID;
}

static int doc_token(const tokenizer_t *tk, const json_t *cfg, const char *key, int32_t *id, const char *label,
                     char *err, size_t errlen)
{
    const char *name = config_token(cfg, key);
    *id = special_id(tk, name);
    if (name && *id == TOK_NO_ID) {
        snprintf(err, errlen,
                 "%s: %s '%.60s' is not an added token of the tokenizer.json beside it: use the "
                 "tokenizer_config.json that came with it",
                 label, key, name);
        return -1;
    }
    return 0;
}

static int doc_tokens(tokenizer_t *tk, const json_t *cfg, const char *label, char *err, size_t errlen)
{
    int32_t bos = TOK_NO_ID, eos = TOK_NO_ID;
    if (cfg && (doc_token(tk, cfg, "bos_token", &bos, label, err, errlen) != 0 ||
                doc_token(tk, cfg, "eos_token", &eos, label, err, errlen) != 0))
        return -1;
    hf_tok_t *h = tk->impl;
    h->config_read = cfg != NULL;
    h->config_bos = bos;
    h->config_eos = eos;
    if (!json_is_false(json_object_get(cfg, "add_bos_token")))
        tk->doc_start = bos;
    if (json_is_true(json_object_get(cfg, "add_eos_token")))
        tk->doc_end = eos;
    else if ((tk->doc_end = special_id(tk, "<|end_of_text|>")) == TOK_NO_ID) /* Llama 3 */
        tk->doc_end = special_id(tk, "<|endoftext|>");                       /* GPT-2, Qwen */
    return 0;
}

/* ---- opening ---- */

/* flags: JSON_DECODE_INT_AS_REAL for tokenizer_config.json, whose
 * model_max_length may be 1e30 written as an integer. */
static json_t *load_json(const char *data, size_t len, size_t flags, const char *label, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES | flags, &je);
    if (root == NULL)
        snprintf(err, errlen, "%s: not valid JSON at line %d column %d: %s: fix or re-fetch the file", label, je.line,
                 je.column, je.text);
    else if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: not a JSON object: fix or re-fetch the file", label);
        json_decref(root);
        root = NULL;
    }
    return root;
}

/* Everything but the rank table, which h->bpe already holds. */
static int read_rest(hf_tok_t *h, const json_t *root, const json_t *cfg, const char *label, char *err, size_t errlen)
{
    const json_t *model = json_object_get(root, "model");
    if (read_merges(h->bpe, model, label, err, errlen) != 0 ||
        check_normalizer(json_object_get(root, "normalizer"), &h->nfc, label, err, errlen) != 0 ||
        check_decoder(json_object_get(root, "decoder"), label, err, errlen) != 0)
        return -1;
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    if (pt == NULL || json_is_null(pt)) {
        snprintf(err, errlen, "%s: no pre_tokenizer: %s", label, FIX_KIND);
        return -1;
    }
    return read_pre_tokenizer(h->bpe, pt, label, err, errlen) != 0 ||
                   read_added(h, json_object_get(model, "vocab"), json_object_get(root, "added_tokens"),
                              json_is_true(json_object_get(cfg, "split_special_tokens")), label, err, errlen) != 0
               ? -1
               : 0;
}

int tok_hfjson_open_mem(tokenizer_t *tk, const char *json, size_t len, const char *config, size_t config_len,
                        const char *label, char *err, size_t errlen)
{
    json_t *root = load_json(json, len, 0, label, err, errlen), *cfg = NULL;
    char cfg_label[TOK_PATH_MAX + 64];
    snprintf(cfg_label, sizeof cfg_label, "the tokenizer_config.json beside %s", label);
    hf_tok_t *h = calloc(1, sizeof *h);
    int rc = -1;
    if (root == NULL || h == NULL) {
        if (h == NULL)
            snprintf(err, errlen, "out of memory reading %s", label);
        goto out;
    }
    if (config && (cfg = load_json(config, config_len, JSON_DECODE_INT_AS_REAL, cfg_label, err, errlen)) == NULL)
        goto out;
    const json_t *model = json_object_get(root, "model");
    if (check_model(model, label, err, errlen) != 0 ||
        (h->bpe = read_vocab(json_object_get(model, "vocab"), json_object_get(root, "added_tokens"), label, err,
                             errlen)) == NULL ||
        read_rest(h, root, cfg, label, err, errlen) != 0)
        goto out;
    tok_bpe_attach(tk, h->bpe, &hf_ops);
    tk->impl = h;
    index_added(h, tk);
    rc = doc_tokens(tk, cfg, label, err, errlen);
    h = NULL; /* tk owns it */
out:
    if (rc != 0)
        one_line(err, errlen);
    hf_free(h);
    json_decref(root);
    json_decref(cfg);
    return rc;
}

/* PATH: a tokenizer.json, a directory holding one, or a NAME of
 * DIR/hf/NAME/tokenizer.json (DIR: $DTRAIN_TOKENIZERS or the build's). */
static int resolve(const char *path, const char *tokdir, char abs[PATH_MAX], char *err, size_t errlen)
{
    char p[PATH_MAX + 64];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(p, sizeof p, "%s/tokenizer.json", path);
    else if (stat(path, &st) != 0 && strchr(path, '/') == NULL)
        snprintf(p, sizeof p, "%s/hf/%s/tokenizer.json", tokdir, path);
    else
        snprintf(p, sizeof p, "%s", path);
    if (realpath(p, abs) == NULL) {
        snprintf(err, errlen,
                 "tokenizer.json '%s' not found: name a tokenizer.json, its directory, or a NAME in "
                 "%s/hf/ (scripts/fetch-tokenizers.sh fetches llama3_1, qwen3, deepseek_v3)",
                 p, tokdir);
        return -1;
    }
    return 0;
}

int tok_hfjson_open(tokenizer_t *tk, const char *path, const char *tokdir, char *err, size_t errlen)
{
    char abs[PATH_MAX], cfg_path[PATH_MAX + 32];
    if (resolve(path, tokdir, abs, err, errlen) != 0)
        return -1;
    if (snprintf(tk->spec, sizeof tk->spec, "hf:%s", abs) >= (int)sizeof tk->spec ||
        snprintf(tk->vocab_path, sizeof tk->vocab_path, "%s", abs) >= (int)sizeof tk->vocab_path) {
        snprintf(err, errlen, "tokenizer.json path too long (%zu bytes): move the file", strlen(abs));
        return -1;
    }
    const char *slash = strrchr(abs, '/');
    snprintf(cfg_path, sizeof cfg_path, "%.*s/tokenizer_config.json", (int)(slash - abs), abs);
    char *data = NULL, *cfg = NULL;
    size_t len, cfg_len = 0;
    int rc = tok_bpe_read_file(abs, &data, &len, err, errlen);
    if (rc == 0 && access(cfg_path, F_OK) == 0)
        rc = tok_bpe_read_file(cfg_path, &cfg, &cfg_len, err, errlen);
    if (rc == 0)
        rc = tok_hfjson_open_mem(tk, data, len, cfg, cfg_len, abs, err, errlen);
    free(data);
    free(cfg);
    if (rc == 0)
        rc = tok_file_sha256(abs, tk->vocab_sha256, err, errlen);
    return rc;
}

void tok_hfjson_config(const tokenizer_t *tk, int *read, int32_t *bos, int32_t *eos)
{
    const hf_tok_t *h = tk->impl;
    *read = h->config_read;
    *bos = h->config_bos;
    *eos = h->config_eos;
}
