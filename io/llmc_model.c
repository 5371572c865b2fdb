/* llm.c's GPT-2 model file: layout from the header, validation, reading
 * slices as fp32, parallel writing. See llmc_model.h for the layout. No
 * MPI here: the fuzzer links this file with st_block.c and safetensors.c
 * (the block reads), errmsg.c, fsutil.c and publish.c. */
#define _GNU_SOURCE /* pwrite, ftruncate, strdup */
#include "io/llmc_model.h"

#include "base/bf16.h" /* dt_f32_to_bf16, dt_bf16_to_f32 */
#include "io/errmsg.h"
#include "io/fsutil.h"
#include "io/publish.h"
#include "io/st_block.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/llmc_model.c assumes a little-endian host: add byte swaps before porting"
#endif

/* Elements converted per pwrite. */
#define WRITE_CHUNK (1 << 16)

static const char *const names[LLMC_N_TENSORS] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
                                                  "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                                                  "fcprojw",  "fcprojb",  "lnfw", "lnfb"};

const char *llmc_tensor_name(llmc_tensor_t id) { return id >= 0 && id < LLMC_N_TENSORS ? names[id] : "?"; }

static const char *label(const llmc_model_t *m) { return m->path != NULL ? m->path : "<memory>"; }

/* ------------------------------------------------------------------ */
/* Layout                                                               */
/* ------------------------------------------------------------------ */

/* Shapes [layers][rows][cols] in file order, from (Vp, maxT, L, C). */
static void fill_shapes(llmc_model_t *m)
{
    int64_t Vp = m->padded_vocab, T = m->max_seq, L = m->n_layer, C = m->d_model;
    const int64_t s[LLMC_N_TENSORS][3] = {{1, Vp, C},    {1, T, C}, {L, 1, C}, {L, 1, C}, {L, 3 * C, C}, {L, 1, 3 * C},
                                          {L, C, C},     {L, 1, C}, {L, 1, C}, {L, 1, C}, {L, 4 * C, C}, {L, 1, 4 * C},
                                          {L, C, 4 * C}, {L, 1, C}, {1, 1, C}, {1, 1, C}};
    memcpy(m->shape, s, sizeof s);
}

int llmc_model_layout(llmc_model_t *m, char *err, size_t errlen)
{
    const char *l = label(m);
    if (m->version != LLMC_MODEL_VERSION_F32 && m->version != LLMC_MODEL_VERSION_BF16) {
        seterr(err, errlen, "'%s': version %d is not llm.c's fp32 (3) or bf16 (5) model file", l, m->version);
        return -1;
    }
    if (m->max_seq < 1 || m->vocab < 1 || m->padded_vocab < 1 || m->n_layer < 1 || m->n_head < 1 || m->d_model < 1) {
        seterr(err, errlen, "'%s': sizes maxT %d, V %d, Vp %d, L %d, NH %d, C %d must all be positive", l, m->max_seq,
               m->vocab, m->padded_vocab, m->n_layer, m->n_head, m->d_model);
        return -1;
    }
    if (m->d_model % m->n_head != 0) {
        seterr(err, errlen, "'%s': C %d is not a multiple of NH %d", l, m->d_model, m->n_head);
        return -1;
    }
    if (m->vocab > m->padded_vocab) {
        seterr(err, errlen, "'%s': V %d exceeds the padded Vp %d", l, m->vocab, m->padded_vocab);
        return -1;
    }
    m->itemsize = m->version == LLMC_MODEL_VERSION_F32 ? 4 : 2;
    fill_shapes(m);
    /* Each dimension < 2^31 * 4, so a product of three fits 2^99: check. */
    uint64_t off = LLMC_MODEL_HEADER_BYTES;
    for (int i = 0; i < LLMC_N_TENSORS; i++) {
        uint64_t n;
        m->offset[i] = off;
        if (__builtin_mul_overflow((uint64_t)m->shape[i][0], (uint64_t)m->shape[i][1], &n) ||
            __builtin_mul_overflow(n, (uint64_t)m->shape[i][2], &n) ||
            __builtin_mul_overflow(n, (uint64_t)m->itemsize, &n) || __builtin_add_overflow(off, n, &off) ||
            off > (uint64_t)INT64_MAX) {
            seterr(err, errlen, "'%s': tensor %s: size overflows 64 bits (corrupt header)", l, names[i]);
            return -1;
        }
    }
    m->file_size = off;
    return 0;
}

