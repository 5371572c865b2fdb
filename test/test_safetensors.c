/* safetensors and llm.c model files (io/safetensors.c, io/llmc_model.c),
 * driven by test_safetensors.sh against the independent Python reader and
 * writer in test/st_ref.py.
 *
 *   test_safetensors unit DIR             in-process checks (fp16/bf16
 *                                         rounding, parse on memory, plan
 *                                         and argument errors)
 *   test_safetensors write OUT SRC MAX    SRC/manifest.json lists tensors
 *                                         [{"name","dtype","shape"}] whose
 *                                         fp32 values are SRC/<i>.f32;
 *                                         write them to the directory OUT
 *                                         with shards of at most MAX bytes,
 *                                         a few rows per call, last rows
 *                                         first
 *   test_safetensors read MODEL REQ OUT   for each line "name r0 nr c0 nc
 *                                         transpose" of REQ, append the
 *                                         block as fp32 to OUT
 *   test_safetensors check MODEL          st_model_open: a summary line,
 *                                         or the error line and exit 1
 *   test_safetensors llmc-write OUT SRC   SRC/llmc.json {version, maxT, V,
 *                                         Vp, L, NH, C}, SRC/<name>.f32 each
 *                                         whole tensor: write OUT (via
 *                                         OUT.tmp, layer by layer)
 *   test_safetensors llmc-read FILE REQ OUT  lines "id layer r0 nr c0 nc"
 *   test_safetensors llmc-check FILE      as check, for llm.c files
 *
 * Exit 0 pass, 1 fail. */
#include "base/ops_math.h"
#include "io/llmc_model.h"
#include "io/safetensors.h"
#include "io/st_block.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int failures, checks;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        checks++;                                                                                                      \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "test_safetensors: %s: %s\n", what, detail);
    exit(1);
}

static float f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Whole file into memory (NULL on error). */
static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n + 1);
    if (b != NULL && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* ------------------------------------------------------------------ */
/* unit                                                                 */
/* ------------------------------------------------------------------ */

static void unit_f16(void)
{
    /* Every half survives half -> float -> half (NaNs stay NaN). */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = st_f16_to_f32((uint16_t)h);
        uint16_t back = st_f32_to_f16(x);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        bad += nan ? !(isnan(x) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0) : back != h;
    }
    CHECK(bad == 0, "%d halves do not round trip", bad);
    /* Ties go to even; the largest half and overflow; subnormals. */
    CHECK(st_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "1+2^-11 (tie) must round to 1.0");
    CHECK(st_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "1+3*2^-11 (tie) must round up to even");
    CHECK(st_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01, "just above a tie rounds up");
    CHECK(st_f32_to_f16(65504.0f) == 0x7bff && st_f32_to_f16(65519.0f) == 0x7bff, "65519 -> 65504");
    CHECK(st_f32_to_f16(65520.0f) == 0x7c00 && st_f32_to_f16(-1e9f) == 0xfc00, "65520 and beyond -> inf");
    CHECK(st_f32_to_f16(0x1p-25f) == 0 && st_f32_to_f16(-0x1p-25f) == 0x8000, "2^-25 (tie) -> 0");
    CHECK(st_f32_to_f16(3 * 0x1p-25f) == 2, "3*2^-25 (tie) -> 2*2^-24");
    CHECK(st_f32_to_f16(0x1p-25f * 1.0001f) == 1, "just above 2^-25 -> 2^-24");
    CHECK(st_f32_to_f16(0x1p-14f - 0x1p-26f) == 0x0400, "the largest subnormal rounds up to the smallest normal");
    CHECK(st_f32_to_f16(f32(0x7f800001u)) != 0x7c00, "a signalling NaN must not become inf");
    /* bf16 (base/ops_math.h): ties to even, as the writer relies on. */
    CHECK(dt_f32_to_bf16(f32(0x3f808000u)) == 0x3f80 && dt_f32_to_bf16(f32(0x3f818000u)) == 0x3f82,
          "bf16 ties to even");
}

