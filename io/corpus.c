/* Document reader for dtrain-prepare: plain text and JSONL, optionally
 * gzip- or zstd-compressed, streamed. See corpus.h for the rules.
 *
 * Layers, bottom up: a file descriptor and a buffer of its raw bytes
 * (c->in); a decoder (raw, gzip, zstd) that writes decompressed bytes into
 * the document buffer (c->buf); and the splitters (JSONL lines, separator
 * pieces, whole files) that find the next document in c->buf. */
#include "io/corpus.h"

#include "io/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>
#include <zstd.h>

typedef enum { SRC_RAW, SRC_GZIP, SRC_ZSTD } src_kind_t;

struct corpus {
    char *const *paths;
    int n_paths;
    corpus_format_t format;
    char *field; /* JSONL field name (owned copy) */
    char *sep;   /* TEXT separator (owned copy), NULL: one doc per file */
    size_t sep_len;
    size_t chunk;   /* bytes per read and per decompression call */
    uint64_t index; /* of the next document */
    int failed;     /* an error was returned: stay stopped */
    int bad_doc;    /* ... in one document's text, its place known (corpus_skip) */
    json_t *root;   /* JSON object holding the last document's text */

    /* The current file. */
    int file;        /* index into paths of the open (or next) file */
    int fd;          /* -1: none open */
    uint64_t n_docs; /* documents returned from this file */
    src_kind_t kind;
    unsigned char *in; /* raw bytes read from fd: [in_pos, in_len) unused */
    size_t in_cap, in_pos, in_len;
    int in_eof; /* read(2) returned 0 */
    z_stream zs;
    int zs_init;
    int member_done; /* gzip: a member ended; another may follow */
    ZSTD_DStream *zd;
    int frame_open; /* zstd: the last frame begun is not complete */
    int src_eof;    /* the decompressed stream of this file ended */

    /* Decompressed bytes: [start, end) not yet consumed; the search for the
     * next line end or separator resumes at scan (bytes before it cannot
     * start one). line is the 1-based line number of buf[start]. */
    char *buf;
    size_t cap, start, end, scan;
    uint64_t line;

    /* Mapped reading (corpus_map_inputs): base[i] is the global offset of
     * file i's first byte, base[n_paths] the total. map holds file
     * map_file (-1: none), the one the documents come from now. */
    int mapped;
    uint64_t *base;
    const char *map;
    int map_file;
    corpus_feed_fn feed;
    void *feed_ctx;
    const corpus_span_t *spans; /* the feed's batch: [span_pos, n_spans) unread */
    size_t n_spans, span_pos;
};

/* Line ends in p[0..n). Every document's bytes pass through here, on
 * every rank: blocks of 64 with a fixed trip count, which gcc -O2
 * vectorises (2.5x a memchr per line on prose, whose lines are short). */
static uint64_t count_nl(const char *p, size_t n)
{
    uint64_t k = 0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        unsigned in_block = 0;
        for (int j = 0; j < 64; j++)
            in_block += p[i + j] == '\n';
        k += in_block;
    }
    for (; i < n; i++)
        k += p[i] == '\n';
    return k;
}

/* The first sep[0..k) in p[0..n), or NULL: memchr for its first byte,
 * then a compare. glibc's memmem goes a byte at a time for short needles
 * (3x slower on "\n\n"), and every rank scans every byte of the input.
 * Separators start with a line end or a control byte, rare enough in
 * text for memchr's long strides (one starting with a space would not
 * be, and would still work). */
static char *find_sep(char *p, size_t n, const char *sep, size_t k)
{
    char *end = p + n;
    while ((size_t)(end - p) >= k) {
        char *q = memchr(p, sep[0], (size_t)(end - p) - k + 1);
        if (q == NULL)
            return NULL;
        if (memcmp(q + 1, sep + 1, k - 1) == 0)
            return q;
        p = q + 1;
    }
    return NULL;
}

static const char *cur_path(const corpus_t *c) { return c->paths[c->file]; }

/* The line the decompressed stream has reached (for errors in the middle
 * of a file): the line at start plus the line ends read beyond it. */
static unsigned long long line_reached(const corpus_t *c)
{
    return (unsigned long long)(c->line + count_nl(c->buf + c->start, c->end - c->start));
}

/* ------------------------------------------------------------------ */
/* Raw bytes                                                           */
/* ------------------------------------------------------------------ */

/* One read(2) of at most n bytes, retried on EINTR: >= 0 bytes, -1 error. */
static ssize_t read_once(corpus_t *c, void *dst, size_t n, char *err, size_t errlen)
{
    for (;;) {
        ssize_t got = read(c->fd, dst, n);
        if (got >= 0)
            return got;
        if (errno != EINTR) {
            seterr(err, errlen,
                   "%s:%llu: cannot read the input: %s; check the file and "
                   "its file system",
                   cur_path(c), line_reached(c), strerror(errno));
            return -1;
        }
    }
}

