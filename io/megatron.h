/* Megatron-LM indexed datasets (also GPT-NeoX's): PREFIX.bin + PREFIX.idx.
 *
 * Layout of Megatron-LM's megatron/core/datasets/indexed_dataset.py,
 * version 1, little-endian, packed (no padding anywhere):
 *
 *   .idx  offset      size  field
 *         0           9     magic "MMIDIDX\0\0"
 *         9           8     uint64 version = 1
 *         17          1     uint8 dtype code (megatron_dtypes[] below)
 *         18          8     uint64 sequence_count N
 *         26          8     uint64 document_count M (documents + 1)
 *         34          4N    int32 sequence_lengths[N]    (tokens)
 *         34+4N       8N    int64 sequence_pointers[N]   (bytes into .bin)
 *         34+12N      8M    int64 document_indices[M]    (sequence indices)
 *         34+12N+8M   N     int8 sequence_modes[N]       (multimodal only)
 *   .bin  the sequences' tokens concatenated in the dtype, no header.
 *
 * pointers[i] is the running sum of lengths[j] * itemsize for j < i, so
 * the .bin holds exactly sum(lengths) * itemsize bytes. Document d is the
 * sequences document_indices[d] .. document_indices[d+1]-1; [0] = 0 and
 * [M-1] = N. dtrain writes one sequence per document (document_indices =
 * 0..N), Megatron's preprocessing may split documents into sentences.
 *
 * The arrays start at offsets 34 and 34 + 4N, which are not aligned to
 * their element size: the accessors below read them with memcpy, never a
 * cast pointer.
 *
 * sequence_modes: Megatron's reader only looks for it when told the
 * dataset is multimodal (the file does not say). We accept an .idx whose
 * trailing bytes are exactly N (the modes array) and expose it through
 * idx->modes; any other trailing length is rejected. A text-only trainer
 * should refuse a dataset with modes (idx->modes != NULL).
 *
 * Functions return 0 on success or -1 with one line in err naming the file,
 * the problem and the fix; they never print or exit.
 */
#ifndef DTRAIN_MEGATRON_H
#define DTRAIN_MEGATRON_H

#include <stddef.h>
#include <stdint.h>

#define MEGATRON_MAGIC "MMIDIDX\0\0"
#define MEGATRON_MAGIC_BYTES 9
#define MEGATRON_VERSION 1
#define MEGATRON_HEADER_BYTES 34 /* magic, version, dtype, N, M */

/* Megatron's DType codes (numpy dtype names). */
typedef enum {
    MEGATRON_UINT8 = 1,
    MEGATRON_INT8 = 2,
    MEGATRON_INT16 = 3,
    MEGATRON_INT32 = 4,
    MEGATRON_INT64 = 5,
    MEGATRON_FLOAT64 = 6,
    MEGATRON_FLOAT32 = 7,
    MEGATRON_UINT16 = 8
} megatron_dtype_code_t;

typedef struct megatron_dtype {
    int code;         /* megatron_dtype_code_t */
    const char *name; /* numpy's name, "uint16" */
    int itemsize;     /* bytes per token */
    int is_float;     /* 1 for float32/float64 (valid format, not token ids) */
    int is_signed;    /* integer types only */
} megatron_dtype_t;

/* The dtype for `code`, or NULL when the code is not one of the eight. */
const megatron_dtype_t *megatron_dtype(int code);

/* Megatron's preprocess_data.py choice: uint16 (8) when vocab_size < 65500,
 * int32 (4) otherwise. */
int megatron_dtype_for_vocab(int vocab_size);

/* A parsed index. Views into the .idx bytes (an mmap after
 * megatron_idx_open, the caller's buffer after megatron_idx_parse): the
 * arrays are not copied. */
typedef struct megatron_idx {
    const unsigned char *base; /* the whole .idx */
    size_t len;                /* its size in bytes */
    const megatron_dtype_t *dtype;
    uint64_t n_seq;                /* N */
    uint64_t n_doc_idx;            /* M = documents + 1 */
    uint64_t n_tokens;             /* sum of lengths */
    uint64_t bin_bytes;            /* size of the .bin = n_tokens * itemsize */
    const unsigned char *lengths;  /* int32[N], unaligned (offset 34) */
    const unsigned char *pointers; /* int64[N], unaligned */
    const unsigned char *doc_idx;  /* int64[M], unaligned */
    const int8_t *modes;           /* int8[N] or NULL (not multimodal) */
    /* set by megatron_idx_open only */
    char *idx_path;
    char *bin_path;
    void *map; /* mmap of the .idx, NULL for an empty mapping or parse */
    size_t map_len;
} megatron_idx_t;

/* Validate an .idx held in memory against the size of its .bin and fill
 * *out with views into buf. Pure (no I/O, no allocation): any bytes, any
 * length, never reads outside [buf, buf+len). Checks magic, version,
 * dtype, that the counts fit the buffer, lengths >= 0, pointers are the
 * running sum, sum * itemsize == bin_bytes, document indices start at 0,
 * never decrease and end at N, and no trailing bytes but a modes array. */
int megatron_idx_parse(const void *buf, size_t len, uint64_t bin_bytes, megatron_idx_t *out, char *err, size_t errlen);

/* Open PREFIX.idx (mmap) and stat PREFIX.bin, then parse. The argument is
 * the prefix, or the .idx or .bin path itself (the suffix is stripped).
 * On error nothing stays open. As with any mmap, a file truncated by
 * another process while open faults (SIGBUS) on access: datasets are
 * read-only inputs. */
int megatron_idx_open(megatron_idx_t *idx, const char *prefix_or_path, char *err, size_t errlen);
void megatron_idx_close(megatron_idx_t *idx);

/* Element i of each array (i < N, or < M for doc_idx; not checked). */
int32_t megatron_idx_length(const megatron_idx_t *idx, uint64_t i);
int64_t megatron_idx_pointer(const megatron_idx_t *idx, uint64_t i);
int64_t megatron_idx_doc(const megatron_idx_t *idx, uint64_t d);
/* Number of documents: M - 1. */
uint64_t megatron_idx_n_docs(const megatron_idx_t *idx);

/* Write an .idx for sequences of seq_len[n_seq] tokens of dtype_code, with
 * document boundaries doc_idx[n_doc_idx] (0, ..., n_seq; one sequence per
 * document is doc_idx = 0..n_seq, also written when doc_idx is NULL and
 * n_doc_idx 0, with no array needed). The pointers are computed here. The
 * .bin is the caller's (it must hold exactly sum(seq_len) * itemsize
 * bytes). Written to idx_path.tmp, synced, renamed over idx_path and the
 * directory synced, so idx_path is either absent, the old file or whole. */
int megatron_idx_write(const char *idx_path, int dtype_code, const int32_t *seq_len, size_t n_seq,
                       const int64_t *doc_idx, size_t n_doc_idx, char *err, size_t errlen);

#endif
