/* Megatron-LM indexed datasets: write the .idx, validate and map it for
 * reading. See megatron.h for the layout. No MPI here: the fuzzer links
 * this file with errmsg.c and publish.c. */
#define _GNU_SOURCE /* mmap, fstat */
#include "io/megatron.h"

#include "io/errmsg.h"
#include "io/publish.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* The file is little-endian and moved to and from memory with memcpy. */
#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/megatron.c assumes a little-endian host: add byte swaps before porting"
#endif

/* Pointers computed per write(2) call while writing the index. */
#define PTR_CHUNK 8192

static const megatron_dtype_t dtypes[] = {
    {MEGATRON_UINT8, "uint8", 1, 0, 0},     {MEGATRON_INT8, "int8", 1, 0, 1},
    {MEGATRON_INT16, "int16", 2, 0, 1},     {MEGATRON_INT32, "int32", 4, 0, 1},
    {MEGATRON_INT64, "int64", 8, 0, 1},     {MEGATRON_FLOAT64, "float64", 8, 1, 1},
    {MEGATRON_FLOAT32, "float32", 4, 1, 1}, {MEGATRON_UINT16, "uint16", 2, 0, 0},
};

const megatron_dtype_t *megatron_dtype(int code)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].code == code)
            return &dtypes[i];
    return NULL;
}

int megatron_dtype_for_vocab(int vocab_size) { return vocab_size < 65500 ? MEGATRON_UINT16 : MEGATRON_INT32; }

/* ------------------------------------------------------------------ */
/* Element access (unaligned, little-endian)                            */
/* ------------------------------------------------------------------ */

