/* Sample order over one dataset or a blend: see data.h. */
#include "src/data/data.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/data/blend.h"
#include "src/model/rng.h"

/* Separates the permutation streams from the initialisation streams
 * (which are keyed by tensor-name hashes). */
#define DATA_STREAM 0x64617461ull /* "data" */

/* The test-only dump of the sample order (test/test_blend.sh): every
 * training sample drawn is appended as "g dataset index" to this file. */
#define DUMP_ENV "DTRAIN_TEST_DUMP_SAMPLES"

static int alloc_parts(data_loader_t *d, int n)
{
    d->n_parts = n;
    d->part = calloc((size_t)n, sizeof *d->part);
    d->weight = calloc((size_t)n, sizeof *d->weight);
    d->cur.count = calloc((size_t)n, sizeof *d->cur.count);
    d->mark.count = calloc((size_t)n, sizeof *d->mark.count);
    return d->part && d->weight && d->cur.count && d->mark.count ? 0 : -1;
}

static int open_parts(data_loader_t *d, const blend_spec_t *b, int vocab_size, char *err, size_t errlen)
{
    if (alloc_parts(d, b->n) != 0) {
        snprintf(err, errlen, "out of memory opening the data");
        return -1;
    }
    for (int i = 0; i < b->n; i++) {
        data_part_t *p = &d->part[i];
        d->weight[i] = b->weight[i];
        if (data_part_open(p, b->path[i], b->fmt[i], vocab_size, d->T, err, errlen) != 0)
            return -1;
        if (d->shuffle && !(p->perm = malloc(p->n_samples * sizeof *p->perm))) {
            snprintf(err, errlen, "out of memory for the sample permutation of %s", p->path);
            return -1;
        }
        d->mapped |= p->fmt == TOKENS_FORMAT_MEGATRON;
        d->n_samples += p->n_samples;
        d->n_tokens += p->n_tokens;
    }
    return 0;
}

