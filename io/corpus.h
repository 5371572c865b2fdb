/* Document reader for dtrain-prepare: walks plain-text and JSONL inputs,
 * each optionally gzip- or zstd-compressed, and yields one document at a
 * time with its position (index over all inputs, file, line).
 *
 * Compression is detected from the first bytes of each file, not from its
 * name: 1f 8b is gzip (every member of a multi-member file, as `cat a.gz
 * b.gz` makes; zero padding after a member is ignored, as gzip(1) and
 * Python's gzip module do), 28 b5 2f fd is zstd (every frame of a
 * concatenation; skippable frames ignored), anything else is read as is.
 * Reading streams: memory holds the current document (in a buffer that
 * grows by doubling and shrinks again after a long document) plus a read
 * buffer of opts->buf_size bytes, so inputs of any size work as long as
 * each document fits in memory.
 *
 * Plain text (CORPUS_TEXT), byte for byte (nothing is stripped, not even a
 * UTF-8 byte order mark):
 *  - no separator: each file is one document, with line 1. A file that is
 *    empty after decompression is an error (an empty document is almost
 *    always a mistake in the input list).
 *  - with a separator: a file is cut at every occurrence of the separator
 *    (leftmost first, occurrences do not overlap, as Python's bytes.split),
 *    the separator is dropped, and every empty piece (from a separator at
 *    the start or end of the file, or two in a row) is skipped, so a file
 *    that holds only separators, or nothing, gives no document. A
 *    document's line is the 1-based line where its first byte is.
 *
 * JSONL (CORPUS_JSONL): one JSON object per line (lines end at LF; a CR
 * before the LF is dropped; the last line needs no LF). Lines that are
 * empty or hold only JSON white space (space, tab, CR) are skipped without
 * being parsed. A UTF-8 byte order mark at the start of a file is skipped.
 * Every other line is a document: its text is the string value of the
 * field opts->jsonl_field (default "text") of the object on that line,
 * decoded to UTF-8 (it may contain NUL bytes, from \u0000; an empty string
 * is a document of 0 bytes, since skipping it would need the parse that
 * want_text == 0 avoids). A line that is not one JSON object (trailing
 * data included), lacks the field, or whose field is not a string, is an
 * error naming the file and the line. Parsing
 * is Jansson's: invalid UTF-8, lone surrogate escapes (\ud800) and numbers
 * beyond the range of a double (1e400) anywhere on the line are errors too. When the field
 * appears twice the last value counts (as in Python's json).
 *
 * corpus_next(c, 0, ...) counts documents exactly as corpus_next(c, 1, ...)
 * does but parses no JSON: a rank that does not own a document skips it
 * cheaply, and the owner is the one that reports a bad line.
 *
 * Errors: functions return -1 and write one line (no newline) to err that
 * names the file, the line where known, the problem and the fix; nothing
 * is printed. After an error, corpus_next keeps returning -1, unless
 * corpus_skip says that the error was one document's (see there). */
#ifndef DTRAIN_CORPUS_H
#define DTRAIN_CORPUS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { CORPUS_TEXT = 0, CORPUS_JSONL = 1 } corpus_format_t;

/* Read buffer size when opts->buf_size is 0. */
#define CORPUS_DEFAULT_BUF_SIZE ((size_t)1 << 20)

typedef struct corpus_opts {
    corpus_format_t format;
    const char *jsonl_field; /* JSONL: the string field holding a document's
                              * text (NULL: "text") */
    const char *separator;   /* TEXT: split each file into documents at every
                              * occurrence (NULL: one document per file) */
    size_t separator_len;    /* bytes of separator (it may hold NULs); >= 1 */
    size_t buf_size;         /* bytes per read (0: CORPUS_DEFAULT_BUF_SIZE);
                              * the tests make it tiny so that separators and
                              * lines straddle reads */
} corpus_opts_t;

typedef struct corpus_doc {
    const char *text; /* valid until the next corpus_next or corpus_close;
                       * NULL when want_text was 0 */
    size_t len;       /* bytes of text; 0 when want_text was 0 */
    size_t span;      /* bytes of input it came from, set even when
                       * want_text was 0 (TEXT: len; JSONL: its line), so
                       * ranks can deal documents out by size unread */
    uint64_t index;   /* 0-based over all inputs, in input order */
    int file;         /* index into paths */
    uint64_t line;    /* JSONL: 1-based line; TEXT: 1-based line where the
                       * document starts; 0 from mapped reading, where
                       * counting lines would cost a pass over every byte:
                       * corpus_doc_line gives it */
    uint64_t offset;  /* mapped reading: byte offset of the text in its file */
} corpus_doc_t;

typedef struct corpus corpus_t;

/* Check that every path is a readable regular file (so a typo fails before
 * hours of work) and prepare to read them in order. paths must outlive c;
 * opts is copied. */