static uint64_t rd_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int64_t rd_i64(const unsigned char *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int32_t rd_i32(const unsigned char *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

int32_t megatron_idx_length(const megatron_idx_t *idx, uint64_t i) { return rd_i32(idx->lengths + 4 * i); }

int64_t megatron_idx_pointer(const megatron_idx_t *idx, uint64_t i) { return rd_i64(idx->pointers + 8 * i); }

int64_t megatron_idx_doc(const megatron_idx_t *idx, uint64_t d) { return rd_i64(idx->doc_idx + 8 * d); }

uint64_t megatron_idx_n_docs(const megatron_idx_t *idx) { return idx->n_doc_idx - 1; }

/* ------------------------------------------------------------------ */
/* Validation                                                           */
/* ------------------------------------------------------------------ */

#define FIX_IDX "re-create it (dtrain-prepare --format megatron or Megatron's preprocess_data.py)"

/* The fixed header: long enough, the magic, the version and a known dtype
 * (into *dtype). */
static int check_preamble(const unsigned char *b, size_t len, const char *idx, const megatron_dtype_t **dtype,
                          char *err, size_t errlen)
{
    if (len < MEGATRON_HEADER_BYTES) {
        seterr(err, errlen,
               "megatron index '%s' is truncated: %zu bytes is shorter than "
               "the %d-byte header: copy it again or " FIX_IDX,
               idx, len, MEGATRON_HEADER_BYTES);
        return -1;
    }
    if (memcmp(b, MEGATRON_MAGIC, MEGATRON_MAGIC_BYTES) != 0) {
        seterr(err, errlen,
               "megatron index '%s' has a bad magic (not \"MMIDIDX\\0\\0\"%s): "
               "it is not a Megatron-LM indexed dataset index; pass the .idx "
               "of a Megatron dataset or " FIX_IDX,
               idx,
               memcmp(b, "TNTIDX", 6) == 0 ? "; \"TNTIDX\" is the older "
                                             "fairseq format, unsupported"
                                           : "");
        return -1;
    }
    uint64_t version = rd_u64(b + 9);
    if (version != MEGATRON_VERSION) {
        seterr(err, errlen,
               "megatron index '%s' has version %llu, only version %d is "
               "supported: " FIX_IDX,
               idx, (unsigned long long)version, MEGATRON_VERSION);
        return -1;
    }
    *dtype = megatron_dtype(b[17]);
    if (*dtype == NULL) {
        seterr(err, errlen,
               "megatron index '%s' has unknown dtype code %u (known: 1..8, "
               "uint8 int8 int16 int32 int64 float64 float32 uint16): the "
               "file is corrupt, " FIX_IDX,
               idx, (unsigned)b[17]);
        return -1;
    }
    return 0;
}

/* The avail bytes after the header hold n sequences (int32 length, int64
 * pointer), m document indices (int64) and then nothing, or a modes array
 * of n bytes: *trailing gets its size. */
static int check_counts(uint64_t n, uint64_t m, size_t avail, const char *idx, size_t *trailing, char *err,
                        size_t errlen)
{
    /* Divide rather than multiply: a hostile count must not wrap. */
    if (n > avail / 12) {
        seterr(err, errlen,
               "megatron index '%s' is truncated or corrupt: sequence count "
               "%llu needs 12 bytes each (length and pointer) but only %zu "
               "bytes follow the header: copy it again or " FIX_IDX,
               idx, (unsigned long long)n, avail);
        return -1;
    }
    size_t rest = avail - (size_t)n * 12;
    if (m == 0) {
        seterr(err, errlen,
               "megatron index '%s' is corrupt: document count 0 (it is "
               "documents + 1, so at least 1): " FIX_IDX,
               idx);
        return -1;
    }
    if (m > rest / 8) {
        seterr(err, errlen,
               "megatron index '%s' is truncated or corrupt: document count "
               "%llu needs 8 bytes each but only %zu bytes follow the %llu "
               "sequences: copy it again or " FIX_IDX,
               idx, (unsigned long long)m, rest, (unsigned long long)n);
        return -1;
    }
    *trailing = rest - (size_t)m * 8;
    if (*trailing != 0 && *trailing != n) {
        seterr(err, errlen,
               "megatron index '%s' has %zu trailing bytes after the document "
               "indices (only a multimodal modes array of exactly %llu bytes "
               "may follow): the file is corrupt or was appended to, " FIX_IDX,
               idx, *trailing, (unsigned long long)n);
        return -1;
    }
    return 0;
}

/* Magic, version, dtype and the two counts against the file length. On
 * success the array views of *out are set. */
static int parse_header(const unsigned char *b, size_t len, const char *idx, megatron_idx_t *out, char *err,
                        size_t errlen)
{
    if (check_preamble(b, len, idx, &out->dtype, err, errlen) != 0)
        return -1;
    uint64_t n = rd_u64(b + 18), m = rd_u64(b + 26);
    size_t trailing;
    if (check_counts(n, m, len - MEGATRON_HEADER_BYTES, idx, &trailing, err, errlen) != 0)
        return -1;
    out->base = b;
    out->len = len;
    out->n_seq = n;
    out->n_doc_idx = m;
    out->lengths = b + MEGATRON_HEADER_BYTES;
    out->pointers = out->lengths + 4 * (size_t)n;
    out->doc_idx = out->pointers + 8 * (size_t)n;
    out->modes = (trailing == n && n > 0) ? (const int8_t *)(out->doc_idx + 8 * (size_t)m) : NULL;
    return 0;
}

/* Lengths non-negative, pointers the running sum of length * itemsize,
 * and the sum exactly the .bin's size. */
static int check_sequences(megatron_idx_t *x, uint64_t bin_bytes, const char *idx, const char *bin, char *err,
                           size_t errlen)
{
    uint64_t pos = 0, item = (uint64_t)x->dtype->itemsize;
    for (uint64_t i = 0; i < x->n_seq; i++) {
        int32_t l = megatron_idx_length(x, i);
        int64_t p = megatron_idx_pointer(x, i);
        if (l < 0) {
            seterr(err, errlen,
                   "megatron index '%s': sequence %llu has negative length "
                   "%d: the file is corrupt, " FIX_IDX,
                   idx, (unsigned long long)i, (int)l);
            return -1;
        }
        if (p < 0 || (uint64_t)p != pos) {
            seterr(err, errlen,
                   "megatron index '%s': sequence %llu points at byte %lld of "
                   "the .bin but the lengths before it end at byte %llu "
                   "(pointers must be the running sum of length x %d): the "
                   "file is corrupt, " FIX_IDX,
                   idx, (unsigned long long)i, (long long)p, (unsigned long long)pos, x->dtype->itemsize);
            return -1;
        }
        /* pos == p < 2^63 and l * item < 2^34: this cannot wrap. */
        pos += (uint64_t)l * item;
        if (pos > bin_bytes) {
            seterr(err, errlen,
                   "megatron data '%s' is truncated: sequence %llu of index "
                   "'%s' ends at byte %llu but the file has %llu bytes: copy "
                   "it again or re-create the dataset",
                   bin, (unsigned long long)i, idx, (unsigned long long)pos, (unsigned long long)bin_bytes);
            return -1;
        }
    }
    if (pos != bin_bytes) {
        seterr(err, errlen,
               "megatron data '%s' is %llu bytes but index '%s' describes "
               "%llu (%llu tokens of %s): the .bin has trailing bytes or "
               "belongs to another index; re-create the dataset",
               bin, (unsigned long long)bin_bytes, idx, (unsigned long long)pos, (unsigned long long)(pos / item),
               x->dtype->name);
        return -1;
    }
    x->n_tokens = pos / item;
    x->bin_bytes = bin_bytes;
    return 0;
}

/* Document indices: [0] = 0, never decreasing, [M-1] = N. */
static int check_documents(const megatron_idx_t *x, const char *idx, char *err, size_t errlen)
{
    int64_t prev = 0;
    for (uint64_t d = 0; d < x->n_doc_idx; d++) {
        int64_t v = megatron_idx_doc(x, d);
        const char *what = NULL;
        if (d == 0 && v != 0)
            what = "must be 0";
        else if (v < prev)
            what = "is below the one before it (they must not decrease)";
        else if ((uint64_t)v > x->n_seq)
            what = "is past the sequence count";
        else if (d + 1 == x->n_doc_idx && (uint64_t)v != x->n_seq)
            what = "is the last and must equal the sequence count";
        if (what != NULL) {
            seterr(err, errlen,
                   "megatron index '%s': document index %llu is %lld, which "
                   "%s (%llu sequences): the file is corrupt, " FIX_IDX,
                   idx, (unsigned long long)d, (long long)v, what, (unsigned long long)x->n_seq);
            return -1;
        }
        prev = v;
    }
    return 0;
}

static int parse_named(const void *buf, size_t len, uint64_t bin_bytes, const char *idx, const char *bin,
                       megatron_idx_t *out, char *err, size_t errlen)
{
    megatron_idx_t x;
    memset(&x, 0, sizeof x);
    if (buf == NULL && len > 0) {
        seterr(err, errlen, "megatron index '%s': no buffer given", idx);
        return -1;
    }
    if (parse_header(buf, len, idx, &x, err, errlen) != 0 ||
        check_sequences(&x, bin_bytes, idx, bin, err, errlen) != 0 || check_documents(&x, idx, err, errlen) != 0)
        return -1;
    *out = x;
    return 0;
}

int megatron_idx_parse(const void *buf, size_t len, uint64_t bin_bytes, megatron_idx_t *out, char *err, size_t errlen)
{
    if (out == NULL) {
        seterr(err, errlen, "megatron_idx_parse: no output given");
        return -1;
    }
    memset(out, 0, sizeof *out);
    return parse_named(buf, len, bin_bytes, "(memory)", "(its .bin)", out, err, errlen);
}

/* ------------------------------------------------------------------ */
/* Opening                                                              */
/* ------------------------------------------------------------------ */

/* PREFIX + suffix in new memory; "x.idx" and "x.bin" give the prefix x. */
static char *with_suffix(const char *arg, const char *suffix)
{
    size_t n = strlen(arg);
    if (n > 4 && (strcmp(arg + n - 4, ".idx") == 0 || strcmp(arg + n - 4, ".bin") == 0))
        n -= 4;
    char *s = malloc(n + 5);
    if (s != NULL) {
        memcpy(s, arg, n);
        memcpy(s + n, suffix, 5);
    }
    return s;
}

/* Size of a regular file, or -1 with err set. */
static int regular_size(const char *path, const char *what, uint64_t *size, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        seterr(err, errlen,
               "cannot open megatron %s '%s': %s: pass the dataset prefix "
               "(PREFIX for PREFIX.bin + PREFIX.idx)",
               what, path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        seterr(err, errlen,
               "megatron %s '%s' is not a regular file: pass the dataset "
               "prefix (PREFIX for PREFIX.bin + PREFIX.idx)",
               what, path);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

/* mmap the whole .idx read-only; an empty file maps to nothing (mmap of 0
 * bytes fails) and parse reports it as truncated. */
static int map_idx(megatron_idx_t *x, char *err, size_t errlen)
{
    int fd = open(x->idx_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open megatron index '%s': %s", x->idx_path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) != 0) {
        seterr(err, errlen, "cannot stat megatron index '%s': %s", x->idx_path, strerror(errno));
    } else if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        seterr(err, errlen, "megatron index '%s' is too large for this host", x->idx_path);
    } else if (st.st_size == 0) {
        rc = 0;
    } else {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            seterr(err, errlen, "cannot map megatron index '%s': %s", x->idx_path, strerror(errno));
        } else {
            x->map = p;
            x->map_len = (size_t)st.st_size;
            rc = 0;
        }
    }
    close(fd); /* read-only: nothing to lose, and the mapping stays */
    return rc;
}

void megatron_idx_close(megatron_idx_t *idx)
{
    if (idx == NULL)
        return;
    if (idx->map != NULL)
        munmap(idx->map, idx->map_len);
    free(idx->idx_path);
    free(idx->bin_path);
    memset(idx, 0, sizeof *idx);
}

int megatron_idx_open(megatron_idx_t *idx, const char *prefix_or_path, char *err, size_t errlen)
{
    if (idx == NULL || prefix_or_path == NULL) {
        seterr(err, errlen, "megatron_idx_open: no index or path given");
        return -1;
    }
    memset(idx, 0, sizeof *idx);
    megatron_idx_t x;
    memset(&x, 0, sizeof x);
    x.idx_path = with_suffix(prefix_or_path, ".idx");
    x.bin_path = with_suffix(prefix_or_path, ".bin");
    uint64_t idx_bytes, bin_bytes;
    if (x.idx_path == NULL || x.bin_path == NULL) {
        seterr(err, errlen, "out of memory opening megatron dataset '%s'", prefix_or_path);
        goto fail;
    }
    if (regular_size(x.idx_path, "index", &idx_bytes, err, errlen) != 0 ||
        regular_size(x.bin_path, "data", &bin_bytes, err, errlen) != 0 || map_idx(&x, err, errlen) != 0)
        goto fail;
    megatron_idx_t parsed;
    if (parse_named(x.map, x.map_len, bin_bytes, x.idx_path, x.bin_path, &parsed, err, errlen) != 0)
        goto fail;
    parsed.idx_path = x.idx_path;
    parsed.bin_path = x.bin_path;
    parsed.map = x.map;
    parsed.map_len = x.map_len;
    *idx = parsed;
    return 0;
fail:
    megatron_idx_close(&x);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Writing                                                              */
/* ------------------------------------------------------------------ */

/* The caller's arrays describe a valid dataset: checked before anything
 * is created, so a bad call leaves no file. */
static int check_write_args(const char *path, const megatron_dtype_t *dt, int code, const int32_t *len, size_t n,
                            const int64_t *doc, size_t m, char *err, size_t errlen)
{
    if (dt == NULL) {
        seterr(err, errlen, "megatron_idx_write '%s': unknown dtype code %d (1..8)", path, code);
        return -1;
    }
    /* doc == NULL: 0..n, made by write_body */
    if (doc != NULL && (m == 0 || doc[0] != 0 || doc[m - 1] < 0 || (uint64_t)doc[m - 1] != n)) {
        seterr(err, errlen,
               "megatron_idx_write '%s': document indices must start at 0 "
               "and end at the sequence count %zu (got %zu of them)",
               path, n, m);
        return -1;
    }
    for (size_t d = 1; doc != NULL && d < m; d++) {
        if (doc[d] < doc[d - 1]) {
            seterr(err, errlen,
                   "megatron_idx_write '%s': document index %zu (%lld) is "
                   "below the one before it (%lld)",
                   path, d, (long long)doc[d], (long long)doc[d - 1]);
            return -1;
        }
    }
    int64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t bytes = (int64_t)len[i] * dt->itemsize; /* < 2^34 */
        if (len[i] < 0 || sum > INT64_MAX - bytes) {    /* negative first */
            seterr(err, errlen,
                   "megatron_idx_write '%s': sequence %zu has length %d: "
                   "%s",
                   path, i, (int)len[i],
                   len[i] < 0 ? "lengths must not be negative" : "the .bin would pass 2^63 bytes");
            return -1;
        }
        sum += bytes;
    }
    return 0;
}

/* Header, lengths, pointers (running sum, computed chunk by chunk so a
 * billion sequences need no 8 GB array), document indices. */
static int write_body(publish_t *pub, const megatron_dtype_t *dt, const int32_t *len, size_t n, const int64_t *doc,
                      size_t m, char *err, size_t errlen)
{
    unsigned char hdr[MEGATRON_HEADER_BYTES];
    uint64_t version = MEGATRON_VERSION, n64 = n, m64 = m;
    memcpy(hdr, MEGATRON_MAGIC, MEGATRON_MAGIC_BYTES);
    memcpy(hdr + 9, &version, 8);
    hdr[17] = (unsigned char)dt->code;
    memcpy(hdr + 18, &n64, 8);
    memcpy(hdr + 26, &m64, 8);
    if (publish_write(pub, hdr, sizeof hdr, err, errlen) != 0 ||
        publish_write(pub, len, n * sizeof *len, err, errlen) != 0)
        return -1;
    int64_t ptr[PTR_CHUNK], pos = 0;
    for (size_t off = 0; off < n; off += PTR_CHUNK) {
        size_t k = (n - off < PTR_CHUNK) ? n - off : PTR_CHUNK;
        for (size_t i = 0; i < k; i++) {
            ptr[i] = pos;
            pos += (int64_t)len[off + i] * dt->itemsize;
        }
        if (publish_write(pub, ptr, k * sizeof *ptr, err, errlen) != 0)
            return -1;
    }
    if (doc != NULL)
        return publish_write(pub, doc, m * sizeof *doc, err, errlen);
    /* doc == NULL: one sequence per document, indices 0..n */
    for (size_t off = 0; off <= n; off += PTR_CHUNK) {
        size_t k = (n + 1 - off < PTR_CHUNK) ? n + 1 - off : PTR_CHUNK;
        for (size_t i = 0; i < k; i++)
            ptr[i] = (int64_t)(off + i);
        if (publish_write(pub, ptr, k * sizeof *ptr, err, errlen) != 0)
            return -1;
    }
    return 0;
}

int megatron_idx_write(const char *idx_path, int dtype_code, const int32_t *seq_len, size_t n_seq,
                       const int64_t *doc_idx, size_t n_doc_idx, char *err, size_t errlen)
{
    if (idx_path == NULL || (seq_len == NULL && n_seq > 0) || (doc_idx == NULL && n_doc_idx > 0)) {
        seterr(err, errlen, "megatron_idx_write: no path or arrays given");
        return -1;
    }
    if (doc_idx == NULL)
        n_doc_idx = n_seq + 1; /* one sequence per document */
    const megatron_dtype_t *dt = megatron_dtype(dtype_code);
    if (check_write_args(idx_path, dt, dtype_code, seq_len, n_seq, doc_idx, n_doc_idx, err, errlen) != 0)
        return -1;

    publish_t pub;
    if (publish_open(&pub, idx_path, 0644, err, errlen) != 0)
        return -1;
    if (write_body(&pub, dt, seq_len, n_seq, doc_idx, n_doc_idx, err, errlen) != 0) {
        publish_abort(&pub, err, errlen); /* the first error is the one to report */
        return -1;
    }
    return publish_commit(&pub, err, errlen);
}
