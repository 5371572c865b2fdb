#include "src/convert/hf_import.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "io/fsutil.h"
#include "io/llmc_model.h"
#include "io/safetensors.h"
#include "mpi/clock.h"
#include "src/convert/hf_config.h"
#include "src/convert/hf_map.h"

/* ---- recognising PATH ------------------------------------------------------ */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int llmc_config(const char *path, model_config_t *c, char *err, size_t errlen)
{
    llmc_model_t m;
    if (llmc_model_open(&m, path, err, errlen) != 0)
        return -1;
    memset(c, 0, sizeof *c);
    *c = (model_config_t){.arch = ARCH_GPT2,
                          .vocab_size = m.vocab,
                          .n_layer = m.n_layer,
                          .n_head = m.n_head,
                          .n_kv_head = m.n_head,
                          .d_model = m.d_model,
                          .d_ff = 4 * m.d_model,
                          .max_seq = m.max_seq,
                          .norm_eps = 1e-5f,
                          .rope_theta = 0};
    llmc_model_close(&m);
    char why[512];
    if (model_config_check(c, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s", path, why);
        return -1;
    }
    return 0;
}

int init_from_probe(const char *path, init_from_kind_t *kind, char *dir, size_t dirlen, model_config_t *c, char *err,
                    size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "--init-from %s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        *kind = INIT_FROM_HF;
        snprintf(dir, dirlen, "%s", path);
        return hf_config_read(dir, c, err, errlen);
    }
    unsigned char magic[4] = {0};
    int fd = open(path, O_RDONLY);
    ssize_t got = fd >= 0 ? read(fd, magic, sizeof magic) : -1;
    if (fd >= 0)
        close(fd);
    const uint32_t m =
        (uint32_t)magic[0] | (uint32_t)magic[1] << 8 | (uint32_t)magic[2] << 16 | (uint32_t)magic[3] << 24;
    if (got == 4 && m == LLMC_MODEL_MAGIC) {
        *kind = INIT_FROM_LLMC;
        return llmc_config(path, c, err, errlen);
    }
    if (ends_with(path, "config.json") || ends_with(path, ".safetensors") || ends_with(path, ".index.json")) {
        *kind = INIT_FROM_HF;
        const char *slash = strrchr(path, '/');
        snprintf(dir, dirlen, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        return hf_config_read(dir, c, err, errlen);
    }
    snprintf(err, errlen,
             "--init-from %s: neither a Hugging Face model directory (config.json and "
             "model.safetensors) nor an llm.c model file (magic %d)",
             path, LLMC_MODEL_MAGIC);
    return -1;
}

/* ---- reading the slices ----------------------------------------------------- */

/* Resident set now, or its peak since the last reset (kB; -1 unknown). */
static long proc_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0 && line[k] == ':')
            v = strtol(line + k + 1, NULL, 10);
    fclose(f);
    return v;
}

/* Linux: writing 5 to clear_refs resets VmHWM to the current RSS. */
static int reset_peak_rss(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    if (fd < 0)
        return -1;
    int ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok ? 0 : -1;
}

/* One source of tensors: a Hugging Face directory or an llm.c file. */
typedef struct source {
    init_from_kind_t kind;
    const char *path; /* for messages */
    st_model_t st;
    llmc_model_t llmc;
    hf_map_t *map;
    int n_map;
    unsigned dtypes; /* bit per st_dtype_t seen */
    init_from_report_t *rep;
    float *tmp; /* staging, tmp_floats */
    size_t tmp_floats;
} source_t;

static int src_tmp(source_t *s, size_t floats, char *err, size_t errlen)
{
    if (floats <= s->tmp_floats)
        return 0;
    float *t = realloc(s->tmp, floats * sizeof *t);
    if (!t) {
        snprintf(err, errlen, "%s: out of memory for %zu staging floats", s->path, floats);
        return -1;
    }
    s->tmp = t;
    s->tmp_floats = floats;
    if (floats * sizeof *t > s->rep->staging_peak)
        s->rep->staging_peak = floats * sizeof *t;
    return 0;
}

