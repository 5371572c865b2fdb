/* libFuzzer harness: multiple-choice eval files (io/evalmc.c), which users
 * bring from llm.c's scripts or make with dtrain-prepare --eval-mc.
 *
 * Sources: io/evalmc.c, io/publish.c, io/errmsg.c (no MPI).
 *
 * Input: 1 flag byte, then the file's bytes, parsed by evalmc_parse from
 * a private heap copy of exactly their length (so ASan sees any overread).
 *   - refused: exactly one non-empty line, naming the file, and f zeroed
 *   - accepted: the examples lie end to end in f->tokens (each pointer
 *     where the previous run ended), 2 <= n_comp <= 32, 0 <= label <
 *     n_comp, completions not empty, ids in range for the version
 *     (uint16: below the 65535 start marker) and max_token their largest
 *   - flag bit 0, accepted: written back by evalmc_write (to a directory
 *     under $TMPDIR, /dev/shm by default) and the file must equal the
 *     input but for what the writer sets itself: the reserved header
 *     words (0) and each example's index (its position). */
#include "io/evalmc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void refused(const char *err, const evalmc_file_t *f)
{
    if (err[0] == '\0' || strchr(err, '\n') != NULL || strncmp(err, "fuzz.bin", 8) != 0 || f->ex || f->tokens || f->n)
        abort();
}

/* The invariants above. */
static void check_accepted(const evalmc_file_t *f)
{
    const int32_t *next = f->tokens;
    int top = -1;
    if (f->n < 1 || (f->version != EVALMC_VERSION_U16 && f->version != EVALMC_VERSION_U32) || !f->ex || !f->tokens)
        abort();
    for (int e = 0; e < f->n; e++) {
        const evalmc_example_t *x = &f->ex[e];
        if (x->n_comp < 2 || x->n_comp > EVALMC_MAX_COMPLETIONS || x->label < 0 || x->label >= x->n_comp ||
            x->ctx_len < 0 || x->ctx != next)
            abort();
        next += x->ctx_len;
        for (int c = 0; c < x->n_comp; c++) {
            if (x->comp_len[c] < 1 || x->comp[c] != next)
                abort();
            next += x->comp_len[c];
        }
    }
    for (const int32_t *t = f->tokens; t < next; t++) {
        if (*t < 0 || (f->version == EVALMC_VERSION_U16 && *t >= 0xFFFF))
            abort();
        top = *t > top ? *t : top;
    }
    if (top != f->max_token)
        abort();
}

/* What evalmc_write must make of an accepted input: the same bytes with
 * header words 4..255 zeroed and example e's index word set to e. */
static void expected_bytes(unsigned char *buf, size_t size, const evalmc_file_t *f)
{
    const int w = f->version == EVALMC_VERSION_U16 ? 2 : 4;
    memset(buf + 16, 0, 4 * EVALMC_HEADER_INTS - 16);
    size_t at = 4 * EVALMC_HEADER_INTS;
    for (int e = 0; e < f->n; e++) {
        unsigned char *idx = buf + at + 2 * (size_t)w;
        for (int b = 0; b < w; b++)
            idx[b] = (unsigned char)((uint32_t)e >> (8 * b));
        uint32_t bytes = 0;
        for (int b = 0; b < w; b++)
            bytes |= (uint32_t)buf[at + (size_t)w + (size_t)b] << (8 * b);
        at += bytes;
        if (at > size)
            abort();
    }
}

static char dir[256];

static void remove_scratch(void) { rmdir(dir); }

/* A private directory for the written files, removed at exit. */
static const char *scratch_dir(void)
{
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/fuzz_evalmc.XXXXXX", t && *t ? t : "/dev/shm");
        if (!mkdtemp(dir) || atexit(remove_scratch) != 0)
            abort();
    }
    return dir;
}

static void write_back(const evalmc_file_t *f, const unsigned char *in, size_t size)
{
    char path[300], err[512] = "";
    snprintf(path, sizeof path, "%s/w.bin", scratch_dir());
    if (evalmc_write(path, f->ex, f->n, f->version, err, sizeof err) != 0) {
        /* only an index the version's word cannot hold may be refused */
        if (f->n < (f->version == EVALMC_VERSION_U16 ? 0xFFFF : INT32_MAX) || strchr(err, '\n'))
            abort();
        return;
    }
    unsigned char *want = malloc(size), *got = malloc(size + 1);
    FILE *fp = fopen(path, "rb");
    if (!want || !got || !fp)
        abort();
    memcpy(want, in, size);
    expected_bytes(want, size, f);
    const size_t n = fread(got, 1, size + 1, fp);
    fclose(fp);
    unlink(path);
    if (n != size || memcmp(got, want, size) != 0)
        abort();
    free(want);
    free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t flag = data[0];
    unsigned char *buf = malloc(size - 1 ? size - 1 : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    evalmc_file_t f;
    char err[512] = "";
    if (evalmc_parse(&f, buf, size - 1, "fuzz.bin", err, sizeof err) != 0)
        refused(err, &f);
    else {
        check_accepted(&f);
        if (flag & 1)
            write_back(&f, buf, size - 1);
        evalmc_free(&f);
    }
    free(buf);
    return 0;
}