/* A file built in memory: one F32 [3,4] and one BF16 [5] tensor. */
static unsigned char *mem_file(size_t *len)
{
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[5],"
                    "\"data_offsets\":[48,58]},\"a\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}}";
    size_t n = (strlen(h) + 7) / 8 * 8;
    *len = 8 + n + 58;
    unsigned char *b = calloc(1, *len);
    uint64_t n64 = n;
    memcpy(b, &n64, 8);
    memset(b + 8, ' ', n);
    memcpy(b + 8, h, strlen(h));
    for (int i = 0; i < 12; i++) {
        float x = (float)i;
        memcpy(b + 8 + n + 4 * i, &x, 4);
    }
    for (int i = 0; i < 5; i++) {
        uint16_t v = dt_f32_to_bf16((float)(10 + i));
        memcpy(b + 8 + n + 48 + 2 * i, &v, 2);
    }
    return b;
}

static void unit_parse(void)
{
    char err[512];
    size_t len;
    unsigned char *b = mem_file(&len);
    st_file_t f;
    CHECK(st_parse_header(b, len, &f, err, sizeof err) == 0, "parse on memory: %s", err);
    CHECK(f.n == 2 && strcmp(f.t[0].name, "a") == 0, "tensors in offset order");
    CHECK(f.metadata_json != NULL && strstr(f.metadata_json, "\"pt\"") != NULL, "metadata kept");
    const st_tensor_t *a = st_find(&f, "a"), *bt = st_find(&f, "b");
    CHECK(a != NULL && bt != NULL && st_find(&f, "c") == NULL, "st_find");
    float d[12];
    /* rows 1..2, cols 1..3 of [3,4]: 5 6 7 / 9 10 11 */
    CHECK(st_read_f32(&f, a, 1, 2, 1, 3, 0, d, err, sizeof err) == 0 && d[0] == 5 && d[5] == 11, "block");
    /* transpose [4,3]: rows 2..3, cols 0..1: T[2][0]=2 T[2][1]=6 T[3][0]=3 T[3][1]=7 */
    CHECK(st_read_f32(&f, a, 2, 2, 0, 2, 1, d, err, sizeof err) == 0 && d[0] == 2 && d[1] == 6 && d[2] == 3 &&
              d[3] == 7,
          "transposed block: %g %g %g %g", d[0], d[1], d[2], d[3]);
    CHECK(st_read_f32(&f, bt, 0, 1, 1, 3, 0, d, err, sizeof err) == 0 && d[0] == 11 && d[2] == 13, "1-D bf16");
    CHECK(st_read_f32(&f, bt, 1, 3, 0, 1, 1, d, err, sizeof err) == 0 && d[0] == 11 && d[2] == 13, "1-D transposed");
    CHECK(st_read_f32(&f, a, 2, 2, 0, 1, 0, d, err, sizeof err) != 0 && strchr(err, '\n') == NULL &&
              strstr(err, "'a'") != NULL,
          "rows past the end refused: %s", err);
    CHECK(st_read_f32(&f, a, 0, 1, -1, 1, 0, d, err, sizeof err) != 0, "negative col refused");
    CHECK(st_read_f32(&f, a, 0, 1, 3, INT64_MAX, 0, d, err, sizeof err) != 0, "overflowing count refused");
    st_close(&f);
    /* every truncation of the file is refused, never read past */
    int acc = 0;
    for (size_t l = 0; l < len; l++) {
        unsigned char *c = malloc(l + 1);
        memcpy(c, b, l);
        acc += st_parse_header(c, l, &f, err, sizeof err) == 0;
        free(c);
    }
    CHECK(acc == 0, "%d truncations accepted", acc);
    free(b);
}

