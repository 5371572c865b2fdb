/* The tokenizer sidecar (PREFIX.tokenizer.json): written by dtrain-prepare,
 * read by dtrain. JSON through Jansson; the layout is in tok_sidecar.h. */
#define _GNU_SOURCE /* glob, stat, access */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "io/tok_sidecar.h"

#include "io/fsutil.h"
#include "io/publish.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

/* A sidecar is a few KB (llama3's 256 special tokens are the most); a
 * bigger file is not one. */
#define SIDECAR_MAX_BYTES (4 << 20)
#define SIDECAR_MAX_SPECIAL (1 << 20)

static const char *const kinds[] = {"byte", "gpt2", "tiktoken", "spm", "hf", NULL};
static const char *const data_formats[] = {"llmc", "megatron", NULL};

/* ---- writing ---------------------------------------------------------------------------- */

void tok_sidecar_from_tokenizer(tok_sidecar_t *s, const tokenizer_t *tk)
{
    memset(s, 0, sizeof *s);
    snprintf(s->kind, sizeof s->kind, "%s", tk->ops && tk->ops->kind ? tk->ops->kind : "");
    snprintf(s->spec, sizeof s->spec, "%s", tk->spec);
    snprintf(s->vocab_path, sizeof s->vocab_path, "%s", tk->vocab_path);
    snprintf(s->vocab_sha256, sizeof s->vocab_sha256, "%s", tk->vocab_sha256);
    s->vocab_size = tk->vocab_size;
    s->doc_start = tk->doc_start;
    s->doc_end = tk->doc_end;
}

/* json_object_set_new that remembers a failure (NULL value: a string that
 * is not UTF-8, or out of memory) instead of returning it at every call. */
static void put(json_t *obj, const char *key, json_t *v, const char **bad)
{
    if (v == NULL || json_object_set_new(obj, key, v) != 0) {
        if (*bad == NULL)
            *bad = key;
    }
}

static json_t *id_or_null(int32_t id) { return id == TOK_NO_ID ? json_null() : json_integer(id); }

static json_t *split_counts(uint64_t docs, uint64_t tokens, const char **bad)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    put(o, "documents", json_integer((json_int_t)docs), bad);
    put(o, "tokens", json_integer((json_int_t)tokens), bad);
    return o;
}

static json_t *special_tokens(const tokenizer_t *tk, const char **bad)
{
    json_t *a = json_array();
    for (int i = 0; a && tk && i < tk->n_special; i++) {
        json_t *o = json_object();
        if (o == NULL || json_array_append_new(a, o) != 0) {
            *bad = "special_tokens";
            break;
        }
        put(o, "name", json_string(tk->special_name[i]), bad);
        put(o, "id", json_integer(tk->special_id[i]), bad);
    }
    return a;
}

char *tok_sidecar_format(const tok_sidecar_t *s, const tokenizer_t *tk, char *err, size_t errlen)
{
    const char *bad = NULL;
    json_t *root = json_object();
    if (root == NULL) {
        snprintf(err, errlen, "out of memory formatting the tokenizer sidecar");
        return NULL;
    }
    put(root, "format", json_string("dtrain-tokenizer"), &bad);
    put(root, "version", json_integer(TOK_SIDECAR_VERSION), &bad);
    put(root, "kind", json_string(s->kind), &bad);
    put(root, "spec", json_string(s->spec), &bad);
    put(root, "vocab_path", json_string(s->vocab_path), &bad);
    put(root, "vocab_sha256", json_string(s->vocab_sha256), &bad);
    put(root, "vocab_size", json_integer(s->vocab_size), &bad);
    put(root, "doc_start", id_or_null(s->doc_start), &bad);
    put(root, "doc_end", id_or_null(s->doc_end), &bad);
    put(root, "special_tokens", special_tokens(tk, &bad), &bad);
    put(root, "data_format", json_string(s->data_format), &bad);
    put(root, "token_bytes", json_integer(s->token_bytes), &bad);
    put(root, "train", split_counts(s->docs[0], s->tokens[0], &bad), &bad);
    put(root, "val", split_counts(s->docs[1], s->tokens[1], &bad), &bad);
    /* insertion order (Jansson keeps it): the same bytes on every run */
    char *text = bad ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (bad)
        snprintf(err, errlen, "tokenizer sidecar field '%s': not valid UTF-8 (or out of memory); use a UTF-8 path",
                 bad);
    else if (text == NULL)
        snprintf(err, errlen, "out of memory formatting the tokenizer sidecar");
    return text;
}

