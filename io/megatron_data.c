/* Training access to Megatron-LM indexed datasets: see megatron_data.h. */
#define _GNU_SOURCE /* madvise */
#include "io/megatron_data.h"

#include "io/errmsg.h"
#include "io/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest id each integer dtype holds. */
static int64_t dtype_max(int code)
{
    switch (code) {
    case MEGATRON_UINT8: return UINT8_MAX;
    case MEGATRON_INT8: return INT8_MAX;
    case MEGATRON_INT16: return INT16_MAX;
    case MEGATRON_UINT16: return UINT16_MAX;
    case MEGATRON_INT32: return INT32_MAX;
    default: return INT64_MAX;
    }
}

/* Token ids need an integer dtype wide enough for the model's ids, and a
 * text-only trainer cannot use a multimodal index. */
static int check_usable(const megatron_idx_t *x, int vocab_size, char *err, size_t errlen)
{
    if (x->modes) {
        seterr(err, errlen,
               "megatron index '%s' is multimodal (it has a sequence modes array): dtrain trains on "
               "text only; pass a text dataset",
               x->idx_path);
        return -1;
    }
    if (x->dtype->is_float) {
        seterr(err, errlen,
               "megatron index '%s' has dtype %s, which holds no token ids: re-create the dataset with "
               "an integer dtype (uint16 or int32)",
               x->idx_path, x->dtype->name);
        return -1;
    }
    if (dtype_max(x->dtype->code) < (int64_t)vocab_size - 1) {
        seterr(err, errlen,
               "megatron index '%s' has dtype %s (ids up to %lld), which cannot hold the model's "
               "vocabulary of %d: the data was made for another vocabulary (check --vocab-size / --model)",
               x->idx_path, x->dtype->name, (long long)dtype_max(x->dtype->code), vocab_size);
        return -1;
    }
    return 0;
}

/* mmap the .bin read-only (an empty one maps to nothing). */
static int map_bin(megatron_data_t *m, char *err, size_t errlen)
{
    const char *path = m->idx.bin_path;
    if (m->idx.bin_bytes == 0)
        return 0;
    if (m->idx.bin_bytes > (uint64_t)SIZE_MAX) {
        seterr(err, errlen, "megatron data '%s' is too large for this host", path);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open megatron data '%s': %s", path, strerror(errno));
        return -1;
    }
    void *p = mmap(NULL, (size_t)m->idx.bin_bytes, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd); /* read-only: the mapping stays */
    if (p == MAP_FAILED) {
        seterr(err, errlen, "cannot map megatron data '%s': %s", path, strerror(e));
        return -1;
    }
    m->bin = p;
    m->bin_len = (size_t)m->idx.bin_bytes;
    return 0;
}

int megatron_data_open(megatron_data_t *m, const char *prefix, int vocab_size, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (megatron_idx_open(&m->idx, prefix, err, errlen) != 0)
        return -1;
    if (check_usable(&m->idx, vocab_size, err, errlen) != 0 || map_bin(m, err, errlen) != 0) {
        megatron_data_close(m);
        return -1;
    }
    return 0;
}

void megatron_data_close(megatron_data_t *m)
{
    if (m->bin)
        munmap((void *)m->bin, m->bin_len);
    megatron_idx_close(&m->idx);
    memset(m, 0, sizeof *m);
}

uint64_t megatron_data_n_tokens(const megatron_data_t *m) { return m->idx.n_tokens; }

/* The .bin is page-aligned and a token's offset a multiple of its size,
 * so typed loads are aligned. */
#define WIDEN(type)                                                                                                    \
    do {                                                                                                               \
        const type *s = (const type *)(const void *)m->bin + off;                                                      \
        for (size_t i = 0; i < n; i++)                                                                                 \
            out[i] = (int32_t)s[i];                                                                                    \
    } while (0)