/* Refill c->in once it is used up; sets in_eof at the end of the file. */
static int fill_in(corpus_t *c, char *err, size_t errlen)
{
    c->in_pos = c->in_len = 0;
    ssize_t got = read_once(c, c->in, c->in_cap, err, errlen);
    if (got < 0)
        return -1;
    if (got == 0)
        c->in_eof = 1;
    c->in_len = (size_t)got;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Decoders: each writes up to cap decompressed bytes to dst and        */
/* returns their count, 0 at the end of the file, -1 on an error.       */
/* ------------------------------------------------------------------ */

static ssize_t raw_read(corpus_t *c, char *dst, size_t cap, char *err, size_t errlen)
{
    if (c->in_pos < c->in_len) { /* the bytes read to look for a magic */
        size_t n = c->in_len - c->in_pos < cap ? c->in_len - c->in_pos : cap;
        memcpy(dst, c->in + c->in_pos, n);
        c->in_pos += n;
        return (ssize_t)n;
    }
    if (c->in_eof)
        return 0;
    ssize_t got = read_once(c, dst, cap, err, errlen);
    if (got == 0)
        c->in_eof = 1;
    return got;
}

static int gz_error(corpus_t *c, int ret, char *err, size_t errlen)
{
    if (ret == Z_MEM_ERROR)
        seterr(err, errlen, "%s:%llu: out of memory while decompressing gzip", cur_path(c), line_reached(c));
    else
        seterr(err, errlen,
               "%s:%llu: invalid gzip data (%s): the file is damaged; copy "
               "it again or re-compress it",
               cur_path(c), line_reached(c), c->zs.msg ? c->zs.msg : "zlib error");
    return -1;
}

/* After a gzip member: skip zero padding (gzip(1) and Python's gzip module
 * accept it), then 1 if another member follows, 0 at the end of file. */
static int gz_next_member(corpus_t *c, char *err, size_t errlen)
{
    for (;;) {
        while (c->in_pos < c->in_len && c->in[c->in_pos] == 0)
            c->in_pos++;
        if (c->in_pos < c->in_len)
            break;
        if (c->in_eof)
            return 0;
        if (fill_in(c, err, errlen) != 0)
            return -1;
    }
    if (inflateReset(&c->zs) != Z_OK)
        return gz_error(c, Z_STREAM_ERROR, err, errlen);
    c->member_done = 0;
    return 1;
}

static ssize_t gz_read(corpus_t *c, char *dst, size_t cap, char *err, size_t errlen)
{
    if (cap > UINT_MAX)
        cap = UINT_MAX;
    for (;;) {
        if (c->member_done) {
            int r = gz_next_member(c, err, errlen);
            if (r <= 0)
                return r;
        }
        if (c->in_pos == c->in_len && !c->in_eof && fill_in(c, err, errlen))
            return -1;
        c->zs.next_in = c->in + c->in_pos;
        c->zs.avail_in = (uInt)(c->in_len - c->in_pos);
        c->zs.next_out = (Bytef *)dst;
        c->zs.avail_out = (uInt)cap;
        int ret = inflate(&c->zs, Z_NO_FLUSH);
        c->in_pos = c->in_len - c->zs.avail_in;
        size_t got = cap - c->zs.avail_out;
        if (ret == Z_STREAM_END)
            c->member_done = 1;
        else if (ret != Z_OK && ret != Z_BUF_ERROR)
            return gz_error(c, ret, err, errlen);
        if (got > 0)
            return (ssize_t)got;
        if (!c->member_done && c->in_pos == c->in_len && c->in_eof) {
            seterr(err, errlen,
                   "%s:%llu: truncated gzip data (the file ends inside a "
                   "compressed member): copy it again or re-compress it",
                   cur_path(c), line_reached(c));
            return -1;
        }
    }
}

static ssize_t zstd_read(corpus_t *c, char *dst, size_t cap, char *err, size_t errlen)
{
    for (;;) {
        if (c->in_pos == c->in_len && !c->in_eof && fill_in(c, err, errlen))
            return -1;
        ZSTD_inBuffer ib = {c->in, c->in_len, c->in_pos};
        ZSTD_outBuffer ob = {dst, cap, 0};
        size_t r = ZSTD_decompressStream(c->zd, &ob, &ib);
        int progress = ib.pos != c->in_pos || ob.pos > 0;
        c->in_pos = ib.pos;
        if (ZSTD_isError(r)) {
            seterr(err, errlen,
                   "%s:%llu: invalid zstd data (%s): the file is damaged; "
                   "copy it again or re-compress it",
                   cur_path(c), line_reached(c), ZSTD_getErrorName(r));
            return -1;
        }
        /* 0: every frame so far is complete and flushed. Only a call that
         * moved data says so: an idle call between frames returns the
         * size of the next frame header it waits for. */
        if (progress)
            c->frame_open = r != 0;
        if (ob.pos > 0)
            return (ssize_t)ob.pos;
        if (progress)
            continue;
        if (c->in_pos < c->in_len) {
            seterr(err, errlen, "%s:%llu: zstd decoding made no progress", cur_path(c), line_reached(c));
            return -1;
        }
        if (!c->frame_open)
            return 0;
        seterr(err, errlen,
               "%s:%llu: truncated zstd data (the file ends inside a "
               "frame): copy it again or re-compress it",
               cur_path(c), line_reached(c));
        return -1;
    }
}

static ssize_t src_read(corpus_t *c, char *dst, size_t cap, char *err, size_t errlen)
{
    switch (c->kind) {
    case SRC_GZIP: return gz_read(c, dst, cap, err, errlen);
    case SRC_ZSTD: return zstd_read(c, dst, cap, err, errlen);
    default: return raw_read(c, dst, cap, err, errlen);
    }
}

/* ------------------------------------------------------------------ */
/* Opening and closing one file                                        */
/* ------------------------------------------------------------------ */

static void src_close(corpus_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->zs_init)
        inflateEnd(&c->zs);
    c->zs_init = 0;
    ZSTD_freeDStream(c->zd); /* NULL is fine */
    c->zd = NULL;
}

