/* io/h5store: write a set of 1-D and 2-D tensors at one layout, read them
 * at another, check every element; CRC-32C check values; failure cases.
 * Driven by test_h5store.sh, one mode per run:
 *
 *   crc                 CRC-32C check value, hardware == software
 *   write PATH SPLIT    write the tensor set split by SPLIT over the ranks
 *   read PATH SPLIT     read it back split by SPLIT, check every element,
 *                       the attributes, a cross-shard window, verify
 *   readverify PATH SPLIT all|nobig
 *                       h5store_read_verify at SPLIT (nobig: no rank reads
 *                       optim/m/big); elements checked; the error on stderr, exit 1
 *   verify PATH         open + h5store_verify; the error on stderr, exit 1
 *   open PATH           open only; the error on stderr, exit 1
 *   many PATH           one tensor in 2000 one-row shards (a 78 KiB checksum table)
 *   fail DIR            failed writes leave no file, same error on every rank
 *
 * SPLIT: rows | cols | uneven (rank r gets a share ~ r, rank 0 none) |
 * inter (2 blocks per rank, round robin) | mixed (rows / cols by tensor,
 * 1-D tensors all on the last rank, the others hold count-0 shards).
 * Element i (row-major) of tensor `name` is (float)(h(name) + i / 7.0). */
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/crc32c.h"
#include "io/h5store.h"
#include "mpi/launch.h"

#define NT 7
static const h5store_tensor_t TENSORS[NT] = {
    {"params/wte", 2, {37, 24}, {10, 24}},   {"params/h.0.attn.wq", 2, {24, 24}, {0, 0}},
    {"params/h.0.ln.b", 1, {24, 1}, {5, 0}}, {"params/lnf.g", 1, {13, 1}, {0, 0}},
    {"optim/m/big", 2, {301, 17}, {0, 0}}, /* contiguous: the corruption test flips a byte in it */
    {"scalar", 1, {1, 1}, {0, 0}},           {"optim/v/h.0.mlp.w", 2, {64, 7}, {16, 7}},
};

static const char *MODEL = "tiny-\xc3\xbc {\"n_layer\": 1, \"d\": 24}"; /* UTF-8 u-umlaut */
#define STEP INT64_C(1234567890123)
#define LR 3e-4

typedef struct ctx {
    int rank, size, fails;
} ctx_t;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
check(ctx_t *c, int ok, const char *fmt, ...)
{
    if (ok)
        return;
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("FAIL rank %d: %s\n", c->rank, line);
    c->fails++;
}

static unsigned name_hash(const char *s)
{
    unsigned h = 0;
    for (unsigned k = 0; s[k]; k++)
        h += (k + 1) * (unsigned char)s[k];
    return h % 997;
}

static float value(const char *name, int64_t i) { return (float)((double)name_hash(name) + (double)i / 7.0); }

/* [lo, hi) of block b when n is cut into nb nearly equal blocks */
static void block(int64_t n, int nb, int b, int64_t *lo, int64_t *hi)
{
    *lo = n * b / nb;
    *hi = n * (b + 1) / nb;
}

/* This rank's shards of tensor ti under `split`: up to 2; returns how many
 * (count-0 shards included). */
