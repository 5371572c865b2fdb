/* The export driver: outputs, tiles, the collective read, the tile
 * transforms and the agreed steps around a target (src/convert/export.h). */
#define _GNU_SOURCE /* renameat2 */
#include "src/convert/export.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "base/transpose.h"
#include "io/fsutil.h"
#include "io/publish.h"
#include "mpi/agree.h"
#include "mpi/clock.h"
#include "src/convert/deal.h"

const char *const export_dtype_names[] = {[EXPORT_F32] = "fp32", [EXPORT_BF16] = "bf16", [EXPORT_F16] = "fp16", NULL};

const char *export_dtype_name(export_dtype_t d)
{
    return export_dtype_names[d == EXPORT_BF16 || d == EXPORT_F16 ? d : EXPORT_F32];
}

/* ---- outputs and tiles ---------------------------------------------------- */

static int same_output(const hf_map_t *a, const hf_map_t *b)
{
    return strcmp(a->src, b->src) == 0 && a->layer == b->layer;
}

/* The output of entries map[first .. first+count): its stored shape, the
 * rows dtrain fills and the tile alignment. */
static void describe_output(const hf_map_t *map, int first, int count, export_out_t *o)
{
    const hf_map_t *e0 = &map[first];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", e0->src);
    o->llmc_id = e0->llmc_id;
    o->layer = e0->layer;
    o->ndim = e0->src_ndim;
    o->rows = e0->src_ndim == 1 ? 1 : e0->src_shape[0];
    o->cols = e0->src_ndim == 1 ? e0->src_shape[0] : e0->src_shape[1];
    o->align = 1;
    o->first = first;
    o->count = count;
    for (int k = first; k < first + count; k++) {
        const hf_map_t *e = &map[k];
        int64_t end = e->ndim == 1 ? 1 : (e->flags & HF_MAP_TRANSPOSE) ? o->rows : e->off + e->nrows;
        if (end > o->covered)
            o->covered = end;
        if ((e->flags & HF_MAP_ROPE) && e->head_size > o->align)
            o->align = e->head_size;
    }
}

int export_outputs(const export_target_t *tg, const model_config_t *c, hf_map_t **map, int *n_map, export_out_t **out,
                   int *n_out, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    if (hf_map_build(c, tg->map_format, tg->map_prefix, map, n_map, err, errlen) != 0)
        return -1;
    export_out_t *o = calloc((size_t)*n_map + 1, sizeof *o);
    if (!o) {
        snprintf(err, errlen, "out of memory for the export plan");
        return -1;
    }
    int n = 0;
    for (int k = 0; k < *n_map;) {
        int count = 1;
        while (k + count < *n_map && same_output(&(*map)[k], &(*map)[k + count]))
            count++;
        describe_output(*map, k, count, &o[n++]);
        k += count;
    }
    /* the map lists each output's entries together: a name seen twice
     * would be written twice */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(o[i].name, o[j].name) == 0 && o[i].layer == o[j].layer) {
                snprintf(err, errlen, "internal: the %s map lists %s twice apart", tg->name, o[i].name);
                free(o);
                return -1;
            }
    *out = o;
    *n_out = n;
    return 0;
}

