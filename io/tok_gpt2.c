/* The gpt2 tokenizer: OpenAI's GPT-2 byte-level BPE from encoder.json
 * (token -> id) and vocab.bpe (the merges in order), giving the ids
 * tiktoken's "gpt2" gives.
 *
 * Both files spell bytes in GPT-2's byte-level alphabet: bytes '!'..'~',
 * U+00A1..U+00AC and U+00AE..U+00FF stand for themselves, the other 68
 * bytes for U+0100.. in byte order. The rank table is built as tiktoken's
 * data_gym_to_mergeable_bpe_ranks does and checked against encoder.json:
 * ranks 0..255 are the single bytes in alphabet order (printable first),
 * merge line i ("A B") makes rank 256 + i = A B, and the one id left is
 * <|endoftext|>, the special token (= doc_start).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "io/tok_bpe.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define ENDOFTEXT "<|endoftext|>"
#define FIX_FETCH "re-run scripts/fetch-tokenizers.sh or point gpt2:DIR at intact files"

static const tokenizer_ops_t gpt2_ops = {
    .kind = "gpt2",
    .encode = tok_bpe_encode,
    .decode = tok_bpe_decode,
    .destroy = tok_bpe_destroy,
};

/* The byte-level alphabet, both ways: byte_cp[b] is the code point that
 * spells byte b; order[i] is the byte of rank i (printable bytes first);
 * shifted[k] is the byte that U+0100 + k spells. */
typedef struct alphabet {
    uint32_t byte_cp[256];
    unsigned char order[256];
    unsigned char shifted[68];
} alphabet_t;

static int printable(int c) { return (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff); }

static void alphabet_init(alphabet_t *a)
{
    int i = 0, shifted = 0;
    for (int c = 0; c < 256; c++)
        if (printable(c)) {
            a->byte_cp[c] = (uint32_t)c;
            a->order[i++] = (unsigned char)c;
        }
    for (int c = 0; c < 256; c++)
        if (!printable(c)) {
            a->shifted[shifted] = (unsigned char)c;
            a->byte_cp[c] = 256 + (uint32_t)shifted++;
            a->order[i++] = (unsigned char)c;
        }
}

/* The byte code point cp spells, or -1 (a table: the load unspells every
 * token of encoder.json and vocab.bpe, on every rank). */
static int cp_byte(const alphabet_t *a, uint32_t cp)
{
    if (cp < 256)
        return printable((int)cp) ? (int)cp : -1;
    return cp < 256 + 68 ? a->shifted[cp - 256] : -1;
}

/* s for an error line: control characters (a JSON key may hold "\n")
 * as \xNN, at most 60 bytes of s. */
static const char *quoted(const char *s, char *buf, size_t size)
{
    size_t k = 0;
    for (size_t i = 0; s[i] && i < 60 && k + 5 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            k += (size_t)snprintf(buf + k, size - k, "\\x%02x", c);
        else
            buf[k++] = (char)c;
    }
    buf[k] = '\0';
    return buf;
}

/* One UTF-8 code point at s[0..n): its length, or -1 when invalid. */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return -1;
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : -1;
    if (len < 0 || (size_t)len > n)
        return -1;
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        v = v << 6 | (s[i] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[len] || v > 0x10ffff || (v >= 0xd800 && v < 0xe000))
        return -1;
    *cp = v;
    return len;
}

/* GPT-2 alphabet text s[0..n) -> bytes (at most n of them) in out;
 * returns the byte count, or -1 (*bad = the offending code point, or
 * UINT32_MAX for invalid UTF-8). */
static long unspell(const alphabet_t *a, const char *s, size_t n, unsigned char *out, uint32_t *bad)
{
    const unsigned char *u = (const unsigned char *)s;
    long k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = utf8_decode(u + i, n - i, &cp);
        if (len < 0) {
            *bad = UINT32_MAX;
            return -1;
        }
        int byte = cp_byte(a, cp);
        if (byte < 0) {
            *bad = cp;
            return -1;
        }
        out[k++] = (unsigned char)byte;
        i += (size_t)len;
    }
    return k;
}

