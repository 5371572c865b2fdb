/* Hugging Face safetensors: validation, mapped reading with conversion to
 * fp32, model directories (single file or sharded with an index), and the
 * parallel writer's plan. See safetensors.h for the layout. No MPI here:
 * the fuzzer links this file with errmsg.c and publish.c, with Jansson. */
#define _GNU_SOURCE /* qsort_r */
#include "io/safetensors.h"

#include "base/bf16.h" /* dt_f32_to_bf16, dt_bf16_to_f32 */
#include "base/transpose.h"
#include "io/errmsg.h"
#include "io/fsutil.h"
#include "io/publish.h"
#include "io/st_block.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* The format is little-endian; elements move through memcpy. */
#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/safetensors.c assumes a little-endian host: add byte swaps before porting"
#endif

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
/* Elements converted per pwrite while writing (fp32 in, <= 4 bytes out). */
#define WRITE_CHUNK (1 << 16)

/* A name from a hostile file, fit for a one-line message: at most 120
 * bytes, control characters as '?'. */
typedef struct {
    char s[128];
} shown_t;
static shown_t show(const char *name)
{
    shown_t o;
    size_t i = 0;
    for (; name != NULL && name[i] != '\0' && i < 120; i++)
        o.s[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    if (name != NULL && name[i] != '\0')
        o.s[i++] = '.', o.s[i++] = '.', o.s[i++] = '.';
    o.s[i] = '\0';
    return o;
}

/* ------------------------------------------------------------------ */
/* Dtypes                                                               */
/* ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    st_dtype_t dtype;
    int bits;
} dtype_info_t;

/* Every dtype safetensors 0.5 defines. The sub-byte ones (F4, F6_*) must
 * fill whole bytes, as the reference implementation requires. */
static const dtype_info_t dtypes[] = {
    {"F32", ST_F32, 32},      {"F16", ST_F16, 16},      {"BF16", ST_BF16, 16},    {"F64", ST_F64, 64},
    {"I64", ST_I64, 64},      {"I32", ST_I32, 32},      {"I16", ST_I16, 16},      {"I8", ST_I8, 8},
    {"U8", ST_U8, 8},         {"BOOL", ST_BOOL, 8},     {"U16", ST_OTHER, 16},    {"U32", ST_OTHER, 32},
    {"U64", ST_OTHER, 64},    {"C64", ST_OTHER, 64},    {"F8_E4M3", ST_OTHER, 8}, {"F8_E5M2", ST_OTHER, 8},
    {"F8_E8M0", ST_OTHER, 8}, {"F6_E2M3", ST_OTHER, 6}, {"F6_E3M2", ST_OTHER, 6}, {"F4", ST_OTHER, 4},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

static const dtype_info_t *dtype_by_name(const char *s)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, s) == 0)
            return &dtypes[i];
    return NULL;
}

size_t st_dtype_size(st_dtype_t d)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == d && d != ST_OTHER)
            return (size_t)dtypes[i].bits / 8;
    return 0;
}

const char *st_dtype_name(st_dtype_t d)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == d && d != ST_OTHER)
            return dtypes[i].name;
    return "?";
}

int64_t st_numel(const st_tensor_t *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d]; /* validated not to overflow when parsed */
    return n;
}

/* ---- fp16 (IEEE binary16) ------------------------------------------ */

uint16_t st_f32_to_f16(float x)
{
    uint32_t u = dt_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520: past the midpoint above 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal: rebias 127 -> 15, round 13 bits */
        uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) /* <= 2^-25: a tie or less rounds to (even) 0 */
        return (uint16_t)sign;
    /* Subnormal: the value in units of 2^-24 is mant * 2^(e - 126). */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u, e = a >> 23;
    uint32_t shift = 126 - e; /* 14 .. 24 */
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++; /* may carry into the smallest normal, 0x400: still right */
    return (uint16_t)(sign | q);
}

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
        float v = (float)m * (1.0f / 16777216.0f);
        return dt_bits_f32(dt_f32_bits(v) | sign);
    }
    if (e == 31)
        return dt_bits_f32(sign | 0x7f800000u | (m << 13));
    return dt_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* n fp32 -> dtype d (F32, BF16, F16) at dst. */
