#include "io/evalmc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/publish.h"

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Word i of the stream (w bytes each, little-endian). */
static uint32_t word(const unsigned char *s, size_t i, int w)
{
    return w == 2 ? (uint32_t)s[2 * i] | (uint32_t)s[2 * i + 1] << 8 : le32(s + 4 * i);
}

void evalmc_free(evalmc_file_t *f)
{
    free(f->ex);
    free(f->tokens);
    memset(f, 0, sizeof *f);
}

/* A reader over the example stream: words [0, n) of width w, the next
 * token slot, and the file's name for messages. */
typedef struct reader {
    const unsigned char *s;
    size_t n, at;
    int w;
    int32_t *tok;
    size_t ntok;
    const char *name;
} reader_t;

/* Reads one length-prefixed token run ending at or before `end`. */
static int read_run(reader_t *r, size_t end, int *len, const int32_t **out, int *max_token)
{
    if (r->at >= end)
        return -1;
    const uint32_t k = word(r->s, r->at++, r->w);
    if (k > end - r->at)
        return -1;
    *len = (int)k;
    *out = r->tok + r->ntok;
    const uint32_t start = r->w == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    for (uint32_t i = 0; i < k; i++) {
        const uint32_t t = word(r->s, r->at++, r->w);
        if (t == start || t > INT32_MAX)
            return -1;
        r->tok[r->ntok++] = (int32_t)t;
        if ((int)t > *max_token)
            *max_token = (int)t;
    }
    return 0;
}

/* Example e at r->at: its fields, checked, into *ex. */
static int read_example(reader_t *r, int e, evalmc_example_t *ex, uint32_t *bytes, int *max_token, char *err,
                        size_t errlen)
{
    const uint32_t start = r->w == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    const size_t at0 = r->at;
    if (r->n - r->at < 6 || word(r->s, r->at, r->w) != start) {
        snprintf(err, errlen, "%s: example %d: %s", r->name, e,
                 r->n - r->at < 6 ? "the file ends inside it (truncated?)" : "no start marker where it should begin");
        return -1;
    }
    *bytes = word(r->s, r->at + 1, r->w);
    const size_t words = *bytes / (uint32_t)r->w;
    if (*bytes % (uint32_t)r->w || words < 6 || words > r->n - r->at) {
        snprintf(err, errlen, "%s: example %d: its size field says %u bytes, which %s", r->name, e, *bytes,
                 words > r->n - r->at ? "runs past the end of the file"
                                      : "is not a whole number of words of 6 or more");
        return -1;
    }
    const size_t end = r->at + words;
    memset(ex, 0, sizeof *ex);
    ex->index = (int)word(r->s, r->at + 2, r->w);
    const uint32_t label = word(r->s, r->at + 3, r->w), nc = word(r->s, r->at + 4, r->w);
    r->at += 5;
    if (nc < 2 || nc > EVALMC_MAX_COMPLETIONS || label >= nc) {
        snprintf(err, errlen,
                 "%s: example %d: %u completions with label %u: expected 2 to %d completions and a label "
                 "below their number",
                 r->name, e, nc, label, EVALMC_MAX_COMPLETIONS);
        return -1;
    }
    ex->label = (int)label;
    ex->n_comp = (int)nc;
    int bad = read_run(r, end, &ex->ctx_len, &ex->ctx, max_token) != 0;
    for (int c = 0; c < ex->n_comp && !bad; c++)
        bad = read_run(r, end, &ex->comp_len[c], &ex->comp[c], max_token) != 0 || ex->comp_len[c] == 0;
    if (bad || r->at != end) {
        snprintf(err, errlen,
                 "%s: example %d (word %zu): its context and completions do not fill its %u bytes exactly "
                 "(a length past its end, an empty completion, or a start marker as a token)",
                 r->name, e, at0, *bytes);
        return -1;
    }
    return 0;
}