static void unit_plan(const char *dir)
{
    char err[512];
    st_plan_t *p;
    st_out_tensor_t t[3] = {{"x", ST_F32, 2, {2, 3}}, {"y", ST_BF16, 1, {5, 0}}, {"x", ST_F32, 1, {1, 0}}};
    CHECK(st_plan_make(t, 3, 0, NULL, &p, err, sizeof err) != 0 && strstr(err, "'x' is named twice"), "dup: %s", err);
    t[2].name = "__metadata__";
    CHECK(st_plan_make(t, 3, 0, NULL, &p, err, sizeof err) != 0 && strstr(err, "reserved"), "reserved: %s", err);
    t[2] = (st_out_tensor_t){"z", ST_I32, 1, {1, 0}};
    CHECK(st_plan_make(t, 3, 0, NULL, &p, err, sizeof err) != 0 && strstr(err, "cannot be written"), "I32: %s", err);
    t[2] = (st_out_tensor_t){"z", ST_F16, 3, {1, 0}};
    CHECK(st_plan_make(t, 3, 0, NULL, &p, err, sizeof err) != 0 && strstr(err, "dimensions"), "3-D: %s", err);
    t[2] = (st_out_tensor_t){"z", ST_F16, 2, {INT64_MAX, INT64_MAX}};
    CHECK(st_plan_make(t, 3, 0, NULL, &p, err, sizeof err) != 0 && strstr(err, "overflows"), "overflow: %s", err);
    t[2] = (st_out_tensor_t){"z", ST_F16, 1, {7, 0}};
    CHECK(st_plan_make(t, 3, 0, "[1]", &p, err, sizeof err) != 0 && strstr(err, "metadata"), "meta: %s", err);
    CHECK(st_plan_make(t, 3, 0, "{\"a\":1}", &p, err, sizeof err) != 0 && strstr(err, "metadata"), "meta: %s", err);
    /* shards of 16 bytes: x (24 B) alone, y (10) alone since 10 + 14 > 16, z (14) */
    CHECK(st_plan_make(t, 3, 16, "{\"format\":\"pt\",\"k\":\"v\"}", &p, err, sizeof err) == 0, "plan: %s", err);
    if (p == NULL || st_plan_n_shards(p) != 3) {
        CHECK(0, "16-byte shards: %d of them, not 3", p != NULL ? st_plan_n_shards(p) : 0);
        st_plan_free(p);
        return;
    }
    CHECK(st_plan_n_shards(p) == 3 && st_plan_tensor_shard(p, 2) == 2 && st_plan_total_size(p) == 48,
          "greedy shards: %d", st_plan_n_shards(p));
    CHECK(strcmp(st_plan_shard_name(p, 1), "model-00002-of-00003.safetensors") == 0, "shard name");
    CHECK((st_plan_tensor_offset(p, 0) - 8) % 8 == 0, "data region aligned to 8");
    float r[6] = {1, 2, 3, 4, 5, 6};
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir", dir);
    CHECK(st_plan_create_files(p, bad, err, sizeof err) != 0 && strstr(err, "no/such"), "create: %s", err);
    CHECK(st_plan_write_f32(p, bad, 0, 0, 1, r, err, sizeof err) != 0 && strstr(err, "create_files first"),
          "write before create: %s", err);
    CHECK(st_plan_write_f32(p, dir, 0, 1, 2, r, err, sizeof err) != 0 && strstr(err, "outside"), "rows: %s", err);
    CHECK(st_plan_write_f32(p, dir, 1, 1, 1, r, err, sizeof err) != 0 && strstr(err, "outside"), "1-D: %s", err);
    CHECK(st_plan_write_f32(p, dir, 3, 0, 1, r, err, sizeof err) != 0, "tensor index");
    st_plan_free(p);
    /* one shard: model.safetensors, no index */
    CHECK(st_plan_make(t, 3, 0, NULL, &p, err, sizeof err) == 0 && st_plan_n_shards(p) == 1 &&
              strcmp(st_plan_shard_name(p, 0), "model.safetensors") == 0,
          "single file");
    st_plan_free(p);
}

