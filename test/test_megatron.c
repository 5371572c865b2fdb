/* Megatron-LM indexed datasets (io/megatron.c), driven by test_megatron.sh.
 *
 *   test_megatron write DIR   write random datasets of every dtype (a .bin
 *                             by hand, the .idx by megatron_idx_write) as
 *                             DIR/<dtype>{.bin,.idx,.jsonl}; the .jsonl holds
 *                             the documents' ids for the numpy reader to
 *                             match. Also checks, in process: the read-back
 *                             through megatron_idx_open, megatron_idx_parse
 *                             on memory, and the writer's errors.
 *   test_megatron check PATH  megatron_idx_open(PATH): print one summary line
 *                             and exit 0, or the error line and exit 1.
 *
 * Exit 0 pass, 1 fail. */
#include "io/megatron.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct ctx {
    const char *dir;
    uint64_t rng; /* xorshift64 state */
    int failures;
    int checks;
} ctx_t;

#define CHECK(c, cond, ...)                                                                                            \
    do {                                                                                                               \
        (c)->checks++;                                                                                                 \
        if (!(cond)) {                                                                                                 \
            (c)->failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

static uint64_t rnd(ctx_t *c)
{
    c->rng ^= c->rng << 13;
    c->rng ^= c->rng >> 7;
    c->rng ^= c->rng << 17;
    return c->rng;
}

static void die(const char *what, const char *path)
{
    fprintf(stderr, "test_megatron: %s '%s': %s\n", what, path, strerror(errno));
    exit(1);
}

/* A random token of the dtype, as int64 (floats hold integers, so the
 * JSON text compares exactly). */
static int64_t rand_token(ctx_t *c, const megatron_dtype_t *dt)
{
    uint64_t r = rnd(c);
    switch (dt->code) {
    case MEGATRON_UINT8: return (int64_t)(r % 256);
    case MEGATRON_INT8: return (int64_t)(r % 256) - 128;
    case MEGATRON_INT16: return (int64_t)(r % 65536) - 32768;
    case MEGATRON_UINT16: return (int64_t)(r % 65536);
    case MEGATRON_INT32: return (int64_t)(int32_t)(uint32_t)r;
    case MEGATRON_INT64: return (int64_t)r;
    case MEGATRON_FLOAT32: return (int64_t)(r % (1u << 24)) - (1 << 23);
    default: return (int64_t)(r % (1ull << 53)) - (1ll << 52); /* float64 */
    }
}

/* Store token v at p in the dtype's little-endian bytes. */
static void put_token(unsigned char *p, const megatron_dtype_t *dt, int64_t v)
{
    union {
        uint8_t u8;
        int8_t i8;
        int16_t i16;
        uint16_t u16;
        int32_t i32;
        int64_t i64;
        float f32;
        double f64;
    } u;
    switch (dt->code) {
    case MEGATRON_UINT8: u.u8 = (uint8_t)v; break;
    case MEGATRON_INT8: u.i8 = (int8_t)v; break;
    case MEGATRON_INT16: u.i16 = (int16_t)v; break;
    case MEGATRON_UINT16: u.u16 = (uint16_t)v; break;
    case MEGATRON_INT32: u.i32 = (int32_t)v; break;
    case MEGATRON_INT64: u.i64 = v; break;
    case MEGATRON_FLOAT32: u.f32 = (float)v; break;
    default: u.f64 = (double)v; break;
    }
    memcpy(p, &u, (size_t)dt->itemsize);
}

static int64_t get_token(const unsigned char *p, const megatron_dtype_t *dt)
{
    union {
        uint8_t u8;
        int8_t i8;
        int16_t i16;
        uint16_t u16;
        int32_t i32;
        int64_t i64;
        float f32;
        double f64;
    } u;
    memcpy(&u, p, (size_t)dt->itemsize);
    switch (dt->code) {
    case MEGATRON_UINT8: return u.u8;
    case MEGATRON_INT8: return u.i8;
    case MEGATRON_INT16: return u.i16;
    case MEGATRON_UINT16: return u.u16;
    case MEGATRON_INT32: return u.i32;
    case MEGATRON_INT64: return u.i64;
    case MEGATRON_FLOAT32: return (int64_t)u.f32;
    default: return (int64_t)u.f64;
    }
}

/* A random dataset in memory: sequence lengths, document boundaries and
 * the tokens (int64, in file order). */
typedef struct ds {
    int32_t *len;
    size_t n;
    int64_t *doc;
    size_t m;
    int64_t *tok;
    size_t n_tok;
} ds_t;

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        fprintf(stderr, "test_megatron: out of memory\n");
        exit(1);
    }
    return p;
}