static int check_header(const unsigned char *buf, size_t len, const char *name, int *w, int *n, uint32_t *longest,
                        char *err, size_t errlen)
{
    if (len < 4 * EVALMC_HEADER_INTS || le32(buf) != EVALMC_MAGIC) {
        snprintf(err, errlen, "%s: not a multiple-choice eval file (%s): write one with dtrain-prepare --eval-mc", name,
                 len < 4 * EVALMC_HEADER_INTS ? "shorter than its 1024-byte header" : "no magic 20240522");
        return -1;
    }
    const uint32_t version = le32(buf + 4), count = le32(buf + 8);
    *longest = le32(buf + 12);
    if (version != EVALMC_VERSION_U16 && version != EVALMC_VERSION_U32) {
        snprintf(err, errlen, "%s: eval file version %u: this dtrain reads 1 (uint16 tokens, llm.c's) and 2 (uint32)",
                 name, version);
        return -1;
    }
    *w = version == EVALMC_VERSION_U16 ? 2 : 4;
    if (count == 0 || count > (uint32_t)INT32_MAX || (len - 4 * EVALMC_HEADER_INTS) % (size_t)*w) {
        snprintf(err, errlen, "%s: %s", name,
                 count == 0 ? "the header counts no examples" : "the size does not fit the header (truncated?)");
        return -1;
    }
    *n = (int)count;
    return 0;
}

int evalmc_parse(evalmc_file_t *f, const unsigned char *buf, size_t len, const char *name, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    int w, n;
    uint32_t longest, seen = 0;
    if (check_header(buf, len, name, &w, &n, &longest, err, errlen) != 0)
        return -1;
    reader_t r = {
        .s = buf + 4 * EVALMC_HEADER_INTS, .n = (len - 4 * EVALMC_HEADER_INTS) / (size_t)w, .w = w, .name = name};
    /* every example takes at least 6 words, so n is bounded by the size */
    if ((size_t)n > r.n / 6) {
        snprintf(err, errlen, "%s: the header counts %d examples, more than its %zu bytes can hold (truncated?)", name,
                 n, len);
        return -1;
    }
    f->version = w == 2 ? EVALMC_VERSION_U16 : EVALMC_VERSION_U32;
    f->n = n;
    f->max_token = -1;
    f->ex = calloc((size_t)n, sizeof *f->ex);
    r.tok = malloc((r.n > 0 ? r.n : 1) * sizeof *r.tok);
    f->tokens = r.tok;
    if (!f->ex || !r.tok) {
        evalmc_free(f);
        snprintf(err, errlen, "%s: out of memory for %d examples", name, n);
        return -1;
    }
    for (int e = 0; e < n; e++) {
        uint32_t bytes;
        if (read_example(&r, e, &f->ex[e], &bytes, &f->max_token, err, errlen) != 0) {
            evalmc_free(f);
            return -1;
        }
        seen = bytes > seen ? bytes : seen;
    }
    if (r.at != r.n || seen != longest) {
        snprintf(err, errlen, "%s: %s", name,
                 r.at != r.n ? "bytes follow the last example the header counts"
                             : "the header's longest-example size does not match the examples");
        evalmc_free(f);
        return -1;
    }
    return 0;
}

int evalmc_load(evalmc_file_t *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, errlen, "cannot open eval file %s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char *buf = NULL;
    const char *why = NULL; /* taken from errno at once: fclose and free may change it */
    struct stat st;
    size_t len = 0;
    /* a directory opens, and its "size" by seeking can be LONG_MAX */
    if (fstat(fileno(fp), &st) != 0)
        why = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file";
    else {
        len = (size_t)st.st_size;
        buf = malloc(len > 0 ? len : 1);
        errno = 0;
        if (!buf)
            why = "out of memory";
        else if (fread(buf, 1, len, fp) != len) /* no errno: it shrank while read */
            why = errno ? strerror(errno) : "the file changed while it was read";
    }
    fclose(fp);
    if (why) {
        free(buf);
        snprintf(err, errlen, "cannot read eval file %s: %s", path, why);
        return -1;
    }
    const int rc = evalmc_parse(f, buf, len, path, err, errlen);
    free(buf);
    return rc;
}