int corpus_open(corpus_t **c, char *const *paths, int n_paths, const corpus_opts_t *opts, char *err, size_t errlen);

/* 1: a document in *doc, 0: end of input, -1: error (err says
 * FILE:LINE: problem; fix). */
int corpus_next(corpus_t *c, int want_text, corpus_doc_t *doc, char *err, size_t errlen);

/* After corpus_next returned -1 for a document whose text alone is bad (a
 * malformed JSONL line, or its mapped file could not be mapped), *doc was
 * filled as with want_text 0 (index, file, line, offset, span): 0, and the
 * next corpus_next goes on with the following document, so that a rank
 * can keep counting documents in step with the others. -1: the error
 * stopped the reading (corpus_next keeps returning -1). */
int corpus_skip(corpus_t *c);

void corpus_close(corpus_t *c);

/* Mapped reading, so that N readers share the finding of documents: each
 * scans 1/N of the bytes (corpus_scan) and the readers swap what they found
 * (the feed), in place of every reader streaming every byte.
 *
 * corpus_map_inputs: 1 when every input is a regular file whose first bytes
 * are not a gzip or zstd magic; c then maps them (mmap) as it reads and
 * returns the same documents as streaming would, in the same order, line 0
 * (see corpus_doc_line). 0: c keeps streaming (compressed inputs, pipes).
 * -1 with err when a file cannot be opened. Call it before corpus_next.
 * corpus_mapped_bytes: the inputs' bytes end to end (global offsets).
 *
 * With a separator, or JSONL, the documents come from the feed: fn gives
 * the next batch of spans, in order (*n == 0: no more), each the global
 * offset and length of one document's text (JSONL: its line without the
 * LF, a CR before it, a BOM at the start of the file); 0, or -1 with err.
 * Without a separator (a document per file) c needs no feed. */
typedef struct corpus_span {
    uint64_t at;  /* global offset of the first byte */
    uint64_t len; /* bytes */
} corpus_span_t;
typedef int (*corpus_feed_fn)(void *ctx, const corpus_span_t **spans, size_t *n, char *err, size_t errlen);
int corpus_map_inputs(corpus_t *c, char *err, size_t errlen);
uint64_t corpus_mapped_bytes(const corpus_t *c);
void corpus_set_feed(corpus_t *c, corpus_feed_fn fn, void *ctx);

/* The spans of the documents that begin in the global bytes [lo, hi) of
 * the mapped inputs, appended to *spans (grown by realloc; *n and *cap
 * its length and size). Each edge moves forward to the first byte where a
 * reader starting there finds the same separators as one that started at
 * the file's beginning (leftmost first, not overlapping), so scans of
 * [a, b) and [b, c) together give exactly the spans of [a, c): ranges
 * may cut documents, separators and lines anywhere. A document that
 * begins in the range is followed past hi to its end. 0, or -1 with err. */
int corpus_scan(corpus_t *c, uint64_t lo, uint64_t hi, corpus_span_t **spans, size_t *n, size_t *cap, char *err,
                size_t errlen);

/* How k readers cut the mapped bytes [0, total) into windows: the window
 * that starts at `next` holds up to k * per_reader bytes (returned: its
 * length), of which reader r scans [*lo, *hi) (the last reader takes the
 * remainder). src/prepare/prepare_split.c and the tests that emulate it. */
static inline uint64_t corpus_window_range(uint64_t total, uint64_t next, uint64_t per_reader, uint64_t k, uint64_t r,
                                           uint64_t *lo, uint64_t *hi)
{
    const uint64_t len = total - next < k * per_reader ? total - next : k * per_reader;
    *lo = next + len / k * r;
    *hi = r + 1 == k ? next + len : *lo + len / k;
    return len;
}

/* doc's line (see corpus_doc_t), counted from its file's start when
 * mapped reading left it 0: for error messages. 0 if it cannot be read. */
uint64_t corpus_doc_line(corpus_t *c, const corpus_doc_t *doc);

/* C escapes (\n \r \t \\ \0 \xHH) in s to bytes, for --doc-separator: at
 * most outcap bytes to out, their count to *outlen. -1 with err on a bad
 * or unfinished escape or when out is too small. */
int corpus_unescape(const char *s, char *out, size_t outcap, size_t *outlen, char *err, size_t errlen);

/* The JSONL line parser alone (pure: for the fuzzer and the tests): the
 * string value of `field` in the JSON object line[0..len), as UTF-8 in a
 * malloc'd buffer (NUL-terminated, but it may hold NULs: use *tlen) that
 * the caller frees. -1 with err (no file or line in it) when the line is
 * not one JSON object, lacks the field or the field is not a string. */
int corpus_jsonl_field(const char *line, size_t len, const char *field, char **text, size_t *tlen, char *err,
                       size_t errlen);

#endif
