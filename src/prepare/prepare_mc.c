/* dtrain-prepare --eval-mc: a JSONL of multiple-choice examples -> one
 * multiple-choice eval file (io/evalmc.h), tokenized as llm.c's
 * dev/data/hellaswag.py does:
 *   context tokens    = encode(context)
 *   completion tokens = encode(" " + ending)   (--eval-mc-space 1, default)
 * since GPT-2-style BPE marks a word's start by its leading space, and the
 * completion follows the context as the next words. --eval-mc-space 0
 * encodes the ending alone (SentencePiece adds its own word-start mark).
 *
 * Each line: {"context": str, "endings": [str, ...], "label": int}, with
 * 2 to EVALMC_MAX_COMPLETIONS non-empty endings and 0 <= label < endings;
 * HellaSwag's own "ctx" stands for "context", and a label may be a string
 * of digits ("3", as some exports write it). Blank lines are skipped.
 *
 * The file is small (HellaSwag's validation set has 10,042 examples), so
 * rank 0 does it all and the others wait for its status. */
#include "src/prepare/prepare.h"

#include "io/errmsg.h"
#include "io/evalmc.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The examples so far: their fields in ex (the token pointers set only at
 * the end, since ids grows by realloc), their first token in ids at at[e]. */
typedef struct mc_build {
    tokenizer_t *tk;
    int space;   /* 1: encode " " + ending */
    int version; /* EVALMC_VERSION_U16 or _U32, from the vocabulary */
    evalmc_example_t *ex;
    size_t *at;
    size_t n, cap;
    tok_ids_t ids;   /* every example's context and completion tokens */
    tok_bytes_t end; /* scratch: " " + ending */
    size_t ctx_tokens, comp_tokens;
    int min_comp, max_comp;
} mc_build_t;

/* Where a message about line `line` of path starts. */
#define MC_AT "%s:%llu: "

static int grow(mc_build_t *b)
{
    if (b->n < b->cap)
        return 0;
    size_t cap = b->cap ? 2 * b->cap : 1024;
    evalmc_example_t *ex = realloc(b->ex, cap * sizeof *ex);
    if (ex)
        b->ex = ex;
    size_t *at = ex ? realloc(b->at, cap * sizeof *at) : NULL;
    if (at)
        b->at = at;
    if (!ex || !at)
        return -1;
    b->cap = cap;
    return 0;
}

/* The label: a JSON integer, or a string of decimal digits (at most 9,
 * so that it converts exactly). -1 when it is neither. */
static int mc_label(const json_t *v, long long *label)
{
    const char *s = json_string_value(v);
    if (json_is_integer(v))
        *label = json_integer_value(v);
    else if (s && *s && strlen(s) <= 9 && strspn(s, "0123456789") == strlen(s))
        *label = strtoll(s, NULL, 10);
    else
        return -1;
    return 0;
}

/* The context (or HellaSwag's "ctx"), endings and label of object o,
 * checked; NULL with err naming the problem. */
static const char *mc_fields(const json_t *o, const json_t **ctx, const json_t **endings, long long *label)
{
    *ctx = json_object_get(o, "context") ? json_object_get(o, "context") : json_object_get(o, "ctx");
    *endings = json_object_get(o, "endings");
    const json_t *l = json_object_get(o, "label");
    if (!*ctx || !*endings || !l)
        return !*ctx ? "no \"context\" (or \"ctx\") field" : !*endings ? "no \"endings\" field" : "no \"label\" field";
    if (!json_is_string(*ctx))
        return "\"context\" is not a string";
    if (json_string_length(*ctx) == 0)
        return "\"context\" is empty: a completion needs a context to follow";
    if (!json_is_array(*endings))
        return "\"endings\" is not an array of strings";
    if (mc_label(l, label) != 0)
        return "\"label\" is not an integer";
    return NULL;
}

/* Appends encode(text[0..len)) to b->ids; its token count in *n. */
static int mc_encode(mc_build_t *b, const char *text, size_t len, int *n, char *err, size_t errlen)
{
    const size_t before = b->ids.n;
    if (tokenizer_encode(b->tk, text, len, &b->ids, err, errlen) != 0)
        return -1;
    *n = (int)(b->ids.n - before);
    return 0;
}

/* Tokenizes ending c of x (" " + it when b->space). */
static int mc_ending(mc_build_t *b, const json_t *s, evalmc_example_t *x, int c, char *err, size_t errlen)
{
    b->end.n = 0;
    if ((b->space && tok_bytes_append(&b->end, " ", 1) != 0) ||
        tok_bytes_append(&b->end, json_string_value(s), json_string_length(s)) != 0) {
        seterr(err, errlen, "out of memory");
        return -1;
    }
    return mc_encode(b, b->end.data, b->end.n, &x->comp_len[c], err, errlen);
}