/* Appends word v (w bytes, little-endian) to out. */
static void put(unsigned char **out, uint32_t v, int w)
{
    for (int b = 0; b < w; b++)
        *(*out)++ = (unsigned char)(v >> (8 * b));
}

/* Example e's words, or 0 when a count or token does not fit the width. */
static size_t example_words(const evalmc_example_t *x, int e, int w)
{
    const uint64_t limit = w == 2 ? 0xFFFFu : 0xFFFFFFFFu; /* all ones is the start marker */
    uint64_t words = 6 + (uint64_t)x->ctx_len;
    int fits = (uint64_t)e < limit && x->n_comp >= 2 && x->n_comp <= EVALMC_MAX_COMPLETIONS && x->label >= 0 &&
               x->label < x->n_comp;
    for (int i = 0; i < x->ctx_len && fits; i++)
        fits = x->ctx[i] >= 0 && (uint64_t)x->ctx[i] < limit;
    for (int c = 0; c < x->n_comp && fits; c++) {
        words += 1 + (uint64_t)x->comp_len[c];
        fits = x->comp_len[c] > 0;
        for (int i = 0; i < x->comp_len[c] && fits; i++)
            fits = x->comp[c][i] >= 0 && (uint64_t)x->comp[c][i] < limit;
    }
    return fits && words * (uint64_t)w < limit ? (size_t)words : 0;
}

int evalmc_write(const char *path, const evalmc_example_t *ex, int n, int version, char *err, size_t errlen)
{
    const int w = version == EVALMC_VERSION_U16 ? 2 : 4;
    unsigned char hdr[4 * EVALMC_HEADER_INTS] = {0}, *h = hdr;
    size_t total = 0, longest = 0;
    if (n < 1) { /* the reader refuses a file that counts no examples */
        snprintf(err, errlen, "%s: no examples to write", path);
        return -1;
    }
    for (int e = 0; e < n; e++) {
        const size_t words = example_words(&ex[e], e, w);
        if (words == 0) {
            snprintf(err, errlen,
                     "%s: example %d does not fit version %d (a token or its size over %s, or fewer "
                     "than 2 completions)",
                     path, e, version, w == 2 ? "65,534" : "2^32-2");
            return -1;
        }
        total += words;
        longest = words * (size_t)w > longest ? words * (size_t)w : longest;
    }
    put(&h, EVALMC_MAGIC, 4), put(&h, (uint32_t)version, 4), put(&h, (uint32_t)n, 4), put(&h, (uint32_t)longest, 4);
    unsigned char *body = malloc(total * (size_t)w + 1), *o = body;
    if (!body) {
        snprintf(err, errlen, "%s: out of memory for %zu bytes", path, total * (size_t)w);
        return -1;
    }
    for (int e = 0; e < n; e++) {
        const evalmc_example_t *x = &ex[e];
        put(&o, w == 2 ? 0xFFFFu : 0xFFFFFFFFu, w);
        put(&o, (uint32_t)(example_words(x, e, w) * (size_t)w), w);
        put(&o, (uint32_t)e, w), put(&o, (uint32_t)x->label, w), put(&o, (uint32_t)x->n_comp, w);
        put(&o, (uint32_t)x->ctx_len, w);
        for (int i = 0; i < x->ctx_len; i++)
            put(&o, (uint32_t)x->ctx[i], w);
        for (int c = 0; c < x->n_comp; c++) {
            put(&o, (uint32_t)x->comp_len[c], w);
            for (int i = 0; i < x->comp_len[c]; i++)
                put(&o, (uint32_t)x->comp[c][i], w);
        }
    }
    publish_t p;
    int rc = publish_open(&p, path, 0644, err, errlen);
    if (rc == 0 && (publish_write(&p, hdr, sizeof hdr, err, errlen) != 0 ||
                    publish_write(&p, body, total * (size_t)w, err, errlen) != 0)) {
        publish_abort(&p, err, errlen);
        rc = -1;
    } else if (rc == 0)
        rc = publish_commit(&p, err, errlen);
    free(body);
    return rc;
}