/* The directory part of path ("." when none) into out. */
int tok_sidecar_write(const char *path, const tok_sidecar_t *s, const tokenizer_t *tk, char *err, size_t errlen)
{
    char *text = tok_sidecar_format(s, tk, err, errlen);
    if (text == NULL)
        return -1;
    if (strlen(path) + 4 >= TOK_PATH_MAX + 8) { /* PATH.tmp as long as it always could be */
        snprintf(err, errlen, "sidecar path too long: '%.200s'", path);
        free(text);
        return -1;
    }
    size_t len = strlen(text);
    text[len] = '\n'; /* a text file ends with a newline; the NUL is not written */
    publish_t pub;
    int rc = publish_open(&pub, path, 0666, err, errlen);
    if (rc == 0 && publish_write(&pub, text, len + 1, err, errlen) != 0) {
        publish_abort(&pub, err, errlen); /* nothing half-written stays behind */
        rc = -1;
    } else if (rc == 0) {
        rc = publish_commit(&pub, err, errlen);
    }
    free(text);
    return rc;
}

/* Errors are one line: a value quoted from the file (a JSON string may
 * hold "\n") or a path must not break it. */
static void one_line(char *err)
{
    for (; *err; err++)
        if ((unsigned char)*err < 0x20 || *err == 0x7f)
            *err = '?';
}

/* ---- reading ---------------------------------------------------------------------------- */

static int one_of(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return 1;
    return 0;
}

/* A string field into out (it must fit, hold no NUL, and be non-empty
 * unless may_be_empty). */
static int get_str(const json_t *root, const char *key, char *out, size_t outlen, int may_be_empty, char *err,
                   size_t errlen)
{
    const json_t *v = json_object_get(root, key);
    if (!json_is_string(v)) {
        snprintf(err, errlen, "field '%s': %s", key, v ? "expected a string" : "missing");
        return -1;
    }
    size_t len = json_string_length(v);
    if (len >= outlen || strlen(json_string_value(v)) != len || (len == 0 && !may_be_empty)) {
        snprintf(err, errlen, "field '%s': %s", key,
                 len == 0        ? "empty"
                 : len >= outlen ? "too long"
                                 : "holds a NUL byte");
        return -1;
    }
    memcpy(out, json_string_value(v), len + 1);
    return 0;
}

