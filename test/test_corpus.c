/* Check program for io/corpus.c, driven by test_corpus.sh: dumps the
 * document stream of the inputs so that the script can compare it, byte
 * for byte, with a reference written independently in Python.
 *
 *   test_corpus [--jsonl FIELD] [--sep ESCAPED] [--buf N]
 *               [--rank R --ranks N] FILE...
 *   test_corpus --unescape ESCAPED
 *
 * Output, per document: "doc INDEX FILE LINE LEN\n", the LEN bytes of its
 * text and "\n"; then "end COUNT\n". With --ranks N only the documents
 * with INDEX % N == R are read with their text (want_text = 1), as in
 * dtrain-prepare; the others are written as "doc INDEX FILE LINE -\n".
 * --unescape writes the bytes of ESCAPED. An error: its one line on
 * stderr, exit 2 (the documents before it are on stdout).
 *
 * --split K [--window W]: mapped reading (when every input can be mapped),
 * its documents found as K ranks of dtrain-prepare find them: windows of
 * K * W bytes, each cut into K ranges scanned one after the other; the
 * output must not change. */
#include "io/corpus.h"
#include "test/corpus_feed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: test_corpus [--jsonl FIELD] [--sep ESCAPED] "
                    "[--buf N] [--rank R --ranks N]\n"
                    "                   [--split K [--window W]] FILE...\n"
                    "       test_corpus --unescape ESCAPED\n");
    return 2;
}

static void put_doc(const corpus_doc_t *d, int want_text)
{
    if (!want_text) {
        printf("doc %llu %d %llu -\n", (unsigned long long)d->index, d->file, (unsigned long long)d->line);
        return;
    }
    printf("doc %llu %d %llu %zu\n", (unsigned long long)d->index, d->file, (unsigned long long)d->line, d->len);
    fwrite(d->text, 1, d->len, stdout);
    putchar('\n');
}

static int dump(char *const *paths, int n, const corpus_opts_t *o, int rank, int ranks, corpus_split_feed_t *split)
{
    char err[1024];
    corpus_t *c;
    corpus_doc_t d;
    unsigned long long count = 0;
    int r;

    if (corpus_open(&c, paths, n, o, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (split->k > 0) {
        r = corpus_map_inputs(c, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "%s\n", err);
            corpus_close(c);
            return 2;
        }
        split->c = c;
        split->total = corpus_mapped_bytes(c);
        corpus_set_feed(c, corpus_split_feed_next, split);
    }
    for (;;) {
        int want = (int)(count % (unsigned long long)ranks) == rank;
        r = corpus_next(c, want, &d, err, sizeof err);
        if (r <= 0)
            break;
        if (d.index != count) {
            fprintf(stderr, "index %llu where %llu was due\n", (unsigned long long)d.index, count);
            r = -1;
            break;
        }
        /* span: the text's bytes for plain text, its line's (never
         * fewer) for JSONL */
        if (want && (o->format == CORPUS_TEXT ? d.span != d.len : d.span < d.len)) {
            snprintf(err, sizeof err, "document %llu: span %zu for a text of %zu bytes", (unsigned long long)d.index,
                     d.span, d.len);
            r = -1;
            break;
        }
        d.line = corpus_doc_line(c, &d);
        put_doc(&d, want);
        count++;
    }
    corpus_close(c);
    free(split->spans);
    fflush(stdout);
    if (r < 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    printf("end %llu\n", count);
    return 0;
}

static int unescape(const char *s)
{
    char out[256], err[512];
    size_t n;
    if (corpus_unescape(s, out, sizeof out, &n, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    fwrite(out, 1, n, stdout);
    return 0;
}

int main(int argc, char **argv)
{
    corpus_opts_t o = {0};
    char sep[256], err[512];
    int rank = 0, ranks = 1, i;
    corpus_split_feed_t split = {.window = (uint64_t)32 << 20};

    o.format = CORPUS_TEXT;
    for (i = 1; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (i + 1 >= argc)
            return usage();
        const char *a = argv[i], *v = argv[++i];
        if (strcmp(a, "--jsonl") == 0) {
            o.format = CORPUS_JSONL;
            o.jsonl_field = v;
        } else if (strcmp(a, "--sep") == 0) {
            if (corpus_unescape(v, sep, sizeof sep, &o.separator_len, err, sizeof err) != 0) {
                fprintf(stderr, "%s\n", err);
                return 2;
            }
            o.separator = sep;
        } else if (strcmp(a, "--buf") == 0) {
            o.buf_size = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--rank") == 0) {
            rank = atoi(v);
        } else if (strcmp(a, "--ranks") == 0) {
            ranks = atoi(v);
        } else if (strcmp(a, "--split") == 0) {
            split.k = atoi(v);
        } else if (strcmp(a, "--window") == 0) {
            split.window = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--unescape") == 0) {
            return unescape(v);
        } else {
            return usage();
        }
    }
    if (ranks < 1 || rank < 0 || rank >= ranks || split.k < 0 || split.window < 1)
        return usage();
    return dump(argv + i, argc - i, &o, rank, ranks, &split);
}
