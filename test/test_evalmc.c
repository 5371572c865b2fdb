/* Multiple-choice eval files (io/evalmc.h): exact round trips through
 * evalmc_write and evalmc_load (random example sets, both versions), the
 * writer's refusals, every single-byte corruption of small valid files
 * (rejected with one line, or parsed into something consistent), and one
 * named malformed file per check of the reader, each rejected with one
 * line naming the problem. Automake protocol: exit 0 pass, 1 fail. */
#include "io/evalmc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static char dir[64] = "test/tmp.evalmc.XXXXXX";

/* xorshift64: the example sets depend on the seed alone */
static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* n random examples, their tokens in *pool (freed by the caller): 2 to 32
 * completions of 1 to 12 tokens, contexts of 0 to 40, ids below limit. */
static evalmc_example_t *random_set(int n, uint32_t limit, int32_t **pool)
{
    evalmc_example_t *ex = calloc((size_t)n, sizeof *ex);
    int32_t *p = malloc((size_t)n * (40 + 32 * 12) * sizeof *p);
    if (!ex || !p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    *pool = p;
    for (int e = 0; e < n; e++) {
        evalmc_example_t *x = &ex[e];
        x->index = 1000 + e; /* the writer numbers them 0..n-1 whatever this says */
        x->n_comp = 2 + (int)rnd(EVALMC_MAX_COMPLETIONS - 1);
        x->label = (int)rnd((uint32_t)x->n_comp);
        x->ctx_len = (int)rnd(41);
        x->ctx = p;
        for (int i = 0; i < x->ctx_len; i++)
            *p++ = (int32_t)(rnd(8) == 0 ? limit - 1 - rnd(2) : rnd(limit)); /* the top ids often */
        for (int c = 0; c < x->n_comp; c++) {
            x->comp_len[c] = 1 + (int)rnd(12);
            x->comp[c] = p;
            for (int i = 0; i < x->comp_len[c]; i++)
                *p++ = (int32_t)rnd(limit);
        }
    }
    return ex;
}

/* f's examples lie end to end in f->tokens, within the limits, and
 * max_token is their largest id: what a reader may rely on. */
static int consistent(const evalmc_file_t *f)
{
    const int32_t *next = f->tokens;
    int top = -1;
    if (f->n < 1 || (f->version != EVALMC_VERSION_U16 && f->version != EVALMC_VERSION_U32))
        return 0;
    for (int e = 0; e < f->n; e++) {
        const evalmc_example_t *x = &f->ex[e];
        if (x->n_comp < 2 || x->n_comp > EVALMC_MAX_COMPLETIONS || x->label < 0 || x->label >= x->n_comp ||
            x->ctx_len < 0 || x->ctx != next)
            return 0;
        next += x->ctx_len;
        for (int c = 0; c < x->n_comp; c++) {
            if (x->comp_len[c] < 1 || x->comp[c] != next)
                return 0;
            next += x->comp_len[c];
        }
    }
    for (const int32_t *t = f->tokens; t < next; t++) {
        if (*t < 0 || (f->version == EVALMC_VERSION_U16 && *t >= 0xFFFF))
            return 0;
        top = *t > top ? *t : top;
    }
    return top == f->max_token;
}

static int same_example(const evalmc_example_t *a, const evalmc_example_t *b, int index)
{
    if (b->index != index || a->label != b->label || a->n_comp != b->n_comp || a->ctx_len != b->ctx_len ||
        memcmp(a->ctx, b->ctx, (size_t)a->ctx_len * sizeof *a->ctx) != 0)
        return 0;
    for (int c = 0; c < a->n_comp; c++)
        if (a->comp_len[c] != b->comp_len[c] || memcmp(a->comp[c], b->comp[c], (size_t)a->comp_len[c] * 4) != 0)
            return 0;
    return 1;
}

static int one_line(const char *err) { return err[0] != '\0' && strchr(err, '\n') == NULL; }

static void round_trips(void)
{
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/rt.bin", dir);
    for (int trial = 0; trial < 40; trial++) {
        const int version = trial % 2 ? EVALMC_VERSION_U32 : EVALMC_VERSION_U16;
        const uint32_t limit = version == EVALMC_VERSION_U16 ? 0xFFFFu : 0x7FFFFFFFu;
        const int n = 1 + (int)rnd(trial < 38 ? 60 : 3000);
        int32_t *pool;
        evalmc_example_t *ex = random_set(n, limit, &pool);
        evalmc_file_t f;
        err[0] = '\0';
        int rc = evalmc_write(path, ex, n, version, err, sizeof err);
        CHECK(rc == 0, "trial %d: write: %s", trial, err);
        rc = rc == 0 ? evalmc_load(&f, path, err, sizeof err) : -1;
        CHECK(rc == 0, "trial %d: load: %s", trial, err);
        if (rc == 0) {
            int same = f.version == version && f.n == n && consistent(&f);
            for (int e = 0; e < n && same; e++)
                same = same_example(&ex[e], &f.ex[e], e);
            CHECK(same, "trial %d (version %d, %d examples): what was read differs from what was written", trial,
                  version, n);
            evalmc_free(&f);
        }
        free(ex);
        free(pool);
    }
    unlink(path);
}

/* The writer refuses what the format cannot hold, in one line, and
 * leaves no file. */
static void writer_refusals(void)
{
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/refused.bin", dir);
    int32_t ctx[2] = {1, 2}, a[1] = {3}, b[1] = {0xFFFF}, big[1] = {-1};
    evalmc_example_t x = {.label = 0, .n_comp = 2, .ctx_len = 2, .ctx = ctx, .comp_len = {1, 1}, .comp = {a, b}};
    struct stat st;
    /* 65535 in version 1, then 1 completion, a label past the end, an
     * empty completion and a negative id, each in version 2 where the
     * token itself fits */
    for (int k = 0; k < 5; k++) {
        evalmc_example_t y = x;
        int version = k == 0 ? EVALMC_VERSION_U16 : EVALMC_VERSION_U32;
        if (k == 1)
            y.n_comp = 1;
        if (k == 2)
            y.label = 2;
        if (k == 3)
            y.comp_len[1] = 0;
        if (k == 4)
            y.comp[1] = big;
        err[0] = '\0';
        CHECK(evalmc_write(path, &y, 1, version, err, sizeof err) != 0 && one_line(err) && strstr(err, path),
              "refusal %d: accepted, or not one line naming the file: '%s'", k, err);
        CHECK(stat(path, &st) != 0 && errno == ENOENT, "refusal %d left %s", k, path);
    }
    /* no examples: a file the reader would refuse ("counts no examples") */
    err[0] = '\0';
    CHECK(evalmc_write(path, &x, 0, EVALMC_VERSION_U16, err, sizeof err) != 0 && one_line(err) && strstr(err, path),
          "0 examples: accepted, or not one line naming the file: '%s'", err);
    CHECK(stat(path, &st) != 0 && errno == ENOENT, "0 examples left %s", path);
    CHECK(evalmc_write(path, &x, 1, EVALMC_VERSION_U32, err, sizeof err) == 0, "65535 in version 2: %s", err);
    unlink(path);
}

/* Bytes of a valid file of n short examples (every byte is corrupted in
 * turn): example e has 2 + e % 3 completions of 1 + (e + c) % 3 tokens,
 * label e % completions and e % 4 context tokens. */
static unsigned char *valid_bytes(int version, int n, size_t *len)
{
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/valid.bin", dir);
    const uint32_t limit = version == EVALMC_VERSION_U16 ? 0xFFFFu : 0x7FFFFFFFu;
    evalmc_example_t *ex = calloc((size_t)n, sizeof *ex);
    int32_t *pool = malloc((size_t)n * 16 * sizeof *pool), *p = pool;
    unsigned char *buf = malloc(1 << 16);
    FILE *fp = NULL;
    if (!ex || !pool || !buf) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    rng_state = 0x5eed + (uint64_t)version;
    for (int e = 0; e < n; e++) {
        evalmc_example_t *x = &ex[e];
        x->n_comp = 2 + e % 3;
        x->label = e % x->n_comp;
        x->ctx_len = e % 4;
        x->ctx = p;
        for (int i = 0; i < x->ctx_len; i++)
            *p++ = (int32_t)rnd(limit);
        for (int c = 0; c < x->n_comp; c++) {
            x->comp_len[c] = 1 + (e + c) % 3;
            x->comp[c] = p;
            for (int i = 0; i < x->comp_len[c]; i++)
                *p++ = (int32_t)rnd(limit);
        }
    }
    if (evalmc_write(path, ex, n, version, err, sizeof err) != 0 || !(fp = fopen(path, "rb"))) {
        fprintf(stderr, "cannot make %s: %s\n", path, err);
        exit(1);
    }
    *len = fread(buf, 1, 1 << 16, fp);
    fclose(fp);
    unlink(path);
    free(ex);
    free(pool);
    return buf;
}

/* Each byte of a valid file, changed to each of a few values: rejected
 * with one line, or read into a consistent file. */
static void corruptions(int version)
{
    size_t len;
    unsigned char *buf = valid_bytes(version, 3, &len);
    static const unsigned char vals[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x1f, 0x20, 0x7f, 0x80, 0xfe, 0xff};
    int rejected = 0, accepted = 0, bad = 0;
    char err[512];
    for (size_t i = 0; i < len; i++) {
        if (i == 16)
            i = 4 * EVALMC_HEADER_INTS; /* header words 4..255 are reserved, and ignored */
        const unsigned char keep = buf[i];
        for (size_t v = 0; v < sizeof vals; v++) {
            if (vals[v] == keep)
                continue;
            buf[i] = vals[v];
            evalmc_file_t f;
            err[0] = '\0';
            if (evalmc_parse(&f, buf, len, "corrupt.bin", err, sizeof err) != 0) {
                rejected++;
                bad += !one_line(err) || strncmp(err, "corrupt.bin", 11) != 0 || f.ex || f.tokens;
            } else {
                accepted++;
                bad += !consistent(&f);
                evalmc_free(&f);
            }
        }
        buf[i] = keep;
    }
    CHECK(bad == 0 && rejected > 0, "version %d: %d of %d corruptions rejected without one line or read inconsistently",
          version, bad, rejected + accepted);
    /* every prefix: a file cut short anywhere */
    bad = 0;
    for (size_t cut = 0; cut < len; cut++) {
        evalmc_file_t f;
        err[0] = '\0';
        bad += evalmc_parse(&f, buf, cut, "cut.bin", err, sizeof err) == 0 || !one_line(err);
    }
    CHECK(bad == 0, "version %d: a truncated file accepted, or not one line", version);
    printf("ok   version %d: %zu-byte file: of its header's 16 bytes and body's %zu, %d single-byte corruptions "
           "rejected with one line, %d read consistently; %zu truncations rejected\n",
           version, len, len - 4 * EVALMC_HEADER_INTS, rejected, accepted, len);
    free(buf);
}

/* Little-endian word w (2 or 4 bytes) at word index i of the body. */
static void set_word(unsigned char *body, size_t i, int w, uint32_t v)
{
    for (int b = 0; b < w; b++)
        body[(size_t)w * i + (size_t)b] = (unsigned char)(v >> (8 * b));
}

static void set_int(unsigned char *buf, int i, uint32_t v) { set_word(buf, (size_t)i, 4, v); }

/* One malformed file per check: a valid file of 2 examples, one change.
 * Example 0 of valid_bytes(.., 2): 2 completions, label 0, no context,
 * completions of 1 and 2 tokens: words START SIZE INDEX LABEL NC 0 1 t 2 t t
 * (11 words), then example 1 at word 11. */
static void malformed(int version)
{
    const int w = version == EVALMC_VERSION_U16 ? 2 : 4;
    size_t len;
    unsigned char *good = valid_bytes(version, 2, &len), *buf = malloc(len + 8);
    char err[512], path[128];
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    const uint32_t start = w == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    struct {
        const char *name, *want;
        size_t len; /* 0: as good */
        int at;     /* -1: header int `hi`, else body word */
        int hi;
        uint32_t v;
    } cases[] = {
        {"truncated header", "shorter than its 1024-byte header", 1000, -2, 0, 0},
        {"wrong magic", "no magic 20240522", 0, -1, 0, 20240520},
        {"version 3", "eval file version 3", 0, -1, 1, 3},
        {"no examples", "the header counts no examples", 0, -1, 2, 0},
        {"more examples than bytes", "more than its", 0, -1, 2, 1000000},
        {"an example more than there are", "example 2: the file ends inside it", 0, -1, 2, 3},
        {"longest-bytes mismatch", "longest-example size does not match", 0, -1, 3, 2},
        {"size field lying (1 word more)", "do not fill its", 0, 1, 0, 12 * (uint32_t)w},
        {"size field past the end", "runs past the end of the file", 0, 1, 0, 4000},
        {"size field not whole words", "not a whole number of words", 0, 1, 0, 11 * (uint32_t)w + 1},
        {"no start marker", "example 0: no start marker", 0, 0, 0, 7},
        {"label >= completions", "2 completions with label 2", 0, 3, 0, 2},
        {"1 completion", "1 completions with label 0", 0, 4, 0, 1},
        {"33 completions", "33 completions", 0, 4, 0, 33},
        {"empty completion", "do not fill its", 0, 6, 0, 0},
        {"a start marker as a token", "a start marker as a token", 0, 7, 0, start},
        {"a token above INT32_MAX", "do not fill its", 0, 7, 0, 0x80000000u},
        {"trailing bytes", "bytes follow the last example", len + (size_t)w, -2, 0, 0},
        {"half a word at the end", "the size does not fit the header", len + 1, -2, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        if (cases[k].v == 0x80000000u && w == 2)
            continue; /* no such uint16 */
        const size_t n = cases[k].len ? cases[k].len : len;
        memset(buf, 0, len + 8);
        memcpy(buf, good, n < len ? n : len);
        if (cases[k].at == -1)
            set_int(buf, cases[k].hi, cases[k].v);
        else if (cases[k].at >= 0)
            set_word(buf + 4 * EVALMC_HEADER_INTS, (size_t)cases[k].at, w, cases[k].v);
        FILE *fp = fopen(path, "wb");
        if (!fp || fwrite(buf, 1, n, fp) != n || fclose(fp) != 0) {
            fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
            exit(1);
        }
        evalmc_file_t f;
        err[0] = '\0';
        const int rc = evalmc_load(&f, path, err, sizeof err);
        CHECK(rc != 0 && one_line(err) && strstr(err, path) && strstr(err, cases[k].want),
              "version %d, %s: %s, wanted one line with '%s': '%s'", version, cases[k].name,
              rc == 0 ? "accepted" : "rejected", cases[k].want, err);
        if (rc == 0)
            evalmc_free(&f);
        else if (k < 3)
            printf("ok   version %d, %s: %s\n", version, cases[k].name, err);
    }
    evalmc_file_t f;
    CHECK(evalmc_parse(&f, good, len, "good", err, sizeof err) == 0, "the unchanged file: %s", err);
    if (f.ex)
        evalmc_free(&f);
    snprintf(path, sizeof path, "%s/none.bin", dir);
    CHECK(evalmc_load(&f, path, err, sizeof err) != 0 && one_line(err) && strstr(err, "cannot open"),
          "a missing file: '%s'", err);
    CHECK(evalmc_load(&f, dir, err, sizeof err) != 0 && one_line(err) && strstr(err, dir) &&
              strstr(err, "not a regular file"),
          "a directory: '%s'", err);
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    unlink(path);
    free(good);
    free(buf);
}

int main(void)
{
    if (!mkdtemp(dir)) {
        fprintf(stderr, "cannot make %s: %s (run from the build directory)\n", dir, strerror(errno));
        return 1;
    }
    rng_state = 20240522;
    round_trips();
    writer_refusals();
    for (int v = EVALMC_VERSION_U16; v <= EVALMC_VERSION_U32; v++) {
        corruptions(v);
        malformed(v);
    }
    rmdir(dir);
    printf("%d check(s), %d failure(s)\n", checks, failures);
    return failures != 0;
}