static int get_int(const json_t *root, const char *key, long long lo, long long hi, long long *out, char *err,
                   size_t errlen)
{
    const json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        snprintf(err, errlen, "field '%s': %s an integer in %lld..%lld", key, v ? "expected" : "missing:", lo, hi);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

/* A token id field: null (none) or 0..vocab-1. */
static int get_id(const json_t *root, const char *key, int vocab, int32_t *out, char *err, size_t errlen)
{
    const json_t *v = json_object_get(root, key);
    if (json_is_null(v)) {
        *out = TOK_NO_ID;
        return 0;
    }
    long long id;
    if (get_int(root, key, 0, vocab - 1, &id, err, errlen) != 0) {
        snprintf(err, errlen, "field '%s': expected null or a token id in 0..%d", key, vocab - 1);
        return -1;
    }
    *out = (int32_t)id;
    return 0;
}

static int check_sha256(const char *hex, const char *kind, char *err, size_t errlen)
{
    size_t n = strspn(hex, "0123456789abcdef");
    int is_byte = strcmp(kind, "byte") == 0;
    if (is_byte ? hex[0] != '\0' : n != 64 || hex[64] != '\0') {
        snprintf(err, errlen, "field 'vocab_sha256': expected %s",
                 is_byte ? "\"\" for kind byte" : "64 lower-case hex digits");
        return -1;
    }
    return 0;
}

/* The spec must name the kind: "byte", or "KIND:..." for the others. */
static int check_tokenizer_fields(const tok_sidecar_t *s, char *err, size_t errlen)
{
    if (!one_of(s->kind, kinds)) {
        snprintf(err, errlen, "field 'kind': '%s' is not byte|gpt2|tiktoken|spm|hf", s->kind);
        return -1;
    }
    size_t k = strlen(s->kind);
    int is_byte = strcmp(s->kind, "byte") == 0;
    if (strncmp(s->spec, s->kind, k) != 0 || (is_byte ? s->spec[k] != '\0' : s->spec[k] != ':')) {
        snprintf(err, errlen, "field 'spec': '%.200s' is not a spec of kind %s", s->spec, s->kind);
        return -1;
    }
    if (is_byte ? s->vocab_path[0] != '\0' : s->vocab_path[0] != '/') {
        snprintf(err, errlen, "field 'vocab_path': expected %s", is_byte ? "\"\" for kind byte" : "an absolute path");
        return -1;
    }
    if (is_byte && s->vocab_size != 256) {
        snprintf(err, errlen, "field 'vocab_size': kind byte has 256 tokens, not %d", s->vocab_size);
        return -1;
    }
    return check_sha256(s->vocab_sha256, s->kind, err, errlen);
}

static int parse_specials(const json_t *root, int vocab, char *err, size_t errlen)
{
    const json_t *a = json_object_get(root, "special_tokens");
    if (!json_is_array(a) || json_array_size(a) > SIDECAR_MAX_SPECIAL) {
        snprintf(err, errlen, "field 'special_tokens': %s", a ? "expected an array of {\"name\", \"id\"}" : "missing");
        return -1;
    }
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *o = json_array_get(a, i);
        const json_t *name = json_object_get(o, "name");
        const json_t *id = json_object_get(o, "id");
        if (!json_is_object(o) || !json_is_string(name) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= vocab) {
            snprintf(err, errlen, "field 'special_tokens' [%zu]: expected {\"name\": string, \"id\": 0..%d}", i,
                     vocab - 1);
            return -1;
        }
    }
    return 0;
}

static int parse_split(const json_t *root, const char *key, uint64_t *docs, uint64_t *tokens, char *err, size_t errlen)
{
    const json_t *o = json_object_get(root, key);
    long long d, t;
    if (!json_is_object(o)) {
        snprintf(err, errlen, "field '%s': %s", key, o ? "expected {\"documents\": N, \"tokens\": N}" : "missing");
        return -1;
    }
    static const char *const fields[2] = {"documents", "tokens"};
    long long *vals[2] = {&d, &t};
    for (int i = 0; i < 2; i++)
        if (get_int(o, fields[i], 0, INT64_MAX, vals[i], err, errlen) != 0) {
            snprintf(err, errlen, "field '%s.%s': expected an integer >= 0", key, fields[i]);
            return -1;
        }
    *docs = (uint64_t)d;
    *tokens = (uint64_t)t;
    return 0;
}

