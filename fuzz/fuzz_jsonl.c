/* libFuzzer harness for io/corpus.c, the reader of untrusted corpora.
 *
 * Links: io/corpus.c and io/errmsg.c (headers by their io/ prefix).
 * Libraries (pkg-config): jansson zlib libzstd.
 * Build and run (clang):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. \
 *     fuzz/fuzz_jsonl.c io/corpus.c io/errmsg.c $(pkg-config --cflags --libs jansson zlib libzstd) \
 *     -o fuzz_jsonl
 *   ./fuzz_jsonl -runs=1000000 SEED_DIR
 * Seeds worth giving (any file works): a few JSONL lines, and the same
 * gzip- and zstd-compressed (gzip -c, zstd -c), each prefixed by one mode
 * byte (see below).
 *
 * Each input is one mode byte and then the bytes of a file. The file goes
 * through two paths:
 *  1. corpus_jsonl_field() on the whole of it as one line, field "text";
 *  2. the full reader: the bytes in a memfd, walked by corpus_open() and
 *     corpus_next() (magic detection, gzip / zstd decoding, line or
 *     separator splitting, JSON parsing), in the format, separator, read
 *     size and want_text pattern that the mode byte picks.
 * Besides the sanitizers, it checks the contracts: an error is one
 * non-empty line, indices count up from 0, a text is as long as it says.
 * Then, when the file is not compressed, it is read a second time mapped,
 * its documents found by byte ranges as dtrain-prepare's ranks find them
 * (corpus_scan over 1 to 4 ranges per window of 1 to 8 bytes a range, from
 * the input's last byte): every document (line, span, text) and the error,
 * if any, must be the streamed pass's. */
#define _GNU_SOURCE /* memfd_create */
#include "io/corpus.h"
#include "test/corpus_feed.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void check_err(const char *err)
{
    if (err[0] == '\0' || strchr(err, '\n') != NULL)
        abort(); /* the contract: exactly one line */
}

static void fuzz_line(const uint8_t *data, size_t size)
{
    char *text = NULL, err[512] = "";
    size_t tlen = 0;
    if (corpus_jsonl_field((const char *)data, size, "text", &text, &tlen, err, sizeof err) == 0) {
        if (text == NULL || text[tlen] != '\0')
            abort();
        free(text);
    } else {
        check_err(err);
    }
}

/* The file in memory, under a path corpus_open can open. */
static int memfile(const uint8_t *data, size_t size, char *path, size_t plen)
{
    int fd = memfd_create("fuzz_jsonl", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    snprintf(path, plen, "/proc/self/fd/%d", fd);
    return fd;
}

/* What a pass saw of each document: line, span, and its text's hash. */
typedef struct seen {
    uint64_t *v; /* 4 a document */
    size_t n, cap;
    int r;
    char err[1024];
} seen_t;

static void seen_add(seen_t *s, const corpus_doc_t *d, uint64_t line, int want);

/* A document whose own text was bad (corpus_skip went on): its line,
 * span, a mark and its message's hash. */
static void seen_skip(seen_t *s, const corpus_doc_t *d, uint64_t line)
{
    corpus_doc_t as_doc = *d;
    as_doc.text = s->err;
    as_doc.len = strlen(s->err);
    seen_add(s, &as_doc, line, 1);
    s->v[s->n - 2] = UINT64_MAX - 1;
}

static void seen_add(seen_t *s, const corpus_doc_t *d, uint64_t line, int want)
{
    if (s->n + 4 > s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (s->v == NULL)
            abort();
    }
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; want && i < d->len; i++)
        h = (h ^ (unsigned char)d->text[i]) * 1099511628211ULL;
    s->v[s->n++] = line;
    s->v[s->n++] = d->span;
    s->v[s->n++] = want ? d->len : UINT64_MAX;
    s->v[s->n++] = h;
}

/* One pass over the inputs; mapped with k > 0 (0: the file cannot be
 * mapped, nothing done). */
static int walk(char **paths, int n_paths, const corpus_opts_t *o, uint8_t mode, int k, uint64_t w, seen_t *s)
{
    corpus_t *c;
    corpus_split_feed_t f = {0};
    if (corpus_open(&c, paths, n_paths, o, s->err, sizeof s->err)) {
        check_err(s->err);
        s->r = -2;
        return 1;
    }
    if (k > 0) {
        int m = corpus_map_inputs(c, s->err, sizeof s->err);
        if (m <= 0) {
            corpus_close(c);
            return 0;
        }
        f = (corpus_split_feed_t){c, corpus_mapped_bytes(c), 0, w, k, NULL, 0, 0};
        corpus_set_feed(c, corpus_split_feed_next, &f);
    }
    corpus_doc_t d;
    uint64_t n = 0;
    for (;;) {
        int want = (mode & 64) || n % 2 == 0;
        s->r = corpus_next(c, want, &d, s->err, sizeof s->err);
        if (s->r < 0 && corpus_skip(c) == 0) { /* one document's error: reading goes on */
            check_err(s->err);
            if (d.index != n++)
                abort();
            seen_skip(s, &d, corpus_doc_line(c, &d));
            continue;
        }
        if (s->r <= 0)
            break;
        if (d.index != n++ || (want && d.len > 0 && d.text == NULL))
            abort();
        if (want && d.len > 0) /* touch every byte: ASan checks the range */
            if (memchr(d.text, 0x7f, d.len) == d.text + d.len)
                abort();
        seen_add(s, &d, corpus_doc_line(c, &d), want);
    }
    if (s->r < 0)
        check_err(s->err);
    corpus_close(c);
    free(f.spans);
    return 1;
}

/* mode bits: 0 JSONL (else text), 1-2 separator (none, "\n\n", "ab",
 * "\0"), 3-5 read size (1 << that: 1 .. 128 bytes), 6 want_text on every
 * document (else every other one), 7 read the file twice. */
static void fuzz_reader(uint8_t mode, const uint8_t *data, size_t size)
{
    static const char *const seps[] = {NULL, "\n\n", "ab", "\0"};
    static const size_t sep_lens[] = {0, 2, 2, 1};
    char path[64];
    int fd = memfile(data, size, path, sizeof path);
    if (fd < 0)
        return;
    char *paths[2] = {path, path};
    corpus_opts_t o = {0};
    o.format = (mode & 1) ? CORPUS_JSONL : CORPUS_TEXT;
    o.separator = seps[(mode >> 1) & 3];
    o.separator_len = sep_lens[(mode >> 1) & 3];
    o.buf_size = (size_t)1 << ((mode >> 3) & 7);
    int n_paths = (mode & 128) ? 2 : 1;
    seen_t streamed = {0}, mapped = {0};
    walk(paths, n_paths, &o, mode, 0, 0, &streamed);
    int k = size ? 1 + data[size - 1] % 4 : 1;
    uint64_t w = size ? 1 + (data[size - 1] >> 2) % 8 : 1;
    if (streamed.r != -2 && walk(paths, n_paths, &o, mode, k, w, &mapped)) {
        if (mapped.r != streamed.r || mapped.n != streamed.n ||
            (mapped.n && memcmp(mapped.v, streamed.v, mapped.n * sizeof *mapped.v) != 0) ||
            (mapped.r < 0 && strcmp(mapped.err, streamed.err) != 0))
            abort(); /* mapped reading by ranges must be streaming's */
    }
    free(streamed.v);
    free(mapped.v);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    fuzz_line(data + 1, size - 1);
    fuzz_reader(data[0], data + 1, size - 1);
    return 0;
}