/* Set up the decoder the file's first bytes (already in c->in) call for. */
static int src_detect(corpus_t *c, char *err, size_t errlen)
{
    const unsigned char *m = c->in;
    c->kind = SRC_RAW;
    if (c->in_len >= 2 && m[0] == 0x1f && m[1] == 0x8b) {
        c->kind = SRC_GZIP;
        memset(&c->zs, 0, sizeof c->zs);
        if (inflateInit2(&c->zs, 15 + 16) != Z_OK) /* 16: gzip wrapper */
            goto nomem;
        c->zs_init = 1;
        c->member_done = 0;
    } else if (c->in_len >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) {
        c->kind = SRC_ZSTD;
        c->frame_open = 1;
        c->zd = ZSTD_createDStream();
        if (c->zd == NULL || ZSTD_isError(ZSTD_initDStream(c->zd)))
            goto nomem;
    }
    return 0;
nomem:
    seterr(err, errlen, "%s: out of memory for the decompressor", cur_path(c));
    return -1;
}

static int src_open(corpus_t *c, char *err, size_t errlen)
{
    const char *path = cur_path(c);
    struct stat st;

    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0) {
        seterr(err, errlen, "cannot open input '%s': %s: check the path", path, strerror(errno));
        return -1;
    }
    if (fstat(c->fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        seterr(err, errlen, "input '%s' is a directory: give the files in it instead", path);
        return -1;
    }
    c->start = c->end = c->scan = 0;
    c->line = 1;
    c->n_docs = 0;
    c->src_eof = 0;
    /* A document far larger than the read size made the buffer grow: give
     * the memory back before the next file. */
    if (c->cap > 8 * c->chunk) {
        char *p = realloc(c->buf, c->chunk);
        if (p != NULL) {
            c->buf = p;
            c->cap = c->chunk;
        }
    }
    /* A pipe may give fewer bytes per read than the 4 of a zstd magic. */
    c->in_pos = c->in_len = 0;
    c->in_eof = 0;
    while (c->in_len < 4 && !c->in_eof) {
        ssize_t got = read_once(c, c->in + c->in_len, c->in_cap - c->in_len, err, errlen);
        if (got < 0)
            return -1;
        c->in_eof = got == 0;
        c->in_len += (size_t)got;
    }
    return src_detect(c, err, errlen);
}

/* ------------------------------------------------------------------ */
/* The document buffer                                                 */
/* ------------------------------------------------------------------ */

/* Make room for one more read after end: move the unconsumed bytes to the
 * front when the tail is short (only then, so a long document is not moved
 * once per read), and double the buffer when that is not enough. */
static int buf_room(corpus_t *c, char *err, size_t errlen)
{
    if (c->cap - c->end >= c->chunk)
        return 0;
    if (c->start > 0) {
        memmove(c->buf, c->buf + c->start, c->end - c->start);
        c->end -= c->start;
        c->scan -= c->start;
        c->start = 0;
        /* A long document made the buffer grow and is gone: give the
         * memory back rather than hold it for the rest of the file. */
        if (c->cap > 8 * c->chunk && c->end < c->chunk) {
            char *p = realloc(c->buf, 2 * c->chunk);
            if (p != NULL) {
                c->buf = p;
                c->cap = 2 * c->chunk;
            }
        }
        if (c->cap - c->end >= c->chunk)
            return 0;
    }
    if (c->end > (SIZE_MAX - c->chunk) / 2) {
        seterr(err, errlen, "%s:%llu: a document too large to hold in memory", cur_path(c), line_reached(c));
        return -1;
    }
    size_t cap = c->cap * 2 > c->end + c->chunk ? c->cap * 2 : c->end + c->chunk;
    char *p = realloc(c->buf, cap);
    if (p == NULL) {
        seterr(err, errlen,
               "%s:%llu: out of memory holding a document of more than %zu "
               "bytes: split the input into smaller documents",
               cur_path(c), (unsigned long long)c->line, c->end - c->start);
        return -1;
    }
    c->buf = p;
    c->cap = cap;
    return 0;
}