static void unit_llmc(void)
{
    char err[512];
    llmc_model_t m = {
        .version = 3, .max_seq = 8, .vocab = 10, .padded_vocab = 16, .n_layer = 2, .n_head = 2, .d_model = 4};
    CHECK(llmc_model_layout(&m, err, sizeof err) == 0, "layout: %s", err);
    /* 16*4 + 8*4 + 2*(4+4+48+12+16+4+4+4+64+16+64+4) + 4 + 4 */
    CHECK(m.file_size == 1024 + 4 * (64 + 32 + 2 * 244 + 8), "file size %llu", (unsigned long long)m.file_size);
    CHECK(m.offset[LLMC_QKVW] == 1024 + 4 * (64 + 32 + 16), "qkvw offset");
    llmc_model_t b = m;
    b.d_model = 5;
    CHECK(llmc_model_layout(&b, err, sizeof err) != 0 && strstr(err, "multiple of NH"), "C %% NH: %s", err);
    b = m, b.vocab = 17;
    CHECK(llmc_model_layout(&b, err, sizeof err) != 0, "V > Vp");
    b = m, b.version = 4;
    CHECK(llmc_model_layout(&b, err, sizeof err) != 0 && strstr(err, "version 4"), "version: %s", err);
    b = m, b.n_layer = INT32_MAX, b.d_model = INT32_MAX - 1, b.n_head = 1;
    CHECK(llmc_model_layout(&b, err, sizeof err) != 0 && strstr(err, "overflows"), "overflow: %s", err);
    float d[4];
    CHECK(llmc_model_read_f32(&m, LLMC_LN1W, 2, 0, 1, 0, 4, d, err, sizeof err) != 0 && strstr(err, "ln1w"),
          "layer past L: %s", err);
    CHECK(llmc_model_read_f32(&m, LLMC_N_TENSORS, 0, 0, 1, 0, 4, d, err, sizeof err) != 0, "bad id");
}

/* st_transpose_f32_stream against the plain double loop, bit for bit (NaN
 * payloads included), over every alignment of dst within a 64-byte line,
 * row strides that are and are not multiples of 8 floats, and shapes that
 * leave a lead, a body of 16-column stripes, a tail and n % 8 rows; the
 * floats around each destination block must be untouched. */
static void unit_transpose_stream(void)
{
    enum { M = 53, N = 21, PAD = 16 };
    static float src[M * N], dst[PAD + 64 * (N + 1) + PAD];
    for (int i = 0; i < M * N; i++)
        src[i] = f32(0x7f800001u + (uint32_t)i * 2654435761u % 0x7fffffu); /* NaNs with payloads, and others */
    const int64_t shapes[][2] = {{0, 5}, {1, 1}, {7, 3}, {16, 8}, {17, 9}, {32, 16}, {40, 21}, {53, 21}, {53, 7}};
    const int64_t ldds[] = {56, 60, 64};
    int bad = 0, cases = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (size_t l = 0; l < sizeof ldds / sizeof ldds[0]; l++)
            for (int off = 0; off < 16; off++) {
                const int64_t m = shapes[sh][0], n = shapes[sh][1], ldd = ldds[l];
                for (size_t k = 0; k < sizeof dst / sizeof dst[0]; k++)
                    dst[k] = f32(0xdeadbeefu);
                float *d = dst + PAD + off;
                st_transpose_f32_stream(src, m, n, N, d, ldd);
                for (int64_t k = 0; k < (int64_t)(sizeof dst / sizeof dst[0]); k++) {
                    const int64_t at = k - PAD - off, j = at >= 0 ? at / ldd : -1, i = at >= 0 ? at % ldd : -1;
                    const int inside = j >= 0 && j < n && i < m;
                    const uint32_t want = inside ? dt_f32_bits(src[i * N + j]) : 0xdeadbeefu;
                    bad += dt_f32_bits(dst[k]) != want;
                }
                cases++;
            }
    CHECK(bad == 0, "streamed transpose: %d floats differ over %d cases", bad, cases);
}

