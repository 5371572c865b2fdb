/* A corpus feed (io/corpus.h, corpus_set_feed) that does what
 * src/prepare/prepare_split.c does, without MPI: the mapped inputs taken in windows
 * of k byte ranges of `window` bytes each, every range scanned in turn as if
 * rank 0, 1, ... k-1 had scanned it. test/test_corpus.c (--split) and
 * fuzz/fuzz_jsonl.c use it to compare the mapped, split reading with the
 * streamed one. Header-only: the test and the fuzzer are built apart. */
#ifndef DTRAIN_TEST_CORPUS_FEED_H
#define DTRAIN_TEST_CORPUS_FEED_H

#include <stdint.h>

#include "io/corpus.h"

typedef struct corpus_split_feed {
    corpus_t *c;
    uint64_t total, next, window; /* bytes: mapped, consumed, per range */
    int k;                        /* ranges per window ("ranks") */
    corpus_span_t *spans;
    size_t n, cap;
} corpus_split_feed_t;

static inline int corpus_split_feed_next(void *ctx, const corpus_span_t **spans, size_t *n, char *err, size_t errlen)
{
    corpus_split_feed_t *f = ctx;
    f->n = 0;
    while (f->n == 0 && f->next < f->total) {
        uint64_t len = 0;
        for (int r = 0; r < f->k; r++) {
            uint64_t lo, hi;
            len = corpus_window_range(f->total, f->next, f->window, (uint64_t)f->k, (uint64_t)r, &lo, &hi);
            if (corpus_scan(f->c, lo, hi, &f->spans, &f->n, &f->cap, err, errlen) != 0)
                return -1;
        }
        f->next += len;
    }
    *spans = f->spans;
    *n = f->n;
    return 0;
}

#endif