/* Decompress one more read into the buffer: 1 bytes added, 0 the file
 * ended (src_eof set), -1 error. */
static int buf_fill(corpus_t *c, char *err, size_t errlen)
{
    if (buf_room(c, err, errlen) != 0)
        return -1;
    ssize_t got = src_read(c, c->buf + c->end, c->chunk, err, errlen);
    if (got < 0)
        return -1;
    if (got == 0) {
        c->src_eof = 1;
        return 0;
    }
    c->end += (size_t)got;
    return 1;
}

/* ------------------------------------------------------------------ */
/* JSON                                                                */
/* ------------------------------------------------------------------ */

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "a number";
    case JSON_REAL: return "a number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

/* The first few keys of obj, comma-separated, for "no such field" errors:
 * usually one of them is the field the user meant. */
static void list_keys(json_t *obj, char *out, size_t outlen)
{
    const char *key;
    json_t *v;
    size_t n = 0, k = 0;
    out[0] = '\0';
    json_object_foreach(obj, key, v)
    {
        (void)v;
        if (k == 6) {
            snprintf(out + n, outlen - n, ", ...");
            return;
        }
        int w = snprintf(out + n, outlen - n, "%s%s", k ? ", " : "", key);
        if (w < 0 || (size_t)w >= outlen - n)
            return;
        n += (size_t)w;
        k++;
    }
    if (k == 0)
        snprintf(out, outlen, "none");
}

/* Parse one line: on success *root owns the object and *text points into
 * it. msg gets the problem and fix without a file or line. */