static int parse_object(const json_t *root, tok_sidecar_t *s, char *err, size_t errlen)
{
    char format[32];
    long long version, vocab, width;
    if (!json_is_object(root)) {
        snprintf(err, errlen, "expected a JSON object");
        return -1;
    }
    if (get_str(root, "format", format, sizeof format, 0, err, errlen) != 0 ||
        strcmp(format, "dtrain-tokenizer") != 0) {
        snprintf(err, errlen, "field 'format': expected \"dtrain-tokenizer\" (not a tokenizer sidecar)");
        return -1;
    }
    if (get_int(root, "version", 1, INT32_MAX, &version, err, errlen) != 0)
        return -1;
    if (version != TOK_SIDECAR_VERSION) {
        snprintf(err, errlen,
                 "field 'version': %lld, but this dtrain reads version %d (or use the dtrain that "
                 "prepared the data)",
                 version, TOK_SIDECAR_VERSION);
        return -1;
    }
    if (get_str(root, "kind", s->kind, sizeof s->kind, 0, err, errlen) != 0 ||
        get_str(root, "spec", s->spec, sizeof s->spec, 0, err, errlen) != 0 ||
        get_str(root, "vocab_path", s->vocab_path, sizeof s->vocab_path, 1, err, errlen) != 0 ||
        get_str(root, "vocab_sha256", s->vocab_sha256, sizeof s->vocab_sha256, 1, err, errlen) != 0 ||
        get_int(root, "vocab_size", 1, INT32_MAX, &vocab, err, errlen) != 0)
        return -1;
    s->vocab_size = (int)vocab;
    if (check_tokenizer_fields(s, err, errlen) != 0 ||
        get_id(root, "doc_start", s->vocab_size, &s->doc_start, err, errlen) != 0 ||
        get_id(root, "doc_end", s->vocab_size, &s->doc_end, err, errlen) != 0 ||
        parse_specials(root, s->vocab_size, err, errlen) != 0 ||
        get_str(root, "data_format", s->data_format, sizeof s->data_format, 0, err, errlen) != 0)
        return -1;
    if (!one_of(s->data_format, data_formats)) {
        snprintf(err, errlen, "field 'data_format': '%s' is not llmc|megatron", s->data_format);
        return -1;
    }
    if (get_int(root, "token_bytes", 2, 4, &width, err, errlen) != 0 || width == 3 ||
        (width == 2 && s->vocab_size > 65536)) {
        snprintf(err, errlen, "field 'token_bytes': expected 2 (vocabulary up to 65536) or 4, for vocabulary %d",
                 s->vocab_size);
        return -1;
    }
    s->token_bytes = (int)width;
    return parse_split(root, "train", &s->docs[0], &s->tokens[0], err, errlen) != 0 ||
                   parse_split(root, "val", &s->docs[1], &s->tokens[1], err, errlen) != 0
               ? -1
               : 0;
}

int tok_sidecar_parse(const char *json, size_t len, tok_sidecar_t *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    json_error_t jerr;
    /* a repeated key would make "which value counts" a guess */
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(err, errlen, "not valid JSON: line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        one_line(err);
        return -1;
    }
    int rc = parse_object(root, s, err, errlen);
    json_decref(root);
    if (rc != 0) {
        memset(s, 0, sizeof *s);
        one_line(err);
    }
    return rc;
}

int tok_sidecar_read(const char *path, tok_sidecar_t *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open tokenizer sidecar '%s': %s", path, strerror(errno));
        return -1;
    }
    char *buf = malloc(SIDECAR_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, SIDECAR_MAX_BYTES + 1, f) : 0;
    int bad_read = buf == NULL || ferror(f);
    fclose(f);
    int rc = -1;
    char why[512];
    if (bad_read)
        snprintf(err, errlen, "cannot read tokenizer sidecar '%s': %s", path, buf ? "read error" : "out of memory");
    else if (n > SIDECAR_MAX_BYTES)
        snprintf(err, errlen,
                 "tokenizer sidecar '%s': over %d bytes, not a sidecar: re-run dtrain-prepare to "
                 "rewrite it",
                 path, SIDECAR_MAX_BYTES);
    else if (tok_sidecar_parse(buf, n, s, why, sizeof why) != 0)
        snprintf(err, errlen, "tokenizer sidecar '%s': %s: re-run dtrain-prepare to rewrite it", path, why);
    else
        rc = 0;
    free(buf);
    one_line(err);
    return rc;
}

