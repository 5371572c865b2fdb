/* The tiktoken tokenizer: a tiktoken rank file (one line "BASE64TOKEN RANK"
 * per mergeable token, as OpenAI's *.tiktoken files and Meta's Llama 3
 * tokenizer.model are) with a named encoding, which gives what the file
 * lacks: the pre-tokenizer pattern and the special tokens.
 *
 * The patterns are tiktoken's, in PCRE2 syntax. For the OpenAI encodings
 * \s is ECMAScript's (TOK_JS_SPACE), since js-tiktoken is the reference
 * the tests hold us to; for llama3 it is Unicode White_Space, what
 * tiktoken's Rust regex (the reference Meta uses) means by \s. The two
 * differ only on U+0085 (White_Space) and U+FEFF (ECMAScript).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "io/tok_bpe.h"
#include "io/tok_hf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX_RANKS "regenerate it with scripts/fetch-tokenizers.sh or use an intact rank file"

static const tokenizer_ops_t tiktoken_ops = {
    .kind = "tiktoken",
    .encode = tok_bpe_encode,
    .decode = tok_bpe_decode,
    .destroy = tok_bpe_destroy,
};

/* ---- the named encodings ---- */

#define SP "[" TOK_JS_SPACE "]"
#define NOT_SP "[^" TOK_JS_SPACE "]"
#define NOT_SP_L_N "[^" TOK_JS_SPACE "\\p{L}\\p{N}]"
#define CONTRACTIONS "'s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D"

/* cl100k_base: ('s|'S|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 * ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ (js-tiktoken's
 * spelling: the case variants written out instead of (?i:...)) */
#define PAT_CL100K                                                                                                     \
    "(" CONTRACTIONS ")|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?" NOT_SP_L_N "+[\\r\\n]*|" SP "*[\\r\\n]+|" SP     \
    "+(?!" NOT_SP ")|" SP "+"

/* o200k_base: words split at case changes, contractions attached. */
#define PAT_O200K                                                                                                      \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(" CONTRACTIONS          \
    ")?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(" CONTRACTIONS       \
    ")?|\\p{N}{1,3}| ?" NOT_SP_L_N "+[\\r\\n/]*|" SP "*[\\r\\n]+|" SP "+(?!" NOT_SP ")|" SP "+"

/* Meta's Llama 3 (tokenizer.py), \s as Unicode White_Space. */
#define PAT_LLAMA3                                                                                                     \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                                         \
    "?[^\\p{White_Space}\\p{L}\\p{N}]+[\\r\\n]*|\\p{White_Space}*[\\r\\n]+|\\p{White_Space}+"                          \
    "(?!\\P{White_Space})|\\p{White_Space}+"

typedef struct special {
    const char *name;
    int32_t id;
} special_t;

typedef struct encoding {
    const char *name;
    const char *pattern;
    const char *hf_pattern;   /* the same in tiktoken's own (Oniguruma-compatible) spelling, for tokenizer.json */
    int32_t n_ranks;          /* mergeable tokens the rank file must hold */
    const special_t *special; /* the first is doc_start */
    int n_special;
    int32_t reserved_from; /* Llama 3: ids reserved_from..n_reserved_to-1 are */
    int32_t reserved_to;   /* <|reserved_special_token_K|>, K counting from 5 */
} encoding_t;

static const special_t r50k_special[] = {{"<|endoftext|>", 50256}};
static const special_t cl100k_special[] = {
    {"<|endoftext|>", 100257},  {"<|fim_prefix|>", 100258},  {"<|fim_middle|>", 100259},
    {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276},
};
static const special_t o200k_special[] = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
static const special_t llama3_special[] = {
    {"<|begin_of_text|>", 128000},
    {"<|end_of_text|>", 128001},
    {"<|reserved_special_token_0|>", 128002},
    {"<|reserved_special_token_1|>", 128003},
    {"<|reserved_special_token_2|>", 128004},
    {"<|reserved_special_token_3|>", 128005},
    {"<|start_header_id|>", 128006},
    {"<|end_header_id|>", 128007},
    {"<|reserved_special_token_4|>", 128008},
    {"<|eot_id|>", 128009},
};

#define N_OF(a) ((int)(sizeof a / sizeof a[0]))

/* tiktoken's patterns as tiktoken (openai_public.py) and the Hugging Face
 * tokenizer.json files of these vocabularies write them. */
#define HF_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define HF_PAT_R50K "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define HF_PAT_CL100K                                                                                                  \
    HF_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"         \
                    "\\s+(?!\\S)|\\s+"
#define HF_PAT_O200K                                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" HF_CONTRACTIONS        \
    "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" HF_CONTRACTIONS      \
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const encoding_t encodings[] = {
    {"r50k_base", TOK_PAT_GPT2, HF_PAT_R50K, 50256, r50k_special, N_OF(r50k_special), 0, 0},
    {"cl100k_base", PAT_CL100K, HF_PAT_CL100K, 100256, cl100k_special, N_OF(cl100k_special), 0, 0},
    {"o200k_base", PAT_O200K, HF_PAT_O200K, 199998, o200k_special, N_OF(o200k_special), 0, 0},
    {"llama3", PAT_LLAMA3, HF_PAT_CL100K, 128000, llama3_special, N_OF(llama3_special), 128010, 128256},
};