static int shards_of(const char *split, int ti, int rank, int size, h5store_shard_t *out)
{
    const h5store_tensor_t *t = &TENSORS[ti];
    int64_t n0 = t->shape[0], n1 = t->shape[1], lo, hi;
    int cols = t->ndim == 2 && (strcmp(split, "cols") == 0 || (strcmp(split, "mixed") == 0 && ti % 2 == 1));
    memset(out, 0, 2 * sizeof *out);
    out[0].tensor = out[1].tensor = ti;
    if (strcmp(split, "mixed") == 0 && t->ndim == 1) {
        /* "replicated": only the last rank writes, the others hold count 0 */
        out[0].count[0] = rank == size - 1 ? n0 : 0;
        out[0].count[1] = 1;
        return 1;
    }
    if (strcmp(split, "inter") == 0) {
        for (int k = 0; k < 2; k++) {
            block(n0, 2 * size, rank + k * size, &lo, &hi);
            out[k].start[0] = lo;
            out[k].count[0] = hi - lo;
            out[k].count[1] = n1;
        }
        return 2;
    }
    if (strcmp(split, "uneven") == 0) {
        /* rank r's share is proportional to r (rank 0 none, when size > 1) */
        int64_t tot = size > 1 ? (int64_t)size * (size - 1) / 2 : 1, before = (int64_t)rank * (rank - 1) / 2;
        int64_t mine = size > 1 ? rank : 1;
        lo = n0 * before / tot;
        hi = n0 * (before + mine) / tot;
    } else {
        block(cols ? n1 : n0, size, rank, &lo, &hi);
    }
    if (cols) {
        out[0].start[1] = lo;
        out[0].count[0] = n0;
        out[0].count[1] = hi - lo;
    } else {
        out[0].start[0] = lo;
        out[0].count[0] = hi - lo;
        out[0].count[1] = n1;
    }
    return 1;
}

/* All shards of this rank with buffers; fill = 1 writes the values in. */
static int make_shards(const char *split, int rank, int size, int fill, h5store_shard_t *s)
{
    int ns = 0;
    for (int t = 0; t < NT; t++)
        ns += shards_of(split, t, rank, size, s + ns);
    for (int i = 0; i < ns; i++) {
        const h5store_tensor_t *t = &TENSORS[s[i].tensor];
        size_t n = (size_t)(s[i].count[0] * s[i].count[1]);
        s[i].buf = malloc((n ? n : 1) * sizeof(float));
        if (!s[i].buf)
            return -1;
        for (int64_t r = 0; r < s[i].count[0]; r++)
            for (int64_t c = 0; c < s[i].count[1]; c++)
                s[i].buf[r * s[i].count[1] + c] =
                    fill ? value(t->name, (s[i].start[0] + r) * t->shape[1] + s[i].start[1] + c) : -1.0f;
    }
    return ns;
}

static void free_shards(h5store_shard_t *s, int n)
{
    for (int i = 0; i < n; i++)
        free(s[i].buf);
}

static void attrs_of(h5store_attr_t a[4], const char *split)
{
    a[0] = (h5store_attr_t){.key = "model", .type = H5STORE_STR, .s = MODEL};
    a[1] = (h5store_attr_t){.key = "step", .type = H5STORE_INT, .i = STEP};
    a[2] = (h5store_attr_t){.key = "lr", .type = H5STORE_DOUBLE, .d = LR};
    a[3] = (h5store_attr_t){.key = "layout", .type = H5STORE_STR, .s = split};
}

/* Elements equal bit for bit */
static int64_t count_bad(const h5store_shard_t *s)
{
    const h5store_tensor_t *t = &TENSORS[s->tensor];
    int64_t bad = 0;
    for (int64_t r = 0; r < s->count[0]; r++)
        for (int64_t c = 0; c < s->count[1]; c++) {
            float want = value(t->name, (s->start[0] + r) * t->shape[1] + s->start[1] + c);
            if (memcmp(&want, &s->buf[r * s->count[1] + c], sizeof want) != 0)
                bad++;
        }
    return bad;
}