/* n_docs documents; seqs_per_doc 1 gives doc = 0..N (dtrain's layout),
 * otherwise each document has 0..3 sequences (Megatron's sentence split,
 * empty documents included). Some sequences are empty. */
static ds_t make_ds(ctx_t *c, const megatron_dtype_t *dt, size_t n_docs, int one_per_doc)
{
    ds_t d;
    d.m = n_docs + 1;
    d.doc = xcalloc(d.m, sizeof *d.doc);
    d.len = xcalloc(n_docs * 4, sizeof *d.len);
    d.n = 0;
    for (size_t k = 0; k < n_docs; k++) {
        size_t seqs = one_per_doc ? 1 : (size_t)(rnd(c) % 4);
        for (size_t s = 0; s < seqs; s++)
            d.len[d.n++] = (rnd(c) % 8 == 0) ? 0 : (int32_t)(rnd(c) % 300);
        d.doc[k + 1] = (int64_t)d.n;
    }
    d.n_tok = 0;
    for (size_t i = 0; i < d.n; i++)
        d.n_tok += (size_t)d.len[i];
    d.tok = xcalloc(d.n_tok, sizeof *d.tok);
    for (size_t i = 0; i < d.n_tok; i++)
        d.tok[i] = rand_token(c, dt);
    return d;
}

static void free_ds(ds_t *d)
{
    free(d->len);
    free(d->doc);
    free(d->tok);
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0)
        die("cannot write", path);
}

/* The .bin by hand, the .idx through megatron_idx_write, and the
 * documents as JSON lines of ids. */
static int write_ds(ctx_t *c, const char *prefix, const megatron_dtype_t *dt, const ds_t *d, int implicit_docs)
{
    char path[512], err[512];
    size_t nb = d->n_tok * (size_t)dt->itemsize;
    unsigned char *bin = xcalloc(nb, 1);
    for (size_t i = 0; i < d->n_tok; i++)
        put_token(bin + i * (size_t)dt->itemsize, dt, d->tok[i]);
    snprintf(path, sizeof path, "%s.bin", prefix);
    write_file(path, bin, nb);
    free(bin);

    snprintf(path, sizeof path, "%s.idx", prefix);
    /* implicit_docs: one sequence per document, doc_idx left to the
     * writer (NULL) */
    int rc = megatron_idx_write(path, dt->code, d->len, d->n, implicit_docs ? NULL : d->doc, implicit_docs ? 0 : d->m,
                                err, sizeof err);
    CHECK(c, rc == 0, "megatron_idx_write %s: %s", path, err);

    snprintf(path, sizeof path, "%s.jsonl", prefix);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        die("cannot write", path);
    size_t t = 0;
    for (size_t k = 0; k + 1 < d->m; k++) {
        const char *sep = ""; /* python's json.dumps spacing: [1, 2] */
        fputc('[', f);
        for (int64_t s = d->doc[k]; s < d->doc[k + 1]; s++)
            for (int32_t j = 0; j < d->len[s]; j++, t++, sep = ", ")
                fprintf(f, "%s%" PRId64, sep, d->tok[t]);
        fputs("]\n", f);
    }
    if (fclose(f) != 0)
        die("cannot write", path);
    return rc;
}

/* Read the dataset back through megatron_idx_open: every field and every
 * token as written. */