/* path: NULL, or the file's (owned by m) to name it in errors. */
static int parse_impl(const void *file_bytes, size_t len, char *path, llmc_model_t *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->path = path;
    const char *l = label(m);
    if (len < LLMC_MODEL_HEADER_BYTES) {
        seterr(err, errlen, "'%s': %zu bytes, shorter than llm.c's %d-byte header", l, len, LLMC_MODEL_HEADER_BYTES);
        return -1;
    }
    int32_t h[8];
    memcpy(h, file_bytes, sizeof h);
    if (h[0] != LLMC_MODEL_MAGIC) {
        seterr(err, errlen, "'%s': magic %d is not llm.c's model file's %d (a token shard or another file?)", l, h[0],
               LLMC_MODEL_MAGIC);
        return -1;
    }
    m->version = h[1], m->max_seq = h[2], m->vocab = h[3], m->n_layer = h[4];
    m->n_head = h[5], m->d_model = h[6], m->padded_vocab = h[7];
    if (llmc_model_layout(m, err, errlen) != 0)
        return -1;
    if (m->file_size != len) {
        seterr(err, errlen, "'%s': %zu bytes, but its header (V %d, Vp %d, maxT %d, L %d, C %d, %s) needs exactly %llu",
               l, len, m->vocab, m->padded_vocab, m->max_seq, m->n_layer, m->d_model,
               m->itemsize == 4 ? "fp32" : "bf16", (unsigned long long)m->file_size);
        return -1;
    }
    m->map = (void *)file_bytes;
    m->size = len;
    return 0;
}

int llmc_model_parse(const void *file_bytes, size_t len, llmc_model_t *m, char *err, size_t errlen)
{
    return parse_impl(file_bytes, len, NULL, m, err, errlen);
}

int llmc_model_open(llmc_model_t *m, const char *path, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    void *map;
    size_t size;
    int regular;
    const int rc = fs_map_file(path, "llm.c model", LLMC_MODEL_HEADER_BYTES, &map, &size, &regular, err, errlen);
    if (rc == -2)
        seterr(err, errlen, "'%s': not a regular file of at least %d bytes (not an llm.c model)", path,
               LLMC_MODEL_HEADER_BYTES);
    if (rc != 0)
        return -1;
    char *p = strdup(path);
    if (p == NULL) {
        seterr(err, errlen, "out of memory opening '%s'", path);
        munmap(map, size);
        return -1;
    }
    if (parse_impl(map, size, p, m, err, errlen) != 0) {
        munmap(map, size);
        free(m->path);
        memset(m, 0, sizeof *m);
        return -1;
    }
    m->mapped = 1;
    return 0;
}