typedef struct tile {
    int out;
    int64_t r0, nr;
    int64_t bytes; /* fp32 bytes of the tile */
    int owner;
    int n_shards; /* this rank's read blocks for it (owner only) */
} tile_t;

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Tiles that cover whole checksum records of the input (a record is one
 * HDF5 chunk: the writer's TP slice), since a record a read covers only in
 * part is read a second time to verify it. A non-transposed entry takes
 * whole chunks of rows; a transposed one reads a column block of every
 * row, which never covers a record, so its output is one tile (GPT-2's
 * Conv1D weights: tens of MB at most). */
static void align_to_records(const hf_map_t *map, export_out_t *o, h5store_t *h)
{
    for (int k = o->first; k < o->first + o->count; k++) {
        const hf_map_t *e = &map[k];
        char full[H5STORE_NAME_MAX];
        snprintf(full, sizeof full, "params/%s", e->name);
        const h5store_tensor_t *t = h5store_find(h, full);
        if (e->ndim == 1 || !t)
            continue;
        if (e->flags & HF_MAP_TRANSPOSE) {
            o->align = o->covered;
            return;
        }
        const int64_t rows = t->chunk[0] > 0 && t->chunk[0] < e->nrows ? t->chunk[0] : e->nrows;
        o->align = o->align / gcd64(o->align, rows) * rows;
    }
    if (o->align > o->covered)
        o->align = o->covered;
}

static int64_t tile_rows(const export_out_t *o, int64_t tile_bytes)
{
    int64_t per = tile_bytes / (o->cols * (int64_t)sizeof(float));
    per = per / o->align * o->align;
    return per < o->align ? o->align : per;
}

/* Every output's covered rows cut into tiles, dealt largest first to the
 * least loaded rank. Pure: the same on every rank. */
static int plan_tiles(const export_out_t *o, int n_out, int nranks, int64_t tile_bytes, tile_t **out, int *n_tiles,
                      char *err, size_t errlen)
{
    int n = 0;
    for (int i = 0; i < n_out; i++) {
        const int64_t per = tile_rows(&o[i], tile_bytes);
        n += (int)((o[i].covered + per - 1) / per);
    }
    tile_t *t = calloc((size_t)n + 1, sizeof *t);
    int64_t *bytes = malloc(((size_t)n + 1) * sizeof *bytes);
    int *owner = malloc(((size_t)n + 1) * sizeof *owner);
    int k = 0;
    for (int i = 0; t && bytes && owner && i < n_out; i++) {
        const int64_t per = tile_rows(&o[i], tile_bytes);
        for (int64_t r = 0; r < o[i].covered; r += per, k++) {
            const int64_t nr = o[i].covered - r < per ? o[i].covered - r : per;
            t[k] = (tile_t){.out = i, .r0 = r, .nr = nr, .bytes = nr * o[i].cols * (int64_t)sizeof(float)};
            bytes[k] = t[k].bytes;
        }
    }
    const int rc = t && bytes && owner ? deal_by_size(bytes, n, nranks, owner) : -1;
    for (int i = 0; rc == 0 && i < n; i++)
        t[i].owner = owner[i];
    free(bytes);
    free(owner);
    if (rc != 0) {
        free(t);
        snprintf(err, errlen, "out of memory for the export plan");
        return -1;
    }
    *out = t;
    *n_tiles = n;
    return 0;
}

/* ---- the dtrain blocks of a tile ------------------------------------------ */

/* The block of dtrain tensor e that tile rows [r0, r0+nr) of its output
 * take: start/count in dtrain's logical coordinates (output row off + i
 * is dtrain row row0 + i). 0 when the tile takes nothing of e. */
static int entry_block(const hf_map_t *e, int64_t r0, int64_t nr, int64_t start[2], int64_t count[2])
{
    if (e->ndim == 1) { /* the whole vector, into the output's one row */
        start[0] = start[1] = 0;
        count[0] = e->shape[0];
        count[1] = 1;
        return 1;
    }
    if (e->flags & HF_MAP_TRANSPOSE) { /* output row j is dtrain column j */
        start[0] = 0;
        start[1] = r0;
        count[0] = e->shape[0];
        count[1] = nr;
        return 1;
    }
    const int64_t lo = r0 > e->off ? r0 : e->off;
    const int64_t hi = r0 + nr < e->off + e->nrows ? r0 + nr : e->off + e->nrows;
    if (lo >= hi)
        return 0;
    start[0] = e->row0 + lo - e->off;
    start[1] = 0;
    count[0] = hi - lo;
    count[1] = e->shape[1];
    return 1;
}

static int find_param(const h5store_tensor_t *list, int n, const char *name)
{
    char full[H5STORE_NAME_MAX];
    snprintf(full, sizeof full, "params/%s", name);
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].name, full) == 0)
            return i;
    return -1;
}

/* One dtrain block of a tile: its first float and the floats from one of
 * its rows to the next; a view into the input's mapping or the read
 * buffer. */
typedef struct tile_blk {
    const float *p;
    int64_t ld;
    int view;
} tile_blk_t;

/* Tile t's dtrain blocks, in entry order, into blk[]: with view, each a
 * view of the input's mapping where its layout allows one (no copy: the
 * writer reads the input's pages), else read into buf (which advances);
 * each record of the input that a block covers whole is verified on the
 * way (tiles cover whole records: align_to_records). Views are for the
 * tiles written as stored: one that is transposed or assembled anyway
 * reads a little faster into buf, which then stays in cache for the
 * checksums and the transpose, than through the mapping, whose pages are
 * mapped one by one first (gpt2-124m on tmpfs, medians of alternating
 * pairs, s: 1 rank 0.38 against 0.43 and 0.37 against 0.37, 2 ranks 0.41
 * against 0.44 and 0.32 against 0.34, 4 ranks 0.36 against 0.38).
 * Independent. */