/* The example's size in words (evalmc.h: 6 + context + completions with
 * their lengths) must fit its size field, a word of 2 or 4 bytes that may
 * not be all ones. */
static const char *mc_too_long(const mc_build_t *b, const evalmc_example_t *x)
{
    size_t words = 6 + (size_t)x->ctx_len;
    for (int c = 0; c < x->n_comp; c++)
        words += 1 + (size_t)x->comp_len[c];
    const size_t limit = b->version == EVALMC_VERSION_U16 ? 0xFFFFu : 0xFFFFFFFFu;
    const size_t width = b->version == EVALMC_VERSION_U16 ? 2 : 4;
    return words * width < limit ? NULL
                                 : "the example is too long for its size field (65,534 bytes in version 1, "
                                   "2^32-2 in version 2): shorten its context or endings";
}

/* Line lno's JSON object, checked: its context, k endings and label.
 * NULL with err when the line is not an example. */
static json_t *mc_parse(const char *line, size_t len, const char *path, unsigned long long lno, const json_t **ctx,
                        const json_t **endings, size_t *k, long long *label, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &je); /* a \u0000 is text, as corpus.c reads it */
    const char *bad = !o ? NULL : !json_is_object(o) ? "not a JSON object" : mc_fields(o, ctx, endings, label);
    *k = !o || bad ? 0 : json_array_size(*endings);
    if (!o)
        seterr(err, errlen, MC_AT "not JSON (%s at column %d): each line must be one object", path, lno, je.text,
               je.column);
    else if (bad)
        seterr(err, errlen, MC_AT "%s: each line needs {\"context\": str, \"endings\": [str, ...], \"label\": int}",
               path, lno, bad);
    else if (*k < 2 || *k > EVALMC_MAX_COMPLETIONS)
        seterr(err, errlen, MC_AT "%zu endings: an example has 2 to %d", path, lno, *k, EVALMC_MAX_COMPLETIONS);
    else if (*label < 0 || (size_t)*label >= *k)
        seterr(err, errlen, MC_AT "label %lld is out of range: it indexes the %zu endings from 0 (0 to %zu)", path, lno,
               *label, *k, *k - 1);
    int ok = o && !bad && *k >= 2 && *k <= EVALMC_MAX_COMPLETIONS && *label >= 0 && (size_t)*label < *k;
    for (size_t c = 0; c < *k && ok; c++) {
        const json_t *e = json_array_get(*endings, c);
        ok = json_is_string(e) && json_string_length(e) > 0;
        if (!ok)
            seterr(err, errlen, MC_AT "ending %zu is %s: every ending is a non-empty string", path, lno, c,
                   json_is_string(e) ? "empty" : "not a string");
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The checked fields' tokens into example b->n. NULL, or why not. */
static const char *mc_tokenize(mc_build_t *b, const json_t *ctx, const json_t *endings, size_t k, long long label,
                               char *tokerr, size_t errlen)
{
    evalmc_example_t *x = &b->ex[b->n];
    memset(x, 0, sizeof *x);
    x->label = (int)label;
    x->n_comp = (int)k;
    b->at[b->n] = b->ids.n;
    int rc = mc_encode(b, json_string_value(ctx), json_string_length(ctx), &x->ctx_len, tokerr, errlen);
    for (int c = 0; c < x->n_comp && rc == 0; c++)
        rc = mc_ending(b, json_array_get(endings, (size_t)c), x, c, tokerr, errlen);
    const char *why = rc != 0 ? tokerr : mc_too_long(b, x);
    for (int c = 0; c < x->n_comp && !why; c++)
        why = x->comp_len[c] == 0 ? "an ending encodes to no tokens: check the tokenizer" : NULL;
    return why;
}

/* One JSON line into example b->n. */
static int mc_line(mc_build_t *b, const char *line, size_t len, const char *path, unsigned long long lno, char *err,
                   size_t errlen)
{
    const json_t *ctx, *endings;
    size_t k;
    long long label = -1;
    json_t *o = mc_parse(line, len, path, lno, &ctx, &endings, &k, &label, err, errlen);
    if (!o)
        return -1;
    char tokerr[PREP_ERRLEN] = "";
    const char *why = mc_tokenize(b, ctx, endings, k, label, tokerr, sizeof tokerr);
    json_decref(o);
    if (why) {
        seterr(err, errlen, MC_AT "%s", path, lno, why);
        return -1;
    }
    const evalmc_example_t *x = &b->ex[b->n];
    b->ctx_tokens += (size_t)x->ctx_len;
    b->comp_tokens += b->ids.n - b->at[b->n] - (size_t)x->ctx_len;
    b->min_comp = b->n == 0 || x->n_comp < b->min_comp ? x->n_comp : b->min_comp;
    b->max_comp = x->n_comp > b->max_comp ? x->n_comp : b->max_comp;
    b->n++;
    return 0;
}

/* Compressed inputs are not read here (the reader is a plain line loop):
 * say so rather than report binary as bad JSON. */
static int mc_check_plain(FILE *f, const char *path, char *err, size_t errlen)
{
    unsigned char m[4] = {0};
    const size_t got = fread(m, 1, sizeof m, f);
    if (ferror(f) || fseek(f, 0, SEEK_SET) != 0) {
        seterr(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        return -1;
    }
    if ((got >= 2 && m[0] == 0x1f && m[1] == 0x8b) || (got == 4 && memcmp(m, "\x28\xb5\x2f\xfd", 4) == 0)) {
        seterr(err, errlen, "'%s' is %s-compressed: --eval-mc reads plain JSONL; decompress it first", path,
               m[0] == 0x1f ? "gzip" : "zstd");
        return -1;
    }
    return 0;
}

/* Every line of path into b. */
static int mc_read(mc_build_t *b, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        seterr(err, errlen, "cannot open '%s': %s: check the --eval-mc file name", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned long long lno = 0;
    int rc = mc_check_plain(f, path, err, errlen);
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lno++;
        char *s = line;
        if (lno == 1 && len >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) /* a UTF-8 byte order mark */
            s += 3, len -= 3;
        while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r')) /* the line end is no part of it */
            len--;
        if (strspn(s, " \t\r\n") >= (size_t)len)
            continue;
        /* the examples are numbered in a word that may not be all ones */
        if (b->n == (b->version == EVALMC_VERSION_U16 ? 0xFFFFu : (size_t)INT32_MAX)) {
            seterr(err, errlen,
                   MC_AT "more than %zu examples: a version-%d file numbers them in %d bits; split the input", path,
                   lno, b->n, b->version, b->version == EVALMC_VERSION_U16 ? 16 : 31);
            rc = -1;
        } else if (grow(b) != 0) {
            seterr(err, errlen, MC_AT "out of memory after %zu examples", path, lno, b->n);
            rc = -1;
        } else
            rc = mc_line(b, s, (size_t)len, path, lno, err, errlen);
    }
    if (rc == 0 && ferror(f)) {
        seterr(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && b->n == 0) {
        seterr(err, errlen, "'%s' holds no examples: give one JSON object per line", path);
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

/* The token pointers, now that ids holds every token. */
static void mc_point(mc_build_t *b)
{
    for (size_t e = 0; e < b->n; e++) {
        evalmc_example_t *x = &b->ex[e];
        const int32_t *p = b->ids.id + b->at[e];
        x->index = (int)e;
        x->ctx = p;
        p += x->ctx_len;
        for (int c = 0; c < x->n_comp; c++) {
            x->comp[c] = p;
            p += x->comp_len[c];
        }
    }
}

static void mc_free(mc_build_t *b)
{
    free(b->ex);
    free(b->at);
    free(b->ids.id);
    free(b->end.data);
}

/* Rank 0's whole job: the exit status, its one error line printed. */
static int mc_run(const prep_run_t *r, tokenizer_t *tk)
{
    const prep_opts_t *o = r->o;
    /* by the vocabulary, as the token shards choose their width: 65,535
     * (all ones) is the start marker, so uint16 holds ids 0..65534 */
    mc_build_t b = {.tk = tk,
                    .space = o->eval_mc_space,
                    .version = tk->vocab_size <= 0xFFFF ? EVALMC_VERSION_U16 : EVALMC_VERSION_U32};
    char err[PREP_ERRLEN] = "";
    int status = mc_read(&b, o->eval_mc, err, sizeof err) != 0 ? PREP_EXIT_USAGE : 0;
    if (status == 0) {
        mc_point(&b);
        if (evalmc_write(o->out, b.ex, (int)b.n, b.version, err, sizeof err) != 0)
            status = PREP_EXIT_IO;
    }
    if (status != 0)
        fprintf(stderr, PREP_PROG ": %s\n", err);
    else
        printf("%s: %zu examples (%d to %d endings), %zu context + %zu ending tokens, version %d (uint%d tokens), "
               "tokenizer %s, endings encoded %s\n",
               o->out, b.n, b.min_comp, b.max_comp, b.ctx_tokens, b.comp_tokens, b.version,
               b.version == EVALMC_VERSION_U16 ? 16 : 32, tk->spec, b.space ? "with a leading space" : "as given");
    mc_free(&b);
    return status;
}

int prep_eval_mc(prep_run_t *r)
{
    int status = r->rank == 0 ? mc_run(r, r->tk) : 0;
    prep_mpi_check(MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast(status)");
    return status;
}