/* The HF file's tensor for e, checked against the map: dtype and shape. */
static int hf_tensor_of(source_t *s, const hf_map_t *e, const st_file_t **f, const st_tensor_t **t, char *err,
                        size_t errlen)
{
    if (st_model_find(&s->st, e->src, f, t) != 0) {
        snprintf(err, errlen, "%s: tensor %s (dtrain's %s) is missing", s->path, e->src, e->name);
        return -1;
    }
    const st_tensor_t *x = *t;
    if (x->dtype != ST_F32 && x->dtype != ST_F16 && x->dtype != ST_BF16) {
        snprintf(err, errlen, "%s: tensor %s has dtype %s: dtrain imports F32, F16 and BF16", s->path, e->src,
                 x->dtype_name);
        return -1;
    }
    if (x->ndim != e->src_ndim || x->shape[0] != e->src_shape[0] || (x->ndim == 2 && x->shape[1] != e->src_shape[1])) {
        char want[64], got[96] = "";
        if (e->src_ndim == 1)
            snprintf(want, sizeof want, "[%lld]", (long long)e->src_shape[0]);
        else
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)e->src_shape[0], (long long)e->src_shape[1]);
        for (int d = 0; d < x->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)x->shape[d]);
        snprintf(err, errlen, "%s: tensor %s has shape [%s], the config's model needs %s", s->path, e->src, got, want);
        return -1;
    }
    s->dtypes |= 1u << x->dtype;
    return 0;
}