static int read_tile(h5store_t *h, const hf_map_t *map, const export_out_t *o, tile_t *t, const h5store_tensor_t *plist,
                     int n_params, int view, float *buf, tile_blk_t *blk, char *err, size_t errlen)
{
    int64_t start[2], count[2];
    int ns = 0;
    for (int k = o->first; k < o->first + o->count; k++) {
        if (!entry_block(&map[k], t->r0, t->nr, start, count))
            continue;
        const int pi = find_param(plist, n_params, map[k].name);
        if (pi < 0) {
            snprintf(err, errlen, "tensor params/%s: not in the input", map[k].name);
            return -1;
        }
        const int v = view ? h5store_view(h, plist[pi].name, start, count, &blk[ns].p, &blk[ns].ld, err, errlen) : 0;
        if (v < 0)
            return -1;
        blk[ns].view = v;
        if (!v) {
            if (h5store_read(h, plist[pi].name, start, count, buf, err, errlen) != 0)
                return -1;
            blk[ns] = (tile_blk_t){.p = buf, .ld = count[1]};
            buf += count[0] * count[1];
        }
        ns++;
    }
    t->n_shards = ns;
    return 0;
}

/* n rows of cols floats, ld apart at src, into dst (rows back to back). */
static void copy_rows(float *dst, const float *src, int64_t n, int64_t cols, int64_t ld)
{
    if (ld == cols)
        memcpy(dst, src, (size_t)(n * cols) * sizeof *dst);
    else
        for (int64_t r = 0; r < n; r++)
            memcpy(dst + r * cols, src + r * ld, (size_t)cols * sizeof *dst);
}

/* Tile rows [r0, r0+nr) of output o, [nr][o->cols], from the blocks read
 * for it (in entry order, as read_tile made them). head: one RoPE head's
 * scratch, align * cols floats. */
static void assemble_tile(const hf_map_t *map, const export_out_t *o, const tile_t *t, const tile_blk_t *blk,
                          float *rows, float *head)
{
    const int64_t cols = o->cols;
    int s = 0;
    int64_t start[2], count[2];
    /* zeros where no entry writes; none where one entry writes every row (GPT-2's Conv1D weights) */
    if (o->count != 1 || !entry_block(&map[o->first], t->r0, t->nr, start, count) ||
        count[0] * count[1] != t->nr * cols)
        memset(rows, 0, (size_t)(t->nr * cols) * sizeof *rows);
    for (int k = o->first; k < o->first + o->count; k++) {
        const hf_map_t *e = &map[k];
        if (!entry_block(e, t->r0, t->nr, start, count))
            continue;
        const tile_blk_t *b = &blk[s++];
        if (e->ndim == 1) { /* [R] -> row 0, columns [off, off+R) (1-D blocks are contiguous) */
            memcpy(rows + e->off, b->p, (size_t)count[0] * sizeof *rows);
            if (e->flags & HF_MAP_ROPE) /* q/k biases and norms: elements in RoPE's order, whole heads */
                hf_rope_to_hf(rows + e->off, count[0], 1, e->head_size, head);
        } else if (e->flags & HF_MAP_TRANSPOSE) { /* blk [R][nr] -> rows[j][off + i] */
            dt_transpose_f32(b->p, count[0], count[1], b->ld, rows + e->off, cols);
        } else { /* blk [n][cols] -> rows [e->off + start - row0 - r0, ...), RoPE's order there */
            float *dst = rows + (e->off + start[0] - e->row0 - t->r0) * cols;
            copy_rows(dst, b->p, count[0], cols, b->ld);
            if (e->flags & HF_MAP_ROPE)
                hf_rope_to_hf(dst, count[0], count[1], e->head_size, head);
        }
    }
}

/* ---- the agreed steps -------------------------------------------------------- */

/* 0 when dir looks like an export --force may replace: regular files only
 * (an export has no subdirectories) and a config.json (Hugging Face's), so
 * a mistyped --to-hf of a home or run directory is refused, not emptied. */