static int jsonl_parse(const char *line, size_t len, const char *field, json_t **root, const char **text, size_t *tlen,
                       char *msg, size_t msglen)
{
    json_error_t je;
    /* JSON_ALLOW_NUL: \u0000 is a legal escape and a text may hold NULs.
     * JSON_DECODE_INT_AS_REAL: an id beyond 64 bits in some other field
     * must not reject the line (only the text field is read). The
     * end-of-input check stays on: two objects on a line are an error. */
    json_t *r = json_loadb(line, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (r == NULL) {
        seterr(msg, msglen,
               "not valid JSON (%s, near byte %d): fix the line, or remove "
               "it",
               je.text, je.position);
        return -1;
    }
    if (!json_is_object(r)) {
        seterr(msg, msglen,
               "the line is %s, not a JSON object: JSONL needs one object "
               "per line",
               json_kind(r));
        json_decref(r);
        return -1;
    }
    json_t *v = json_object_get(r, field);
    if (v == NULL) {
        char keys[200];
        list_keys(r, keys, sizeof keys);
        seterr(msg, msglen,
               "no \"%s\" field in the object (its fields: %s): name the "
               "field that holds the text with --jsonl-field",
               field, keys);
        json_decref(r);
        return -1;
    }
    if (!json_is_string(v)) {
        seterr(msg, msglen,
               "field \"%s\" is %s, not a string: fix the line, or name the "
               "field that holds the text with --jsonl-field",
               field, json_kind(v));
        json_decref(r);
        return -1;
    }
    *root = r;
    *text = json_string_value(v);
    *tlen = json_string_length(v);
    return 0;
}

int corpus_jsonl_field(const char *line, size_t len, const char *field, char **text, size_t *tlen, char *err,
                       size_t errlen)
{
    json_t *root;
    const char *s;
    size_t n;
    if (line == NULL || field == NULL || text == NULL || tlen == NULL) {
        seterr(err, errlen, "corpus_jsonl_field: a NULL argument");
        return -1;
    }
    if (jsonl_parse(line, len, field, &root, &s, &n, err, errlen) != 0)
        return -1;
    *text = malloc(n + 1);
    if (*text == NULL) {
        json_decref(root);
        seterr(err, errlen, "out of memory for a text of %zu bytes", n);
        return -1;
    }
    memcpy(*text, s, n);
    (*text)[n] = '\0';
    *tlen = n;
    json_decref(root);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Splitters: 1 a document, 0 this file has no more, -1 error          */
/* ------------------------------------------------------------------ */

/* Only JSON white space, so the line holds no document. */
static int is_blank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
            return 0;
    return 1;
}

/* The next line of the file: [*p, *p + *len) without its LF, *line its
 * number. 0 at the end of the file. */
static int next_line(corpus_t *c, const char **p, size_t *len, uint64_t *line, char *err, size_t errlen)
{
    for (;;) {
        char *nl = memchr(c->buf + c->scan, '\n', c->end - c->scan);
        size_t next;
        if (nl != NULL) {
            next = (size_t)(nl - c->buf) + 1;
            *len = (size_t)(nl - c->buf) - c->start;
        } else if (!c->src_eof) {
            c->scan = c->end;
            if (buf_fill(c, err, errlen) < 0)
                return -1;
            continue;
        } else if (c->start == c->end) {
            return 0;
        } else { /* the last line, without a LF */
            next = c->end;
            *len = c->end - c->start;
        }
        *p = c->buf + c->start;
        *line = c->line++;
        c->start = c->scan = next;
        return 1;
    }
}

static int next_jsonl(corpus_t *c, int want_text, corpus_doc_t *doc, char *err, size_t errlen)
{
    const char *p;
    size_t len;
    uint64_t line;
    for (;;) {
        int r = next_line(c, &p, &len, &line, err, errlen);
        if (r <= 0)
            return r;
        if (len > 0 && p[len - 1] == '\r')
            len--;
        if (line == 1 && len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0) {
            p += 3; /* a UTF-8 byte order mark, as Windows editors write */
            len -= 3;
        }
        if (!is_blank(p, len))
            break;
    }
    doc->line = line;
    doc->text = NULL;
    doc->len = 0;
    doc->span = len;
    if (!want_text) /* the rank that owns the document parses it */
        return 1;
    char msg[512];
    if (jsonl_parse(p, len, c->field, &c->root, &doc->text, &doc->len, msg, sizeof msg) != 0) {
        seterr(err, errlen, "%s:%llu: %s", cur_path(c), (unsigned long long)line, msg);
        c->bad_doc = 1;
        return -1;
    }
    return 1;
}

/* The next non-empty piece between separators. A separator may straddle
 * reads: after a miss the search resumes sep_len - 1 bytes before the end,
 * the earliest place a separator completed by the next read can start. */
static int next_piece(corpus_t *c, int want_text, corpus_doc_t *doc, char *err, size_t errlen)
{
    for (;;) {
        char *hit = find_sep(c->buf + c->scan, c->end - c->scan, c->sep, c->sep_len);
        size_t len, next;
        if (hit != NULL) {
            len = (size_t)(hit - c->buf) - c->start;
            next = (size_t)(hit - c->buf) + c->sep_len;
        } else if (!c->src_eof) {
            size_t keep = c->sep_len - 1;
            c->scan = c->end - c->start > keep ? c->end - keep : c->start;
            if (buf_fill(c, err, errlen) < 0)
                return -1;
            continue;
        } else if (c->start == c->end) {
            return 0;
        } else {
            len = c->end - c->start;
            next = c->end;
        }
        const char *p = c->buf + c->start;
        uint64_t line = c->line;
        c->line += count_nl(p, next - c->start); /* piece and separator */
        c->start = c->scan = next;
        if (len == 0)
            continue; /* separators at the ends or in a row */
        doc->line = line;
        doc->text = want_text ? p : NULL;
        doc->len = want_text ? len : 0;
        doc->span = len;
        return 1;
    }
}

/* The whole file as one document. */
static int next_whole(corpus_t *c, int want_text, corpus_doc_t *doc, char *err, size_t errlen)
{
    if (c->n_docs > 0)
        return 0;
    while (!c->src_eof)
        if (buf_fill(c, err, errlen) < 0)
            return -1;
    if (c->end == c->start) {
        seterr(err, errlen, "%s: empty input (no bytes%s): remove it from the inputs", cur_path(c),
               c->kind == SRC_RAW ? "" : " after decompression");
        return -1;
    }
    doc->line = 1;
    doc->text = want_text ? c->buf + c->start : NULL;
    doc->len = want_text ? c->end - c->start : 0;
    doc->span = c->end - c->start;
    c->start = c->scan = c->end;
    return 1;
}

/* ------------------------------------------------------------------ */
/* Mapped reading: see corpus.h                                        */
/* ------------------------------------------------------------------ */

static uint64_t file_size(const corpus_t *c, int f) { return c->base[f + 1] - c->base[f]; }

/* File f mapped read-only (a 0-byte file maps to ""). NULL with err. */
static const char *map_open(const corpus_t *c, int f, char *err, size_t errlen)
{
    uint64_t size = file_size(c, f);
    if (size == 0)
        return "";
    if (size > SIZE_MAX) {
        seterr(err, errlen, "%s: too large to map on this system", c->paths[f]);
        return NULL;
    }
    int fd = open(c->paths[f], O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size)) {
        /* mapped bytes past a shrunk file's end would kill the reader */
        close(fd);
        seterr(err, errlen, "input '%s' changed size while being read: let it be written in full first", c->paths[f]);
        return NULL;
    }
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (m == MAP_FAILED) {
        seterr(err, errlen, "cannot %s input '%s': %s: check the file", fd < 0 ? "open" : "map", c->paths[f],
               strerror(e));
        return NULL;
    }
    return m;
}

static void map_close(const corpus_t *c, int f, const char *m)
{
    if (m != NULL && file_size(c, f) > 0)
        munmap((void *)(uintptr_t)m, (size_t)file_size(c, f));
}

/* c->map made file f's. */
static int map_use(corpus_t *c, int f, char *err, size_t errlen)
{
    if (c->map_file == f)
        return 0;
    map_close(c, c->map_file, c->map);
    c->map = NULL;
    c->map_file = -1;
    c->map = map_open(c, f, err, errlen);
    if (c->map == NULL)
        return -1;
    c->map_file = f;
    return 0;
}