static int has_suffix(const char *s, const char *suffix)
{
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Why a Llama-shaped checkpoint's extra tensor cannot be taken, when it is
 * one dtrain knows of: a bias or norm that another architecture (or
 * none) has, which dropping would change the model. */
static const char *extra_why(const char *name, const model_config_t *c)
{
    if (c->arch != ARCH_LLAMA)
        return "an extra tensor: a different architecture or configuration?";
    if (has_suffix(name, ".self_attn.o_proj.bias"))
        return "an o_proj bias, which Qwen2 does not have and dtrain's Llama cannot hold (q/k/v biases "
               "only): dtrain cannot train this checkpoint";
    if (has_suffix(name, "_proj.bias") && strstr(name, ".mlp.") != NULL)
        return "an MLP bias, which dtrain's Llama MLP does not have: dtrain cannot train this checkpoint";
    if (has_suffix(name, ".self_attn.q_proj.bias") || has_suffix(name, ".self_attn.k_proj.bias") ||
        has_suffix(name, ".self_attn.v_proj.bias"))
        return "a q/k/v bias, which only Qwen2ForCausalLM has: is config.json's architectures right?";
    if (has_suffix(name, ".self_attn.q_norm.weight") || has_suffix(name, ".self_attn.k_norm.weight"))
        return "a per-head q/k norm, which only Qwen3ForCausalLM has: is config.json's architectures right?";
    return "an extra tensor: a different architecture or configuration?";
}

/* Every tensor of the directory is one the map reads, a known buffer, or
 * GPT-2's lm_head (checked against wte later). */
static int hf_check_extra(source_t *s, const model_config_t *c, char *err, size_t errlen)
{
    for (int i = 0; i < s->st.n_index; i++) {
        const char *name = s->st.index[i].name;
        int used = hf_map_ignorable(name) || (model_head_tied(c) && strcmp(name, "lm_head.weight") == 0);
        for (int k = 0; k < s->n_map && !used; k++)
            used = strcmp(s->map[k].src, name) == 0;
        if (!used) {
            snprintf(err, errlen, "%s: tensor %s is not part of dtrain's %s model (%s)", s->path, name,
                     model_arch_name(c->arch), extra_why(name, c));
            return -1;
        }
    }
    return 0;
}

/* Source block of e (dtrain rows r0.., cols c0..) into dst[nr][nc]. */
static int src_read(source_t *s, const hf_map_t *e, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst,
                    char *err, size_t errlen)
{
    int64_t sr0, snr, sc0, snc;
    int tr;
    hf_map_src_block(e, r0, nr, c0, nc, &sr0, &snr, &sc0, &snc, &tr);
    if (s->kind == INIT_FROM_LLMC) {
        s->rep->bytes_read += (uint64_t)(snr * snc) * s->llmc.itemsize;
        return llmc_model_read_f32(&s->llmc, (llmc_tensor_t)e->llmc_id, e->layer, sr0, snr, sc0, snc, dst, err, errlen);
    }
    const st_file_t *f;
    const st_tensor_t *t;
    if (hf_tensor_of(s, e, &f, &t, err, errlen) != 0)
        return -1;
    s->rep->bytes_read += (uint64_t)(snr * snc) * st_dtype_size(t->dtype);
    return st_read_f32(f, t, sr0, snr, sc0, snc, tr, dst, err, errlen);
}

/* Drops the mapped file pages read so far from this process's resident
 * set (they stay in the page cache): the import then holds at most one
 * tensor's source pages at a time. */
static void src_drop_pages(const source_t *s)
{
    if (s->kind == INIT_FROM_LLMC) {
        if (s->llmc.mapped && s->llmc.map)
            madvise(s->llmc.map, s->llmc.size, MADV_DONTNEED);
        return;
    }
    for (int i = 0; i < s->st.n_files; i++)
        if (s->st.files[i].mapped && s->st.files[i].map)
            madvise(s->st.files[i].map, s->st.files[i].size, MADV_DONTNEED);
}

/* Logical rows [r0, r0+n) of dtrain tensor name, columns [c0, c0+cols),
 * into dst[n][cols] from the map's entries that cover them (one, or for a
 * MoE expert stack each expert's source tensor). */
static int load_rows(source_t *s, const char *name, int64_t r0, int64_t n, int64_t c0, int64_t cols, float *dst,
                     char *err, size_t errlen)
{
    int64_t got = 0;
    for (int i = 0; i < s->n_map; i++) {
        const hf_map_t *e = &s->map[i];
        if (strcmp(e->name, name) != 0)
            continue;
        const int64_t lo = r0 > e->row0 ? r0 : e->row0;
        const int64_t hi = r0 + n < e->row0 + e->nrows ? r0 + n : e->row0 + e->nrows;
        if (lo >= hi)
            continue;
        float *out = dst + (lo - r0) * cols;
        if (src_read(s, e, lo, hi - lo, c0, cols, out, err, errlen) != 0)
            return -1;
        if (e->flags & HF_MAP_ROPE) {
            if (src_tmp(s, (size_t)e->head_size * (size_t)cols, err, errlen) != 0)
                return -1;
            hf_rope_to_dtrain(out, hi - lo, cols, e->head_size, s->tmp);
        }
        got += hi - lo;
    }
    if (got != n) {
        snprintf(err, errlen, "%s: no source for rows %lld.. of dtrain tensor %s (internal: the map and the table "
                 "disagree)", s->path, (long long)r0, name);
        return -1;
    }
    return 0;
}

/* This rank's slice of table tensor d into host: its rows, or each of its
 * blocks of rows (a MoE expert stack's, param_desc_t groups). */
static int load_tensor(source_t *s, const param_desc_t *d, float *host, char *err, size_t errlen)
{
    float *dst = host + d->offset;
    const int64_t rows = d->count[0], cols = d->count[1];
    const int blocks = d->groups > 1 ? d->held : 1;
    /* vocabulary padding rows: memory only, zero */
    memset(dst + rows * blocks * cols, 0, (size_t)(d->local_rows - rows * blocks) * (size_t)cols * sizeof *dst);
    for (int k = 0; k < blocks && rows > 0; k++)
        if (load_rows(s, d->name, param_logical_row(d, (int64_t)k * rows), rows, d->start[1], cols,
                      dst + (int64_t)k * rows * cols, err, errlen) != 0)
            return -1;
    return 0;
}

/* GPT-2 ties the head to wte, a tied Llama to tok_emb: a stored
 * lm_head.weight must equal the embedding. */
static int check_tied_head(source_t *s, const model_config_t *c, const param_table_t *t, const float *host, char *err,
                           size_t errlen)
{
    const int k = param_table_find(t, model_embed_name(c));
    if (k < 0 || s->kind != INIT_FROM_HF || st_model_find(&s->st, "lm_head.weight", NULL, NULL) != 0)
        return 0;
    const param_desc_t *d = &t->p[k];
    const hf_map_t *emb = hf_map_find(s->map, s->n_map, model_embed_name(c));
    hf_map_t head = *emb;
    snprintf(head.src, sizeof head.src, "lm_head.weight");
    const size_t n = (size_t)d->count[0] * (size_t)d->count[1];
    if (src_tmp(s, n, err, errlen) != 0 ||
        src_read(s, &head, d->start[0], d->count[0], 0, d->count[1], s->tmp, err, errlen) != 0)
        return -1;
    if (memcmp(s->tmp, host + d->offset, n * sizeof *host) != 0) {
        snprintf(err, errlen,
                 "%s: tensor lm_head.weight differs from %s: the config ties the head to the embedding "
                 "(tie_word_embeddings)",
                 s->path, emb->src);
        return -1;
    }
    return 0;
}

static void report_dtypes(const source_t *s, init_from_report_t *rep)
{
    rep->dtypes[0] = '\0';
    if (s->kind == INIT_FROM_LLMC) {
        snprintf(rep->dtypes, sizeof rep->dtypes, "%s", s->llmc.itemsize == 2 ? "bf16" : "f32");
        return;
    }
    static const struct {
        st_dtype_t d;
        const char *n;
    } names[] = {{ST_F32, "f32"}, {ST_F16, "f16"}, {ST_BF16, "bf16"}};
    for (int i = 0; i < 3; i++)
        if (s->dtypes & (1u << names[i].d))
            snprintf(rep->dtypes + strlen(rep->dtypes), sizeof rep->dtypes - strlen(rep->dtypes), "%s%s",
                     rep->dtypes[0] ? "+" : "", names[i].n);
}

/* A MoE checkpoint's routers have as many rows as config.json has
 * experts: the first that does not is named with both counts. */
static int check_experts(source_t *s, const model_config_t *c, char *err, size_t errlen)
{
    for (int i = 0; i < s->n_map && c->moe.experts; i++) {
        const hf_map_t *e = &s->map[i];
        const st_tensor_t *t;
        if (!has_suffix(e->name, ".moe.router") || st_model_find(&s->st, e->src, NULL, &t) != 0)
            continue;
        if (t->ndim == 2 && t->shape[1] == c->d_model && t->shape[0] != c->moe.experts) {
            snprintf(err, errlen,
                     "%s: tensor %s routes to %lld experts, config.json's model has %d (num_local_experts or "
                     "num_experts): the checkpoint and its config disagree",
                     s->path, e->src, (long long)t->shape[0], c->moe.experts);
            return -1;
        }
    }
    return 0;
}

static int open_source(source_t *s, const char *path, const model_config_t *c, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    model_config_t fc;
    if (init_from_probe(path, &s->kind, dir, sizeof dir, &fc, err, errlen) != 0)
        return -1;
    if (s->kind == INIT_FROM_LLMC) {
        if (llmc_model_open(&s->llmc, path, err, errlen) != 0)
            return -1;
        s->rep->n_files = 1;
        return hf_map_build(c, HF_FMT_LLMC, NULL, &s->map, &s->n_map, err, errlen);
    }
    if (st_model_open(&s->st, dir, err, errlen) != 0)
        return -1;
    s->rep->n_files = s->st.n_files;
    const char *prefix = st_model_find(&s->st, "transformer.wte.weight", NULL, NULL) == 0 ? "transformer." : "";
    if (hf_map_build(c, HF_FMT_HF, prefix, &s->map, &s->n_map, err, errlen) != 0)
        return -1;
    if (check_experts(s, c, err, errlen) != 0)
        return -1;
    /* validate every tensor's name, dtype and shape (the headers alone)
     * on every rank, so a bad file fails the same way everywhere */
    for (int i = 0; i < s->n_map; i++) {
        const st_file_t *f;
        const st_tensor_t *t;
        if (hf_tensor_of(s, &s->map[i], &f, &t, err, errlen) != 0)
            return -1;
    }
    if (model_head_tied(c)) {
        hf_map_t head = *hf_map_find(s->map, s->n_map, model_embed_name(c));
        snprintf(head.src, sizeof head.src, "lm_head.weight");
        const st_file_t *f;
        const st_tensor_t *t;
        if (st_model_find(&s->st, "lm_head.weight", NULL, NULL) == 0 &&
            hf_tensor_of(s, &head, &f, &t, err, errlen) != 0)
            return -1;
    }
    return hf_check_extra(s, c, err, errlen);
}

static void close_source(source_t *s)
{
    if (s->kind == INIT_FROM_LLMC && s->llmc.path)
        llmc_model_close(&s->llmc);
    if (s->kind == INIT_FROM_HF && s->st.files)
        st_model_close(&s->st);
    free(s->map);
    free(s->tmp);
}

/* The import's loaders: --threads threads (at most LOADER_MAX) take the
 * table's tensors in turn from a shared counter, each with its own copy of
 * the source (its staging, counters and first failure; the files, maps and
 * name map shared and only read). No barrier between tensors: a thread
 * descheduled on a loaded machine holds up only its own tensor (a split of
 * each copy across OpenMP threads waited at every tensor's barrier and ran
 * 2x slower). On the dev VM's 2 cores, gpt2-124m's fp32 import at 1 rank:
 * 0.17 s on one thread, whose transposes of the Conv1D matrices a second
 * thread now shares. A fresh destination (not the model's resident
 * parameters) is faulted in a tensor at a time with MADV_POPULATE_WRITE
 * (one call instead of a trap on every 4 KiB page the copy first touches:
 * the fill of 498 MB 1.17 s -> 0.95 s on one thread); a kernel without it
 * (before 5.14: EINVAL) leaves the faults to the copy. The first failure
 * in table order is the one reported, as one thread would: every tensor
 * before a failing one was taken before it and is finished. */
#define LOADER_MAX 8
typedef struct loader {
    source_t src; /* this thread's copy: own tmp, dtypes and report */
    init_from_report_t rep;
    const param_table_t *t;
    float *host;
    int fresh;
    atomic_int *next, *stop;
    int failed_at; /* the table index of its failure, or t->n */
    char err[1024];
} loader_t;

static void populate_dest(const float *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    fs_advise(p, n * sizeof *p, MADV_POPULATE_WRITE);
#else
    (void)p, (void)n;
#endif
}

static void *loader_run(void *arg)
{
    loader_t *l = arg;
    const param_table_t *t = l->t;
    /* stop is read before a tensor is taken, never between taking and
     * loading it: every tensor taken is loaded, so none before a failing
     * one is skipped */
    while (!atomic_load(l->stop)) {
        const int k = atomic_fetch_add(l->next, 1);
        if (k >= t->n)
            break;
        if (l->fresh)
            populate_dest(l->host + t->p[k].offset, (size_t)t->p[k].local_rows * (size_t)t->p[k].count[1]);
        if (load_tensor(&l->src, &t->p[k], l->host, l->err, sizeof l->err) != 0) {
            l->failed_at = k;
            atomic_store(l->stop, 1);
            break;
        }
        src_drop_pages(&l->src);
        const uint64_t b = (uint64_t)t->p[k].numel * sizeof(float);
        l->rep.largest_tensor = b > l->rep.largest_tensor ? b : l->rep.largest_tensor;
    }
    return NULL;
}

/* Runs n loaders (the first on this thread) over t; the lowest failure in
 * err. Merges their reports into s and rep. */
static int run_loaders(source_t *s, const param_table_t *t, float *host, int fresh, int n, init_from_report_t *rep,
                       char *err, size_t errlen)
{
    loader_t l[LOADER_MAX];
    pthread_t th[LOADER_MAX];
    atomic_int next = 0, stop = 0;
    int started = 1, rc = 0;
    for (int i = 0; i < n; i++) {
        l[i] = (loader_t){
            .src = *s, .t = t, .host = host, .fresh = fresh, .next = &next, .stop = &stop, .failed_at = t->n};
        l[i].src.rep = &l[i].rep;
        l[i].src.tmp = NULL, l[i].src.tmp_floats = 0, l[i].src.dtypes = 0;
    }
    while (started < n && pthread_create(&th[started], NULL, loader_run, &l[started]) == 0)
        started++;
    loader_run(&l[0]);
    int first = t->n;
    for (int i = 0; i < n; i++) {
        if (i > 0 && i < started)
            pthread_join(th[i], NULL);
        if (i < started && l[i].failed_at < first) {
            first = l[i].failed_at;
            snprintf(err, errlen, "%s", l[i].err);
            rc = -1;
        }
        s->dtypes |= l[i].src.dtypes;
        rep->bytes_read += l[i].rep.bytes_read;
        rep->staging_peak = l[i].rep.staging_peak > rep->staging_peak ? l[i].rep.staging_peak : rep->staging_peak;
        rep->largest_tensor =
            l[i].rep.largest_tensor > rep->largest_tensor ? l[i].rep.largest_tensor : rep->largest_tensor;
        free(l[i].src.tmp);
    }
    return rc;
}

int init_from_load(const char *path, const model_config_t *c, const param_table_t *t, float *host, int fresh,
                   init_from_report_t *rep, char *err, size_t errlen)
{
    memset(rep, 0, sizeof *rep);
    const double t0 = now_s();
    const long rss0 = reset_peak_rss() == 0 ? proc_status_kb("VmRSS") : -1;
    source_t s = {.path = path, .rep = rep};
    int rc = open_source(&s, path, c, err, errlen);
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    threads = threads < 1 ? 1 : threads > LOADER_MAX ? LOADER_MAX : threads;
    if (rc == 0)
        rc = run_loaders(&s, t, host, fresh, threads, rep, err, errlen);
    if (rc == 0 && model_head_tied(c))
        rc = check_tied_head(&s, c, t, host, err, errlen);
    rep->kind = s.kind;
    report_dtypes(&s, rep);
    close_source(&s);
    const long hwm = proc_status_kb("VmHWM");
    rep->rss_growth_kb = rss0 >= 0 && hwm >= 0 ? hwm - rss0 : -1;
    rep->local_bytes = (uint64_t)t->numel * sizeof(float);
    rep->seconds = now_s() - t0;
    return rc;
}