void megatron_data_tokens(const megatron_data_t *m, uint64_t off, size_t n, int32_t *out)
{
    switch (m->idx.dtype->code) {
    case MEGATRON_UINT8: WIDEN(uint8_t); break;
    case MEGATRON_INT8: WIDEN(int8_t); break;
    case MEGATRON_INT16: WIDEN(int16_t); break;
    case MEGATRON_UINT16: WIDEN(uint16_t); break;
    case MEGATRON_INT32: WIDEN(int32_t); break;
    default: WIDEN(int64_t); break; /* open refused the float dtypes */
    }
}

/* Index of the first token outside 0 .. vocab - 1 in [begin, end), or end. */
#define FIRST_BAD(type)                                                                                                \
    do {                                                                                                               \
        const type *s = (const type *)(const void *)m->bin;                                                            \
        for (uint64_t i = begin; i < end; i++)                                                                         \
            if ((int64_t)s[i] < 0 || (int64_t)s[i] >= (int64_t)vocab) {                                                \
                *value = (int64_t)s[i];                                                                                \
                return i;                                                                                              \
            }                                                                                                          \
    } while (0)

static uint64_t first_bad(const megatron_data_t *m, uint64_t begin, uint64_t end, int vocab, int64_t *value)
{
    switch (m->idx.dtype->code) {
    case MEGATRON_UINT8: FIRST_BAD(uint8_t); break;
    case MEGATRON_INT8: FIRST_BAD(int8_t); break;
    case MEGATRON_INT16: FIRST_BAD(int16_t); break;
    case MEGATRON_UINT16: FIRST_BAD(uint16_t); break;
    case MEGATRON_INT32: FIRST_BAD(int32_t); break;
    default: FIRST_BAD(int64_t); break;
    }
    return end;
}

int megatron_data_check_vocab(const megatron_data_t *m, uint64_t begin, uint64_t end, int vocab_size, char *err,
                              size_t errlen)
{
    int64_t v = 0;
    uint64_t i = first_bad(m, begin, end, vocab_size, &v);
    if (i == end)
        return 0;
    seterr(err, errlen,
           "megatron data '%s': token at index %llu has value %lld, outside the model's vocabulary "
           "0 .. %d: the data was made with a different tokenizer (check the tokenizer and --vocab-size)",
           m->idx.bin_path, (unsigned long long)i, (long long)v, vocab_size - 1);
    return -1;
}

/* Token offset of document d's first token (d <= documents). */
static uint64_t doc_first_token(const megatron_data_t *m, uint64_t d)
{
    uint64_t s = (uint64_t)megatron_idx_doc(&m->idx, d);
    if (s >= m->idx.n_seq)
        return m->idx.n_tokens;
    return (uint64_t)megatron_idx_pointer(&m->idx, s) / (uint64_t)m->idx.dtype->itemsize;
}

void megatron_data_positions(const megatron_data_t *m, uint64_t off, size_t n, int32_t *pos)
{
    const uint64_t nd = megatron_idx_n_docs(&m->idx);
    uint64_t lo = 0, hi = nd; /* the first document that starts after off */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (doc_first_token(m, mid) <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t d = lo, next = d < nd ? doc_first_token(m, d) : UINT64_MAX;
    int32_t p = 0;
    for (size_t t = 0; t < n; t++) {
        if (t > 0)
            p++;
        if (off + t == next) { /* empty documents share a start: step past them all */
            p = 0;
            while (d < nd && doc_first_token(m, d) <= off + t)
                d++;
            next = d < nd ? doc_first_token(m, d) : UINT64_MAX;
        }
        pos[t] = p;
    }
}

void megatron_data_prefetch(const megatron_data_t *m, uint64_t off, size_t n)
{
    if (!m->bin || n == 0)
        return;
    const size_t w = (size_t)m->idx.dtype->itemsize;
    fs_advise(m->bin + off * w, n * w, MADV_WILLNEED); /* a hint: failure only loses the read-ahead */
}