static int mode_crc(ctx_t *c)
{
    crc32c_t sw, hw;
    crc32c_init(&sw, 0);
    crc32c_init(&hw, 1);
    uint32_t v = crc32c_update(&sw, 0, "123456789", 9);
    check(c, v == 0xE3069283u, "software crc32c(\"123456789\") = %08x, want e3069283", v);
    v = crc32c_update(&hw, 0, "123456789", 9);
    check(c, v == 0xE3069283u, "crc32c(\"123456789\") = %08x with hw=%d, want e3069283", v, hw.hw);
    v = crc32c_update(&sw, crc32c_update(&sw, 0, "1234", 4), "56789", 5);
    check(c, v == 0xE3069283u, "crc32c in two pieces = %08x", v);
    check(c, crc32c_update(&sw, 0, "", 0) == 0, "crc32c of nothing is not 0");
    /* 32 bytes of zeros: the iSCSI test vector (RFC 3720 B.4) */
    unsigned char z[32] = {0};
    v = crc32c_update(&sw, 0, z, 32);
    check(c, v == 0x8A9136AAu, "crc32c(32 zero bytes) = %08x, want 8a9136aa", v);
    enum { N = 1 << 20 };
    unsigned char *buf = malloc(N);
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
    /* lengths around the hardware path's 3-lane blocks too */
    const size_t L3 = 3 * (size_t)CRC32C_LANE;
    size_t lens[32];
    int nl = 0;
    for (size_t len = 0; len < 99990; len = len * 3 + 1)
        lens[nl++] = len;
    lens[nl++] = L3 - 1;
    lens[nl++] = L3;
    lens[nl++] = L3 + 1;
    lens[nl++] = 2 * L3 + 13;
    lens[nl++] = N - 9;
    int bad = 0, n = 0;
    for (int off = 0; off < 9; off++) {
        for (int k = 0; k < nl; k++) {
            const size_t len = lens[k];
            uint32_t a = crc32c_update(&sw, 0, buf + off, len);
            uint32_t b =
                crc32c_update(&hw, crc32c_update(&hw, 0, buf + off, len / 3), buf + off + len / 3, len - len / 3);
            uint32_t d = crc32c_update(&hw, 0, buf + off, len);
            bad += (a != b) + (a != d);
            n += 2;
        }
    }
    check(c, bad == 0, "%d of %d hardware/software crc32c differences", bad, n);
    free(buf);
    if (c->rank == 0)
        printf("crc32c: check values match, hardware path %s\n", hw.hw ? "on" : "off (no SSE4.2)");
    return 0;
}

static int mode_write(ctx_t *c, const char *path, const char *split)
{
    h5store_shard_t s[2 * NT];
    h5store_attr_t a[4];
    char err[512] = "";
    int ns = make_shards(split, c->rank, c->size, 1, s);
    attrs_of(a, split);
    double t0 = MPI_Wtime();
    int rc = h5store_write(path, MPI_COMM_WORLD, TENSORS, NT, s, ns, a, 4, err, sizeof err);
    double dt = MPI_Wtime() - t0;
    check(c, rc == 0, "write %s: %s", path, err);
    free_shards(s, ns);
    if (c->rank == 0 && rc == 0)
        printf("wrote %s at np %d split %s (%d shards on rank 0) in %.3f s\n", path, c->size, split, ns, dt);
    return 0;
}