static int replaceable_dir(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    int has_config = 0, rc = 0;
    struct dirent *e;
    char p[PATH_MAX];
    struct stat st;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        has_config |= strcmp(e->d_name, "config.json") == 0;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p || lstat(p, &st) != 0 ||
            !S_ISREG(st.st_mode)) {
            snprintf(err, errlen,
                     "%s holds %.200s, which is not a regular file: --force replaces only a model "
                     "directory an export wrote; choose another path",
                     dir, e->d_name);
            rc = -1;
        }
    }
    closedir(d);
    if (rc == 0 && !has_config) {
        snprintf(err, errlen,
                 "%s has no config.json, so it is not a model directory an export wrote: --force "
                 "will not replace it; choose another path",
                 dir);
        rc = -1;
    }
    return rc;
}

/* 0 unless the input is dest itself or lies below it (replacing dest
 * would delete the file being exported). */
static int input_outside(const char *input, const char *dest, const struct stat *dest_st, char *err, size_t errlen)
{
    char path[PATH_MAX];
    struct stat st;
    if (!realpath(input, path))
        return 0; /* the input's own checks report it */
    for (;;) {
        if (stat(path, &st) == 0 && st.st_dev == dest_st->st_dev && st.st_ino == dest_st->st_ino) {
            snprintf(err, errlen, "%s %s the input %s: write the export somewhere else", dest,
                     S_ISDIR(dest_st->st_mode) ? "holds" : "is", input);
            return -1;
        }
        char *slash = strrchr(path, '/');
        if (!slash || slash == path)
            return 0;
        *slash = '\0';
    }
}

/* Rank 0's checks of dest: absent, or with --force the same kind of thing,
 * neither the input nor holding it, and (a directory) one an export wrote;
 * x->tmp, the temporary name beside it. */
static int check_dest(const export_target_t *tg, export_ctx_t *x, char *err, size_t errlen)
{
    const char *dest = x->opt->dest;
    const int want_dir = tg == &export_target_hf;
    struct stat st;
    if (stat(dest, &st) == 0) {
        if (!x->opt->force) {
            snprintf(err, errlen, "%s exists: remove it, choose another path, or pass --force to replace it", dest);
            return -1;
        }
        if (want_dir != !!S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "%s exists and is %s: --force replaces a %s only", dest,
                     S_ISDIR(st.st_mode) ? "a directory" : "not a directory", want_dir ? "directory" : "file");
            return -1;
        }
        if (input_outside(x->opt->input, dest, &st, err, errlen) != 0 ||
            (want_dir && replaceable_dir(dest, err, errlen) != 0))
            return -1;
    } else if (errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", dest, strerror(errno));
        return -1;
    }
    return export_tmp_name(dest, x->tmp, sizeof x->tmp, err, errlen);
}

/* Rank 0, once the export is known to go ahead (so a refused one makes no
 * directories): dest's parent made as mkdir -p does and probed for a new
 * file, and a temporary left by a killed export removed. */
static int make_room(export_ctx_t *x, char *err, size_t errlen)
{
    char failed[PATH_MAX];
    struct stat st;
    if (fs_mkdir_parent(x->opt->dest, failed, sizeof failed) != 0) {
        snprintf(err, errlen, "%s: cannot create directory %.512s: %s", x->opt->dest, failed, strerror(errno));
        return -1;
    }
    if (fs_probe_parent(x->tmp, failed, sizeof failed) != 0) {
        snprintf(err, errlen, "%s: cannot write into directory %.512s: %s", x->opt->dest, failed, strerror(errno));
        return -1;
    }
    export_remove(x->tmp);
    if (lstat(x->tmp, &st) == 0) {
        snprintf(err, errlen, "%s, left by an earlier export, cannot be removed: remove it by hand", x->tmp);
        return -1;
    }
    return 0;
}

/* Rank 0's string to every rank. */
static int bcast_str(comm_t *world, char *s, size_t len, char *err, size_t errlen)
{
    char cerr[COMM_ERR_MAX];
    if (world->ops->broadcast(world, s, len, COMM_BYTE, 0, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "broadcasting the export's temporary name failed: %s", cerr);
        return -1;
    }
    return 0;
}

/* An output that is one untransposed dtrain tensor at offset 0 (Llama's
 * every weight, GPT-2's embeddings): its tiles are read straight into the
 * rows written, with no assembly buffer. */
static int direct_output(const hf_map_t *map, const export_out_t *o)
{
    const hf_map_t *e = &map[o->first];
    return o->count == 1 && e->ndim == 2 && !(e->flags & HF_MAP_TRANSPOSE) && e->off == 0 && e->shape[1] == o->cols;
}