static void check_read_back(ctx_t *c, const char *prefix, const megatron_dtype_t *dt, const ds_t *d)
{
    megatron_idx_t x;
    char err[512], path[512];
    int rc = megatron_idx_open(&x, prefix, err, sizeof err);
    CHECK(c, rc == 0, "megatron_idx_open %s: %s", prefix, err);
    if (rc != 0)
        return;
    CHECK(c, x.dtype == dt && x.n_seq == d->n && x.n_doc_idx == d->m && x.n_tokens == d->n_tok && x.modes == NULL,
          "%s: header fields differ from what was written", prefix);
    CHECK(c, megatron_idx_n_docs(&x) == d->m - 1, "%s: document count", prefix);
    int64_t pos = 0;
    for (size_t i = 0; i < d->n; i++) {
        CHECK(c, megatron_idx_length(&x, i) == d->len[i] && megatron_idx_pointer(&x, i) == pos,
              "%s: sequence %zu length/pointer", prefix, i);
        pos += (int64_t)d->len[i] * dt->itemsize;
    }
    for (size_t k = 0; k < d->m; k++)
        CHECK(c, megatron_idx_doc(&x, k) == d->doc[k], "%s: doc index %zu", prefix, k);
    /* the tokens through the validated pointers */
    snprintf(path, sizeof path, "%s.bin", prefix);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die("cannot read", path);
    unsigned char *bin = xcalloc(x.bin_bytes, 1);
    if (x.bin_bytes && fread(bin, 1, x.bin_bytes, f) != x.bin_bytes)
        die("cannot read", path);
    fclose(f);
    size_t bad = 0, t = 0;
    for (size_t i = 0; i < d->n; i++) {
        const unsigned char *s = bin + megatron_idx_pointer(&x, i);
        for (int32_t j = 0; j < d->len[i]; j++, t++)
            bad += get_token(s + (size_t)j * (size_t)dt->itemsize, dt) != d->tok[t];
    }
    CHECK(c, bad == 0, "%s: %zu tokens differ on read-back", prefix, bad);
    free(bin);
    megatron_idx_close(&x);
}

/* The writer refuses bad arrays before creating anything, and reports a
 * failed write (here: the file size limit, standing in for a full disk)
 * with one line and no file left behind. */