static int cmd_unit(const char *dir)
{
    unit_f16();
    unit_transpose_stream();
    unit_parse();
    unit_plan(dir);
    unit_llmc();
    printf("unit: %d checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------ */
/* write / read / check                                                 */
/* ------------------------------------------------------------------ */

static st_dtype_t dtype_of(const char *s)
{
    return strcmp(s, "BF16") == 0 ? ST_BF16 : strcmp(s, "F16") == 0 ? ST_F16 : ST_F32;
}

static float *read_f32_file(const char *path, size_t n)
{
    size_t len;
    float *v = slurp(path, &len);
    if (v == NULL || len != n * 4)
        die("cannot read (or wrong size)", path);
    return v;
}

static int cmd_write(const char *out, const char *src, unsigned long long max)
{
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s/manifest.json", src);
    json_error_t je;
    json_t *man = json_load_file(path, 0, &je);
    if (!json_is_array(man))
        die("bad manifest", path);
    int n = (int)json_array_size(man);
    st_out_tensor_t *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(man, (size_t)i), *sh = json_object_get(e, "shape");
        t[i].name = json_string_value(json_object_get(e, "name"));
        t[i].dtype = dtype_of(json_string_value(json_object_get(e, "dtype")));
        t[i].ndim = (int)json_array_size(sh);
        for (int d = 0; d < t[i].ndim; d++)
            t[i].shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
    }
    st_plan_t *p;
    if (st_plan_make(t, n, max, NULL, &p, err, sizeof err) != 0 || st_plan_create_files(p, out, err, sizeof err) != 0)
        die("plan", err);
    for (int i = n - 1; i >= 0; i--) { /* any order: last tensor, last rows first */
        int64_t rows = t[i].ndim == 2 ? t[i].shape[0] : 1, cols = t[i].ndim == 2 ? t[i].shape[1] : t[i].shape[0];
        snprintf(path, sizeof path, "%s/%d.f32", src, i);
        float *v = read_f32_file(path, (size_t)(rows * cols));
        for (int64_t r1 = rows; r1 > 0; r1 -= 3) {
            int64_t r0 = r1 >= 3 ? r1 - 3 : 0;
            if (st_plan_write_f32(p, out, i, r0, r1 - r0, v + r0 * cols, err, sizeof err) != 0)
                die("write", err);
        }
        free(v);
    }
    if (st_plan_sync(p, out, err, sizeof err) != 0 || st_plan_write_index(p, out, err, sizeof err) != 0)
        die("finish", err);
    printf("wrote %d tensors in %d shard(s), %llu bytes\n", n, st_plan_n_shards(p),
           (unsigned long long)st_plan_total_size(p));
    st_plan_free(p);
    free(t);
    json_decref(man);
    return 0;
}

static int cmd_read(const char *model, const char *req, const char *out)
{
    char err[1024], name[512];
    st_model_t m;
    if (st_model_open(&m, model, err, sizeof err) != 0)
        die("open", err);
    FILE *in = fopen(req, "r"), *o = fopen(out, "wb");
    if (in == NULL || o == NULL)
        die("cannot open", req);
    long long r0, nr, c0, nc;
    int tr, n = 0;
    while (fscanf(in, "%511s %lld %lld %lld %lld %d", name, &r0, &nr, &c0, &nc, &tr) == 6) {
        const st_file_t *f;
        const st_tensor_t *t;
        if (st_model_find(&m, name, &f, &t) != 0)
            die("no tensor", name);
        float *d = malloc((size_t)(nr * nc + 1) * sizeof *d);
        if (st_read_f32(f, t, r0, nr, c0, nc, tr, d, err, sizeof err) != 0)
            die("read", err);
        fwrite(d, sizeof *d, (size_t)(nr * nc), o);
        free(d);
        n++;
    }
    fclose(in);
    fclose(o);
    printf("read %d blocks from %d file(s)\n", n, m.n_files);
    st_model_close(&m);
    return 0;
}

static int cmd_check(const char *model)
{
    char err[1024];
    st_model_t m;
    if (st_model_open(&m, model, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int n = 0;
    for (int i = 0; i < m.n_files; i++)
        n += m.files[i].n;
    printf("%d file(s), %d tensors, first %s %s\n", m.n_files, n, m.files[0].n > 0 ? m.files[0].t[0].name : "-",
           m.files[0].n > 0 ? m.files[0].t[0].dtype_name : "-");
    st_model_close(&m);
    return 0;
}

/* ------------------------------------------------------------------ */
/* llm.c                                                                */
/* ------------------------------------------------------------------ */

static int cmd_llmc_write(const char *out, const char *src)
{
    char path[4096], tmp[4096], err[1024];
    snprintf(path, sizeof path, "%s/llmc.json", src);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (c == NULL)
        die("bad llmc.json", path);
#define GETI(k) (int)json_integer_value(json_object_get(c, k))
    llmc_model_t m = {.version = GETI("version"),
                      .max_seq = GETI("maxT"),
                      .vocab = GETI("V"),
                      .padded_vocab = GETI("Vp"),
                      .n_layer = GETI("L"),
                      .n_head = GETI("NH"),
                      .d_model = GETI("C")};
    json_decref(c);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    if (llmc_model_layout(&m, err, sizeof err) != 0 || llmc_model_create(tmp, &m, err, sizeof err) != 0)
        die("create", err);
    for (int id = LLMC_N_TENSORS - 1; id >= 0; id--) {
        const int64_t *s = m.shape[id];
        snprintf(path, sizeof path, "%s/%s.f32", src, llmc_tensor_name((llmc_tensor_t)id));
        float *v = read_f32_file(path, (size_t)(s[0] * s[1] * s[2]));
        for (int l = (int)s[0] - 1; l >= 0; l--) /* layer by layer, 2 rows a call */
            for (int64_t r = 0; r < s[1]; r += 2) {
                int64_t nr = s[1] - r < 2 ? s[1] - r : 2;
                if (llmc_model_write_f32(tmp, &m, (llmc_tensor_t)id, l, r, nr, v + (l * s[1] + r) * s[2], err,
                                         sizeof err) != 0)
                    die("write", err);
            }
        free(v);
    }
    if (llmc_model_sync(tmp, err, sizeof err) != 0 || llmc_model_commit(tmp, out, err, sizeof err) != 0)
        die("commit", err);
    printf("wrote %s: %llu bytes\n", out, (unsigned long long)m.file_size);
    return 0;
}

static int cmd_llmc_read(const char *file, const char *req, const char *out)
{
    char err[1024];
    llmc_model_t m;
    if (llmc_model_open(&m, file, err, sizeof err) != 0)
        die("open", err);
    FILE *in = fopen(req, "r"), *o = fopen(out, "wb");
    if (in == NULL || o == NULL)
        die("cannot open", req);
    long long r0, nr, c0, nc;
    int id, layer, n = 0;
    while (fscanf(in, "%d %d %lld %lld %lld %lld", &id, &layer, &r0, &nr, &c0, &nc) == 6) {
        float *d = malloc((size_t)(nr * nc + 1) * sizeof *d);
        if (llmc_model_read_f32(&m, (llmc_tensor_t)id, layer, r0, nr, c0, nc, d, err, sizeof err) != 0)
            die("read", err);
        fwrite(d, sizeof *d, (size_t)(nr * nc), o);
        free(d);
        n++;
    }
    fclose(in);
    fclose(o);
    printf("read %d blocks\n", n);
    llmc_model_close(&m);
    return 0;
}

static int cmd_llmc_check(const char *file)
{
    char err[1024];
    llmc_model_t m;
    if (llmc_model_open(&m, file, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("llm.c model: version %d, V %d (Vp %d), maxT %d, L %d, NH %d, C %d\n", m.version, m.vocab, m.padded_vocab,
           m.max_seq, m.n_layer, m.n_head, m.d_model);
    llmc_model_close(&m);
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "unit") == 0 && argc == 3)
        return cmd_unit(argv[2]);
    if (strcmp(cmd, "write") == 0 && argc == 5)
        return cmd_write(argv[2], argv[3], strtoull(argv[4], NULL, 10));
    if (strcmp(cmd, "read") == 0 && argc == 5)
        return cmd_read(argv[2], argv[3], argv[4]);
    if (strcmp(cmd, "check") == 0 && argc == 3)
        return cmd_check(argv[2]);
    if (strcmp(cmd, "llmc-write") == 0 && argc == 4)
        return cmd_llmc_write(argv[2], argv[3]);
    if (strcmp(cmd, "llmc-read") == 0 && argc == 5)
        return cmd_llmc_read(argv[2], argv[3], argv[4]);
    if (strcmp(cmd, "llmc-check") == 0 && argc == 3)
        return cmd_llmc_check(argv[2]);
    fprintf(stderr, "usage: test_safetensors unit DIR | write OUT SRC MAX | read MODEL REQ OUT | check MODEL |\n"
                    "       llmc-write OUT SRC | llmc-read FILE REQ OUT | llmc-check FILE\n");
    return 2;
}