static const encoding_t *find_encoding(const char *name)
{
    for (int i = 0; i < N_OF(encodings); i++)
        if (strcmp(encodings[i].name, name) == 0)
            return &encodings[i];
    return NULL;
}

const char *tok_hf_pattern(const tokenizer_t *tk)
{
    if (strcmp(tk->ops->kind, "gpt2") == 0) /* GPT-2's pattern is r50k_base's */
        return HF_PAT_R50K;
    if (strcmp(tk->ops->kind, "tiktoken") != 0)
        return NULL;
    const char *colon = strrchr(tk->spec, ':'); /* the spec ends ":ENCODING" */
    const encoding_t *enc = colon ? find_encoding(colon + 1) : NULL;
    return enc ? enc->hf_pattern : NULL;
}

/* ---- the rank file ---- */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Strict standard base64 (padded to a multiple of 4): s[0..n) -> out;
 * the byte count, or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0 || n % 4 != 0)
        return -1;
    long k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = (u[i + 3] == '=') + (u[i + 2] == '=');
        if (pad > 0 && i + 4 != n)
            return -1;
        if (pad == 1 && u[i + 2] == '=')
            return -1; /* "x=y=" */
        int v[4];
        for (int j = 0; j < 4 - pad; j++)
            if ((v[j] = b64_value(u[i + j])) < 0)
                return -1;
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (pad < 2 ? (uint32_t)v[2] << 6 : 0) |
                     (pad < 1 ? (uint32_t)v[3] : 0);
        out[k++] = (unsigned char)(w >> 16);
        if (pad < 2)
            out[k++] = (unsigned char)(w >> 8);
        if (pad < 1)
            out[k++] = (unsigned char)w;
    }
    return k;
}

