/* One dataset of a data set (src/data/data.h): its files, opened and indexed
 * by sample. */
#include "src/data/data.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/model/docmask.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* PATH.idx / PATH.bin -> PATH in place; 0 for any other name. */
static int strip_suffix(char *s)
{
    size_t n = strlen(s);
    if (n > 4 && (strcmp(s + n - 4, ".idx") == 0 || strcmp(s + n - 4, ".bin") == 0)) {
        s[n - 4] = '\0';
        return 1;
    }
    return 0;
}

/* The dataset prefixes a Megatron path names, sorted bytewise and
 * distinct: PREFIX, PREFIX.idx, PREFIX.bin or a glob of any of them
 * (names other than .idx / .bin that a glob matches are not datasets). */
static int megatron_prefixes(const char *path, char ***out, int *n_out, char *err, size_t errlen)
{
    glob_t g;
    memset(&g, 0, sizeof g);
    char alt[4096];
    snprintf(alt, sizeof alt, "%s.idx", path);
    int grc = glob(path, 0, NULL, &g);
    if (grc == GLOB_NOMATCH) {
        globfree(&g);
        memset(&g, 0, sizeof g);
        grc = glob(alt, 0, NULL, &g);
    }
    if (grc != 0 || g.gl_pathc == 0) {
        globfree(&g);
        snprintf(err, errlen,
                 "no megatron dataset matches '%s' (neither it nor %s exists): pass PREFIX for "
                 "PREFIX.bin + PREFIX.idx, or a glob of .idx files",
                 path, alt);
        return -1;
    }
    char **v = calloc(g.gl_pathc, sizeof *v);
    int n = 0, oom = v == NULL;
    for (size_t i = 0; !oom && i < g.gl_pathc; i++) {
        char *s = strdup(g.gl_pathv[i]);
        oom = s == NULL;
        if (s && strip_suffix(s))
            v[n++] = s;
        else
            free(s);
    }
    globfree(&g);
    if (oom) {
        for (int i = 0; i < n; i++)
            free(v[i]);
        free(v);
        snprintf(err, errlen, "out of memory listing megatron datasets '%s'", path);
        return -1;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m > 0 && strcmp(v[m - 1], v[i]) == 0)
            free(v[i]);
        else
            v[m++] = v[i];
    if (m == 0) {
        free(v);
        snprintf(err, errlen,
                 "'%s' matches no .idx or .bin file: pass PREFIX for PREFIX.bin + PREFIX.idx, or a "
                 "glob of .idx files",
                 path);
        return -1;
    }
    *out = v;
    *n_out = m;
    return 0;
}

static int open_megatron(data_part_t *p, const char *path, int vocab_size, char *err, size_t errlen)
{
    char **prefix;
    int n;
    if (megatron_prefixes(path, &prefix, &n, err, errlen) != 0)
        return -1;
    int rc = 0;
    p->mm = calloc((size_t)n, sizeof *p->mm);
    if (!p->mm) {
        snprintf(err, errlen, "out of memory opening megatron datasets '%s'", path);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        rc = megatron_data_open(&p->mm[i], prefix[i], vocab_size, err, errlen);
        if (rc == 0)
            p->n_files++;
    }
    for (int i = 0; i < n; i++)
        free(prefix[i]);
    free(prefix);
    return rc;
}

static size_t file_tokens(const data_part_t *p, int f)
{
    return p->fmt == TOKENS_FORMAT_MEGATRON ? (size_t)megatron_data_n_tokens(&p->mm[f]) : p->set.shard[f].n;
}

int data_part_open(data_part_t *p, const char *path, tokens_format_t fmt, int vocab_size, int T, char *err,
                   size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->fmt = fmt;
    p->perm_epoch = -1;
    if (!(p->path = strdup(path))) {
        snprintf(err, errlen, "out of memory opening %s", path);
        return -1;
    }
    if (fmt == TOKENS_FORMAT_MEGATRON) {
        if (open_megatron(p, path, vocab_size, err, errlen) != 0)
            return -1;
    } else {
        if (tokens_open(&p->set, path, fmt, vocab_size, err, errlen) != 0)
            return -1;
        p->n_files = p->set.n_shards;
    }
    if (!(p->file_first = calloc((size_t)p->n_files + 1, sizeof *p->file_first))) {
        snprintf(err, errlen, "out of memory indexing %s", path);
        return -1;
    }
    for (int f = 0; f < p->n_files; f++) {
        size_t n = file_tokens(p, f);
        p->n_tokens += n;
        p->file_first[f + 1] = p->file_first[f] + (n > 0 ? (n - 1) / (size_t)T : 0);
    }
    p->n_samples = p->file_first[p->n_files];
    if (p->n_samples == 0) {
        snprintf(err, errlen,
                 "%s: %zu tokens hold no sample of --seq-len %d + 1 tokens; use more data or a shorter "
                 "--seq-len",
                 path, p->n_tokens, T);
        return -1;
    }
    return 0;
}

void data_part_close(data_part_t *p)
{
    tokens_close(&p->set);
    for (int f = 0; p->mm && f < p->n_files; f++)
        megatron_data_close(&p->mm[f]);
    free(p->mm);
    free(p->file_first);
    free(p->perm);
    free(p->path);
    memset(p, 0, sizeof *p);
}

/* The file holding sample k: the last f with file_first[f] <= k. */
static int file_of(const data_part_t *p, uint64_t k)
{
    int lo = 0, hi = p->n_files - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (p->file_first[mid] <= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void data_part_window(const data_part_t *p, int T, uint64_t k, int32_t *tok, int32_t *tgt, int32_t *pos,
                      int32_t doc_start, int32_t doc_end)
{
    const int f = file_of(p, k);
    const uint64_t off = (k - p->file_first[f]) * (uint64_t)T;
    if (p->fmt != TOKENS_FORMAT_MEGATRON) {
        const int32_t *src = p->set.shard[f].tok + off;
        memcpy(tok, src, (size_t)T * sizeof *tok);
        memcpy(tgt, src + 1, (size_t)T * sizeof *tgt);
        if (pos)
            docmask_positions(tok, 1, T, doc_start, doc_end, pos);
        return;
    }
    const megatron_data_t *m = &p->mm[f];
    megatron_data_tokens(m, off, (size_t)T, tok);
    memcpy(tgt, tok + 1, (size_t)(T - 1) * sizeof *tgt);
    megatron_data_tokens(m, off + (uint64_t)T, 1, tgt + T - 1);
    if (pos)
        megatron_data_positions(m, off, (size_t)T, pos);
}

void data_part_prefetch(const data_part_t *p, int T, uint64_t k)
{
    if (p->fmt != TOKENS_FORMAT_MEGATRON)
        return; /* llm.c shards are in memory */
    const int f = file_of(p, k);
    megatron_data_prefetch(&p->mm[f], (k - p->file_first[f]) * (uint64_t)T, (size_t)T + 1);
}