typedef struct merges {
    const char *text; /* vocab.bpe */
    size_t len;
    size_t first;   /* offset of the first merge line */
    int32_t n;      /* merge lines */
    int first_line; /* 1-based line number of the first merge */
} merges_t;

/* Count the merge lines of vocab.bpe: an optional "#version" line, then
 * lines "A B"; a trailing newline is optional. */
static int merges_scan(merges_t *m, const char *path, char *err, size_t errlen)
{
    const char *t = m->text, *end = t + m->len;
    m->first = 0;
    m->first_line = 1;
    if (m->len >= 8 && memcmp(t, "#version", 8) == 0) {
        const char *nl = memchr(t, '\n', m->len);
        m->first = nl ? (size_t)(nl + 1 - t) : m->len;
        m->first_line = 2;
    }
    m->n = 0;
    int line = m->first_line;
    for (const char *p = t + m->first; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *sp = memchr(p, ' ', (size_t)(e - p));
        if (sp == NULL || sp == p || sp + 1 == e || memchr(sp + 1, ' ', (size_t)(e - sp - 1)) != NULL) {
            snprintf(err, errlen, "%s:%d: a merge line is two tokens split by one space (\"A B\"): %s", path, line,
                     FIX_FETCH);
            return -1;
        }
        if (m->n == INT32_MAX - 257) {
            snprintf(err, errlen, "%s: too many merge lines: %s", path, FIX_FETCH);
            return -1;
        }
        m->n++;
        p = e + (nl != NULL);
    }
    return 0;
}

/* encoder.json -> ranks 0..n_ranks-1 of b, and the id of <|endoftext|>. */
static int load_encoder(tok_bpe_t *b, const alphabet_t *a, json_t *obj, const char *path, int32_t *eot, char *err,
                        size_t errlen)
{
    int32_t n_ranks = tok_bpe_n_ranks(b);
    const char *key;
    json_t *val;
    *eot = -1;
    char q[256];
    json_object_foreach(obj, key, val)
    {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id > n_ranks) {
            snprintf(err, errlen, "%s: key \"%s\": the id must be an integer in 0..%d: %s", path,
                     quoted(key, q, sizeof q), (int)n_ranks, FIX_FETCH);
            return -1;
        }
        if (strcmp(key, ENDOFTEXT) == 0) {
            *eot = (int32_t)id;
            continue;
        }
        /* GPT-2's keys are short: the stack holds all of them, so the
         * 50,257 keys cost no malloc each */
        size_t klen = strlen(key);
        unsigned char small[256];
        unsigned char *bytes = klen < sizeof small ? small : malloc(klen + 1);
        uint32_t bad = 0;
        long n = bytes ? unspell(a, key, klen, bytes, &bad) : -2;
        int32_t other = -1;
        int rc = n > 0 ? tok_bpe_set(b, (int32_t)id, bytes, (size_t)n, &other) : 0;
        if (bytes != small)
            free(bytes);
        if (n == -2 || rc < 0) {
            snprintf(err, errlen, "out of memory reading %s", path);
            return -1;
        }
        if (n <= 0) {
            snprintf(err, errlen,
                     n == 0              ? "%s: key \"%s\" is empty: %s"
                     : bad == UINT32_MAX ? "%s: key \"%s\" is not valid UTF-8: %s"
                                         : "%s: key \"%s\" has a character outside GPT-2's byte alphabet: %s",
                     path, quoted(key, q, sizeof q), FIX_FETCH);
            return -1;
        }
        if (rc == TOK_BPE_DUP_RANK || rc == TOK_BPE_DUP_TOKEN || rc == TOK_BPE_BAD) {
            snprintf(err, errlen, "%s: key \"%s\": id %d %s: %s", path, quoted(key, q, sizeof q), (int)id,
                     rc == TOK_BPE_BAD ? "is not a token id" : "is given twice", FIX_FETCH);
            return -1;
        }
    }
    if (*eot != n_ranks) {
        snprintf(err, errlen, "%s: \"%s\" must be the last id, %d: %s", path, ENDOFTEXT, (int)n_ranks, FIX_FETCH);
        return -1;
    }
    return 0;
}