/* Lines of text[0..len): a trailing newline is optional. */
static long count_lines(const char *text, size_t len)
{
    long n = 0;
    for (const char *p = text, *end = text + len; p < end; n++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    return n;
}

/* One line "BASE64 RANK" -> b (a CR before the newline is allowed). */
static int parse_line(tok_bpe_t *b, const char *p, const char *e, long line, const char *label, unsigned char *buf,
                      char *err, size_t errlen)
{
    if (e > p && e[-1] == '\r')
        e--;
    const char *sp = memchr(p, ' ', (size_t)(e - p));
    const char *r = sp ? sp + 1 : e;
    int32_t rank = 0;
    int digits = 0;
    for (; r < e && *r >= '0' && *r <= '9' && digits < 9; r++, digits++)
        rank = rank * 10 + (*r - '0'); /* 9 digits: no overflow; ranks are < 2^24 */
    if (sp == NULL || digits == 0 || r != e) {
        snprintf(err, errlen, "%s:%ld: a line is \"BASE64TOKEN RANK\" (one space, a decimal rank): %s", label, line,
                 FIX_RANKS);
        return -1;
    }
    long n = b64_decode(p, (size_t)(sp - p), buf);
    if (n <= 0) {
        snprintf(err, errlen, "%s:%ld: the token is not valid padded base64: %s", label, line, FIX_RANKS);
        return -1;
    }
    int32_t other = -1;
    int rc = tok_bpe_set(b, rank, buf, (size_t)n, &other);
    if (rc == 0)
        return 0;
    if (rc < 0)
        snprintf(err, errlen, "out of memory reading %s", label);
    else if (rc == TOK_BPE_BAD)
        snprintf(err, errlen, "%s:%ld: rank %d is not below the number of lines, %d: ranks must be 0..N-1: %s", label,
                 line, (int)rank, (int)tok_bpe_n_ranks(b), FIX_RANKS);
    else if (rc == TOK_BPE_DUP_RANK)
        snprintf(err, errlen, "%s:%ld: rank %d is given twice: %s", label, line, (int)rank, FIX_RANKS);
    else
        snprintf(err, errlen, "%s:%ld: the token of rank %d already has rank %d: %s", label, line, (int)rank,
                 (int)other, FIX_RANKS);
    return -1;
}

int tok_tiktoken_parse(tok_bpe_t **out, const char *data, size_t len, const char *label, char *err, size_t errlen)
{
    *out = NULL;
    long n = count_lines(data, len);
    if (n < 256 || n > (1 << 24)) {
        snprintf(err, errlen, "%s: %ld lines; a rank file has one per token, 256 to %d of them: %s", label, n, 1 << 24,
                 FIX_RANKS);
        return -1;
    }
    tok_bpe_t *b = tok_bpe_new((int32_t)n);
    unsigned char *buf = malloc(len);
    if (b == NULL || buf == NULL) {
        snprintf(err, errlen, "out of memory reading %s", label);
        goto fail;
    }
    long line = 1;
    for (const char *p = data, *end = data + len; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        if (parse_line(b, p, e, line, label, buf, err, errlen) != 0)
            goto fail;
        p = e + (nl != NULL);
    }
    int32_t missing_rank;
    int missing_byte;
    if (tok_bpe_check(b, &missing_rank, &missing_byte) != 0) {
        /* with n lines and no duplicate rank in 0..n-1, no rank is missing */
        snprintf(err, errlen, "%s: no token for the byte 0x%02x: a byte-level BPE needs all 256 single bytes: %s",
                 label, missing_byte, FIX_RANKS);
        goto fail;
    }
    free(buf);
    *out = b;
    return 0;
fail:
    free(buf);
    tok_bpe_free(b);
    return -1;
}

/* The encoding's special tokens, its pattern, and the ops into tk. */
static int apply_encoding(tokenizer_t *tk, tok_bpe_t *b, const encoding_t *enc, const char *label, char *err,
                          size_t errlen)
{
    if (tok_bpe_n_ranks(b) != enc->n_ranks) {
        snprintf(err, errlen,
                 "%s has %d ranks but encoding %s has %d: name the file's encoding (tiktoken:FILE:ENCODING)", label,
                 (int)tok_bpe_n_ranks(b), enc->name, (int)enc->n_ranks);
        return -1;
    }
    for (int i = 0; i < enc->n_special; i++)
        if (tok_bpe_add_special(b, enc->special[i].name, enc->special[i].id) != 0)
            goto oom;
    for (int32_t id = enc->reserved_from; id < enc->reserved_to; id++) {
        char name[64];
        snprintf(name, sizeof name, "<|reserved_special_token_%d|>", (int)(id - enc->reserved_from + 5));
        if (tok_bpe_add_special(b, name, id) != 0)
            goto oom;
    }
    if (tok_bpe_compile(b, enc->pattern, err, errlen) != 0)
        return -1;
    tok_bpe_attach(tk, b, &tiktoken_ops);
    tk->doc_start = enc->special[0].id;
    return 0;
oom:
    snprintf(err, errlen, "out of memory reading %s", label);
    return -1;
}

static int unknown_encoding(const char *name, char *err, size_t errlen)
{
    int used = snprintf(err, errlen, "unknown tiktoken encoding '%s': use one of", name);
    for (int i = 0; i < N_OF(encodings) && used >= 0 && (size_t)used < errlen; i++)
        used += snprintf(err + used, errlen - (size_t)used, "%s %s", i ? "," : "", encodings[i].name);
    if (used >= 0 && (size_t)used < errlen)
        snprintf(err + used, errlen - (size_t)used, " (tiktoken:FILE:ENCODING)");
    return -1;
}

int tok_tiktoken_open_mem(tokenizer_t *tk, const char *data, size_t len, const char *label, const char *encoding,
                          char *err, size_t errlen)
{
    const encoding_t *enc = find_encoding(encoding);
    if (enc == NULL)
        return unknown_encoding(encoding, err, errlen);
    tok_bpe_t *b;
    if (tok_tiktoken_parse(&b, data, len, label, err, errlen) != 0)
        return -1;
    if (apply_encoding(tk, b, enc, label, err, errlen) != 0) {
        tok_bpe_free(b);
        return -1;
    }
    return 0;
}

/* The file's base name without ".tiktoken" names the default encoding. */
static void default_encoding(const char *path, char *name, size_t size)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 9 && strcmp(base + n - 9, ".tiktoken") == 0)
        n -= 9;
    snprintf(name, size, "%.*s", (int)(n < size ? n : size - 1), base);
}

int tok_tiktoken_open(tokenizer_t *tk, const char *file, const char *encoding, char *err, size_t errlen)
{
    char abs[PATH_MAX], name[256];
    if (encoding == NULL || *encoding == '\0') {
        default_encoding(file, name, sizeof name);
        encoding = name;
    }
    if (find_encoding(encoding) == NULL) {
        int used = snprintf(err, errlen, "%s: ", file);
        if (used > 0 && (size_t)used < errlen)
            unknown_encoding(encoding, err + used, errlen - (size_t)used);
        return -1;
    }
    if (realpath(file, abs) == NULL) {
        snprintf(err, errlen,
                 "tiktoken rank file '%s' not found: run scripts/fetch-tokenizers.sh or name an existing file", file);
        return -1;
    }
    if (snprintf(tk->spec, sizeof tk->spec, "tiktoken:%s:%s", abs, encoding) >= (int)sizeof tk->spec ||
        snprintf(tk->vocab_path, sizeof tk->vocab_path, "%s", abs) >= (int)sizeof tk->vocab_path) {
        snprintf(err, errlen, "tiktoken rank file path too long (%zu bytes): move the file", strlen(abs));
        return -1;
    }
    char *data;
    size_t len;
    if (tok_bpe_read_file(abs, &data, &len, err, errlen) != 0)
        return -1;
    int rc = tok_tiktoken_open_mem(tk, data, len, abs, encoding, err, errlen);
    free(data);
    if (rc == 0)
        rc = tok_file_sha256(abs, tk->vocab_sha256, err, errlen);
    return rc;
}