int data_open(data_loader_t *d, const char *spec, tokens_format_t fmt, int vocab_size, int T, int shuffle,
              uint64_t seed, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->T = T;
    d->shuffle = shuffle;
    d->seed = seed;
    d->doc_start = d->doc_end = -1;
    d->dump_fd = -1;
    blend_spec_t b;
    if (blend_parse(spec, fmt, &b, err, errlen) != 0)
        return -1;
    int rc = open_parts(d, &b, vocab_size, err, errlen);
    blend_free(&b);
    const char *dump = getenv(DUMP_ENV);
    if (rc == 0 && shuffle && dump && *dump &&
        (d->dump_fd = open(dump, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
        snprintf(err, errlen, "%s=%s: cannot open it", DUMP_ENV, dump);
        rc = -1;
    }
    if (rc != 0)
        data_close(d);
    return rc;
}

void data_close(data_loader_t *d)
{
    for (int i = 0; d->part && i < d->n_parts; i++)
        data_part_close(&d->part[i]);
    free(d->part);
    free(d->weight);
    free(d->cur.count);
    free(d->mark.count);
    if (d->dump_fd >= 0)
        close(d->dump_fd);
    memset(d, 0, sizeof *d);
}

int data_check_vocab(const data_loader_t *d, int vocab_size, int share, int shares, char *err, size_t errlen)
{
    for (int i = 0; i < d->n_parts; i++) {
        const data_part_t *p = &d->part[i];
        for (int f = 0; p->fmt == TOKENS_FORMAT_MEGATRON && f < p->n_files; f++) {
            const uint64_t n = megatron_data_n_tokens(&p->mm[f]);
            const uint64_t b = n * (uint64_t)share / (uint64_t)shares, e = n * (uint64_t)(share + 1) / (uint64_t)shares;
            if (megatron_data_check_vocab(&p->mm[f], b, e, vocab_size, err, errlen) != 0)
                return -1;
        }
    }
    return 0;
}

void data_set_doc_tokens(data_loader_t *d, int32_t doc_start, int32_t doc_end)
{
    d->doc_start = doc_start;
    d->doc_end = doc_end;
}

int data_spec_indexed(const char *spec, tokens_format_t fmt)
{
    blend_spec_t b;
    char err[8];
    if (blend_parse(spec, fmt, &b, err, sizeof err) != 0)
        return 0;
    int all = 1;
    for (int i = 0; i < b.n; i++)
        all &= b.fmt[i] == TOKENS_FORMAT_MEGATRON;
    blend_free(&b);
    return all;
}

void data_sidecar_path(const char *spec, tokens_format_t fmt, char *out, size_t outlen)
{
    blend_spec_t b;
    char err[8];
    if (blend_parse(spec, fmt, &b, err, sizeof err) != 0) {
        snprintf(out, outlen, "%s", spec);
        return;
    }
    const char *p = b.path[0];
    size_t n = strlen(p);
    const int bare = b.fmt[0] == TOKENS_FORMAT_MEGATRON && !strpbrk(p, "*?[") &&
                     !(n > 4 && (strcmp(p + n - 4, ".idx") == 0 || strcmp(p + n - 4, ".bin") == 0));
    snprintf(out, outlen, "%s%s", p, bare ? ".idx" : "");
    blend_free(&b);
}

/* Fisher-Yates with draws keyed by (seed, dataset, epoch, position): the
 * same permutation on every rank and every rerun. Dataset 0's stream is
 * the one a single dataset always had. */
static void make_permutation(const data_loader_t *d, data_part_t *p, int part, int64_t epoch)
{
    size_t n = p->n_samples;
    for (size_t i = 0; i < n; i++)
        p->perm[i] = i;
    uint64_t stream = DATA_STREAM ^ rng_mix64((uint64_t)epoch);
    if (part > 0)
        stream ^= rng_mix64(0x626c656e64ull + (uint64_t)part); /* "blend" */
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(rng_bits(d->seed, stream, i) % (uint64_t)(i + 1));
        uint64_t t = p->perm[i];
        p->perm[i] = p->perm[j];
        p->perm[j] = t;
    }
    p->perm_epoch = epoch;
}

static void cursor_copy(data_cursor_t *dst, const data_cursor_t *src, int n)
{
    dst->g = src->g;
    memcpy(dst->count, src->count, (size_t)n * sizeof *dst->count);
}

/* Advance c (counts over n parts) to g samples. */
static void cursor_advance(const double *w, int n, uint64_t *count, uint64_t *at, uint64_t g)
{
    for (; *at < g; (*at)++)
        count[blend_pick(w, count, n, *at)]++;
}

/* Dataset and its sample index of blend sample g. The cursor moves
 * forward from where it is (the callers draw in increasing g); an earlier
 * g restarts it from 0. */
static int locate(data_loader_t *d, uint64_t g, uint64_t *j)
{
    if (d->n_parts == 1) {
        *j = g;
        return 0;
    }
    if (g < d->cur.g) {
        d->cur.g = 0;
        memset(d->cur.count, 0, (size_t)d->n_parts * sizeof *d->cur.count);
    }
    cursor_advance(d->weight, d->n_parts, d->cur.count, &d->cur.g, g);
    int i = blend_pick(d->weight, d->cur.count, d->n_parts, g);
    *j = d->cur.count[i]++;
    d->cur.g++;
    return i;
}

void data_counts(const data_loader_t *d, uint64_t n, uint64_t *count)
{
    uint64_t at = 0;
    memset(count, 0, (size_t)d->n_parts * sizeof *count);
    if (d->n_parts == 1) {
        count[0] = n;
        return;
    }
    if (d->cur.g <= n) {
        at = d->cur.g;
        memcpy(count, d->cur.count, (size_t)d->n_parts * sizeof *count);
    }
    cursor_advance(d->weight, d->n_parts, count, &at, n);
}

/* The part's sample of its j-th draw: epoch j / n, permuted when training. */
static uint64_t part_sample(data_loader_t *d, int i, uint64_t j)
{
    data_part_t *p = &d->part[i];
    int64_t epoch = (int64_t)(j / p->n_samples);
    uint64_t k = j % p->n_samples;
    if (d->shuffle) {
        if (epoch != p->perm_epoch)
            make_permutation(d, p, i, epoch);
        k = p->perm[k];
    }
    return k;
}

void data_sample(data_loader_t *d, uint64_t g, int32_t *tok, int32_t *tgt, int32_t *pos)
{
    uint64_t j;
    int i = locate(d, g, &j);
    uint64_t k = part_sample(d, i, j);
    data_part_window(&d->part[i], d->T, k, tok, tgt, pos, d->doc_start, d->doc_end);
    if (d->dump_fd >= 0) {
        char line[80];
        int n = snprintf(line, sizeof line, "%llu %d %llu\n", (unsigned long long)g, i, (unsigned long long)j);
        if (write(d->dump_fd, line, (size_t)n) != n) /* a test aid: a short write shows up as a failed test */
            perror(DUMP_ENV);
    }
}

static uint64_t batch_first(int64_t step, int micro, int accum, int dp_rank, int dp_size, int B)
{
    uint64_t gb = (uint64_t)B * (uint64_t)accum * (uint64_t)dp_size;
    return (uint64_t)step * gb + ((uint64_t)micro * (uint64_t)dp_size + (uint64_t)dp_rank) * (uint64_t)B;
}

/* Read-ahead: hint the kernel at the windows of samples [g, g + B) (the
 * cursor is put back, so the next draw advances from where it was). */
static void prefetch(data_loader_t *d, uint64_t g, int B)
{
    cursor_copy(&d->mark, &d->cur, d->n_parts);
    for (int b = 0; b < B; b++) {
        uint64_t j;
        int i = locate(d, g + (uint64_t)b, &j);
        data_part_prefetch(&d->part[i], d->T, part_sample(d, i, j));
    }
    cursor_copy(&d->cur, &d->mark, d->n_parts);
}

void data_batch(data_loader_t *d, int64_t step, int micro, int accum, int dp_rank, int dp_size, int B, int32_t *tok,
                int32_t *tgt, int32_t *pos)
{
    const size_t T = (size_t)d->T;
    uint64_t first = batch_first(step, micro, accum, dp_rank, dp_size, B);
    for (int b = 0; b < B; b++)
        data_sample(d, first + (uint64_t)b, tok + (size_t)b * T, tgt + (size_t)b * T, pos ? pos + (size_t)b * T : NULL);
    const int last = micro + 1 == accum;
    if (d->mapped)
        prefetch(d, batch_first(last ? step + 1 : step, last ? 0 : micro + 1, accum, dp_rank, dp_size, B), B);
}

void data_describe(const data_loader_t *d, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "%zu tokens (%zu samples)", d->n_tokens, d->n_samples);
    for (int i = 0; d->n_parts > 1 && i < d->n_parts && n >= 0 && (size_t)n < outlen; i++) {
        const data_part_t *p = &d->part[i];
        n += snprintf(out + n, outlen - (size_t)n, "%s %.4g %s (%zu samples)", i ? "," : ": a blend of", d->weight[i],
                      p->path, p->n_samples);
    }
}
