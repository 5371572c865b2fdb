/* Token shard files: exact round trips through tokens_write/tokens_open
 * (uint16, uint32, several shards in glob order, headerless raw uint16)
 * and one-line errors, naming the file and the problem, for every kind of
 * bad input. Automake protocol: exit 0 pass, 1 fail. */
#define _GNU_SOURCE /* nftw */
#include "io/tokens.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct ctx {
    char dir[64]; /* test/tmp.tokens.XXXXXX */
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

static void path_in(const ctx_t *c, const char *name, char *out, size_t len)
{
    int w = snprintf(out, len, "%s/%s", c->dir, name);
    if (w < 0 || (size_t)w >= len) {
        fprintf(stderr, "test path too long: %s/%s\n", c->dir, name);
        exit(1);
    }
}

/* Write raw bytes: header fields and body exactly as given, so each bad
 * file differs from a good one in one deliberate way. */
static void write_raw(const char *path, const void *a, size_t alen, const void *b, size_t blen)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || (alen && fwrite(a, 1, alen, f) != alen) || (blen && fwrite(b, 1, blen, f) != blen) ||
        fclose(f) != 0) {
        fprintf(stderr, "cannot write test file %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* An llm.c file whose header says (magic, version, count) and whose body
 * holds nbody uint16 tokens 0..nbody-1 (mod 256). */
static void write_llmc_u16(const char *path, int32_t magic, int32_t version, int32_t count, size_t nbody)
{
    int32_t hdr[TOKENS_HEADER_INTS] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count;
    uint16_t *body = calloc(nbody ? nbody : 1, sizeof *body);
    if (body == NULL)
        exit(1);
    for (size_t i = 0; i < nbody; i++)
        body[i] = (uint16_t)(i % 256);
    write_raw(path, hdr, sizeof hdr, body, nbody * sizeof *body);
    free(body);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Expect tokens_open to fail with a message containing every needle. */
static void expect_error(ctx_t *c, const char *pattern, tokens_format_t fmt, int vocab, const char *const *needles)
{
    token_set_t set;
    char err[1024] = "";
    int rc = tokens_open(&set, pattern, fmt, vocab, err, sizeof err);
    CHECK(c, rc == -1, "tokens_open('%s') returned %d, want -1", pattern, rc);
    CHECK(c, set.n_shards == 0 && set.shard == NULL && set.n_tokens == 0,
          "failed tokens_open('%s') left a non-empty set", pattern);
    CHECK(c, strchr(err, '\n') == NULL, "error is not one line: %s", err);
    /* Shown in the test log so a reader can judge the wording. */
    printf("expected error: %s\n", err);
    for (const char *const *n = needles; *n != NULL; n++)
        CHECK(c, strstr(err, *n) != NULL, "error for '%s' lacks \"%s\": %s", pattern, *n, err);
    if (rc == 0)
        tokens_close(&set);
}

static void test_roundtrip_u16(ctx_t *c)
{
    /* Sizes chosen to cross the writer's 65536-token chunk and to include
     * a one-token shard; written out of order to test the sort. */
    const size_t sizes[3] = {70001, 1, 513};
    const char *names[3] = {"rt16_000000.bin", "rt16_000001.bin", "rt16_000002.bin"};
    int32_t *tok[3];
    char path[256], err[1024];
    for (int s = 0; s < 3; s++) {
        tok[s] = malloc(sizes[s] * sizeof(int32_t));
        if (tok[s] == NULL)
            exit(1);
        for (size_t i = 0; i < sizes[s]; i++)
            tok[s][i] = (int32_t)((i * 7919u + (unsigned)s * 31u) % 65536u);
    }
    tok[0][0] = 0;
    tok[0][1] = 65535; /* the extremes must survive the uint16 cast */
    const int order[3] = {2, 0, 1};
    for (int k = 0; k < 3; k++) {
        int s = order[k];
        path_in(c, names[s], path, sizeof path);
        int rc = tokens_write(path, tok[s], sizes[s], 2, err, sizeof err);
        CHECK(c, rc == 0, "tokens_write %s: %s", path, err);
        CHECK(c, file_size(path) == 1024 + 2 * (long)sizes[s], "%s is %ld bytes, want %ld", path, file_size(path),
              1024 + 2 * (long)sizes[s]);
        char tmp[300];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        CHECK(c, access(tmp, F_OK) != 0, "%s left behind", tmp);
    }

    /* The header on disk, byte for byte: llm.c must read what we write. */
    path_in(c, names[2], path, sizeof path);
    FILE *f = fopen(path, "rb");
    int32_t hdr[TOKENS_HEADER_INTS];
    CHECK(c, f != NULL && fread(hdr, sizeof hdr, 1, f) == 1, "cannot read back %s", path);
    if (f != NULL && fclose(f) != 0)
        CHECK(c, 0, "fclose %s", path);
    CHECK(c, hdr[0] == 20240520 && hdr[1] == 1 && hdr[2] == 513, "u16 header is %d %d %d, want 20240520 1 513", hdr[0],
          hdr[1], hdr[2]);
    int zeros = 1;
    for (int i = 3; i < TOKENS_HEADER_INTS; i++)
        zeros &= hdr[i] == 0;
    CHECK(c, zeros, "u16 header words 3..255 are not zero");

    char pat[256];
    path_in(c, "rt16_*.bin", pat, sizeof pat);
    token_set_t set;
    int rc = tokens_open(&set, pat, TOKENS_FORMAT_LLMC, 65536, err, sizeof err);
    CHECK(c, rc == 0, "tokens_open %s: %s", pat, err);
    if (rc != 0)
        goto done;
    CHECK(c, set.n_shards == 3, "n_shards %d, want 3", set.n_shards);
    CHECK(c, set.n_tokens == 70001 + 1 + 513, "n_tokens %zu, want 70515", set.n_tokens);
    for (int s = 0; s < 3 && s < set.n_shards; s++) {
        path_in(c, names[s], path, sizeof path);
        CHECK(c, strcmp(set.shard[s].path, path) == 0, "shard %d is %s, want %s", s, set.shard[s].path, path);
        CHECK(c, set.shard[s].n == sizes[s], "shard %d has %zu tokens, want %zu", s, set.shard[s].n, sizes[s]);
        size_t bad = 0;
        for (size_t i = 0; i < sizes[s] && i < set.shard[s].n; i++)
            bad += set.shard[s].tok[i] != tok[s][i];
        CHECK(c, bad == 0, "shard %d: %zu tokens differ", s, bad);
    }
    CHECK(c, set.shard[0].tok[1] == 65535, "token 65535 read back as %d", set.shard[0].tok[1]);
    tokens_close(&set);
    CHECK(c, set.shard == NULL && set.n_shards == 0 && set.n_tokens == 0, "tokens_close left the set non-empty");

    /* A plain path is a pattern matching only itself. */
    path_in(c, names[1], path, sizeof path);
    rc = tokens_open(&set, path, TOKENS_FORMAT_LLMC, 65536, err, sizeof err);
    CHECK(c, rc == 0 && set.n_shards == 1 && set.n_tokens == 1 && set.shard[0].tok[0] == tok[1][0],
          "plain path %s: rc %d: %s", path, rc, err);
    if (rc == 0)
        tokens_close(&set);
done:
    for (int s = 0; s < 3; s++)
        free(tok[s]);
}

static void test_roundtrip_u32(ctx_t *c)
{
    /* Llama-3 sized ids, well past uint16. */
    const int vocab = 128256;
    const size_t n = 100003;
    int32_t *tok = malloc(n * sizeof *tok);
    if (tok == NULL)
        exit(1);
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)((i * 104729u) % (unsigned)vocab);
    tok[7] = vocab - 1;
    char path[256], err[1024];
    path_in(c, "rt32_train_000000.bin", path, sizeof path);
    int rc = tokens_write(path, tok, n, 4, err, sizeof err);
    CHECK(c, rc == 0, "tokens_write u32: %s", err);
    CHECK(c, file_size(path) == 1024 + 4 * (long)n, "u32 file is %ld bytes", file_size(path));
    FILE *f = fopen(path, "rb");
    int32_t hdr[3] = {0};
    CHECK(c, f != NULL && fread(hdr, sizeof hdr, 1, f) == 1, "read %s", path);
    if (f != NULL && fclose(f) != 0)
        CHECK(c, 0, "fclose %s", path);
    CHECK(c, hdr[0] == 20240801 && hdr[1] == 7 && hdr[2] == (int32_t)n, "u32 header is %d %d %d, want 20240801 7 %zu",
          hdr[0], hdr[1], hdr[2], n);

    token_set_t set;
    rc = tokens_open(&set, path, TOKENS_FORMAT_LLMC, vocab, err, sizeof err);
    CHECK(c, rc == 0, "tokens_open u32: %s", err);
    if (rc == 0) {
        CHECK(c, set.n_shards == 1 && set.n_tokens == n && set.shard[0].n == n, "u32 set has %d shards, %zu tokens",
              set.n_shards, set.n_tokens);
        CHECK(c, memcmp(set.shard[0].tok, tok, n * sizeof *tok) == 0, "u32 tokens differ after the round trip");
        tokens_close(&set);
    }
    /* The same file against a vocabulary one too small. */
    const char *needles[] = {path, "vocab", "index 7", "128255", "128255", NULL};
    expect_error(c, path, TOKENS_FORMAT_LLMC, vocab - 1, needles);
    free(tok);
}

static void test_raw_u16(ctx_t *c)
{
    const size_t n = 999;
    uint16_t raw[999];
    for (size_t i = 0; i < n; i++)
        raw[i] = (uint16_t)((i * 37u) % 50257u);
    char path[256], err[1024];
    path_in(c, "raw_train.bin", path, sizeof path);
    write_raw(path, raw, sizeof raw, NULL, 0);
    token_set_t set;
    int rc = tokens_open(&set, path, TOKENS_FORMAT_RAW_U16, 50257, err, sizeof err);
    CHECK(c, rc == 0, "raw-u16 open: %s", err);
    if (rc == 0) {
        CHECK(c, set.n_tokens == n && set.shard[0].n == n, "raw-u16 read %zu tokens, want %zu", set.n_tokens, n);
        size_t bad = 0;
        for (size_t i = 0; i < n && i < set.shard[0].n; i++)
            bad += set.shard[0].tok[i] != (int32_t)raw[i];
        CHECK(c, bad == 0, "raw-u16: %zu tokens differ", bad);
        tokens_close(&set);
    }
    /* Without the flag it must fail on the magic and suggest the flag. */
    const char *needles[] = {path, "magic", "20240520", "20240801", "--data-format raw-u16", NULL};
    expect_error(c, path, TOKENS_FORMAT_LLMC, 50257, needles);
}

static void test_bad_inputs(ctx_t *c)
{
    char path[256], pat[256];

    path_in(c, "nothing_*.bin", pat, sizeof pat);
    {
        const char *n[] = {"no token files match", pat, "dtrain-prepare", "check the path", NULL};
        expect_error(c, pat, TOKENS_FORMAT_LLMC, 256, n);
    }

    path_in(c, "magic.bin", path, sizeof path);
    write_llmc_u16(path, 12345, 1, 10, 10);
    {
        const char *n[] = {path, "magic", "12345", "20240520", "20240801", "raw-u16", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    path_in(c, "version.bin", path, sizeof path);
    write_llmc_u16(path, TOKENS_MAGIC_U16, 2, 10, 10);
    {
        const char *n[] = {path, "version", "2", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    /* 100 tokens promised, 50 present: 1224 bytes expected, 1124 found. */
    path_in(c, "trunc.bin", path, sizeof path);
    write_llmc_u16(path, TOKENS_MAGIC_U16, 1, 100, 50);
    {
        const char *n[] = {path, "truncated", "1224", "1124", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    path_in(c, "long.bin", path, sizeof path);
    write_llmc_u16(path, TOKENS_MAGIC_U16, 1, 50, 100);
    {
        const char *n[] = {path, "overlong", "1124", "1224", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    path_in(c, "short.bin", path, sizeof path);
    write_raw(path, "0123456789", 10, NULL, 0);
    {
        const char *n[] = {path, "truncated", "10 bytes", "1024", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    path_in(c, "empty.bin", path, sizeof path);
    write_llmc_u16(path, TOKENS_MAGIC_U16, 1, 0, 0);
    {
        const char *n[] = {path, "empty", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    path_in(c, "negative.bin", path, sizeof path);
    write_llmc_u16(path, TOKENS_MAGIC_U16, 1, -5, 0);
    {
        const char *n[] = {path, "count", "-5", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    /* Byte tokens are < 256 by construction; put a 300 at index 7. */
    {
        int32_t tok[20];
        for (int i = 0; i < 20; i++)
            tok[i] = i;
        tok[7] = 300;
        char err[1024];
        path_in(c, "vocab.bin", path, sizeof path);
        int rc = tokens_write(path, tok, 20, 2, err, sizeof err);
        CHECK(c, rc == 0, "tokens_write vocab.bin: %s", err);
        const char *n[] = {path, "vocab", "index 7", "300", "256", "--vocab-size", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    /* A uint32 value above INT32_MAX must not slip past as negative. */
    {
        int32_t hdr[TOKENS_HEADER_INTS] = {0};
        hdr[0] = TOKENS_MAGIC_U32;
        hdr[1] = TOKENS_VERSION_U32;
        hdr[2] = 2;
        uint32_t body[2] = {5, 0xFFFFFFFFu};
        path_in(c, "huge32.bin", path, sizeof path);
        write_raw(path, hdr, sizeof hdr, body, sizeof body);
        const char *n[] = {path, "vocab", "index 1", "4294967295", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    path_in(c, "odd.bin", path, sizeof path);
    write_raw(path, "abc", 3, NULL, 0);
    {
        const char *n[] = {path, "odd", "3 bytes", NULL};
        expect_error(c, path, TOKENS_FORMAT_RAW_U16, 256, n);
    }

    path_in(c, "zero.bin", path, sizeof path);
    write_raw(path, NULL, 0, NULL, 0);
    {
        const char *n[] = {path, "empty", NULL};
        expect_error(c, path, TOKENS_FORMAT_RAW_U16, 256, n);
    }

    /* An llm.c shard read as raw-u16 would train on its header. */
    path_in(c, "rt16_000002.bin", path, sizeof path);
    {
        const char *n[] = {path, "llm.c", "raw-u16", NULL};
        expect_error(c, path, TOKENS_FORMAT_RAW_U16, 65536, n);
    }

    /* A directory caught by the glob. */
    path_in(c, "dir.bin", path, sizeof path);
    if (mkdir(path, 0755) != 0) {
        fprintf(stderr, "mkdir %s: %s\n", path, strerror(errno));
        exit(1);
    }
    {
        const char *n[] = {path, "not a regular file", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 256, n);
    }

    /* One bad shard among good ones: the error names the bad one and the
     * whole set is released. */
    {
        int32_t tok[4] = {1, 2, 3, 4};
        char err[1024];
        path_in(c, "mix_000000.bin", path, sizeof path);
        CHECK(c, tokens_write(path, tok, 4, 2, err, sizeof err) == 0, "%s", err);
        path_in(c, "mix_000001.bin", path, sizeof path);
        write_llmc_u16(path, TOKENS_MAGIC_U16, 1, 9, 4);
        path_in(c, "mix_000002.bin", pat, sizeof pat);
        CHECK(c, tokens_write(pat, tok, 4, 2, err, sizeof err) == 0, "%s", err);
        path_in(c, "mix_*.bin", pat, sizeof pat);
        const char *n[] = {path, "truncated", NULL};
        expect_error(c, pat, TOKENS_FORMAT_LLMC, 256, n);
    }

    /* Argument checks. */
    path_in(c, "rt16_000001.bin", path, sizeof path);
    {
        const char *n[] = {"vocab size", "--vocab-size", NULL};
        expect_error(c, path, TOKENS_FORMAT_LLMC, 0, n);
    }
    {
        const char *n[] = {"format", NULL};
        expect_error(c, path, (tokens_format_t)7, 256, n);
    }
}

static void test_write_errors(ctx_t *c)
{
    char path[256], tmp[300], err[1024];
    int32_t tok[3] = {1, 65536, 2};
    path_in(c, "w_bad.bin", path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    int rc = tokens_write(path, tok, 3, 2, err, sizeof err);
    CHECK(c, rc == -1 && strstr(err, path) && strstr(err, "65536") && strstr(err, "index 1"), "u16 overflow: rc %d: %s",
          rc, err);
    CHECK(c, access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "a rejected write left a file behind");

    tok[1] = -1;
    rc = tokens_write(path, tok, 3, 4, err, sizeof err);
    CHECK(c, rc == -1 && strstr(err, path) && strstr(err, "-1"), "negative token: rc %d: %s", rc, err);

    tok[1] = 5;
    rc = tokens_write(path, tok, 3, 3, err, sizeof err);
    CHECK(c, rc == -1 && strstr(err, path) && strstr(err, "width 3"), "width 3: rc %d: %s", rc, err);

    rc = tokens_write(path, tok, 0, 2, err, sizeof err);
    CHECK(c, rc == -1 && strstr(err, path) && strstr(err, "empty"), "empty write: rc %d: %s", rc, err);

    path_in(c, "no/such/dir/x.bin", path, sizeof path);
    rc = tokens_write(path, tok, 3, 2, err, sizeof err);
    CHECK(c, rc == -1 && strstr(err, path) && strstr(err, "directory"), "missing directory: rc %d: %s", rc, err);

    /* A tiny buffer truncates the message but must not overflow. */
    char small[16];
    memset(small, 'x', sizeof small);
    rc = tokens_write(path, tok, 3, 2, small, sizeof small);
    CHECK(c, rc == -1 && strlen(small) == sizeof small - 1, "small error buffer: rc %d, len %zu", rc, strlen(small));
    /* And a NULL one is allowed. */
    rc = tokens_write(path, tok, 3, 2, NULL, 0);
    CHECK(c, rc == -1, "NULL error buffer: rc %d", rc);
}

static void test_format_parse(ctx_t *c)
{
    tokens_format_t f = (tokens_format_t)99;
    CHECK(c, tokens_format_parse("llmc", &f) == 0 && f == TOKENS_FORMAT_LLMC, "parse llmc");
    CHECK(c, tokens_format_parse("raw-u16", &f) == 0 && f == TOKENS_FORMAT_RAW_U16, "parse raw-u16");
    CHECK(c, tokens_format_parse("raw-u32", &f) == -1, "parse raw-u32");
    CHECK(c, tokens_format_parse("", &f) == -1, "parse empty");
    CHECK(c, tokens_format_parse(NULL, &f) == -1, "parse NULL");
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    if (remove(p) != 0) {
        fprintf(stderr, "cannot remove %s: %s\n", p, strerror(errno));
        return -1;
    }
    return 0;
}

int main(void)
{
    ctx_t c = {.dir = "test/tmp.tokens.XXXXXX"};
    /* Automake runs tests from the build directory, where test/ exists;
     * create it for a standalone run from elsewhere. */
    if (mkdir("test", 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot create test/: %s\n", strerror(errno));
        return 1;
    }
    if (mkdtemp(c.dir) == NULL) {
        fprintf(stderr, "mkdtemp %s: %s\n", c.dir, strerror(errno));
        return 1;
    }

    test_format_parse(&c);
    test_roundtrip_u16(&c);
    test_roundtrip_u32(&c);
    test_raw_u16(&c);
    test_bad_inputs(&c);
    test_write_errors(&c);

    if (nftw(c.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        fprintf(stderr, "cannot remove %s\n", c.dir);
        return 1;
    }
    printf("test_tokens: %d checks, %d failed\n", c.checks, c.failures);
    return c.failures == 0 ? 0 : 1;
}