/* The tile writer: a thread that hands the queued tiles, in order, to the
 * target while the caller reads and assembles the next ones into other
 * row buffers. The target's write is a kernel copy into the page cache
 * (as much CPU as dd's own copy), the read a CRC-32C and transpose: on a
 * rank with a core to spare the two overlap. Tiles alternate large and
 * tiny (a matrix, then its bias and norm vectors): with one buffer in
 * flight, a tiny tile's post waited for the matrix's write and the next
 * matrix's read started only then (gpt2-124m, 1 rank: the writer busy
 * 0.21 s, the reader waiting as long), so small tiles take small buffers
 * and a queue lets the reader run ahead. HDF5 stays on the calling thread
 * (not thread-safe here). */
#define WRITER_LARGE 2  /* row buffers of the largest tile: the one written, the one read */
#define WRITER_SMALL 16 /* row buffers of WRITER_SMALL_BYTES, for the tiles that fit */
#define WRITER_SLOTS (WRITER_LARGE + WRITER_SMALL)
#define WRITER_SMALL_BYTES (256 << 10)
#define WRITER_QUEUE 64 /* posted tiles waiting (those written from the input's mapping hold no slot) */
typedef struct tile_job {
    int out; /* output; rows [r0, r0+nr) */
    int64_t r0, nr;
    const float *rows;
    int slot; /* the row buffer it holds, or -1 */
} tile_job_t;

typedef struct tile_writer {
    const export_target_t *tg;
    export_ctx_t *x;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tile_job_t q[WRITER_QUEUE];
    int head, count;        /* the queue: posted, not yet written (the head while it is written) */
    int busy[WRITER_SLOTS]; /* a slot's rows are queued or being written */
    int quit, rc;           /* stop; the first failure */
    char err[512];
} tile_writer_t;

static void *writer_run(void *arg)
{
    tile_writer_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->count == 0 && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->count == 0)
            break;
        const tile_job_t j = w->q[w->head];
        pthread_mutex_unlock(&w->mu);
        int rc = w->rc != 0 ? 0 : w->tg->write_rows(w->x, j.out, j.r0, j.nr, j.rows, w->err, sizeof w->err);
        pthread_mutex_lock(&w->mu);
        w->rc = w->rc != 0 ? w->rc : rc;
        w->head = (w->head + 1) % WRITER_QUEUE;
        w->count--;
        if (j.slot >= 0)
            w->busy[j.slot] = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The writer's status (under w->mu): 0, or -1 and its message in err. */
static int writer_status(const tile_writer_t *w, char *err, size_t errlen)
{
    if (w->rc != 0)
        snprintf(err, errlen, "%s", w->err);
    return w->rc != 0 ? -1 : 0;
}

/* A free row buffer for the next tile, a small one when small (waits for
 * the writer to release one): its index in *slot, or -1 and the writer's
 * failure in err. The caller holds it until it posts the tile or
 * writer_release()s it. */
static int writer_slot(tile_writer_t *w, int small, int *slot, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    int s = -1;
    while (w->rc == 0 && s < 0) {
        for (int k = small ? WRITER_LARGE : 0; k < (small ? WRITER_SLOTS : WRITER_LARGE) && s < 0; k++)
            s = w->busy[k] ? -1 : k;
        if (s < 0)
            pthread_cond_wait(&w->cv, &w->mu);
    }
    if (s >= 0)
        w->busy[s] = 1;
    const int rc = writer_status(w, err, errlen);
    pthread_mutex_unlock(&w->mu);
    *slot = s;
    return rc;
}

static void writer_release(tile_writer_t *w, int slot)
{
    pthread_mutex_lock(&w->mu);
    w->busy[slot] = 0;
    pthread_mutex_unlock(&w->mu);
}

/* Queues rows (tile rows [r0, r0+nr) of output out, in buffer slot, or -1
 * for rows the caller keeps valid: the input's mapping); the caller
 * leaves the rows alone until the writer releases the slot. */