/* An uncompressed regular file: 1, its size in *size; 0 not; -1 error. */
static int map_probe(const char *path, uint64_t *size, char *err, size_t errlen)
{
    struct stat st;
    /* stat first: opening a named pipe (a <(zcat ...) argument) and
     * closing it again would cut its writer off */
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open input '%s': %s: check the path", path, strerror(errno));
        return -1;
    }
    unsigned char m[4];
    ssize_t got = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, m, sizeof m, 0) : -1;
    close(fd);
    if (got < 0)
        return 0;
    if ((got >= 2 && m[0] == 0x1f && m[1] == 0x8b) ||
        (got >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd))
        return 0;
    *size = (uint64_t)st.st_size;
    return 1;
}

int corpus_map_inputs(corpus_t *c, char *err, size_t errlen)
{
    uint64_t *base = calloc((size_t)c->n_paths + 1, sizeof *base);
    if (base == NULL) {
        seterr(err, errlen, "corpus_map_inputs: out of memory");
        return -1;
    }
    for (int i = 0; i < c->n_paths; i++) {
        uint64_t size = 0;
        int r = map_probe(c->paths[i], &size, err, errlen);
        if (r <= 0) {
            free(base);
            return r;
        }
        base[i + 1] = base[i] + size;
    }
    free(c->base);
    c->base = base;
    c->mapped = 1;
    return 1;
}

uint64_t corpus_mapped_bytes(const corpus_t *c) { return c->mapped ? c->base[c->n_paths] : 0; }

void corpus_set_feed(corpus_t *c, corpus_feed_fn fn, void *ctx)
{
    c->feed = fn;
    c->feed_ctx = ctx;
}

/* The first p' >= p where no separator occurrence starts in [p'-k+1, p'):
 * a greedy reader is then between separators at p' whatever came before
 * (a separator it took before p' ended by p'). Periodic separators ("\n\n"
 * in a run of line ends) make this differ from p. */
static size_t sync_at(const char *m, size_t size, const char *sep, size_t k, size_t p)
{
    while (p > 0 && p < size) {
        size_t low = p >= k - 1 ? p - (k - 1) : 0, hit = SIZE_MAX;
        for (size_t q = p; q-- > low;)
            if (q + k <= size && memcmp(m + q, sep, k) == 0) {
                hit = q;
                break;
            }
        if (hit == SIZE_MAX)
            return p;
        p = hit + k; /* > p: hit >= p - k + 1 */
    }
    return p < size ? p : size;
}

/* One piece [s, e) of file bytes m as a span, by the streaming rules. */
static int scan_emit(const corpus_t *c, const char *m, uint64_t base, size_t s, size_t e, corpus_span_t **spans,
                     size_t *n, size_t *cap)
{
    if (c->format == CORPUS_JSONL) {
        if (e > s && m[e - 1] == '\r')
            e--;
        if (s == 0 && e - s >= 3 && memcmp(m, "\xef\xbb\xbf", 3) == 0)
            s += 3;
        if (is_blank(m + s, e - s))
            return 0;
    } else if (e == s) {
        return 0;
    }
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 4096;
        corpus_span_t *p = realloc(*spans, nc * sizeof *p);
        if (p == NULL)
            return -1;
        *spans = p;
        *cap = nc;
    }
    (*spans)[(*n)++] = (corpus_span_t){base + s, e - s};
    return 0;
}

/* corpus_scan within file f: the pieces that begin in [lo, hi) of it. */
static int scan_file(const corpus_t *c, int f, size_t lo, size_t hi, corpus_span_t **spans, size_t *n, size_t *cap,
                     char *err, size_t errlen)
{
    const char *m = map_open(c, f, err, errlen);
    if (m == NULL)
        return -1;
    /* JSONL: documents are lines */
    const char *sep = c->format == CORPUS_JSONL ? "\n" : c->sep;
    size_t size = (size_t)file_size(c, f), k = c->format == CORPUS_JSONL ? 1 : c->sep_len;
    lo = sync_at(m, size, sep, k, lo);
    hi = sync_at(m, size, sep, k, hi);
    /* a piece begins at the file's start and after each separator */
    size_t pos = lo, piece = lo == 0 ? 0 : SIZE_MAX;
    int rc = 0;
    while (pos < hi || piece != SIZE_MAX) {
        /* past hi only to end a piece: separators after it are the next
         * range's (and one inside a long document would be found again
         * by every range it spans) */
        size_t lim = piece != SIZE_MAX || hi + k - 1 >= size ? size : hi + k - 1;
        const char *hit = find_sep((char *)(uintptr_t)m + pos, lim - pos, sep, k);
        size_t at = hit ? (size_t)(hit - m) : size;
        if (piece != SIZE_MAX && scan_emit(c, m, c->base[f], piece, at, spans, n, cap) != 0) {
            seterr(err, errlen, "%s: out of memory listing its documents", c->paths[f]);
            rc = -1;
            break;
        }
        if (hit == NULL || at >= hi)
            break;
        piece = pos = at + k;
    }
    map_close(c, f, m);
    return rc;
}