/* Ranks 0..255 are the bytes in alphabet order. */
static int check_bytes(const tok_bpe_t *b, const alphabet_t *a, const char *path, char *err, size_t errlen)
{
    for (int i = 0; i < 256; i++) {
        int32_t r = tok_bpe_rank(b, &a->order[i], 1);
        if (r != i) {
            snprintf(err, errlen, "%s: the byte 0x%02x (U+%04X) must have id %d, not %d: %s", path, a->order[i],
                     (unsigned)a->byte_cp[a->order[i]], i, (int)r, FIX_FETCH);
            return -1;
        }
    }
    return 0;
}

/* Merge line i ("A B") makes rank 256 + i from two earlier tokens. */
static int check_merges(tok_bpe_t *b, const alphabet_t *a, const merges_t *m, const char *epath, const char *vpath,
                        char *err, size_t errlen)
{
    const char *p = m->text + m->first, *end = m->text + m->len;
    unsigned char buf[512];
    for (int32_t i = 0; i < m->n; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *sp = memchr(p, ' ', (size_t)(e - p));
        int line = m->first_line + (int)i;
        size_t la = (size_t)(sp - p), lb = (size_t)(e - sp - 1);
        uint32_t bad;
        long na = la < sizeof buf / 2 ? unspell(a, p, la, buf, &bad) : -1;
        long nb = lb < sizeof buf / 2 && na > 0 ? unspell(a, sp + 1, lb, buf + na, &bad) : -1;
        if (na <= 0 || nb <= 0) {
            snprintf(err, errlen, "%s:%d: a token is not spelled in GPT-2's byte alphabet (or too long): %s", vpath,
                     line, FIX_FETCH);
            return -1;
        }
        int32_t ra = tok_bpe_rank(b, buf, (size_t)na), rb = tok_bpe_rank(b, buf + na, (size_t)nb);
        if (ra < 0 || rb < 0 || ra >= 256 + i || rb >= 256 + i) {
            snprintf(err, errlen, "%s:%d: the merge's two tokens must be in %s with ids below %d: %s", vpath, line,
                     epath, 256 + (int)i, FIX_FETCH);
            return -1;
        }
        /* Every rank has a token (load_encoder filled n_ranks distinct
         * ones), so A B has rank 256 + i exactly when rank 256 + i's bytes
         * are A B: a compare instead of a third hash lookup per merge (the
         * load is paid by every rank, whatever their number). */
        size_t tlen;
        const unsigned char *tok = tok_bpe_token(b, 256 + i, &tlen);
        if (tlen != (size_t)(na + nb) || memcmp(tok, buf, tlen) != 0) {
            int32_t rab = tok_bpe_rank(b, buf, (size_t)(na + nb));
            snprintf(err, errlen, "%s:%d: the merged token has id %d in %s, not %d (256 + merge index): %s", vpath,
                     line, (int)rab, epath, 256 + (int)i, FIX_FETCH);
            return -1;
        }
        if (tok_bpe_set_split(b, 256 + i, (size_t)na) != 0) { /* tokenizer.json's merges, as given */
            snprintf(err, errlen, "out of memory reading %s", vpath);
            return -1;
        }
        p = e + (nl != NULL);
    }
    return 0;
}