static void from_f32(const float *src, st_dtype_t d, size_t n, unsigned char *dst)
{
    if (d == ST_F32) {
        memcpy(dst, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h = d == ST_BF16 ? dt_f32_to_bf16(src[i]) : st_f32_to_f16(src[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

/* ------------------------------------------------------------------ */
/* Parsing and validation                                               */
/* ------------------------------------------------------------------ */

static int is_nonneg_int(const json_t *v) { return json_is_integer(v) && json_integer_value(v) >= 0; }

/* bytes = product(shape) * bits / 8, overflow-checked; -1 when it does not
 * fit in 64 bits or is not a whole number of bytes. */
static int tensor_bytes(const st_tensor_t *t, int bits, uint64_t *bytes)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(n, (uint64_t)t->shape[d], &n))
            return -1;
    if (n > (uint64_t)INT64_MAX)
        return -1;
    uint64_t b;
    if (__builtin_mul_overflow(n, (uint64_t)bits, &b) || b % 8 != 0)
        return -1;
    *bytes = b / 8;
    return 0;
}

/* One entry "name": {"dtype", "shape", "data_offsets"} -> *t (name set by
 * the caller). data is the data region's length. */
static int parse_tensor(const char *label, const char *name, json_t *v, uint64_t data, st_tensor_t *t, char *err,
                        size_t errlen)
{
    const char *l = label;
    shown_t nm = show(name);
    if (!json_is_object(v)) {
        seterr(err, errlen, "%s: tensor '%s': entry is not a JSON object", l, nm.s);
        return -1;
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off)) {
        seterr(err, errlen, "%s: tensor '%s': needs \"dtype\" (a string), \"shape\" and \"data_offsets\" (arrays)", l,
               nm.s);
        return -1;
    }
    const dtype_info_t *di = dtype_by_name(json_string_value(dt));
    if (di == NULL) {
        seterr(err, errlen, "%s: tensor '%s': unknown dtype '%s' (its element size is unknown)", l, nm.s,
               show(json_string_value(dt)).s);
        return -1;
    }
    t->dtype = di->dtype;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", di->name);
    size_t nd = json_array_size(sh);
    if (nd > ST_MAX_DIMS) {
        seterr(err, errlen, "%s: tensor '%s': %zu dimensions (at most %d are supported)", l, nm.s, nd, ST_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *x = json_array_get(sh, d);
        if (!is_nonneg_int(x)) {
            seterr(err, errlen, "%s: tensor '%s': shape[%zu] is not a non-negative integer", l, nm.s, d);
            return -1;
        }
        t->shape[d] = (int64_t)json_integer_value(x);
    }
    if (json_array_size(off) != 2 || !is_nonneg_int(json_array_get(off, 0)) || !is_nonneg_int(json_array_get(off, 1))) {
        seterr(err, errlen, "%s: tensor '%s': data_offsets is not [begin, end] of non-negative integers", l, nm.s);
        return -1;
    }
    t->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
    t->end = (uint64_t)json_integer_value(json_array_get(off, 1));
    uint64_t want;
    if (tensor_bytes(t, di->bits, &want) != 0) {
        seterr(err, errlen, "%s: tensor '%s': its shape's size overflows or is not whole bytes of %s", l, nm.s,
               di->name);
        return -1;
    }
    if (t->end < t->begin || t->end - t->begin != want) {
        seterr(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] hold %s bytes, but its %s shape needs %llu", l,
               nm.s, (unsigned long long)t->begin, (unsigned long long)t->end,
               t->end < t->begin ? "negative" : "a different number of", di->name, (unsigned long long)want);
        return -1;
    }
    if (t->end > data) {
        seterr(err, errlen,
               "%s: tensor '%s': data_offsets end %llu is past the data region's %llu bytes (file truncated?)", l, nm.s,
               (unsigned long long)t->end, (unsigned long long)data);
        return -1;
    }
    return 0;
}

/* "__metadata__": an object of strings, kept re-serialised. */
static int parse_metadata(const char *label, json_t *v, st_file_t *out, char *err, size_t errlen)
{
    const char *k;
    json_t *x;
    if (!json_is_object(v)) {
        seterr(err, errlen, "%s: __metadata__ is not a JSON object", label);
        return -1;
    }
    json_object_foreach(v, k, x)
    {
        if (!json_is_string(x)) {
            seterr(err, errlen, "%s: __metadata__ '%s' is not a string (safetensors metadata maps strings to strings)",
                   label, show(k).s);
            return -1;
        }
    }
    out->metadata_json = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (out->metadata_json == NULL) {
        seterr(err, errlen, "%s: out of memory", label);
        return -1;
    }
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* by_name order; base: the tensors (qsort_r, so threads may parse). */
static int cmp_name_idx(const void *a, const void *b, void *base)
{
    const st_tensor_t *t = base;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

/* Sort by offset, refuse overlaps, build the by-name index. */
static int check_layout(const char *label, st_file_t *f, char *err, size_t errlen)
{
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_begin);
    for (int i = 1; i < f->n; i++) {
        const st_tensor_t *p = &f->t[i - 1], *q = &f->t[i];
        if (q->begin < p->end) {
            seterr(err, errlen, "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (bytes %llu..%llu)", label,
                   show(q->name).s, (unsigned long long)q->begin, (unsigned long long)q->end, show(p->name).s,
                   (unsigned long long)p->begin, (unsigned long long)p->end);
            return -1;
        }
    }
    f->by_name = malloc(((size_t)f->n + 1) * sizeof *f->by_name);
    if (f->by_name == NULL) {
        seterr(err, errlen, "%s: out of memory", label);
        return -1;
    }
    for (int i = 0; i < f->n; i++)
        f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name_idx, f->t);
    return 0;
}

/* Every entry of the header object: tensors into f->t, the metadata. */
static int parse_entries(const char *label, json_t *root, uint64_t data, st_file_t *f, char *err, size_t errlen)
{
    size_t n = json_object_size(root);
    f->t = calloc(n + 1, sizeof *f->t);
    if (f->t == NULL) {
        seterr(err, errlen, "%s: out of memory for %zu tensors", label, n);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        if (strcmp(k, "__metadata__") == 0) {
            if (parse_metadata(label, v, f, err, errlen) != 0)
                return -1;
            continue;
        }
        st_tensor_t *t = &f->t[f->n];
        if ((t->name = strdup(k)) == NULL) {
            seterr(err, errlen, "%s: out of memory", label);
            return -1;
        }
        f->n++;
        if (parse_tensor(label, k, v, data, t, err, errlen) != 0)
            return -1;
    }
    return 0;
}

static int parse_impl(const char *label, const void *bytes, size_t len, st_file_t *f, char *err, size_t errlen)
{
    const unsigned char *b = bytes;
    if (len < 8) {
        seterr(err, errlen, "%s: %zu bytes, shorter than the 8-byte header length (not a safetensors file)", label,
               len);
        return -1;
    }
    uint64_t n;
    memcpy(&n, b, 8);
    if (n > ST_MAX_HEADER_BYTES) {
        seterr(err, errlen, "%s: header length %llu exceeds the %u-byte limit (not a safetensors file?)", label,
               (unsigned long long)n, ST_MAX_HEADER_BYTES);
        return -1;
    }
    if (n > len - 8) {
        seterr(err, errlen, "%s: header length %llu runs past the end of the %zu-byte file (truncated?)", label,
               (unsigned long long)n, len);
        return -1;
    }
    f->header_len = n;
    /* The spec requires the header to start with '{' (no leading blanks). */
    if (n == 0 || b[8] != '{') {
        seterr(err, errlen, "%s: header does not begin with '{' (not a safetensors file)", label);
        return -1;
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)b + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        seterr(err, errlen, "%s: header is not valid JSON: %s (at header byte %d)", label, show(je.text).s,
               je.position);
        return -1;
    }
    int rc = -1;
    if (!json_is_object(root))
        seterr(err, errlen, "%s: header is not a JSON object", label);
    else if (parse_entries(label, root, len - 8 - n, f, err, errlen) == 0)
        rc = check_layout(label, f, err, errlen);
    json_decref(root);
    return rc;
}

int st_parse_header(const void *file_bytes, size_t len, st_file_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->map = (void *)file_bytes;
    out->size = len;
    if (parse_impl("safetensors header", file_bytes, len, out, err, errlen) != 0) {
        st_close(out);
        return -1;
    }
    return 0;
}

int st_open(st_file_t *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    int regular;
    const int mrc = fs_map_file(path, "safetensors file", 8, &f->map, &f->size, &regular, err, errlen);
    if (mrc == -2)
        seterr(err, errlen, "'%s': %s, shorter than the 8-byte header length (not a safetensors file)", path,
               regular ? "a file" : "not a regular file");
    if (mrc != 0)
        return -1;
    f->mapped = 1;
    f->path = strdup(path);
    if (f->path == NULL) {
        seterr(err, errlen, "out of memory opening '%s'", path);
        st_close(f);
        return -1;
    }
    char *label = malloc(strlen(path) + 3);
    if (label != NULL)
        sprintf(label, "'%s'", path);
    int rc = label == NULL ? -1 : parse_impl(label, f->map, f->size, f, err, errlen);
    if (label == NULL)
        seterr(err, errlen, "out of memory opening '%s'", path);
    free(label);
    if (rc != 0)
        st_close(f);
    return rc;
}

void st_close(st_file_t *f)
{
    if (f == NULL)
        return;
    for (int i = 0; f->t != NULL && i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    free(f->by_name);
    free(f->metadata_json); /* from json_dumps: malloc by default */
    if (f->mapped && f->map != NULL)
        munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor_t *st_find(const st_file_t *f, const char *name)
{
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const st_tensor_t *t = &f->t[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Reading slices                                                       */
/* ------------------------------------------------------------------ */

/* [from, from + n) inside [0, size)? Overflow-proof. */
static int in_range(int64_t from, int64_t n, int64_t size)
{
    return from >= 0 && n >= 0 && from <= size && n <= size - from;
}

/* dst row i = source row r0 + i, cols c0 .. c0 + nc (a row of cols). */
static void read_rows(const unsigned char *base, st_dtype_t d, size_t isz, int64_t cols, int64_t r0, int64_t nr,
                      int64_t c0, int64_t nc, float *dst)
{
    for (int64_t i = 0; i < nr; i++)
        st_to_f32(base + ((size_t)(r0 + i) * (size_t)cols + (size_t)c0) * isz, d, nc, dst + i * nc, 1);
}

/* dst column j = source row c0 + j, its cols r0..; in blocks of 32 x 32 so
 * that the strided writes stay in cache (one source row a column of dst at
 * a time ran at a fraction of the disk's speed), 32 source rows at a time
 * read front to back (32 sequential streams). */
static void read_transposed(const unsigned char *base, st_dtype_t d, size_t isz, int64_t cols, int64_t r0, int64_t nr,
                            int64_t c0, int64_t nc, float *dst)
{
    const unsigned char *s0 = base + ((size_t)c0 * (size_t)cols + (size_t)r0) * isz;
    if (d == ST_F32 && ((uintptr_t)s0 & 3) == 0) { /* plain bits: the register transposes */
        dt_transpose_f32((const float *)(const void *)s0, nc, nr, cols, dst, nc);
        return;
    }
    enum { BS = 32 };
    const int64_t groups = (nc + BS - 1) / BS;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t j0 = g * BS, nj = nc - j0 < BS ? nc - j0 : BS;
        for (int64_t i0 = 0; i0 < nr; i0 += BS) {
            const int64_t ni = nr - i0 < BS ? nr - i0 : BS;
            for (int64_t j = j0; j < j0 + nj; j++)
                st_to_f32(base + ((size_t)(c0 + j) * (size_t)cols + (size_t)(r0 + i0)) * isz, d, ni, dst + i0 * nc + j,
                          nc);
        }
    }
}

int st_read_f32(const st_file_t *f, const st_tensor_t *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int transpose,
                float *dst, char *err, size_t errlen)
{
    const char *l = f->path != NULL ? f->path : "<memory>";
    shown_t nm = show(t->name);
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16 && t->dtype != ST_F64) {
        seterr(err, errlen, "'%s': tensor '%s': dtype %s cannot be read as fp32 (F32, F16, BF16 or F64 only)", l, nm.s,
               t->dtype_name);
        return -1;
    }
    if (t->ndim > 2) {
        seterr(err, errlen, "'%s': tensor '%s': %d dimensions (only 1-D and 2-D tensors are read by rows)", l, nm.s,
               t->ndim);
        return -1;
    }
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
    int64_t cols = t->ndim == 2 ? t->shape[1] : t->ndim == 1 ? t->shape[0] : 1;
    int64_t lr = transpose ? cols : rows, lc = transpose ? rows : cols; /* as read */
    if (!in_range(r0, nr, lr) || !in_range(c0, nc, lc)) {
        seterr(err, errlen,
               "'%s': tensor '%s': block rows [%lld, +%lld) x cols [%lld, +%lld) is outside its %s[%lld, %lld]", l,
               nm.s, (long long)r0, (long long)nr, (long long)c0, (long long)nc, transpose ? "transpose " : "",
               (long long)lr, (long long)lc);
        return -1;
    }
    if (f->map == NULL || 8 + f->header_len + t->end > f->size) {
        seterr(err, errlen, "'%s': tensor '%s': file not mapped or tensor outside it", l, nm.s);
        return -1;
    }
    const uint64_t at = 8 + f->header_len + t->begin; /* the tensor's first byte in the file */
    const unsigned char *base = (const unsigned char *)f->map + at;
    size_t isz = st_dtype_size(t->dtype);
    if (f->mapped && f->path != NULL &&
        st_pread_block(f->path, f->size, at, t->dtype, cols, r0, nr, c0, nc, transpose, dst) == 0)
        return 0;
    if (f->mapped) /* the source rows the block spans, read ahead in large requests */
        fs_advise(base + (size_t)(transpose ? c0 : r0) * (size_t)cols * isz,
                  (size_t)(transpose ? nc : nr) * (size_t)cols * isz, MADV_WILLNEED);
    if (transpose)
        read_transposed(base, t->dtype, isz, cols, r0, nr, c0, nc, dst);
    else
        read_rows(base, t->dtype, isz, cols, r0, nr, c0, nc, dst);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Model directories                                                    */
/* ------------------------------------------------------------------ */

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p != NULL) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const st_model_entry_t *)a)->name, ((const st_model_entry_t *)b)->name);
}