int corpus_scan(corpus_t *c, uint64_t lo, uint64_t hi, corpus_span_t **spans, size_t *n, size_t *cap, char *err,
                size_t errlen)
{
    if (!c->mapped || (c->format == CORPUS_TEXT && c->sep == NULL)) {
        seterr(err, errlen, "corpus_scan: needs mapped inputs and a separator or JSONL");
        return -1;
    }
    for (int f = 0; f < c->n_paths && lo < hi; f++) {
        uint64_t b = c->base[f], e = c->base[f + 1];
        if (e <= lo || b >= hi)
            continue;
        size_t flo = (size_t)(lo - b), fhi = (size_t)((hi < e ? hi : e) - b);
        if (lo < b)
            flo = 0;
        if (scan_file(c, f, flo, fhi, spans, n, cap, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* The next span from the feed; 0 when it has no more. */
static int feed_next(corpus_t *c, corpus_span_t *s, char *err, size_t errlen)
{
    while (c->span_pos == c->n_spans) {
        c->span_pos = c->n_spans = 0;
        if (c->feed == NULL) {
            seterr(err, errlen, "corpus_next: mapped reading with a separator needs a feed");
            return -1;
        }
        if (c->feed(c->feed_ctx, &c->spans, &c->n_spans, err, errlen) != 0)
            return -1;
        if (c->n_spans == 0)
            return 0;
    }
    *s = c->spans[c->span_pos++];
    return 1;
}

/* The next document, mapped: a whole file, or the feed's next span. */
static int next_mapped(corpus_t *c, int want_text, corpus_doc_t *doc, char *err, size_t errlen)
{
    corpus_span_t s;
    int f = c->file; /* the file of the last document */
    if (c->format == CORPUS_TEXT && c->sep == NULL) {
        if (c->n_docs > 0 && ++f >= c->n_paths)
            return 0;
        if (file_size(c, f) == 0) {
            seterr(err, errlen, "%s: empty input (no bytes): remove it from the inputs", c->paths[f]);
            return -1;
        }
        s = (corpus_span_t){c->base[f], file_size(c, f)};
    } else {
        int r = feed_next(c, &s, err, errlen);
        if (r <= 0)
            return r;
        while (s.at >= c->base[f + 1])
            f++;
    }
    c->file = f;
    c->n_docs++;
    doc->file = f;
    doc->line = 0;
    doc->offset = s.at - c->base[f];
    doc->span = (size_t)s.len;
    doc->text = NULL;
    doc->len = 0;
    if (!want_text)
        return 1;
    /* from here on an error is this document's: the next one is found */
    c->bad_doc = 1;
    if (map_use(c, f, err, errlen) != 0)
        return -1;
    const char *p = c->map + doc->offset;
    if (c->format != CORPUS_JSONL) {
        doc->text = p;
        doc->len = (size_t)s.len;
        return 1;
    }
    char msg[512];
    if (jsonl_parse(p, (size_t)s.len, c->field, &c->root, &doc->text, &doc->len, msg, sizeof msg) != 0) {
        seterr(err, errlen, "%s:%llu: %s", c->paths[f], (unsigned long long)corpus_doc_line(c, doc), msg);
        return -1;
    }
    return 1;
}

uint64_t corpus_doc_line(corpus_t *c, const corpus_doc_t *doc)
{
    if (doc->line != 0 || !c->mapped)
        return doc->line;
    char err[256];
    if (map_use(c, doc->file, err, sizeof err) != 0)
        return 0;
    return 1 + count_nl(c->map, (size_t)doc->offset);
}

/* ------------------------------------------------------------------ */
/* Public API                                                          */
/* ------------------------------------------------------------------ */

/* Fail early, before any work, on a path that cannot be read. stat(2)
 * rather than open(2): opening a named pipe (a <(zcat ...) argument) and
 * closing it again would cut its writer off. */
static int check_path(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0 || access(path, R_OK) != 0) {
        seterr(err, errlen, "cannot read input '%s': %s: check the path", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        seterr(err, errlen, "input '%s' is a directory: give the files in it instead", path);
        return -1;
    }
    return 0;
}

static int check_opts(const corpus_opts_t *o, char *err, size_t errlen)
{
    if (o->format != CORPUS_TEXT && o->format != CORPUS_JSONL) {
        seterr(err, errlen, "corpus_open: unknown input format %d", (int)o->format);
        return -1;
    }
    if (o->format == CORPUS_JSONL && o->jsonl_field != NULL && o->jsonl_field[0] == '\0') {
        seterr(err, errlen,
               "empty JSONL field name: give the name of the field that "
               "holds the text (default \"text\")");
        return -1;
    }
    if (o->format == CORPUS_TEXT && o->separator != NULL && o->separator_len == 0) {
        seterr(err, errlen,
               "empty document separator: give at least one byte, or none "
               "for one document per file");
        return -1;
    }
    return 0;
}

int corpus_open(corpus_t **out, char *const *paths, int n_paths, const corpus_opts_t *o, char *err, size_t errlen)
{
    *out = NULL;
    if (n_paths < 1 || paths == NULL) {
        seterr(err, errlen, "no input files: name at least one");
        return -1;
    }
    if (check_opts(o, err, errlen) != 0)
        return -1;
    for (int i = 0; i < n_paths; i++)
        if (check_path(paths[i], err, errlen) != 0)
            return -1;
    corpus_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        goto nomem;
    c->paths = paths;
    c->n_paths = n_paths;
    c->format = o->format;
    c->fd = -1;
    c->map_file = -1;
    c->chunk = o->buf_size ? o->buf_size : CORPUS_DEFAULT_BUF_SIZE;
    c->in_cap = c->chunk < 4 ? 4 : c->chunk;
    c->in = malloc(c->in_cap);
    /* Never NULL, not even before the first read: memchr on a NULL
     * pointer is undefined even for 0 bytes. */
    c->cap = c->chunk;
    c->buf = malloc(c->cap);
    c->field = strdup(o->jsonl_field ? o->jsonl_field : "text");
    if (c->in == NULL || c->buf == NULL || c->field == NULL)
        goto nomem;
    if (o->format == CORPUS_TEXT && o->separator != NULL) {
        c->sep = malloc(o->separator_len);
        if (c->sep == NULL)
            goto nomem;
        memcpy(c->sep, o->separator, o->separator_len);
        c->sep_len = o->separator_len;
    }
    *out = c;
    return 0;
nomem:
    corpus_close(c);
    seterr(err, errlen, "corpus_open: out of memory");
    return -1;
}

int corpus_next(corpus_t *c, int want_text, corpus_doc_t *doc, char *err, size_t errlen)
{
    if (c->failed) {
        seterr(err, errlen, "corpus_next: reading stopped at an earlier error");
        return -1;
    }
    json_decref(c->root); /* the previous document's text */
    c->root = NULL;
    if (c->mapped) {
        int r = next_mapped(c, want_text, doc, err, errlen);
        if (r >= 0)
            c->bad_doc = 0;
        if (r > 0 || c->bad_doc)
            doc->index = c->index++;
        c->failed = r < 0;
        return r;
    }
    for (;;) {
        if (c->fd < 0) {
            if (c->file >= c->n_paths)
                return 0;
            if (src_open(c, err, errlen) != 0)
                break;
        }
        int r;
        if (c->format == CORPUS_JSONL)
            r = next_jsonl(c, want_text, doc, err, errlen);
        else if (c->sep != NULL)
            r = next_piece(c, want_text, doc, err, errlen);
        else
            r = next_whole(c, want_text, doc, err, errlen);
        if (r > 0 || c->bad_doc) {
            doc->index = c->index++;
            doc->file = c->file;
            doc->offset = 0;
            c->n_docs++;
            if (r > 0)
                return 1;
        }
        if (r < 0)
            break;
        src_close(c);
        c->file++;
    }
    c->failed = 1;
    return -1;
}

int corpus_skip(corpus_t *c)
{
    if (!c->failed || !c->bad_doc)
        return -1;
    c->failed = c->bad_doc = 0;
    return 0;
}

void corpus_close(corpus_t *c)
{
    if (c == NULL)
        return;
    src_close(c);
    if (c->mapped)
        map_close(c, c->map_file, c->map);
    free(c->base);
    json_decref(c->root);
    free(c->in);
    free(c->buf);
    free(c->field);
    free(c->sep);
    free(c);
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

int corpus_unescape(const char *s, char *out, size_t outcap, size_t *outlen, char *err, size_t errlen)
{
    size_t n = 0;
    for (size_t i = 0; s[i] != '\0'; i++) {
        char ch = s[i];
        if (ch == '\\') {
            size_t at = i++;
            switch (s[i]) {
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case '\\': ch = '\\'; break;
            case '0': ch = '\0'; break;
            case 'x': {
                int hi = s[i + 1] ? hexval(s[i + 1]) : -1;
                int lo = hi >= 0 && s[i + 2] ? hexval(s[i + 2]) : -1;
                if (lo < 0) {
                    seterr(err, errlen,
                           "document separator '%s': '\\x' at character %zu "
                           "needs two hex digits (e.g. \\x1e)",
                           s, at + 1);
                    return -1;
                }
                ch = (char)(hi * 16 + lo);
                i += 2;
                break;
            }
            default:
                seterr(err, errlen,
                       "document separator '%s': %s at character %zu: use "
                       "\\n \\r \\t \\\\ \\0 or \\xHH",
                       s, s[i] ? "unknown escape" : "a lone backslash", at + 1);
                return -1;
            }
        }
        if (n == outcap) {
            seterr(err, errlen,
                   "document separator '%s' is longer than %zu bytes: use a "
                   "shorter one",
                   s, outcap);
            return -1;
        }
        out[n++] = ch;
    }
    *outlen = n;
    return 0;
}