static int load(tokenizer_t *tk, const char *encoder_json, size_t elen, const char *vocab_bpe, size_t vlen,
                const char *epath, const char *vpath, char *err, size_t errlen)
{
    merges_t m = {vocab_bpe, vlen, 0, 0, 1};
    if (merges_scan(&m, vpath, err, errlen) != 0)
        return -1;
    json_error_t jerr;
    json_t *obj = json_loadb(encoder_json, elen, JSON_REJECT_DUPLICATES, &jerr);
    if (obj == NULL) {
        char q[256];
        snprintf(err, errlen, "%s:%d:%d: %s: %s", epath, jerr.line, jerr.column, quoted(jerr.text, q, sizeof q),
                 FIX_FETCH);
        return -1;
    }
    tok_bpe_t *b = NULL;
    int rc = -1;
    size_t n = json_is_object(obj) ? json_object_size(obj) : 0;
    if (n != 257 + (size_t)m.n) {
        snprintf(err, errlen, "%s: %zu entries; %s's %d merges need %d (256 bytes, the merges, %s): %s", epath, n,
                 vpath, (int)m.n, 257 + (int)m.n, ENDOFTEXT, FIX_FETCH);
        goto out;
    }
    if ((b = tok_bpe_new(256 + m.n)) == NULL) {
        snprintf(err, errlen, "out of memory reading %s", epath);
        goto out;
    }
    alphabet_t a;
    alphabet_init(&a);
    int32_t eot;
    if (load_encoder(b, &a, obj, epath, &eot, err, errlen) != 0 || check_bytes(b, &a, epath, err, errlen) != 0 ||
        check_merges(b, &a, &m, epath, vpath, err, errlen) != 0)
        goto out;
    if (tok_bpe_add_special(b, ENDOFTEXT, eot) != 0) {
        snprintf(err, errlen, "out of memory reading %s", epath);
        goto out;
    }
    if (tok_bpe_compile(b, TOK_PAT_GPT2, err, errlen) != 0)
        goto out;
    tok_bpe_attach(tk, b, &gpt2_ops);
    tk->doc_start = eot;
    b = NULL;
    rc = 0;
out:
    tok_bpe_free(b);
    json_decref(obj);
    return rc;
}

int tok_gpt2_open_mem(tokenizer_t *tk, const char *encoder_json, size_t encoder_len, const char *vocab_bpe,
                      size_t vocab_len, const char *label, char *err, size_t errlen)
{
    char epath[TOK_PATH_MAX], vpath[TOK_PATH_MAX];
    if (snprintf(epath, sizeof epath, "%s/encoder.json", label) >= (int)sizeof epath ||
        snprintf(vpath, sizeof vpath, "%s/vocab.bpe", label) >= (int)sizeof vpath ||
        snprintf(tk->spec, sizeof tk->spec, "gpt2:%s", label) >= (int)sizeof tk->spec) {
        snprintf(err, errlen, "gpt2 vocabulary directory name too long (%zu bytes)", strlen(label));
        return -1;
    }
    return load(tk, encoder_json, encoder_len, vocab_bpe, vocab_len, epath, vpath, err, errlen);
}

int tok_gpt2_open(tokenizer_t *tk, const char *dir, char *err, size_t errlen)
{
    char abs[PATH_MAX], epath[TOK_PATH_MAX], vpath[TOK_PATH_MAX];
    if (realpath(dir, abs) == NULL) {
        snprintf(err, errlen,
                 "gpt2 vocabulary directory '%s' not found: run scripts/fetch-tokenizers.sh, set "
                 "DTRAIN_TOKENIZERS, or write gpt2:DIR",
                 dir);
        return -1;
    }
    if (snprintf(epath, sizeof epath, "%s/encoder.json", abs) >= (int)sizeof epath ||
        snprintf(vpath, sizeof vpath, "%s/vocab.bpe", abs) >= (int)sizeof vpath ||
        snprintf(tk->spec, sizeof tk->spec, "gpt2:%s", abs) >= (int)sizeof tk->spec) {
        snprintf(err, errlen, "gpt2 vocabulary directory name too long (%zu bytes): move the files", strlen(abs));
        return -1;
    }
    char *ej = NULL, *vb = NULL;
    size_t elen, vlen;
    int rc = -1;
    if (tok_bpe_read_file(epath, &ej, &elen, err, errlen) != 0 ||
        tok_bpe_read_file(vpath, &vb, &vlen, err, errlen) != 0) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, ": %s", FIX_FETCH);
        goto out;
    }
    if (load(tk, ej, elen, vb, vlen, epath, vpath, err, errlen) != 0 ||
        tok_file_sha256(epath, tk->vocab_sha256, err, errlen) != 0)
        goto out;
    memcpy(tk->vocab_path, epath, sizeof epath);
    rc = 0;
out:
    free(ej);
    free(vb);
    return rc;
}