/* ---- finding ---------------------------------------------------------------------------- */

int tok_sidecar_path(const char *prefix, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "%s%s", prefix, TOK_SIDECAR_SUFFIX);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

/* Length of the prefix of name ending in SPLIT_NNNNNN.bin (one or more
 * digits), or 0 when it does not. */
static size_t shard_prefix(const char *name, size_t len, const char *split)
{
    if (len < 4 || strcmp(name + len - 4, ".bin") != 0)
        return 0;
    size_t d = len - 4;
    while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9')
        d--;
    size_t k = strlen(split);
    if (d == len - 4 || d < k || strncmp(name + d - k, split, k) != 0)
        return 0;
    return d - k;
}

static int ends_with(const char *s, size_t len, const char *tail)
{
    size_t k = strlen(tail);
    return len >= k && strcmp(s + len - k, tail) == 0;
}

int tok_sidecar_find(const char *data_file, char *out, size_t outlen)
{
    static const char *const whole[] = {"_train.bin", "_val.bin", "_train.idx", "_val.idx", ".bin", NULL};
    size_t len = strlen(data_file), keep = 0;
    if ((keep = shard_prefix(data_file, len, "_train_")) == 0 && (keep = shard_prefix(data_file, len, "_val_")) == 0)
        for (const char *const *t = whole; *t && keep == 0; t++)
            if (ends_with(data_file, len, *t))
                keep = len - strlen(*t);
    if (keep == 0)
        return 1;
    int n = snprintf(out, outlen, "%.*s%s", (int)keep, data_file, TOK_SIDECAR_SUFFIX);
    if (n < 0 || (size_t)n >= outlen)
        return -1;
    struct stat st;
    return stat(out, &st) == 0 && S_ISREG(st.st_mode) ? 0 : 1;
}

int tok_sidecar_find_glob(const char *pattern, char *out, size_t outlen)
{
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        globfree(&g);
        return tok_sidecar_find(pattern, out, outlen); /* a plain path (or none) */
    }
    /* glob sorts by the locale; the data loader takes files bytewise */
    const char *first = g.gl_pathv[0];
    for (size_t i = 1; i < g.gl_pathc; i++)
        if (strcmp(g.gl_pathv[i], first) < 0)
            first = g.gl_pathv[i];
    int rc = tok_sidecar_find(first, out, outlen);
    globfree(&g);
    return rc;
}

/* ---- opening the tokenizer -------------------------------------------------------------- */

static int readable(const char *path) { return access(path, R_OK) == 0; }