static void check_writer_errors(ctx_t *c)
{
    char path[512], tmp[600], err[512];
    int32_t len[3] = {2, 0, 5};
    int64_t doc_ok[4] = {0, 1, 2, 3}, doc_gap[3] = {0, 2, 1}, doc_short[3] = {0, 1, 2};
    snprintf(path, sizeof path, "%s/bad.idx", c->dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    struct st {
        const char *what;
        int code;
        const int32_t *len;
        const int64_t *doc;
        size_t m;
    } cases[] = {
        {"unknown dtype", 9, len, doc_ok, 4},
        {"decreasing doc index", MEGATRON_UINT16, len, doc_gap, 3},
        {"doc index not ending at N", MEGATRON_UINT16, len, doc_short, 3},
        {"no doc index", MEGATRON_UINT16, len, doc_ok, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        int rc = megatron_idx_write(path, cases[i].code, cases[i].len, 3, cases[i].doc, cases[i].m, err, sizeof err);
        CHECK(c, rc != 0 && err[0] && !strchr(err, '\n') && access(path, F_OK) != 0 && access(tmp, F_OK) != 0,
              "writer accepted %s or left a file (%s)", cases[i].what, err);
    }
    int32_t neg[3] = {2, -1, 5};
    int rc = megatron_idx_write(path, MEGATRON_UINT16, neg, 3, doc_ok, 4, err, sizeof err);
    CHECK(c, rc != 0 && access(path, F_OK) != 0, "writer accepted length -1");

    /* A 4096-byte file size limit: write(2) fails with EFBIG. */
    size_t n = 100000;
    int32_t *big = xcalloc(n, sizeof *big);
    int64_t *doc = xcalloc(n + 1, sizeof *doc);
    for (size_t i = 0; i <= n; i++)
        doc[i] = (int64_t)i;
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    err[0] = '\0';
    rc = megatron_idx_write(path, MEGATRON_UINT16, big, n, doc, n + 1, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECK(c, rc != 0 && strstr(err, "cannot write") && strstr(err, tmp) && !strchr(err, '\n'),
          "a write past the size limit gave '%s'", err);
    CHECK(c, access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "a failed write left %s or %s behind", path, tmp);
    free(big);
    free(doc);
}

/* megatron_idx_parse on memory: a good index, then each field broken. */
static void check_parse_memory(ctx_t *c)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/uint16.idx", c->dir);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die("cannot read", path);
    unsigned char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    megatron_idx_t x;
    uint64_t n;
    memcpy(&n, buf + 18, 8);
    /* the .bin size follows from the index itself */
    int64_t last_ptr;
    int32_t last_len;
    memcpy(&last_ptr, buf + 34 + 4 * n + 8 * (n - 1), 8);
    memcpy(&last_len, buf + 34 + 4 * (n - 1), 4);
    uint64_t bin = (uint64_t)last_ptr + 2 * (uint64_t)last_len;
    CHECK(c, megatron_idx_parse(buf, len, bin, &x, err, sizeof err) == 0, "parse of a good index: %s", err);
    CHECK(c, megatron_idx_parse(buf, len, bin + 2, &x, err, sizeof err) != 0, "parse accepted a .bin 2 bytes too long");
    CHECK(c, megatron_idx_parse(NULL, 0, 0, &x, err, sizeof err) != 0, "parse accepted nothing");
    for (size_t cut = 0; cut < len; cut += 1 + cut / 7)
        CHECK(c, megatron_idx_parse(buf, cut, bin, &x, err, sizeof err) != 0,
              "parse accepted the first %zu of %zu bytes", cut, len);
    unsigned char bad[sizeof buf];
    size_t offs[] = {0, 9, 17, 18, 26, 34, 34 + 4 * n, 34 + 12 * n};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        memcpy(bad, buf, len);
        bad[offs[i]] ^= 0x40;
        CHECK(c, megatron_idx_parse(bad, len, bin, &x, err, sizeof err) != 0, "parse accepted byte %zu flipped",
              offs[i]);
    }
}

static int do_write(ctx_t *c)
{
    char prefix[512];
    for (int code = 1; code <= 8; code++) {
        const megatron_dtype_t *dt = megatron_dtype(code);
        ds_t d = make_ds(c, dt, 40 + (size_t)code * 7, 1);
        snprintf(prefix, sizeof prefix, "%s/%s", c->dir, dt->name);
        if (write_ds(c, prefix, dt, &d, code % 2 == 0) == 0)
            check_read_back(c, prefix, dt, &d);
        free_ds(&d);
    }
    /* Megatron's general layout: several sequences per document. */
    const megatron_dtype_t *dt = megatron_dtype(MEGATRON_INT32);
    ds_t d = make_ds(c, dt, 60, 0);
    snprintf(prefix, sizeof prefix, "%s/multi", c->dir);
    if (write_ds(c, prefix, dt, &d, 0) == 0)
        check_read_back(c, prefix, dt, &d);
    free_ds(&d);

    CHECK(c, megatron_dtype(0) == NULL && megatron_dtype(9) == NULL, "unknown dtype codes have a table entry");
    CHECK(c,
          megatron_dtype_for_vocab(50257) == MEGATRON_UINT16 && megatron_dtype_for_vocab(65499) == MEGATRON_UINT16 &&
              megatron_dtype_for_vocab(65500) == MEGATRON_INT32 && megatron_dtype_for_vocab(128256) == MEGATRON_INT32,
          "megatron_dtype_for_vocab does not follow Megatron's < 65500");
    check_parse_memory(c);
    check_writer_errors(c);
    printf("test_megatron write: %d checks, %d failures\n", c->checks, c->failures);
    return c->failures == 0 ? 0 : 1;
}

static int do_check(const char *path)
{
    megatron_idx_t x;
    char err[1024];
    if (megatron_idx_open(&x, path, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("OK %s: %" PRIu64 " sequences, %" PRIu64 " documents, %" PRIu64 " tokens of %s%s\n", path, x.n_seq,
           megatron_idx_n_docs(&x), x.n_tokens, x.dtype->name, x.modes ? ", multimodal modes" : "");
    megatron_idx_close(&x);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "check") == 0)
        return do_check(argv[2]);
    if (argc == 3 && strcmp(argv[1], "write") == 0) {
        ctx_t c = {argv[2], 0x9e3779b97f4a7c15ull, 0, 0};
        return do_write(&c);
    }
    fprintf(stderr, "usage: test_megatron write DIR | check PATH\n");
    return 1;
}