static int writer_post(tile_writer_t *w, tile_job_t job, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    while (w->rc == 0 && w->count == WRITER_QUEUE)
        pthread_cond_wait(&w->cv, &w->mu);
    const int rc = writer_status(w, err, errlen);
    if (rc == 0) {
        w->q[(w->head + w->count) % WRITER_QUEUE] = job;
        w->count++;
        pthread_cond_broadcast(&w->cv);
    } else if (job.slot >= 0) {
        w->busy[job.slot] = 0;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static int writer_start(tile_writer_t *w, const export_target_t *tg, export_ctx_t *x, char *err, size_t errlen)
{
    *w = (tile_writer_t){.tg = tg, .x = x};
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    const int e = pthread_create(&w->thread, NULL, writer_run, w);
    if (e != 0) {
        snprintf(err, errlen, "rank %d: cannot start the tile writer thread: %s", x->rank, strerror(e));
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    return e != 0 ? -1 : 0;
}

/* Waits for the queued tiles (all written, or the rest skipped after a
 * failure), stops the thread; rc is the caller's status, returned unless
 * the writer failed (its message then in err). */
static int writer_stop(tile_writer_t *w, int rc, char *err, size_t errlen)
{
    char werr[512];
    pthread_mutex_lock(&w->mu);
    while (w->count > 0)
        pthread_cond_wait(&w->cv, &w->mu);
    const int wrc = writer_status(w, werr, sizeof werr);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    if (rc == 0 && wrc != 0) {
        snprintf(err, errlen, "%s", werr);
        rc = -1;
    }
    return rc;
}

/* This rank's largest tile (bytes), its largest tile that needs assembly,
 * one RoPE head of rows (floats) and the most entries of one output. */
static void tile_sizes(const export_ctx_t *x, const hf_map_t *map, const tile_t *t, int n_tiles, int64_t *most,
                       int64_t *most_assembled, int64_t *head, int *most_entries)
{
    *most = 0, *most_assembled = 0, *head = 1, *most_entries = 1;
    for (int i = 0; i < n_tiles; i++)
        if (t[i].owner == x->rank) {
            const export_out_t *o = &x->out[t[i].out];
            *most = t[i].bytes > *most ? t[i].bytes : *most;
            if (!direct_output(map, o) && t[i].bytes > *most_assembled)
                *most_assembled = t[i].bytes;
            for (int k = o->first; k < o->first + o->count; k++) /* one RoPE head of rows */
                if ((map[k].flags & HF_MAP_ROPE) && map[k].head_size * o->cols > *head)
                    *head = map[k].head_size * o->cols;
            *most_entries = o->count > *most_entries ? o->count : *most_entries;
        }
}

/* Tile t read and assembled: *out is its output rows, in buf or (an untransposed
 * view) in the input's mapping. blocks, blk, scratch: read_tile's and
 * assemble_tile's. *read_failed: the input was at fault. */
static int tile_output(h5store_t *h, const hf_map_t *map, const export_out_t *o, tile_t *t,
                       const h5store_tensor_t *plist, int n_params, float *buf, float *blocks, tile_blk_t *blk,
                       float *scratch, export_report_t *rep, int *read_failed, const float **out, char *err,
                       size_t errlen)
{
    const hf_map_t *e = &map[o->first];
    const int direct = direct_output(map, o);
    const double t0 = now_s();
    const int rc = read_tile(h, map, o, t, plist, n_params, direct, direct ? buf : blocks, blk, err, errlen);
    rep->t_read += now_s() - t0;
    rep->in_bytes += t->bytes;
    if (rc != 0) {
        *read_failed = 1;
        return -1;
    }
    *out = buf;
    if (!direct)
        assemble_tile(map, o, t, blk, buf, scratch);
    else if (blk[0].view && blk[0].ld == o->cols && !(e->flags & HF_MAP_ROPE))
        *out = blk[0].p; /* written straight from the input's mapping */
    else if (blk[0].view)
        copy_rows(buf, blk[0].p, t->nr, o->cols, blk[0].ld);
    if (direct && (e->flags & HF_MAP_ROPE))
        hf_rope_to_hf(buf, t->nr, o->cols, e->head_size, scratch);
    return 0;
}

/* Read, transform and write this rank's tiles: a rank holds two of its
 * largest tiles (the one written, the one read) and WRITER_SMALL small
 * ones, not its share of the model, and its writes start while it still
 * reads. Tiles of at most WRITER_SMALL_BYTES (biases, norms) take small
 * buffers: in a large one each, the next matrix waited for the write of
 * the one before (and written by this thread, they waited for the
 * writer's pwrite into the same file, which holds the file's lock).
 * *read_failed: the input was at fault (exit 2). */
static int write_tiles(const export_target_t *tg, export_ctx_t *x, h5store_t *h, const hf_map_t *map, tile_t *t,
                       int n_tiles, const h5store_tensor_t *plist, int n_params, export_report_t *rep, int *read_failed,
                       char *err, size_t errlen)
{
    int64_t most, most_assembled, head;
    int most_entries;
    tile_sizes(x, map, t, n_tiles, &most, &most_assembled, &head, &most_entries);
    float *rows[WRITER_SLOTS], *blocks = malloc((size_t)most_assembled + 1);
    float *scratch = malloc((size_t)head * sizeof(float));
    tile_blk_t *blk = calloc((size_t)most_entries, sizeof *blk);
    int rc = blocks && scratch && blk ? 0 : -1;
    for (int k = 0; k < WRITER_SLOTS; k++)
        rc = (rows[k] = malloc(k < WRITER_LARGE ? (size_t)most + 1 : WRITER_SMALL_BYTES)) != NULL ? rc : -1;
    if (rc != 0)
        snprintf(err, errlen, "rank %d: out of memory for a %.1f MiB tile", x->rank, (double)most / 1048576.0);
    tile_writer_t w;
    const int started = rc == 0 && writer_start(&w, tg, x, err, errlen) == 0;
    rc = started ? rc : -1;
    for (int i = 0; i < n_tiles && rc == 0; i++) {
        if (t[i].owner != x->rank)
            continue;
        int b;
        if ((rc = writer_slot(&w, t[i].bytes <= WRITER_SMALL_BYTES, &b, err, errlen)) != 0)
            break;
        const float *out;
        rc = tile_output(h, map, &x->out[t[i].out], &t[i], plist, n_params, rows[b], blocks, blk, scratch, rep,
                         read_failed, &out, err, errlen);
        if (rc != 0 || out != rows[b])
            writer_release(&w, b);
        if (rc == 0)
            rc = writer_post(&w, (tile_job_t){t[i].out, t[i].r0, t[i].nr, out, out == rows[b] ? b : -1}, err, errlen);
    }
    if (started)
        rc = writer_stop(&w, rc, err, errlen);
    for (int k = 0; k < WRITER_SLOTS; k++)
        free(rows[k]);
    free(blocks);
    free(scratch);
    free(blk);
    return rc;
}

status_t export_run(comm_t *world, const export_target_t *tg, const export_opts_t *o, h5store_t *h,
                    const model_config_t *cfg, const h5store_tensor_t *params_list, int n_params, export_report_t *rep,
                    char *err, size_t errlen)
{
    const int rank = world->rank, nranks = world->size;
    int n_map = 0, n_tiles = 0, read_failed = 0;
    export_ctx_t x = {.opt = o, .cfg = cfg, .rank = rank};
    hf_map_t *map = NULL;
    export_out_t *outs = NULL;
    tile_t *tiles = NULL;
    const double t0 = now_s();
    memset(rep, 0, sizeof *rep);
    status_t fail_as = STATUS_INPUT; /* until the writing starts */

    int rc = rank == 0 ? check_dest(tg, &x, err, errlen) : 0;
    rc = agree(world, rc, err, errlen);
    if (rc == 0)
        rc = bcast_str(world, x.tmp, sizeof x.tmp, err, errlen);
    if (rc == 0)
        rc = export_outputs(tg, cfg, &map, &n_map, &outs, &x.n_out, err, errlen);
    x.out = outs;
    for (int i = 0; rc == 0 && i < x.n_out; i++)
        align_to_records(map, &outs[i], h);
    if (rc == 0)
        rc = tg->prepare(&x, err, errlen);
    if (rc == 0)
        rc = plan_tiles(outs, x.n_out, nranks, o->tile_bytes > 0 ? o->tile_bytes : (int64_t)EXPORT_TILE_BYTES, &tiles,
                        &n_tiles, err, errlen);
    rc = agree(world, rc, err, errlen);
    /* the destination's directory made and probed before any work: a path
     * that cannot take the export is the command line's to fix (2) */
    if (rc == 0)
        rc = agree(world, rank == 0 && make_room(&x, err, errlen) != 0 ? -1 : 0, err, errlen);
    if (rc == 0) {
        rc = agree(world, rank == 0 ? tg->create(&x, err, errlen) : 0, err, errlen);
        if (rc == 0)
            rc = write_tiles(tg, &x, h, map, tiles, n_tiles, params_list, n_params, rep, &read_failed, err, errlen);
        if (rc == 0)
            rc = tg->sync(&x, err, errlen);
        /* a damaged input is the input's fault (2), anything else the machine's (1) */
        int32_t any_read_failed = read_failed || x.input_failed;
        char cerr[COMM_ERR_MAX];
        if (world->ops->allreduce(world, &any_read_failed, 1, COMM_INT32, COMM_MAX, cerr, sizeof cerr) != STATUS_OK &&
            rc == 0) {
            snprintf(err, errlen, "the all-reduce of the export's read status failed: %s", cerr);
            rc = -1;
        }
        rc = agree(world, rc, err, errlen);
        if (rc == 0)
            rc = agree(world, rank == 0 ? tg->publish(&x, err, errlen) : 0, err, errlen);
        fail_as = any_read_failed ? STATUS_INPUT : STATUS_FAIL;
        if (rc != 0 && rank == 0)
            tg->discard(&x);
    }
    rep->n_out = x.n_out;
    rep->n_tiles = n_tiles;
    snprintf(rep->note, sizeof rep->note, "%s", x.note);
    if (tg->destroy)
        tg->destroy(&x);
    free(tiles);
    free(outs);
    free(map);
    rep->t_total = now_s() - t0;
    rep->t_write = rep->t_total - rep->t_read;
    return rc == 0 ? STATUS_OK : fail_as;
}

/* ---- files ---------------------------------------------------------------------- */

int export_tmp_name(const char *dest, char *tmp, size_t len, char *err, size_t errlen)
{
    char d[PATH_MAX];
    int n = snprintf(d, sizeof d, "%s", dest);
    while (n > 1 && d[n - 1] == '/') /* "out/" names the directory out */
        d[--n] = '\0';
    const char *slash = strrchr(d, '/');
    const char *base = slash ? slash + 1 : d;
    int w = slash ? snprintf(tmp, len, "%.*s/.%s.tmp", (int)(slash - d), d, base) : snprintf(tmp, len, ".%s.tmp", base);
    if (n >= (int)sizeof d || w < 0 || (size_t)w >= len || !*base) {
        snprintf(err, errlen, "%s: not a usable path for an export (too long, or no name)", dest);
        return -1;
    }
    return 0;
}

/* --force over a directory where the file system has no RENAME_EXCHANGE
 * (NFS, some parallel file systems): the old export aside, the new one in,
 * the old one removed. dest is missing only between the two renames. */
static int replace_dir(const char *tmp, const char *dest, char *err, size_t errlen)
{
    char old[PATH_MAX];
    if (snprintf(old, sizeof old, "%s.old", tmp) >= (int)sizeof old) {
        snprintf(err, errlen, "%s: path too long", tmp);
        return -1;
    }
    export_remove(old);
    if (rename(dest, old) != 0) {
        snprintf(err, errlen, "cannot move the existing %s aside to %s: %s", dest, old, strerror(errno));
        return -1;
    }
    if (rename(tmp, dest) != 0) {
        const int e = errno, restored = rename(old, dest) == 0;
        snprintf(err, errlen, "cannot rename %s to %s: %s (the previous export is %s %s)", tmp, dest, strerror(e),
                 restored ? "back in" : "in", restored ? dest : old);
        return -1;
    }
    export_remove(old);
    return 0;
}

int export_commit(const char *tmp, const char *dest, char *err, size_t errlen)
{
    struct stat st;
    if (stat(dest, &st) == 0 && S_ISDIR(st.st_mode)) {
        /* --force: swap in one step where the file system can, so dest is
         * always a complete export */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dest, RENAME_EXCHANGE) == 0)
            export_remove(tmp); /* now the old export */
        else if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
            snprintf(err, errlen, "cannot exchange %s with the existing %s: %s", tmp, dest, strerror(errno));
            return -1;
        } else if (replace_dir(tmp, dest, err, errlen) != 0)
            return -1;
    } else if (rename(tmp, dest) != 0) { /* a file replaces a file atomically */
        snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, dest, strerror(errno));
        return -1;
    }
    return publish_sync_dir_of(dest, err, errlen);
}

void export_remove(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[PATH_MAX];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) < (int)sizeof p)
                unlink(p); /* an export directory holds files only */
        }
        closedir(d);
    }
    rmdir(path);
}