/* Open one more file (dir/name) into m->files. */
static int model_add_file(st_model_t *m, const char *dir, const char *name, char *err, size_t errlen)
{
    char *path = dir != NULL ? join(dir, name) : strdup(name);
    st_file_t *nf = realloc(m->files, ((size_t)m->n_files + 1) * sizeof *nf);
    if (path == NULL || nf == NULL) {
        free(path);
        if (nf != NULL)
            m->files = nf;
        seterr(err, errlen, "out of memory opening '%s'", name);
        return -1;
    }
    m->files = nf;
    int rc = st_open(&m->files[m->n_files], path, err, errlen);
    free(path);
    if (rc == 0)
        m->n_files++;
    return rc;
}

/* A shard name from the index: a plain file name in the directory. */
static int plain_name(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* The index's weight_map: open each shard once, point each name at its
 * tensor, and refuse a name missing from its shard or a shard tensor the
 * map does not list. */
static int model_from_index(st_model_t *m, const char *dir, const char *ipath, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        seterr(err, errlen, "'%s': not valid JSON: %s (line %d)", ipath, show(je.text).s, je.line);
        return -1;
    }
    int rc = -1;
    json_t *wm = json_object_get(root, "weight_map");
    size_t nw = json_object_size(wm);
    if (!json_is_object(wm) || nw == 0) {
        seterr(err, errlen, "'%s': no \"weight_map\" object naming each tensor's shard", ipath);
        goto out;
    }
    m->index = calloc(nw, sizeof *m->index);
    if (m->index == NULL) {
        seterr(err, errlen, "out of memory reading '%s'", ipath);
        goto out;
    }
    const char *k;
    json_t *v;
    size_t seen = 0; /* tensors of the shards, to find unlisted ones */
    json_object_foreach(wm, k, v)
    {
        const char *fname = json_string_value(v);
        if (fname == NULL || !plain_name(fname)) {
            seterr(err, errlen, "'%s': tensor '%s': shard is not a file name in the directory", ipath, show(k).s);
            goto out;
        }
        int fi = 0;
        while (fi < m->n_files && strcmp(strrchr(m->files[fi].path, '/') + 1, fname) != 0)
            fi++;
        if (fi == m->n_files) {
            if (model_add_file(m, dir, fname, err, errlen) != 0)
                goto out;
            seen += (size_t)m->files[fi].n;
        }
        const st_tensor_t *t = st_find(&m->files[fi], k);
        if (t == NULL) {
            seterr(err, errlen, "'%s': tensor '%s': missing (the index says it is there)", m->files[fi].path,
                   show(k).s);
            goto out;
        }
        m->index[m->n_index++] = (st_model_entry_t){t->name, fi, (int)(t - m->files[fi].t)};
    }
    if (seen != nw) { /* every listed tensor was found, so some are unlisted */
        for (int fi = 0; fi < m->n_files; fi++)
            for (int i = 0; i < m->files[fi].n; i++) {
                const char *s = json_string_value(json_object_get(wm, m->files[fi].t[i].name));
                const char *base = strrchr(m->files[fi].path, '/') + 1;
                if (s == NULL || strcmp(s, base) != 0) {
                    seterr(err, errlen, "'%s': tensor '%s': not listed for this shard in %s", m->files[fi].path,
                           show(m->files[fi].t[i].name).s, INDEX_NAME);
                    goto out;
                }
            }
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* One file: every tensor of it. */
static int model_from_file(st_model_t *m, const char *path, char *err, size_t errlen)
{
    if (model_add_file(m, NULL, path, err, errlen) != 0)
        return -1;
    const st_file_t *f = &m->files[0];
    m->index = calloc((size_t)f->n + 1, sizeof *m->index);
    if (m->index == NULL) {
        seterr(err, errlen, "out of memory reading '%s'", path);
        return -1;
    }
    for (int i = 0; i < f->n; i++)
        m->index[m->n_index++] = (st_model_entry_t){f->t[i].name, 0, i};
    return 0;
}

int st_model_open(st_model_t *m, const char *dir, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    struct stat st;
    if (stat(dir, &st) != 0) {
        seterr(err, errlen, "cannot open model '%s': %s", dir, strerror(errno));
        return -1;
    }
    m->dir = strdup(dir);
    char *ipath = join(dir, INDEX_NAME), *spath = join(dir, SINGLE_NAME);
    int rc = -1;
    if (m->dir == NULL || ipath == NULL || spath == NULL)
        seterr(err, errlen, "out of memory opening '%s'", dir);
    else if (S_ISREG(st.st_mode))
        rc = model_from_file(m, dir, err, errlen);
    else if (access(ipath, F_OK) == 0)
        rc = model_from_index(m, dir, ipath, err, errlen);
    else if (access(spath, F_OK) == 0)
        rc = model_from_file(m, spath, err, errlen);
    else
        seterr(err, errlen, "'%s': neither %s nor %s is there (not a Hugging Face model directory)", dir, SINGLE_NAME,
               INDEX_NAME);
    free(ipath);
    free(spath);
    if (rc == 0)
        qsort(m->index, (size_t)m->n_index, sizeof *m->index, cmp_entry);
    else
        st_model_close(m);
    return rc;
}

int st_model_find(const st_model_t *m, const char *name, const st_file_t **f, const st_tensor_t **t)
{
    st_model_entry_t key = {name, 0, 0};
    const st_model_entry_t *e =
        m->n_index > 0 ? bsearch(&key, m->index, (size_t)m->n_index, sizeof key, cmp_entry) : NULL;
    if (e == NULL)
        return -1;
    if (f != NULL)
        *f = &m->files[e->file];
    if (t != NULL)
        *t = &m->files[e->file].t[e->tensor];
    return 0;
}

void st_model_close(st_model_t *m)
{
    for (int i = 0; i < m->n_files; i++)
        st_close(&m->files[i]);
    free(m->files);
    free(m->index);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ */
/* Writing                                                              */
/* ------------------------------------------------------------------ */

typedef struct {
    char *name;
    st_dtype_t dtype;
    int ndim;
    int64_t shape[2];
    int64_t rows, cols;     /* [rows][cols]: [1][n] for a 1-D tensor */
    uint64_t bytes, offset; /* offset: from the start of its file */
    int shard;
} plan_tensor_t;

typedef struct {
    char name[48];
    char *header; /* JSON padded with spaces to a multiple of 8 */
    uint64_t header_len, size;
} plan_shard_t;

struct st_plan {
    plan_tensor_t *t;
    int n;
    plan_shard_t *s;
    int n_shards;
    uint64_t total;
};

static int plan_check_tensor(const st_out_tensor_t *o, int i, plan_tensor_t *t, char *err, size_t errlen)
{
    shown_t nm = show(o->name);
    if (o->name == NULL || o->name[0] == '\0' || strcmp(o->name, "__metadata__") == 0) {
        seterr(err, errlen, "st_plan_make: tensor %d: empty or reserved name '%s'", i, nm.s);
        return -1;
    }
    if (o->dtype != ST_F32 && o->dtype != ST_BF16 && o->dtype != ST_F16) {
        seterr(err, errlen, "st_plan_make: tensor '%s': dtype %s cannot be written (F32, BF16 or F16)", nm.s,
               st_dtype_name(o->dtype));
        return -1;
    }
    if (o->ndim < 1 || o->ndim > 2 || o->shape[0] < 0 || (o->ndim == 2 && o->shape[1] < 0)) {
        seterr(err, errlen, "st_plan_make: tensor '%s': needs 1 or 2 non-negative dimensions", nm.s);
        return -1;
    }
    t->dtype = o->dtype;
    t->ndim = o->ndim;
    t->shape[0] = o->shape[0];
    t->shape[1] = o->ndim == 2 ? o->shape[1] : 0;
    t->rows = o->ndim == 2 ? o->shape[0] : 1; /* a 1-D tensor is one row */
    t->cols = o->ndim == 2 ? o->shape[1] : o->shape[0];
    uint64_t n;
    if (__builtin_mul_overflow((uint64_t)t->rows, (uint64_t)t->cols, &n) ||
        __builtin_mul_overflow(n, (uint64_t)st_dtype_size(o->dtype), &t->bytes) || t->bytes > (uint64_t)INT64_MAX) {
        seterr(err, errlen, "st_plan_make: tensor '%s': size overflows", nm.s);
        return -1;
    }
    if ((t->name = strdup(o->name)) == NULL) {
        seterr(err, errlen, "st_plan_make: out of memory");
        return -1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int plan_check_unique(const st_plan_t *p, char *err, size_t errlen)
{
    char **names = malloc(((size_t)p->n + 1) * sizeof *names);
    if (names == NULL) {
        seterr(err, errlen, "st_plan_make: out of memory");
        return -1;
    }
    for (int i = 0; i < p->n; i++)
        names[i] = p->t[i].name;
    qsort(names, (size_t)p->n, sizeof *names, cmp_str);
    int rc = 0;
    for (int i = 1; i < p->n && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            seterr(err, errlen, "st_plan_make: tensor '%s' is named twice", show(names[i]).s);
            rc = -1;
        }
    free(names);
    return rc;
}

/* One shard's header: {"__metadata__": meta, name: {dtype, shape,
 * data_offsets}, ...} for tensors [a, b), compact, padded to 8. */
static int plan_header(st_plan_t *p, int s, int a, int b, json_t *meta, char *err, size_t errlen)
{
    json_t *root = json_object();
    int bad = root == NULL || json_object_set(root, "__metadata__", meta) != 0;
    uint64_t off = 0;
    for (int i = a; i < b && !bad; i++) {
        plan_tensor_t *t = &p->t[i];
        json_t *shape = t->ndim == 2 ? json_pack("[II]", (json_int_t)t->shape[0], (json_int_t)t->shape[1])
                                     : json_pack("[I]", (json_int_t)t->shape[0]);
        json_t *e = json_pack("{s:s, s:o, s:[II]}", "dtype", st_dtype_name(t->dtype), "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + t->bytes));
        /* json_string refuses names that are not UTF-8; so does pack. */
        bad = e == NULL || json_object_set_new(root, t->name, e) != 0;
        t->offset = off; /* relative until the header's length is known */
        off += t->bytes;
    }
    char *js = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (js == NULL) {
        seterr(err, errlen, "st_plan_make: shard %d: cannot encode its header (a tensor name that is not UTF-8?)",
               s + 1);
        return -1;
    }
    size_t len = strlen(js), padded = (len + 7) / 8 * 8;
    plan_shard_t *sh = &p->s[s];
    char *h = malloc(padded + 1);
    if (h == NULL) {
        free(js);
        seterr(err, errlen, "st_plan_make: out of memory");
        return -1;
    }
    memcpy(h, js, len);
    free(js);
    sh->header = h;
    memset(sh->header + len, ' ', padded - len);
    sh->header[padded] = '\0';
    sh->header_len = padded;
    sh->size = 8 + padded + off;
    for (int i = a; i < b; i++)
        p->t[i].offset += 8 + padded;
    return 0;
}

/* Metadata: the caller's object of strings, or {"format": "pt"}. */
static json_t *plan_metadata(const char *js, char *err, size_t errlen)
{
    if (js == NULL)
        return json_pack("{s:s}", "format", "pt");
    json_error_t je;
    json_t *m = json_loads(js, JSON_REJECT_DUPLICATES, &je);
    const char *k;
    json_t *v;
    int ok = json_is_object(m);
    json_object_foreach(m, k, v) ok = ok && json_is_string(v);
    if (!ok) {
        seterr(err, errlen, "st_plan_make: metadata is not a JSON object of strings%s%s", m == NULL ? ": " : "",
               m == NULL ? je.text : "");
        json_decref(m);
        return NULL;
    }
    return m;
}

/* Greedy, in order: a new shard when the next tensor would pass max. */
static int plan_shards(st_plan_t *p, uint64_t max, json_t *meta, char *err, size_t errlen)
{
    int *first = malloc(((size_t)p->n + 1) * sizeof *first);
    if (first == NULL) {
        seterr(err, errlen, "st_plan_make: out of memory");
        return -1;
    }
    uint64_t cur = 0;
    for (int i = 0; i < p->n; i++) {
        if (i == 0 || (cur > 0 && (cur >= max || p->t[i].bytes > max - cur)))
            first[p->n_shards++] = i, cur = 0;
        cur += p->t[i].bytes;
        p->t[i].shard = p->n_shards - 1;
        p->total += p->t[i].bytes;
    }
    first[p->n_shards] = p->n;
    int rc = (p->s = calloc((size_t)p->n_shards, sizeof *p->s)) == NULL ? -1 : 0;
    if (rc != 0)
        seterr(err, errlen, "st_plan_make: out of memory");
    for (int s = 0; s < p->n_shards && rc == 0; s++) {
        if (p->n_shards == 1)
            snprintf(p->s[s].name, sizeof p->s[s].name, "%s", SINGLE_NAME);
        else
            snprintf(p->s[s].name, sizeof p->s[s].name, "model-%05d-of-%05d.safetensors", s + 1, p->n_shards);
        rc = plan_header(p, s, first[s], first[s + 1], meta, err, errlen);
    }
    free(first);
    return rc;
}

int st_plan_make(const st_out_tensor_t *t, int n, uint64_t max_shard_bytes, const char *metadata_json_or_NULL,
                 st_plan_t **pp, char *err, size_t errlen)
{
    *pp = NULL;
    if (t == NULL || n <= 0) {
        seterr(err, errlen, "st_plan_make: no tensors to write");
        return -1;
    }
    st_plan_t *p = calloc(1, sizeof *p);
    if (p == NULL || (p->t = calloc((size_t)n, sizeof *p->t)) == NULL) {
        free(p);
        seterr(err, errlen, "st_plan_make: out of memory");
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++, p->n++)
        rc = plan_check_tensor(&t[i], i, &p->t[i], err, errlen);
    if (rc == 0)
        rc = plan_check_unique(p, err, errlen);
    json_t *meta = rc == 0 ? plan_metadata(metadata_json_or_NULL, err, errlen) : NULL;
    if (rc == 0 && meta == NULL)
        rc = -1;
    if (rc == 0)
        rc = plan_shards(p, max_shard_bytes > 0 ? max_shard_bytes : ST_DEFAULT_SHARD_BYTES, meta, err, errlen);
    json_decref(meta);
    if (rc != 0) {
        st_plan_free(p);
        return -1;
    }
    *pp = p;
    return 0;
}

void st_plan_free(st_plan_t *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < p->n; i++)
        free(p->t[i].name);
    for (int s = 0; p->s != NULL && s < p->n_shards; s++)
        free(p->s[s].header);
    free(p->t);
    free(p->s);
    free(p);
}

int st_plan_n_shards(const st_plan_t *p) { return p->n_shards; }
const char *st_plan_shard_name(const st_plan_t *p, int s) { return p->s[s].name; }
uint64_t st_plan_shard_size(const st_plan_t *p, int s) { return p->s[s].size; }
int st_plan_tensor_shard(const st_plan_t *p, int i) { return p->t[i].shard; }
uint64_t st_plan_tensor_offset(const st_plan_t *p, int i) { return p->t[i].offset; }
uint64_t st_plan_total_size(const st_plan_t *p) { return p->total; }

int st_plan_create_files(const st_plan_t *p, const char *dir, char *err, size_t errlen)
{
    for (int s = 0; s < p->n_shards; s++) {
        char *path = join(dir, p->s[s].name);
        if (path == NULL) {
            seterr(err, errlen, "out of memory");
            return -1;
        }
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int rc = fd < 0 ? -1 : 0;
        if (rc != 0)
            seterr(err, errlen, "cannot create '%s': %s", path, strerror(errno));
        uint64_t n = p->s[s].header_len;
        if (rc == 0)
            rc = pwrite_full(fd, &n, 8, 0, path, err, errlen);
        if (rc == 0)
            rc = pwrite_full(fd, p->s[s].header, (size_t)n, 8, path, err, errlen);
        if (rc == 0 && ftruncate(fd, (off_t)p->s[s].size) != 0) {
            seterr(err, errlen, "cannot size '%s' to %llu bytes: %s", path, (unsigned long long)p->s[s].size,
                   strerror(errno));
            rc = -1;
        }
        if (fd >= 0 && close(fd) != 0 && rc == 0) {
            seterr(err, errlen, "cannot close '%s': %s", path, strerror(errno));
            rc = -1;
        }
        free(path);
        if (rc != 0)
            return -1;
    }
    return 0;
}

int st_plan_write_f32(const st_plan_t *p, const char *dir, int i, int64_t r0, int64_t nr, const float *rows, char *err,
                      size_t errlen)
{
    if (i < 0 || i >= p->n) {
        seterr(err, errlen, "st_plan_write_f32: tensor %d is not in the plan's %d", i, p->n);
        return -1;
    }
    const plan_tensor_t *t = &p->t[i];
    if (!in_range(r0, nr, t->rows)) {
        seterr(err, errlen, "st_plan_write_f32: tensor '%s': rows [%lld, +%lld) outside its %lld", show(t->name).s,
               (long long)r0, (long long)nr, (long long)t->rows);
        return -1;
    }
    char *path = join(dir, p->s[t->shard].name);
    unsigned char *buf = malloc(WRITE_CHUNK * 4); /* converted rows (bf16, fp16) */
    int fd = path != NULL ? open(path, O_WRONLY | O_CLOEXEC) : -1;
    int rc = fd < 0 || buf == NULL ? -1 : 0;
    if (rc != 0)
        seterr(err, errlen, "cannot open '%s' for writing (st_plan_create_files first?): %s", path != NULL ? path : dir,
               strerror(errno));
    size_t isz = st_dtype_size(t->dtype), n = (size_t)nr * (size_t)t->cols;
    uint64_t off = t->offset + (uint64_t)r0 * (uint64_t)t->cols * isz;
    if (t->dtype == ST_F32 && rc == 0) /* the rows are the bytes: no conversion, no copy */
        rc = pwrite_full(fd, rows, n * isz, off, path, err, errlen);
    for (size_t done = 0; t->dtype != ST_F32 && done < n && rc == 0;) {
        size_t m = n - done < WRITE_CHUNK ? n - done : WRITE_CHUNK;
        from_f32(rows + done, t->dtype, m, buf);
        rc = pwrite_full(fd, buf, m * isz, off + done * isz, path, err, errlen);
        done += m;
    }
    if (fd >= 0 && close(fd) != 0 && rc == 0) {
        seterr(err, errlen, "cannot close '%s': %s", path, strerror(errno));
        rc = -1;
    }
    free(buf);
    free(path);
    return rc;
}

int st_plan_sync(const st_plan_t *p, const char *dir, char *err, size_t errlen)
{
    for (int s = 0; s < p->n_shards; s++) {
        char *path = join(dir, p->s[s].name);
        int rc = path == NULL ? -1 : publish_fsync_path(path, err, errlen);
        if (path == NULL)
            seterr(err, errlen, "out of memory");
        free(path);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* {"metadata": {"total_size": N}, "weight_map": {name: shard}}, keys sorted
 * and indented as transformers' save_pretrained writes it. */
static char *index_json(const st_plan_t *p)
{
    json_t *wm = json_object();
    for (int i = 0; wm != NULL && i < p->n; i++)
        if (json_object_set_new(wm, p->t[i].name, json_string(p->s[p->t[i].shard].name)) != 0) {
            json_decref(wm);
            wm = NULL;
        }
    json_t *root = wm == NULL
                       ? NULL
                       : json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)p->total, "weight_map", wm);
    char *js = root == NULL ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    return js;
}

int st_plan_write_index(const st_plan_t *p, const char *dir, char *err, size_t errlen)
{
    if (p->n_shards <= 1)
        return 0;
    char *js = index_json(p), *path = join(dir, INDEX_NAME);
    int rc = js == NULL || path == NULL ? -1 : 0;
    if (rc != 0)
        seterr(err, errlen, "out of memory writing %s", INDEX_NAME);
    publish_t pub;
    if (rc == 0)
        rc = publish_open(&pub, path, 0644, err, errlen);
    if (rc == 0) {
        if (publish_write(&pub, js, strlen(js), err, errlen) != 0 || publish_write(&pub, "\n", 1, err, errlen) != 0) {
            publish_abort(&pub, err, errlen);
            rc = -1;
        } else {
            rc = publish_commit(&pub, err, errlen);
        }
    }
    free(js);
    free(path);
    return rc;
}