static int mode_read(ctx_t *c, const char *path, const char *split)
{
    char err[512] = "", str[256] = "";
    h5store_t *h = h5store_open(path, MPI_COMM_WORLD, err, sizeof err);
    if (!h) {
        if (c->rank == 0)
            fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* catalog */
    const h5store_tensor_t *list;
    int n = h5store_list(h, &list);
    check(c, n == NT, "catalog has %d tensors, want %d", n, NT);
    for (int i = 0; i < NT; i++) {
        const h5store_tensor_t *t = h5store_find(h, TENSORS[i].name);
        check(c,
              t && t->ndim == TENSORS[i].ndim && t->shape[0] == TENSORS[i].shape[0] &&
                  t->shape[1] == TENSORS[i].shape[1] && t->chunk[0] == TENSORS[i].chunk[0],
              "catalog entry for %s wrong or missing", TENSORS[i].name);
    }
    for (int i = 1; i < n; i++)
        check(c, strcmp(list[i - 1].name, list[i].name) < 0, "catalog not sorted at %d", i);
    check(c, h5store_find(h, "params/nope") == NULL, "found a tensor that is not there");
    /* attributes */
    int64_t step = 0;
    double lr = 0, stepd = 0;
    check(c, h5store_get_int(h, "step", &step, err, sizeof err) == 0 && step == STEP, "step %lld: %s", (long long)step,
          err);
    check(c, h5store_get_double(h, "lr", &lr, err, sizeof err) == 0 && lr == LR, "lr %g: %s", lr, err);
    check(c, h5store_get_double(h, "step", &stepd, err, sizeof err) == 0 && stepd == (double)STEP,
          "step as double %g: %s", stepd, err);
    check(c, h5store_get_str(h, "model", str, sizeof str, err, sizeof err) == 0 && strcmp(str, MODEL) == 0,
          "model '%s': %s", str, err);
    check(c, h5store_get_str(h, "model", str, 8, err, sizeof err) == -1 && strstr(err, "longer than"),
          "short buffer: %s", err);
    check(c,
          h5store_get_int(h, "model", &step, err, sizeof err) == -1 && strstr(err, "is a string, expected an integer"),
          "string as int: %s", err);
    check(c, h5store_get_int(h, "nope", &step, err, sizeof err) == -1 && strstr(err, "no attribute nope"),
          "missing attribute: %s", err);
    check(c, h5store_has_attr(h, "layout") == 1 && h5store_has_attr(h, "nope") == 0, "has_attr");

    /* the tensors at this layout */
    h5store_shard_t s[2 * NT];
    int ns = make_shards(split, c->rank, c->size, 0, s);
    double t0 = MPI_Wtime();
    int rc = h5store_read_shards(h, TENSORS, NT, s, ns, err, sizeof err);
    double dt = MPI_Wtime() - t0;
    if (rc != 0) {
        if (c->rank == 0)
            fprintf(stderr, "%s\n", err);
        free_shards(s, ns);
        h5store_close(h, err, sizeof err);
        return 1;
    }
    int64_t bad = 0, checked = 0;
    for (int i = 0; i < ns; i++) {
        bad += count_bad(&s[i]);
        checked += s[i].count[0] * s[i].count[1];
    }
    check(c, bad == 0, "%lld of %lld elements differ", (long long)bad, (long long)checked);
    free_shards(s, ns);

    /* a window across shard boundaries, different on every rank */
    h5store_shard_t w = {.tensor = 4, .start = {3 + 7 * c->rank, 2}, .count = {50, 13}};
    w.buf = malloc(50 * 13 * sizeof(float));
    rc = h5store_read(h, "optim/m/big", w.start, w.count, w.buf, err, sizeof err);
    check(c, rc == 0 && count_bad(&w) == 0, "window read: rc %d %s", rc, err);
    int64_t oob[2] = {300, 0}, two[2] = {2, 17};
    check(c,
          h5store_read(h, "optim/m/big", oob, two, w.buf, err, sizeof err) == -1 &&
              strstr(err, "outside shape [301,17]"),
          "out-of-bounds read: %s", err);
    free(w.buf);

    /* a layout that does not match the file */
    h5store_tensor_t t2[NT];
    memcpy(t2, TENSORS, sizeof t2);
    t2[1].shape[1] = 25;
    rc = h5store_read_shards(h, t2, NT, NULL, 0, err, sizeof err);
    check(c, rc == -1 && strcmp(err, "tensor params/h.0.attn.wq: shape [24,24] in file, expected [24,25]") == 0,
          "shape mismatch: rc %d '%s'", rc, err);
    snprintf(t2[1].name, sizeof t2[1].name, "params/nope");
    rc = h5store_read_shards(h, t2, NT, NULL, 0, err, sizeof err);
    check(c, rc == -1 && strstr(err, "tensor params/nope: not in"), "missing tensor: rc %d '%s'", rc, err);

    int64_t nsh = 0, nb = 0, want = 0;
    for (int i = 0; i < NT; i++)
        want += TENSORS[i].shape[0] * TENSORS[i].shape[1] * 4;
    rc = h5store_verify(h, &nsh, &nb, err, sizeof err);
    check(c, rc == 0 && nb == want, "verify: rc %d, %lld of %lld bytes: %s", rc, (long long)nb, (long long)want, err);
    check(c, h5store_close(h, err, sizeof err) == 0, "close: %s", err);
    long long all[2] = {checked, bad};
    MPI_Allreduce(MPI_IN_PLACE, all, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (c->rank == 0)
        printf("read %s at np %d split %s: %lld elements, %lld differ, read_shards %.3f s; verify: %lld shards, "
               "%lld bytes\n",
               path, c->size, split, all[0], all[1], dt, (long long)nsh, (long long)nb);
    return 0;
}

/* h5store_read_verify at split: the elements read are right, and every
 * checksum in the file is checked, also with "nobig" (no rank reads
 * optim/m/big, so its records are left to the verification pass). */
static int mode_readverify(ctx_t *c, const char *path, const char *split, const char *which)
{
    char err[512] = "";
    h5store_t *h = h5store_open(path, MPI_COMM_WORLD, err, sizeof err);
    if (!h) {
        if (c->rank == 0)
            fprintf(stderr, "%s\n", err);
        return 1;
    }
    h5store_shard_t s[2 * NT];
    int ns = make_shards(split, c->rank, c->size, 0, s), n = 0;
    for (int i = 0; i < ns; i++) {
        if (strcmp(which, "nobig") == 0 && s[i].tensor == 4)
            free(s[i].buf);
        else
            s[n++] = s[i];
    }
    int rc = h5store_read_verify(h, TENSORS, NT, s, n, err, sizeof err);
    int64_t bad = 0, elems = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        bad += count_bad(&s[i]);
        elems += s[i].count[0] * s[i].count[1];
    }
    free_shards(s, n);
    if (h5store_close(h, rc ? NULL : err, rc ? 0 : sizeof err))
        rc = -1;
    if (rc != 0) {
        if (c->rank == 0)
            fprintf(stderr, "%s\n", err);
        return 1;
    }
    check(c, bad == 0, "%lld of %lld elements differ", (long long)bad, (long long)elems);
    long long all = elems;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (c->rank == 0)
        printf("read_verify %s at np %d split %s (%s): %lld elements read and right, every checksum checked\n", path,
               c->size, split, which, all);
    return 0;
}

static int mode_verify(ctx_t *c, const char *path, int verify)
{
    char err[512] = "";
    h5store_t *h = h5store_open(path, MPI_COMM_WORLD, err, sizeof err);
    int rc = h ? 0 : -1;
    int64_t ns = 0, nb = 0;
    if (h && verify)
        rc = h5store_verify(h, &ns, &nb, err, sizeof err);
    if (h && h5store_close(h, rc ? NULL : err, rc ? 0 : sizeof err))
        rc = -1;
    if (rc != 0) {
        if (c->rank == 0)
            fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (c->rank == 0)
        printf("%s: ok, %lld shards, %lld bytes verified\n", path, (long long)ns, (long long)nb);
    return 0;
}

/* 2000 one-row shards of one tensor, dealt round robin: 2000 checksum
 * records (78 KiB, over HDF5's 64 KiB compact attribute limit) and up to
 * 2000/np collective write rounds. */
static int mode_many(ctx_t *c, const char *path)
{
    enum { R = 2000, C = 3 };
    h5store_tensor_t t = {"many/rows", 2, {R, C}, {0, 0}};
    int ns = 0;
    h5store_shard_t *s = calloc(R, sizeof *s);
    float *buf = malloc(R * C * sizeof *buf);
    for (int r = 0; r < R; r++) {
        for (int k = 0; k < C; k++)
            buf[r * C + k] = value(t.name, (int64_t)r * C + k);
        if (r % c->size == c->rank)
            s[ns++] = (h5store_shard_t){.tensor = 0, .start = {r, 0}, .count = {1, C}, .buf = buf + r * C};
    }
    char err[512] = "";
    double t0 = MPI_Wtime();
    int rc = h5store_write(path, MPI_COMM_WORLD, &t, 1, s, ns, NULL, 0, err, sizeof err);
    double dt = MPI_Wtime() - t0;
    check(c, rc == 0, "write: %s", err);
    h5store_t *h = rc == 0 ? h5store_open(path, MPI_COMM_WORLD, err, sizeof err) : NULL;
    check(c, h != NULL, "open: %s", err);
    int64_t nsh = 0, nb = 0;
    if (h) {
        float *back = malloc(R * C * sizeof *back);
        int64_t st[2] = {0, 0}, ct[2] = {R, C};
        check(c, h5store_read(h, t.name, st, ct, back, err, sizeof err) == 0, "read: %s", err);
        check(c, memcmp(back, buf, R * C * sizeof *buf) == 0, "values differ");
        check(c, h5store_verify(h, &nsh, &nb, err, sizeof err) == 0 && nsh == R && nb == R * C * 4,
              "verify: %lld shards %lld bytes: %s", (long long)nsh, (long long)nb, err);
        check(c, h5store_close(h, err, sizeof err) == 0, "close: %s", err);
        free(back);
    }
    if (c->rank == 0)
        printf("many: %d one-row shards written in %.3f s, %lld verified\n", R, dt, (long long)nsh);
    free(s);
    free(buf);
    return 0;
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

/* Expect h5store_write to fail on every rank with the same message
 * containing `want`, leaving neither `path` nor its temp file. */
static void expect_fail(ctx_t *c, const char *what, const char *path, const char *tmp, const h5store_tensor_t *t,
                        int nt, const h5store_shard_t *s, int ns, const char *want, int keep)
{
    char err[512] = "", first[512];
    int rc = h5store_write(path, MPI_COMM_WORLD, t, nt, s, ns, NULL, 0, err, sizeof err);
    snprintf(first, sizeof first, "%s", err);
    MPI_Bcast(first, sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    check(c, rc == -1 && strstr(err, want) && strcmp(err, first) == 0,
          "%s: rc %d, '%s' (want '%s', the same on every rank)", what, rc, err, want);
    check(c, keep == exists(path), "%s: %s %s", what, path, keep ? "is gone" : "exists");
    check(c, !tmp || !exists(tmp), "%s: %s left behind", what, tmp);
    if (c->rank == 0)
        printf("%s: %s\n", what, err);
}

static int mode_fail(ctx_t *c, const char *dir)
{
    char path[512], tmp[512], bad[512], err[512] = "";
    h5store_shard_t s[2 * NT];
    int ns = make_shards("rows", c->rank, c->size, 1, s);
    snprintf(path, sizeof path, "%s/keep.h5", dir);
    snprintf(tmp, sizeof tmp, "%s/.keep.h5.tmp", dir);

    snprintf(bad, sizeof bad, "%s/no/such/dir/x.h5", dir);
    expect_fail(c, "missing directory", bad, NULL, TENSORS, NT, s, ns, "cannot create", 0);

    /* a good file first; the failures below must leave it as it was */
    h5store_attr_t a = {.key = "step", .type = H5STORE_INT, .i = 1};
    int rc = h5store_write(path, MPI_COMM_WORLD, TENSORS, NT, s, ns, &a, 1, err, sizeof err);
    check(c, rc == 0, "good write: %s", err);

    /* fails inside HDF5 after the temp file was made and written to:
     * "x" is a dataset, so there is no group "x" to hold "x/y" */
    h5store_tensor_t t2[NT + 2];
    memcpy(t2, TENSORS, sizeof TENSORS);
    t2[NT] = (h5store_tensor_t){"x", 1, {4, 1}, {0, 0}};
    t2[NT + 1] = (h5store_tensor_t){"x/y", 1, {4, 1}, {0, 0}};
    float four[4] = {1, 2, 3, 4};
    h5store_shard_t s2[2 * NT + 2];
    memcpy(s2, s, sizeof(h5store_shard_t) * (size_t)ns);
    int ns2 = ns;
    if (c->rank == 0) {
        s2[ns2++] = (h5store_shard_t){.tensor = NT, .start = {0, 0}, .count = {4, 1}, .buf = four};
        s2[ns2++] = (h5store_shard_t){.tensor = NT + 1, .start = {0, 0}, .count = {4, 1}, .buf = four};
    }
    expect_fail(c, "HDF5 error mid-write", path, tmp, t2, NT + 2, s2, ns2, "cannot create dataset x/y", 1);

    /* one rank's bad shard: caught before any file is touched */
    h5store_shard_t keep = s[0];
    if (c->rank == c->size - 1)
        s[0].count[0] += 1;
    char want[64];
    snprintf(want, sizeof want, "rank %d: shard 0 of tensor params/wte", c->size - 1);
    expect_fail(c, "shard out of bounds", path, tmp, TENSORS, NT, s, ns, want, 1);
    s[0] = keep;

    /* a missing shard: the tensor is not covered */
    expect_fail(c, "incomplete cover", path, tmp, TENSORS, NT, s + 1, ns - 1, "tensor params/wte: the shards cover", 1);

    if (c->size > 1) {
        /* two ranks write the same rows */
        h5store_shard_t s3[2 * NT];
        float *whole = calloc(37 * 24, sizeof *whole); /* all of params/wte */
        memcpy(s3, s, sizeof s3);
        s3[0].start[0] = 0;
        s3[0].count[0] = c->rank == 1 ? 37 : c->rank == 0 ? 5 : 0;
        s3[0].buf = whole;
        expect_fail(c, "overlap", path, tmp, TENSORS, NT, s3, ns, "overlap", 1);
        free(whole);

        /* a tensor list that differs between ranks */
        memcpy(t2, TENSORS, sizeof TENSORS);
        if (c->rank == c->size - 1)
            t2[2].chunk[0] = 6;
        expect_fail(c, "ranks disagree", path, tmp, t2, NT, s, ns, "differ between ranks", 1);
    }
    h5store_tensor_t dup[2] = {TENSORS[3], TENSORS[3]};
    expect_fail(c, "duplicate name", path, tmp, dup, 2, NULL, 0, "appears twice", 1);

    /* the good file is intact */
    h5store_t *h = h5store_open(path, MPI_COMM_WORLD, err, sizeof err);
    int64_t step = 0, nb = 0;
    check(c, h && h5store_get_int(h, "step", &step, err, sizeof err) == 0 && step == 1, "old file: %s", err);
    check(c, h && h5store_verify(h, NULL, &nb, err, sizeof err) == 0 && nb > 0, "old file verify: %s", err);
    if (h)
        h5store_close(h, err, sizeof err);
    free_shards(s, ns);
    return 0;
}

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    ctx_t c = {env.world_rank, env.world_size, 0};
    const char *mode = argc > 1 ? argv[1] : "";
    int status;
    if (strcmp(mode, "crc") == 0)
        status = mode_crc(&c);
    else if (strcmp(mode, "write") == 0 && argc == 4)
        status = mode_write(&c, argv[2], argv[3]);
    else if (strcmp(mode, "read") == 0 && argc == 4)
        status = mode_read(&c, argv[2], argv[3]);
    else if (strcmp(mode, "readverify") == 0 && argc == 5)
        status = mode_readverify(&c, argv[2], argv[3], argv[4]);
    else if (strcmp(mode, "verify") == 0 && argc == 3)
        status = mode_verify(&c, argv[2], 1);
    else if (strcmp(mode, "open") == 0 && argc == 3)
        status = mode_verify(&c, argv[2], 0);
    else if (strcmp(mode, "many") == 0 && argc == 3)
        status = mode_many(&c, argv[2]);
    else if (strcmp(mode, "fail") == 0 && argc == 3)
        status = mode_fail(&c, argv[2]);
    else {
        if (env.world_rank == 0)
            fprintf(stderr, "usage: test_h5store crc | write|read PATH SPLIT | readverify PATH SPLIT all|nobig | "
                            "verify|open|many PATH | fail DIR\n");
        status = 2;
    }
    int all = c.fails;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (env.world_rank == 0 && status != 2)
        printf("%s %s at np %d: %d failure(s)\n", all || status ? "FAIL" : "ok", mode, env.world_size, all);
    launch_exit(&env, status ? status : all ? 1 : 0);
    return 0;
}