void llmc_model_close(llmc_model_t *m)
{
    if (m == NULL)
        return;
    if (m->mapped && m->map != NULL)
        munmap(m->map, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ */
/* Reading and writing rows                                             */
/* ------------------------------------------------------------------ */

static int in_range(int64_t from, int64_t n, int64_t size)
{
    return from >= 0 && n >= 0 && from <= size && n <= size - from;
}

/* Byte offset of element [layer][r][c] of id, after checking the block
 * [layer][r0, r0+nr)[c0, c0+nc) is inside the tensor. */
static int block_offset(const llmc_model_t *m, const char *l, llmc_tensor_t id, int layer, int64_t r0, int64_t nr,
                        int64_t c0, int64_t nc, uint64_t *off, char *err, size_t errlen)
{
    if (id < 0 || id >= LLMC_N_TENSORS) {
        seterr(err, errlen, "'%s': tensor id %d is not an llm.c tensor", l, (int)id);
        return -1;
    }
    const int64_t *s = m->shape[id];
    if (layer < 0 || layer >= s[0] || !in_range(r0, nr, s[1]) || !in_range(c0, nc, s[2])) {
        seterr(err, errlen,
               "'%s': tensor %s: layer %d rows [%lld, +%lld) cols [%lld, +%lld) outside its [%lld][%lld][%lld]", l,
               names[id], layer, (long long)r0, (long long)nr, (long long)c0, (long long)nc, (long long)s[0],
               (long long)s[1], (long long)s[2]);
        return -1;
    }
    *off = m->offset[id] +
           (((uint64_t)layer * (uint64_t)s[1] + (uint64_t)r0) * (uint64_t)s[2] + (uint64_t)c0) * m->itemsize;
    return 0;
}

int llmc_model_read_f32(const llmc_model_t *m, llmc_tensor_t id, int layer, int64_t r0, int64_t nr, int64_t c0,
                        int64_t nc, float *dst, char *err, size_t errlen)
{
    uint64_t off;
    if (block_offset(m, label(m), id, layer, r0, nr, c0, nc, &off, err, errlen) != 0)
        return -1;
    if (m->map == NULL || m->file_size > m->size) {
        seterr(err, errlen, "'%s': not mapped", label(m));
        return -1;
    }
    /* a file is read with pread, as safetensors are: through the mapping,
     * every page faulted in held gpt2-124m's import to 60-70 % of dd's
     * read (0.16-0.19 s, now 0.05 s with two loader threads) */
    const st_dtype_t d = m->itemsize == 4 ? ST_F32 : ST_BF16;
    const uint64_t rows = (uint64_t)m->shape[id][1], cols = (uint64_t)m->shape[id][2];
    const uint64_t at = m->offset[id] + (uint64_t)layer * rows * cols * m->itemsize; /* the layer's [rows][cols] */
    if (m->mapped && m->path != NULL &&
        st_pread_block(m->path, m->size, at, d, (int64_t)cols, r0, nr, c0, nc, 0, dst) == 0)
        return 0;
    const unsigned char *base = (const unsigned char *)m->map + off;
    size_t row = (size_t)m->shape[id][2] * m->itemsize;
    for (int64_t i = 0; i < nr; i++) {
        const unsigned char *p = base + (size_t)i * row;
        if (m->itemsize == 4) {
            memcpy(dst + i * nc, p, (size_t)nc * 4);
            continue;
        }
        for (int64_t j = 0; j < nc; j++) {
            uint16_t h;
            memcpy(&h, p + 2 * j, 2);
            dst[i * nc + j] = dt_bf16_to_f32(h);
        }
    }
    return 0;
}

int llmc_model_create(const char *path, const llmc_model_t *shape_fields, char *err, size_t errlen)
{
    llmc_model_t m = *shape_fields;
    m.path = (char *)path, m.map = NULL, m.mapped = 0;
    if (llmc_model_layout(&m, err, errlen) != 0)
        return -1;
    int32_t h[LLMC_MODEL_HEADER_INTS] = {LLMC_MODEL_MAGIC, m.version, m.max_seq, m.vocab,
                                         m.n_layer,        m.n_head,  m.d_model, m.padded_vocab};
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        seterr(err, errlen, "cannot create '%s': %s", path, strerror(errno));
        return -1;
    }
    int rc = pwrite_full(fd, h, sizeof h, 0, path, err, errlen);
    if (rc == 0 && ftruncate(fd, (off_t)m.file_size) != 0) {
        seterr(err, errlen, "cannot size '%s' to %llu bytes: %s", path, (unsigned long long)m.file_size,
               strerror(errno));
        rc = -1;
    }
    if (close(fd) != 0 && rc == 0) {
        seterr(err, errlen, "cannot close '%s': %s", path, strerror(errno));
        rc = -1;
    }
    return rc;
}

int llmc_model_write_f32(const char *path, const llmc_model_t *layout, llmc_tensor_t id, int layer, int64_t r0,
                         int64_t nr, const float *rows, char *err, size_t errlen)
{
    uint64_t off;
    int64_t cols = id >= 0 && id < LLMC_N_TENSORS ? layout->shape[id][2] : 0;
    if (block_offset(layout, path, id, layer, r0, nr, 0, cols, &off, err, errlen) != 0)
        return -1;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    unsigned char *buf = malloc(WRITE_CHUNK * 4);
    int rc = fd < 0 || buf == NULL ? -1 : 0;
    if (rc != 0)
        seterr(err, errlen, "cannot open '%s' for writing (llmc_model_create first?): %s", path, strerror(errno));
    size_t n = (size_t)nr * (size_t)cols, isz = layout->itemsize;
    for (size_t done = 0; done < n && rc == 0;) {
        size_t k = n - done < WRITE_CHUNK ? n - done : WRITE_CHUNK;
        if (isz == 4)
            memcpy(buf, rows + done, k * 4);
        else
            for (size_t j = 0; j < k; j++) {
                uint16_t h = dt_f32_to_bf16(rows[done + j]);
                memcpy(buf + 2 * j, &h, 2);
            }
        rc = pwrite_full(fd, buf, k * isz, off + done * isz, path, err, errlen);
        done += k;
    }
    if (fd >= 0 && close(fd) != 0 && rc == 0) {
        seterr(err, errlen, "cannot close '%s': %s", path, strerror(errno));
        rc = -1;
    }
    free(buf);
    return rc;
}

int llmc_model_sync(const char *path, char *err, size_t errlen) { return publish_fsync_path(path, err, errlen); }

int llmc_model_commit(const char *tmp, const char *path, char *err, size_t errlen)
{
    return publish_rename(tmp, path, err, errlen);
}
