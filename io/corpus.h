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
 * is printed. After an error, corpus_next keeps returning -1. */
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
                       * document starts */
} corpus_doc_t;

typedef struct corpus corpus_t;

/* Check that every path is a readable regular file (so a typo fails before
 * hours of work) and prepare to read them in order. paths must outlive c;
 * opts is copied. */
int corpus_open(corpus_t **c, char *const *paths, int n_paths, const corpus_opts_t *opts, char *err, size_t errlen);

/* 1: a document in *doc, 0: end of input, -1: error (err says
 * FILE:LINE: problem; fix). */
int corpus_next(corpus_t *c, int want_text, corpus_doc_t *doc, char *err, size_t errlen);

void corpus_close(corpus_t *c);

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
