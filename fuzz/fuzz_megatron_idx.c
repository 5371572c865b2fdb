/* libFuzzer harness: megatron_idx_parse, the validator of Megatron-LM
 * .idx files (untrusted: users bring datasets made elsewhere).
 *
 * Sources: io/megatron.c (no MPI, no other library).
 *
 * Input: 8 bytes of .bin size (little-endian) then the .idx bytes. The
 * index is parsed twice: against the fuzzer's .bin size, and against the
 * size its own lengths imply (summed here, independently), so inputs get
 * past the .bin size check to the document indices. A parse that
 * succeeds must describe a consistent dataset; anything else aborts. */
#include "io/megatron.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Sum of lengths x itemsize when the header is plausible, else 0. Careful
 * arithmetic: this runs on hostile bytes too. */
static uint64_t implied_bin_bytes(const uint8_t *b, size_t len)
{
    if (len < MEGATRON_HEADER_BYTES)
        return 0;
    const megatron_dtype_t *dt = megatron_dtype(b[17]);
    uint64_t n;
    memcpy(&n, b + 18, 8);
    if (dt == NULL || n > (len - MEGATRON_HEADER_BYTES) / 4)
        return 0;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        int32_t l;
        memcpy(&l, b + MEGATRON_HEADER_BYTES + 4 * i, 4);
        if (l > 0)
            sum += (uint64_t)l * (uint64_t)dt->itemsize;
    }
    return sum;
}

/* Everything a successful parse promises, checked through the accessors
 * (ASan sees every read). */
static void check_invariants(const megatron_idx_t *x, uint64_t bin_bytes)
{
    uint64_t pos = 0, item = (uint64_t)x->dtype->itemsize;
    if (x->n_doc_idx < 1 || x->bin_bytes != bin_bytes)
        abort();
    for (uint64_t i = 0; i < x->n_seq; i++) {
        int32_t l = megatron_idx_length(x, i);
        if (l < 0 || megatron_idx_pointer(x, i) != (int64_t)pos)
            abort();
        pos += (uint64_t)l * item;
        if (pos > bin_bytes)
            abort();
    }
    if (pos != bin_bytes || x->n_tokens * item != bin_bytes)
        abort();
    int64_t prev = 0;
    for (uint64_t d = 0; d < x->n_doc_idx; d++) {
        int64_t v = megatron_idx_doc(x, d);
        if (v < prev || (uint64_t)v > x->n_seq || (d == 0 && v != 0))
            abort();
        prev = v;
    }
    if ((uint64_t)prev != x->n_seq)
        abort();
    if (x->modes != NULL) {
        volatile int8_t sink = 0;
        for (uint64_t i = 0; i < x->n_seq; i++)
            sink ^= x->modes[i];
        (void)sink;
    }
}

static void parse_one(const uint8_t *idx, size_t len, uint64_t bin_bytes)
{
    megatron_idx_t x;
    char err[512];
    err[0] = '\0';
    if (megatron_idx_parse(idx, len, bin_bytes, &x, err, sizeof err) == 0)
        check_invariants(&x, bin_bytes);
    else if (err[0] == '\0' || strchr(err, '\n') != NULL)
        abort(); /* errors are one non-empty line */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t bin_bytes = 0;
    if (size >= 8) {
        memcpy(&bin_bytes, data, 8);
        data += 8;
        size -= 8;
    }
    parse_one(data, size, bin_bytes);
    parse_one(data, size, implied_bin_bytes(data, size));
    return 0;
}