/* The spec of the same tokenizer with its vocabulary at file instead. */
static int relocated_spec(const tok_sidecar_t *s, const char *file, char *out, size_t outlen)
{
    char dir[TOK_PATH_MAX];
    int n;
    if (strcmp(s->kind, "gpt2") == 0) {
        if (fs_dir_of(file, dir, sizeof dir) != 0)
            return -1;
        n = snprintf(out, outlen, "gpt2:%s", dir);
    } else if (strcmp(s->kind, "tiktoken") == 0) {
        /* the canonical spec is tiktoken:VOCAB_PATH:ENCODING */
        size_t k = strlen("tiktoken:"), p = strlen(s->vocab_path);
        const char *enc =
            strncmp(s->spec + k, s->vocab_path, p) == 0 && s->spec[k + p] == ':' ? s->spec + k + p + 1 : NULL;
        n = enc ? snprintf(out, outlen, "tiktoken:%s:%s", file, enc) : snprintf(out, outlen, "tiktoken:%s", file);
    } else {
        n = snprintf(out, outlen, "%s:%s", s->kind, file);
    }
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

/* Whether file is the vocabulary that made the data: 1 when its sha256 is
 * the recorded one, -1 when it exists with another, 0 when it cannot be
 * read. */
static int same_vocabulary(const tok_sidecar_t *s, const char *file)
{
    char hex[65], e[256];
    if (!readable(file))
        return 0;
    return tok_file_sha256(file, hex, e, sizeof e) == 0 && strcmp(hex, s->vocab_sha256) == 0 ? 1 : -1;
}

/* Appends path to places[0..n) unless it is there already (the same
 * directory reached twice); returns the new count. */
#define PLACE_MAX (2 * TOK_PATH_MAX)
static int add_place(char (*places)[PLACE_MAX], int n, const char *path)
{
    for (int i = 0; i < n; i++)
        if (strcmp(places[i], path) == 0)
            return n;
    snprintf(places[n], PLACE_MAX, "%s", path);
    return n + 1;
}

/* The hf kind's files are all named tokenizer.json, one directory each
 * (DIR/hf/NAME/tokenizer.json): appends those under dir/hf/ to places[0..n),
 * at most max in all; returns the new count. */
static int add_hf_places(char (*places)[PLACE_MAX], int n, int max, const char *dir)
{
    char pattern[PLACE_MAX];
    glob_t g;
    if (snprintf(pattern, sizeof pattern, "%s/hf/*/tokenizer.json", dir) >= (int)sizeof pattern ||
        glob(pattern, 0, NULL, &g) != 0)
        return n;
    for (size_t i = 0; i < g.gl_pathc && n < max; i++)
        n = add_place(places, n, g.gl_pathv[i]);
    globfree(&g);
    return n;
}

/* The spec to open. A sidecar names its vocabulary by identity (kind, file
 * name, sha256), so data moves between machines without its absolute path:
 * the file is looked for, in order, beside the sidecar, in
 * $DTRAIN_TOKENIZERS/KIND/, in the build's tokenizer directory
 * (DTRAIN_TOKENIZER_DIR/KIND/), and at the path recorded when the data was
 * prepared; the first with the recorded sha256 is used (doc/data.md,
 * "Tokenizer sidecars"). The hf kind looks in each KIND/NAME/ (one directory per
 * tokenizer.json), and at the recorded path before them: tokenizer.json
 * files of one sha256 can sit beside different tokenizer_config.json files
 * (a base model's and its instruct model's), and the one the data was
 * prepared with, when it is still there, is the one dreshard --to-hf
 * writes back. */
#define N_PLACES 8
static int choose_spec(const tok_sidecar_t *s, const char *sidecar_path, char *spec, size_t speclen, char *err,
                       size_t errlen)
{
    if (strcmp(s->kind, "byte") == 0) {
        snprintf(spec, speclen, "%s", s->spec);
        return 0;
    }
    const char *slash = strrchr(s->vocab_path, '/');
    const char *base = slash ? slash + 1 : s->vocab_path;
    const char *env = getenv("DTRAIN_TOKENIZERS");
    char dir[TOK_PATH_MAX], cand[N_PLACES][PLACE_MAX], p[PLACE_MAX];
    const int hf = strcmp(s->kind, "hf") == 0;
    int n = 0, other = -1;
    if (fs_dir_of(sidecar_path, dir, sizeof dir) == 0 && snprintf(p, sizeof p, "%s/%s", dir, base) < (int)sizeof p)
        n = add_place(cand, n, p);
    if (env && *env && !hf && snprintf(p, sizeof p, "%s/%s/%s", env, s->kind, base) < (int)sizeof p)
        n = add_place(cand, n, p);
    if (hf)
        n = add_place(cand, n, s->vocab_path);
    if (env && *env && hf)
        n = add_hf_places(cand, n, N_PLACES / 2, env);
    if (!hf && snprintf(p, sizeof p, "%s/%s/%s", tokenizer_builtin_dir(), s->kind, base) < (int)sizeof p)
        n = add_place(cand, n, p);
    if (hf)
        n = add_hf_places(cand, n, N_PLACES - 1, tokenizer_builtin_dir());
    n = add_place(cand, n, s->vocab_path);
    for (int i = 0; i < n; i++) {
        int same = same_vocabulary(s, cand[i]);
        if (same < 0 && other < 0)
            other = i;
        if (same <= 0)
            continue;
        if (strcmp(cand[i], s->vocab_path) == 0)
            snprintf(spec, speclen, "%s", s->spec);
        else if (relocated_spec(s, cand[i], spec, speclen) != 0)
            continue;
        return 0;
    }
    char where[N_PLACES * PLACE_MAX + 64];
    size_t w = 0;
    for (int i = 0; i < n && w < sizeof where; i++)
        w += (size_t)snprintf(where + w, sizeof where - w, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", cand[i]);
    snprintf(err, errlen,
             "data sidecar %s: no %s vocabulary with the data's sha256 %.12s... at %s%s%s%s: put the "
             "vocabulary that made the data in one of those places, or give --tokenizer SPEC for it "
             "(or --tokenizer none)",
             sidecar_path, s->kind, s->vocab_sha256, where, other >= 0 ? " (" : "", other >= 0 ? cand[other] : "",
             other >= 0 ? " is another vocabulary)" : "");
    return -1;
}

/* The opened tokenizer must be the one that made the data. */
static int check_same(const tok_sidecar_t *s, const char *sidecar_path, const tokenizer_t *tk, char *err, size_t errlen)
{
    if (strcmp(tk->vocab_sha256, s->vocab_sha256) != 0) {
        snprintf(err, errlen,
                 "data sidecar %s: vocabulary %s has sha256 %.12s..., but the data was made with "
                 "sha256 %.12s...: give --tokenizer SPEC naming the original vocabulary, or re-run dtrain-prepare",
                 sidecar_path, tk->vocab_path, tk->vocab_sha256, s->vocab_sha256);
        return -1;
    }
    /* the document tokens too: an hf tokenizer.json takes them from the
     * tokenizer_config.json beside it, which its sha256 does not cover */
    if (tk->vocab_size != s->vocab_size || tk->doc_start != s->doc_start || tk->doc_end != s->doc_end) {
        snprintf(err, errlen,
                 "data sidecar %s: tokenizer %s has vocabulary %d and document tokens %d, %d, but the "
                 "data records %d and %d, %d: give --tokenizer SPEC, or re-run dtrain-prepare",
                 sidecar_path, tk->spec, tk->vocab_size, (int)tk->doc_start, (int)tk->doc_end, s->vocab_size,
                 (int)s->doc_start, (int)s->doc_end);
        return -1;
    }
    return 0;
}

int tok_sidecar_open_tokenizer(const tok_sidecar_t *s, const char *sidecar_path, tokenizer_t **tk, char *err,
                               size_t errlen)
{
    *tk = NULL;
    char spec[TOK_PATH_MAX + 64], why[768];
    if (choose_spec(s, sidecar_path, spec, sizeof spec, err, errlen) != 0) {
        one_line(err);
        return -1;
    }
    /* SentencePiece data made with an EOS after each document records it */
    int add_eos = strcmp(s->kind, "spm") == 0 && s->doc_end != TOK_NO_ID;
    int rc = 0;
    if (tokenizer_open(tk, spec, add_eos, why, sizeof why) != 0) {
        snprintf(err, errlen,
                 "data sidecar %s: %s: give --tokenizer SPEC for the tokenizer that made the data "
                 "(or --tokenizer none)",
                 sidecar_path, why);
        rc = -1;
    } else if (check_same(s, sidecar_path, *tk, err, errlen) != 0) {
        tokenizer_close(*tk);
        *tk = NULL;
        rc = -1;
    }
    if (rc != 0)
        one_line(err);
    return rc;
}
