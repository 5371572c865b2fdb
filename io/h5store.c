/* The parallel-HDF5 tensor store. See h5store.h for the API and
 * doc/format.md for the file layout.
 *
 * Collective discipline: every HDF5 call that is collective under MPI-IO
 * (file create/open/flush/close, dataset and attribute creation with
 * collective metadata writes) is entered by every rank in the same order.
 * Inputs are validated and agreed on before the file is created, and ranks
 * agree again after each tensor, so a rank never goes on to the next
 * collective call after another rank failed. Data moves by independent
 * transfers both ways (a failed data write leaves no collective state
 * behind); reads also use independent metadata reads, so ranks may read
 * different tensors in any order. */
#define _GNU_SOURCE /* O_DIRECTORY, fallocate */
#include "io/h5store.h"

#include <hdf5.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "io/crc32c.h"
#include "io/errmsg.h"

/* The checksums cover the bytes as stored (IEEE fp32 little-endian) and are
 * computed on host memory, which is the same bytes only on little-endian. */
#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/h5store.c assumes a little-endian host: add byte swaps before porting"
#endif

#define CRC_ATTR "crc32c"             /* per dataset: int64 [k,5] start0 start1 count0 count1 crc */
#define VERSION_ATTR "h5store_version" /* root: int64 */
#define RESERVED_PREFIX "h5store_"
#define MSG_LEN 512                   /* agreed messages travel in fixed buffers */
/* Data move between the caller's tensors and the file through a staging
 * buffer of this many floats (8 MiB; more when one row is longer), a
 * block of rows at a time: the kernel then copies to and from the same few
 * pages every time instead of walking gigabytes of the caller's memory.
 * On the dev VM the kernel's first touch of each user page costs ~6 us (a
 * 1.5 GB checkpoint: ~2 s per direction); the user-space memcpy into the
 * stage costs ~0.2 s, and the CRC of a block is taken while it is in cache. */
#define STAGE_ELEMS ((int64_t)1 << 21)

/* The stage size: STAGE_ELEMS, or H5STORE_STAGE_FLOATS from the environment
 * (for tests: a stage of a few floats makes small tensors take many
 * blocks and rows longer than the stage). */
static int64_t stage_elems(void)
{
    const char *v = getenv("H5STORE_STAGE_FLOATS");
    const long long x = v ? atoll(v) : 0;
    return x > 0 ? (int64_t)x : STAGE_ELEMS;
}

/* One recorded shard: a hyperslab and the CRC-32C of its bytes. */
typedef struct srec {
    int64_t s0, s1, c0, c1;
    int64_t crc;
    int tensor, rank; /* writer: tensor index and owner (not stored) */
    int checked;      /* reader: a read on this rank matched the CRC (not stored) */
} srec_t;

typedef struct entry {
    h5store_tensor_t t;
    srec_t *rec;
    int nrec;
} entry_t;

struct h5store {
    MPI_Comm comm; /* the caller's; must outlive the handle */
    int rank, size;
    hid_t file, dxpl;
    char path[PATH_MAX];
    entry_t *e;
    h5store_tensor_t *list; /* e[i].t, contiguous, for h5store_list */
    int n, cap;
    crc32c_t crc;
    float *stage; /* the staging buffer of reads, stage_n floats (grown on demand) */
    int64_t stage_n;
};

/* Rows of a [rows, cols] block that fit one stage of `elems` floats (>= 1). */
static int64_t stage_rows(int64_t elems, int64_t cols)
{
    const int64_t r = cols > 0 ? elems / cols : elems;
    return r > 0 ? r : 1;
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

typedef struct ewalk {
    char *buf;
    size_t len;
    int n;
} ewalk_t;

/* Walking upward starts at the innermost (most specific) entry; keep it
 * with its class names and the one above it, as platform.md recommends. */
static herr_t ewalk_cb(unsigned n, const H5E_error2_t *e, void *data)
{
    ewalk_t *w = data;
    (void)n;
    if (w->n >= 2)
        return 0;
    size_t used = strlen(w->buf);
    if (used + 1 >= w->len)
        return 0;
    if (w->n == 0) {
        char maj[128] = "", min[128] = "";
        if (H5Eget_msg(e->maj_num, NULL, maj, sizeof maj) < 0)
            maj[0] = '\0';
        if (H5Eget_msg(e->min_num, NULL, min, sizeof min) < 0)
            min[0] = '\0';
        snprintf(w->buf + used, w->len - used, "%s() %s (%s: %s)", e->func_name,
                 e->desc ? e->desc : "", maj, min);
    } else {
        snprintf(w->buf + used, w->len - used, " <- %s() %s", e->func_name, e->desc ? e->desc : "");
    }
    w->n++;
    return 0;
}

/* "<what>: <HDF5's reason>" as one line, then the stack is cleared. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void h5err(char *err, size_t errlen, const char *fmt, ...)
{
    char what[MSG_LEN], why[MSG_LEN] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ewalk_t w = {why, sizeof why, 0};
    if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, ewalk_cb, &w) < 0 || why[0] == '\0')
        snprintf(why, sizeof why, "unknown HDF5 error");
    if (H5Eclear2(H5E_DEFAULT) < 0) {
        /* nothing more to report: the line below already says what failed */
    }
    for (char *p = why; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    seterr(err, errlen, "%s: %s", what, why);
}

static void mpierr(char *err, size_t errlen, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    seterr(err, errlen, "%s failed: %s", what, s);
}

/* HDF5 prints its error stack on every rank by default; while the store
 * runs, it is off (and the message is built by h5err), then restored. */
typedef struct quiet {
    H5E_auto2_t fn;
    void *data;
    int saved;
} quiet_t;

static void quiet_on(quiet_t *q)
{
    q->saved = H5Eget_auto2(H5E_DEFAULT, &q->fn, &q->data) >= 0;
    if (H5Eset_auto2(H5E_DEFAULT, NULL, NULL) < 0) {
        /* still correct, only noisier */
    }
}

static void quiet_off(const quiet_t *q)
{
    if (q->saved && H5Eset_auto2(H5E_DEFAULT, q->fn, q->data) < 0) {
        /* the caller's handler stays off; nothing else to do */
    }
}

int h5store_agree(MPI_Comm comm, int rc, char *err, size_t errlen)
{
    int rank = 0, mine, low;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) {
        seterr(err, errlen, "MPI_Comm_rank failed in h5store");
        return -1;
    }
    mine = rc != 0 ? rank : INT_MAX;
    int mrc = MPI_Allreduce(&mine, &low, 1, MPI_INT, MPI_MIN, comm);
    if (mrc != MPI_SUCCESS) {
        mpierr(err, errlen, mrc, "MPI_Allreduce (h5store agreement)");
        return -1;
    }
    if (low == INT_MAX)
        return 0;
    char msg[MSG_LEN] = "error";
    if (rank == low && err != NULL && errlen > 0)
        snprintf(msg, sizeof msg, "%s", err);
    mrc = MPI_Bcast(msg, sizeof msg, MPI_CHAR, low, comm);
    if (mrc != MPI_SUCCESS) {
        mpierr(err, errlen, mrc, "MPI_Bcast (h5store agreement)");
        return -1;
    }
    seterr(err, errlen, "%s", msg);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Shapes, regions, records                                            */
/* ------------------------------------------------------------------ */

/* "[37,24]" or "[13]" */
static const char *shape_str(char *buf, size_t n, int ndim, const int64_t shape[2])
{
    if (ndim == 1)
        snprintf(buf, n, "[%" PRId64 "]", shape[0]);
    else
        snprintf(buf, n, "[%" PRId64 ",%" PRId64 "]", shape[0], shape[1]);
    return buf;
}

/* A hyperslab for messages, ranges inclusive: "elements 0..12",
 * "rows 0..127", "rows 0..127 cols 64..127" (cols only when partial). */
static const char *region_str(char *buf, size_t n, int ndim, const int64_t shape[2],
                              const int64_t s[2], const int64_t c[2])
{
    if (ndim == 1)
        snprintf(buf, n, "elements %" PRId64 "..%" PRId64, s[0], s[0] + c[0] - 1);
    else if (s[1] == 0 && c[1] == shape[1])
        snprintf(buf, n, "rows %" PRId64 "..%" PRId64, s[0], s[0] + c[0] - 1);
    else
        snprintf(buf, n, "rows %" PRId64 "..%" PRId64 " cols %" PRId64 "..%" PRId64, s[0],
                 s[0] + c[0] - 1, s[1], s[1] + c[1] - 1);
    return buf;
}

static const char *rec_str(char *buf, size_t n, const h5store_tensor_t *t, const srec_t *r)
{
    int64_t s[2] = {r->s0, r->s1}, c[2] = {r->c0, r->c1};
    return region_str(buf, n, t->ndim, t->shape, s, c);
}

static int cmp_srec(const void *a, const void *b)
{
    const srec_t *x = a, *y = b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    if (x->s0 != y->s0)
        return x->s0 < y->s0 ? -1 : 1;
    if (x->s1 != y->s1)
        return x->s1 < y->s1 ? -1 : 1;
    return 0;
}

/* The records of one tensor (sorted by start) lie inside its shape, do not
 * overlap and together cover every element: each element has exactly one
 * checksum, written exactly once. */
static int check_cover(const h5store_tensor_t *t, const srec_t *r, int n, int writer,
                       char *err, size_t errlen)
{
    char a[96], b[96], sh[48];
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].s0 < 0 || r[i].s1 < 0 || r[i].c0 < 1 || r[i].c1 < 1 ||
            r[i].s0 + r[i].c0 > t->shape[0] || r[i].s1 + r[i].c1 > t->shape[1]) {
            seterr(err, errlen, "tensor %s: shard %s outside shape %s", t->name,
                   rec_str(a, sizeof a, t, &r[i]), shape_str(sh, sizeof sh, t->ndim, t->shape));
            return -1;
        }
        sum += r[i].c0 * r[i].c1;
        for (int j = i + 1; j < n && r[j].s0 < r[i].s0 + r[i].c0; j++) {
            if (r[j].s1 < r[i].s1 + r[i].c1 && r[i].s1 < r[j].s1 + r[j].c1) {
                if (writer)
                    seterr(err, errlen, "tensor %s: shards of rank %d (%s) and rank %d (%s) overlap",
                           t->name, r[i].rank, rec_str(a, sizeof a, t, &r[i]), r[j].rank,
                           rec_str(b, sizeof b, t, &r[j]));
                else
                    seterr(err, errlen, "tensor %s: checksummed shards %s and %s overlap", t->name,
                           rec_str(a, sizeof a, t, &r[i]), rec_str(b, sizeof b, t, &r[j]));
                return -1;
            }
        }
    }
    if (sum != t->shape[0] * t->shape[1]) {
        seterr(err, errlen, "tensor %s: %s cover %" PRId64 " of %" PRId64 " elements%s", t->name,
               writer ? "the shards" : "checksummed shards", sum, t->shape[0] * t->shape[1],
               writer ? " (every element must be written by exactly one rank)" : "");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Writing                                                             */
/* ------------------------------------------------------------------ */

static int cmp_tensor_ptr(const void *a, const void *b)
{
    const h5store_tensor_t *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int check_name(const char *name, char *err, size_t errlen)
{
    size_t n = strnlen(name, H5STORE_NAME_MAX);
    if (n == 0 || n == H5STORE_NAME_MAX) {
        seterr(err, errlen, "tensor name '%.*s' is empty or not shorter than %d bytes",
               (int)(n > 40 ? 40 : n), name, H5STORE_NAME_MAX);
        return -1;
    }
    if (name[0] == '/' || name[n - 1] == '/' || strstr(name, "//") != NULL || name[0] == '.') {
        seterr(err, errlen, "tensor name '%s': want a relative path like 'params/wte' "
               "(no leading '/' or '.', no trailing or double '/')", name);
        return -1;
    }
    return 0;
}

/* Local checks of everything this rank was handed. */
static int check_inputs(const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns,
                        const h5store_attr_t *a, int na, int rank, char *err, size_t errlen)
{
    char sh[48], rg[96];
    if (nt < 0 || ns < 0 || na < 0 || (nt > 0 && !t) || (ns > 0 && !s) || (na > 0 && !a)) {
        seterr(err, errlen, "h5store_write: bad counts or NULL lists");
        return -1;
    }
    for (int i = 0; i < nt; i++) {
        if (check_name(t[i].name, err, errlen))
            return -1;
        const h5store_tensor_t *x = &t[i];
        if ((x->ndim != 1 && x->ndim != 2) || x->shape[0] < 1 || x->shape[1] < 1 ||
            (x->ndim == 1 && x->shape[1] != 1)) {
            seterr(err, errlen, "tensor %s: bad ndim %d / shape [%" PRId64 ",%" PRId64 "] "
                   "(want 1-D [n] with shape[1] = 1, or 2-D, all dims >= 1)",
                   x->name, x->ndim, x->shape[0], x->shape[1]);
            return -1;
        }
        if (x->chunk[0] != 0 || (x->ndim == 2 && x->chunk[1] != 0)) {
            int64_t c1 = x->ndim == 2 ? x->chunk[1] : 1;
            /* HDF5 limits a chunk to 4 GiB and to the dataset's extent */
            if (x->chunk[0] < 1 || x->chunk[0] > x->shape[0] || c1 < 1 || c1 > x->shape[1] ||
                x->chunk[0] * c1 > (int64_t)(UINT32_MAX / sizeof(float))) {
                seterr(err, errlen, "tensor %s: chunk [%" PRId64 ",%" PRId64 "] does not fit "
                       "shape %s (or is over 4 GiB)", x->name, x->chunk[0], x->chunk[1],
                       shape_str(sh, sizeof sh, x->ndim, x->shape));
                return -1;
            }
        }
    }
    if (nt > 1) {
        const h5store_tensor_t **p = malloc((size_t)nt * sizeof *p);
        if (!p) {
            seterr(err, errlen, "out of memory checking %d tensor names", nt);
            return -1;
        }
        for (int i = 0; i < nt; i++)
            p[i] = &t[i];
        qsort(p, (size_t)nt, sizeof *p, cmp_tensor_ptr);
        for (int i = 1; i < nt; i++)
            if (strcmp(p[i - 1]->name, p[i]->name) == 0) {
                seterr(err, errlen, "tensor %s appears twice in the list", p[i]->name);
                free(p);
                return -1;
            }
        free(p);
    }
    for (int i = 0; i < na; i++) {
        if (!a[i].key || !a[i].key[0] || strncmp(a[i].key, RESERVED_PREFIX, strlen(RESERVED_PREFIX)) == 0 ||
            (a[i].type != H5STORE_INT && a[i].type != H5STORE_DOUBLE && a[i].type != H5STORE_STR) ||
            (a[i].type == H5STORE_STR && !a[i].s)) {
            seterr(err, errlen, "attribute %d ('%s'): empty or reserved key, bad type, or NULL string",
                   i, a[i].key ? a[i].key : "(null)");
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(a[i].key, a[j].key) == 0) {
                seterr(err, errlen, "attribute '%s' appears twice", a[i].key);
                return -1;
            }
    }
    for (int i = 0; i < ns; i++) {
        if (s[i].tensor < 0 || s[i].tensor >= nt) {
            seterr(err, errlen, "rank %d: shard %d names tensor %d of %d", rank, i, s[i].tensor, nt);
            return -1;
        }
        const h5store_tensor_t *x = &t[s[i].tensor];
        if (s[i].count[0] == 0 || s[i].count[1] == 0)
            continue; /* nothing to write; start is not looked at */
        int64_t n1 = x->ndim == 1 ? 1 : x->shape[1];
        if (s[i].start[0] < 0 || s[i].start[1] < 0 || s[i].count[0] < 0 || s[i].count[1] < 0 ||
            s[i].start[0] + s[i].count[0] > x->shape[0] || s[i].start[1] + s[i].count[1] > n1) {
            seterr(err, errlen, "rank %d: shard %d of tensor %s (start [%" PRId64 ",%" PRId64
                   "] count [%" PRId64 ",%" PRId64 "]) outside shape %s", rank, i, x->name,
                   s[i].start[0], s[i].start[1], s[i].count[0], s[i].count[1],
                   shape_str(sh, sizeof sh, x->ndim, x->shape));
            return -1;
        }
        if (!s[i].buf) {
            int64_t c[2] = {s[i].count[0], s[i].count[1]};
            seterr(err, errlen, "rank %d: shard %d of tensor %s (%s) has no buffer", rank, i,
                   x->name, region_str(rg, sizeof rg, x->ndim, x->shape, s[i].start, c));
            return -1;
        }
    }
    return 0;
}

/* A checksum of the tensor list and attributes, to prove every rank
 * passed the same ones. */
static uint32_t inputs_hash(const crc32c_t *cc, const h5store_tensor_t *t, int nt,
                            const h5store_attr_t *a, int na)
{
    uint32_t h = crc32c_update(cc, 0, &nt, sizeof nt);
    for (int i = 0; i < nt; i++) {
        h = crc32c_update(cc, h, t[i].name, strlen(t[i].name) + 1);
        h = crc32c_update(cc, h, &t[i].ndim, sizeof t[i].ndim);
        h = crc32c_update(cc, h, t[i].shape, sizeof t[i].shape);
        h = crc32c_update(cc, h, t[i].chunk, sizeof t[i].chunk);
    }
    h = crc32c_update(cc, h, &na, sizeof na);
    for (int i = 0; i < na; i++) {
        h = crc32c_update(cc, h, a[i].key, strlen(a[i].key) + 1);
        int ty = (int)a[i].type;
        h = crc32c_update(cc, h, &ty, sizeof ty);
        if (a[i].type == H5STORE_INT)
            h = crc32c_update(cc, h, &a[i].i, sizeof a[i].i);
        else if (a[i].type == H5STORE_DOUBLE)
            h = crc32c_update(cc, h, &a[i].d, sizeof a[i].d);
        else
            h = crc32c_update(cc, h, a[i].s, strlen(a[i].s) + 1);
    }
    return h;
}

/* Every rank's shard records (with CRCs), sorted by (tensor, start), on
 * every rank: the tables written beside the data, and the proof that the
 * shards tile each tensor exactly. */
static int gather_records(MPI_Comm comm, int rank, int size, const crc32c_t *cc,
                          const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns,
                          srec_t **out, int *n_out, char *err, size_t errlen)
{
    enum { F = 7 }; /* tensor s0 s1 c0 c1 crc rank */
    int nloc = 0, rc = -1, mrc;
    for (int i = 0; i < ns; i++)
        nloc += s[i].count[0] > 0 && s[i].count[1] > 0;
    int64_t *mine = malloc((size_t)(nloc > 0 ? nloc : 1) * F * sizeof *mine);
    int *cnt = malloc(2 * (size_t)size * sizeof *cnt);
    int64_t *all = NULL;
    srec_t *r = NULL;
    if (!mine || !cnt) {
        seterr(err, errlen, "out of memory for %d shard records", nloc);
        goto done;
    }
    int k = 0;
    for (int i = 0; i < ns; i++) {
        if (s[i].count[0] <= 0 || s[i].count[1] <= 0)
            continue;
        int64_t *m = mine + (size_t)k++ * F;
        m[0] = s[i].tensor;
        m[1] = s[i].start[0];
        m[2] = t[s[i].tensor].ndim == 1 ? 0 : s[i].start[1];
        m[3] = s[i].count[0];
        m[4] = s[i].count[1];
        m[5] = crc32c_update(cc, 0, s[i].buf, (size_t)(s[i].count[0] * s[i].count[1]) * sizeof(float));
        m[6] = rank;
    }
    int nf = nloc * F;
    mrc = MPI_Allgather(&nf, 1, MPI_INT, cnt, 1, MPI_INT, comm);
    if (mrc != MPI_SUCCESS) {
        mpierr(err, errlen, mrc, "MPI_Allgather (shard counts)");
        goto done;
    }
    int *displ = cnt + size;
    int64_t total = 0;
    for (int p = 0; p < size; p++) {
        displ[p] = (int)total;
        total += cnt[p];
    }
    if (total > INT_MAX) {
        seterr(err, errlen, "too many shards (%" PRId64 " records)", total / F);
        goto done;
    }
    all = malloc((size_t)(total > 0 ? total : 1) * sizeof *all);
    r = malloc((size_t)(total / F > 0 ? total / F : 1) * sizeof *r);
    if (!all || !r) {
        seterr(err, errlen, "out of memory for %" PRId64 " shard records", total / F);
        goto done;
    }
    mrc = MPI_Allgatherv(mine, nf, MPI_INT64_T, all, cnt, displ, MPI_INT64_T, comm);
    if (mrc != MPI_SUCCESS) {
        mpierr(err, errlen, mrc, "MPI_Allgatherv (shard records)");
        goto done;
    }
    int n = (int)(total / F);
    for (int i = 0; i < n; i++) {
        const int64_t *m = all + (size_t)i * F;
        r[i] = (srec_t){.tensor = (int)m[0], .s0 = m[1], .s1 = m[2], .c0 = m[3], .c1 = m[4],
                        .crc = m[5], .rank = (int)m[6]};
    }
    qsort(r, (size_t)n, sizeof *r, cmp_srec);
    *out = r;
    *n_out = n;
    r = NULL;
    rc = 0;
done:
    free(mine);
    free(cnt);
    free(all);
    free(r);
    return rc;
}

static int write_attr(hid_t loc, const h5store_attr_t *a, char *err, size_t errlen)
{
    hid_t space = H5Screate(H5S_SCALAR), ftype = H5I_INVALID_HID, attr = H5I_INVALID_HID;
    hid_t mtype;
    const void *val;
    int rc = -1;
    if (space < 0) {
        h5err(err, errlen, "attribute %s: H5Screate", a->key);
        return -1;
    }
    if (a->type == H5STORE_INT) {
        ftype = H5Tcopy(H5T_STD_I64LE);
        mtype = H5T_NATIVE_INT64;
        val = &a->i;
    } else if (a->type == H5STORE_DOUBLE) {
        ftype = H5Tcopy(H5T_IEEE_F64LE);
        mtype = H5T_NATIVE_DOUBLE;
        val = &a->d;
    } else {
        /* variable-length UTF-8: h5py reads it as a Python str */
        ftype = H5Tcopy(H5T_C_S1);
        if (ftype >= 0 && (H5Tset_size(ftype, H5T_VARIABLE) < 0 || H5Tset_cset(ftype, H5T_CSET_UTF8) < 0)) {
            h5err(err, errlen, "attribute %s: string type", a->key);
            goto done;
        }
        mtype = ftype;
        val = &a->s;
    }
    if (ftype < 0) {
        h5err(err, errlen, "attribute %s: H5Tcopy", a->key);
        goto done;
    }
    attr = H5Acreate2(loc, a->key, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0) {
        h5err(err, errlen, "cannot create attribute %s", a->key);
        goto done;
    }
    if (H5Awrite(attr, mtype, val) < 0) {
        h5err(err, errlen, "cannot write attribute %s", a->key);
        goto done;
    }
    rc = 0;
done:
    if (attr >= 0 && H5Aclose(attr) < 0 && rc == 0) {
        h5err(err, errlen, "attribute %s: H5Aclose", a->key);
        rc = -1;
    }
    if (ftype >= 0 && H5Tclose(ftype) < 0 && rc == 0) {
        h5err(err, errlen, "attribute %s: H5Tclose", a->key);
        rc = -1;
    }
    if (H5Sclose(space) < 0 && rc == 0) {
        h5err(err, errlen, "attribute %s: H5Sclose", a->key);
        rc = -1;
    }
    return rc;
}

/* The crc32c table of one dataset: int64 [n,5] start0 start1 count0 count1 crc. */
static int write_crc_attr(hid_t dset, const h5store_tensor_t *t, const srec_t *r, int n,
                          char *err, size_t errlen)
{
    if (n == 0)
        return 0;
    int64_t *v = malloc((size_t)n * 5 * sizeof *v);
    if (!v) {
        seterr(err, errlen, "tensor %s: out of memory for %d checksums", t->name, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int64_t *x = v + (size_t)i * 5;
        x[0] = r[i].s0, x[1] = r[i].s1, x[2] = r[i].c0, x[3] = r[i].c1, x[4] = r[i].crc;
    }
    hsize_t dims[2] = {(hsize_t)n, 5};
    int rc = -1;
    hid_t attr = H5I_INVALID_HID, space = H5Screate_simple(2, dims, NULL);
    if (space < 0) {
        h5err(err, errlen, "tensor %s: checksum table space", t->name);
        goto done;
    }
    attr = H5Acreate2(dset, CRC_ATTR, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0 || H5Awrite(attr, H5T_NATIVE_INT64, v) < 0) {
        h5err(err, errlen, "tensor %s: cannot write the checksum table", t->name);
        goto done;
    }
    rc = 0;
done:
    if (attr >= 0 && H5Aclose(attr) < 0 && rc == 0) {
        h5err(err, errlen, "tensor %s: H5Aclose", t->name);
        rc = -1;
    }
    if (space >= 0 && H5Sclose(space) < 0 && rc == 0) {
        h5err(err, errlen, "tensor %s: H5Sclose", t->name);
        rc = -1;
    }
    free(v);
    return rc;
}

/* Collective: create one dataset and its checksum table; then, with
 * independent transfers, this rank writes its shards of the tensor
 * (mine[0..nmine)), a block of rows at a time copied into the stage of
 * stage_n floats. A rank with no shard of the tensor writes nothing: the
 * ranks do not wait for each other over the data, only the dataset's
 * creation is collective. */
static int write_tensor(hid_t file, hid_t dxpl, const h5store_tensor_t *t, const srec_t *rec,
                        int nrec, const h5store_shard_t *const *mine, int nmine,
                        float *stage, int64_t stage_n, char *err, size_t errlen)
{
    hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
    hid_t lcpl = H5I_INVALID_HID, dcpl = H5I_INVALID_HID, space = H5I_INVALID_HID;
    hid_t dset = H5I_INVALID_HID, fs = H5I_INVALID_HID, ms = H5I_INVALID_HID;
    int rc = -1;
    if ((lcpl = H5Pcreate(H5P_LINK_CREATE)) < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        (dcpl = H5Pcreate(H5P_DATASET_CREATE)) < 0 ||
        /* every element is written: skip HDF5's zero fill (seconds per GiB) */
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 ||
        (space = H5Screate_simple(t->ndim, dims, NULL)) < 0) {
        h5err(err, errlen, "tensor %s: property lists", t->name);
        goto done;
    }
    if (t->chunk[0] > 0) {
        hsize_t cd[2] = {(hsize_t)t->chunk[0], t->ndim == 2 ? (hsize_t)t->chunk[1] : 1};
        if (H5Pset_chunk(dcpl, t->ndim, cd) < 0) {
            h5err(err, errlen, "tensor %s: H5Pset_chunk", t->name);
            goto done;
        }
    }
    dset = H5Dcreate2(file, t->name, H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
    if (dset < 0) {
        h5err(err, errlen, "cannot create dataset %s", t->name);
        goto done;
    }
    if (write_crc_attr(dset, t, rec, nrec, err, errlen))
        goto done;
    for (int j = 0; j < nmine; j++) {
        const h5store_shard_t *sh = mine[j];
        const int64_t rows = stage_rows(stage_n, sh->count[1]);
        for (int64_t r0 = 0; r0 < sh->count[0]; r0 += rows) {
            const int64_t n = sh->count[0] - r0 < rows ? sh->count[0] - r0 : rows;
            hsize_t st[2] = {(hsize_t)(sh->start[0] + r0), t->ndim == 2 ? (hsize_t)sh->start[1] : 0};
            hsize_t ct[2] = {(hsize_t)n, (hsize_t)sh->count[1]};
            memcpy(stage, sh->buf + r0 * sh->count[1], (size_t)(n * sh->count[1]) * sizeof *stage);
            if ((fs = H5Scopy(space)) < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, st, NULL, ct, NULL) < 0 ||
                (ms = H5Screate_simple(t->ndim, ct, NULL)) < 0) {
                h5err(err, errlen, "tensor %s: selection", t->name);
                goto done;
            }
            if (H5Dwrite(dset, H5T_NATIVE_FLOAT, ms, fs, dxpl, stage) < 0) {
                h5err(err, errlen, "cannot write tensor %s", t->name);
                goto done;
            }
            if (H5Sclose(fs) < 0 || H5Sclose(ms) < 0) {
                fs = ms = H5I_INVALID_HID;
                h5err(err, errlen, "tensor %s: H5Sclose", t->name);
                goto done;
            }
            fs = ms = H5I_INVALID_HID;
        }
    }
    rc = 0;
done:
    if (ms >= 0 && H5Sclose(ms) < 0 && rc == 0)
        rc = -1;
    if (fs >= 0 && H5Sclose(fs) < 0 && rc == 0)
        rc = -1;
    if (dset >= 0 && H5Dclose(dset) < 0 && rc == 0) {
        h5err(err, errlen, "tensor %s: H5Dclose", t->name);
        rc = -1;
    }
    if (space >= 0 && H5Sclose(space) < 0 && rc == 0)
        rc = -1;
    if (dcpl >= 0 && H5Pclose(dcpl) < 0 && rc == 0)
        rc = -1;
    if (lcpl >= 0 && H5Pclose(lcpl) < 0 && rc == 0)
        rc = -1;
    if (rc != 0 && err && errlen && err[0] == '\0')
        seterr(err, errlen, "tensor %s: closing HDF5 objects failed", t->name);
    return rc;
}

/* "<dir>/.<base>.tmp" beside the final file (same file system: rename is
 * atomic) and the directory, for its fsync. */
static int temp_paths(const char *path, char *tmp, char *dir, size_t n, char *err, size_t errlen)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (*base == '\0') {
        seterr(err, errlen, "'%s' names a directory, not a file", path);
        return -1;
    }
    int dl = slash ? (int)(slash - path) : 0;
    /* "out.h5" lives in ".", "/out.h5" in "/" */
    int a = !slash ? snprintf(dir, n, ".") : dl == 0 ? snprintf(dir, n, "/") : snprintf(dir, n, "%.*s", dl, path);
    int b = slash ? snprintf(tmp, n, "%.*s/.%s.tmp", dl, path, base) : snprintf(tmp, n, ".%s.tmp", base);
    if (a < 0 || b < 0 || (size_t)a >= n || (size_t)b >= n) {
        seterr(err, errlen, "path too long: %s", path);
        return -1;
    }
    return 0;
}

/* Bytes a file of these tensors can take: the data, plus HDF5's metadata
 * (measured at about 2.7 KiB per chunked dataset with its checksum
 * attribute; three times that is reserved) and the root attributes. */
static off_t file_bytes_bound(const h5store_tensor_t *t, int nt, int nrec)
{
    off_t b = (off_t)1 << 20;
    for (int i = 0; i < nt; i++)
        b += (off_t)t[i].shape[0] * t[i].shape[1] * (off_t)sizeof(float) + 8192;
    return b + (off_t)nrec * 64;
}

/* Rank 0, right after the file is created: reserve its blocks before any
 * data is written. A write that fails for lack of space on one rank but not
 * another leaves HDF5's collective metadata cache in different states on
 * different ranks, and the collective H5Fclose that follows then never
 * returns; reserving the space up front turns a full disk into an error
 * that every rank sees before the first collective write. Where the file
 * system cannot reserve (no fallocate), the free space is checked instead. */
static int reserve_space(const char *tmp, off_t bytes, char *err, size_t errlen)
{
    const double mib = (double)bytes / (1 << 20);
#ifdef FALLOC_FL_KEEP_SIZE
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) {
        seterr(err, errlen, "cannot open %s to reserve space: %s", tmp, strerror(errno));
        return -1;
    }
    /* KEEP_SIZE: the file's length stays HDF5's business */
    int rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, bytes);
    int e = errno;
    if (close(fd) != 0 && rc == 0) {
        seterr(err, errlen, "cannot close %s: %s", tmp, strerror(errno));
        return -1;
    }
    if (rc == 0)
        return 0;
    if (e != EOPNOTSUPP && e != ENOSYS) {
        seterr(err, errlen, "cannot reserve %.1f MiB for %s: %s", mib, tmp, strerror(e));
        return -1;
    }
#endif
    struct statvfs fs;
    if (statvfs(tmp, &fs) != 0) {
        seterr(err, errlen, "cannot query free space for %s: %s", tmp, strerror(errno));
        return -1;
    }
    if ((double)fs.f_bavail * (double)fs.f_frsize < (double)bytes) {
        seterr(err, errlen, "cannot write %s: %s (needs up to %.1f MiB, %.1f MiB free)", tmp, strerror(ENOSPC), mib,
               (double)fs.f_bavail * (double)fs.f_frsize / (1 << 20));
        return -1;
    }
    return 0;
}

/* Rank 0 only: make the closed temporary file durable under its final
 * name. Release the part of the reservation past the file's end, fsync
 * the data, rename, fsync the directory entry. */
static int publish(const char *tmp, const char *path, const char *dir, off_t reserved, char *err, size_t errlen)
{
    int fd = open(tmp, O_RDWR);
#ifdef FALLOC_FL_PUNCH_HOLE
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size < reserved &&
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, st.st_size, reserved - st.st_size) != 0 &&
        errno != EOPNOTSUPP && errno != ENOSYS) {
        seterr(err, errlen, "cannot release unused space of %s: %s", tmp, strerror(errno));
        close(fd);
        return -1;
    }
#else
    (void)reserved;
#endif
    if (fd < 0 || fsync(fd) != 0) {
        seterr(err, errlen, "cannot fsync %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (close(fd) != 0) {
        seterr(err, errlen, "cannot close %s: %s", tmp, strerror(errno));
        return -1;
    }
    if (rename(tmp, path) != 0) {
        seterr(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        return -1;
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) {
        /* the file is complete and renamed; only the rename's durability
         * is in doubt, and the caller should know */
        seterr(err, errlen, "wrote %s but cannot fsync directory %s: %s", path, dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (close(fd) != 0) {
        seterr(err, errlen, "cannot close directory %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

static hid_t mpio_fapl(MPI_Comm comm, int collective_metadata, char *err, size_t errlen)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0 ||
        /* v18+ object headers: attributes over 64 KiB (large checksum
         * tables) go to dense storage instead of failing */
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0 ||
        (collective_metadata &&
         (H5Pset_all_coll_metadata_ops(fapl, 1) < 0 || H5Pset_coll_metadata_write(fapl, 1) < 0))) {
        h5err(err, errlen, "cannot set up MPI-IO file access");
        if (fapl >= 0 && H5Pclose(fapl) < 0) {
            /* already failing */
        }
        return H5I_INVALID_HID;
    }
    return fapl;
}

int h5store_write(const char *path, MPI_Comm comm, const h5store_tensor_t *t, int nt,
                  const h5store_shard_t *s, int ns, const h5store_attr_t *a, int na,
                  char *err, size_t errlen)
{
    char tmp[PATH_MAX] = "", dir[PATH_MAX] = "", msg[MSG_LEN] = "";
    int rank, size, rc = 0, mrc;
    quiet_t q;
    hid_t fapl = H5I_INVALID_HID, file = H5I_INVALID_HID, dxpl = H5I_INVALID_HID;
    srec_t *rec = NULL;
    int nrec = 0, *nmine = NULL;
    const h5store_shard_t **mine = NULL;
    float *stage = NULL;
    int64_t stage_n = stage_elems();
    crc32c_t *cc = malloc(sizeof *cc);

    if ((mrc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS || (mrc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS) {
        mpierr(err, errlen, mrc, "MPI_Comm_rank/size");
        free(cc);
        return -1;
    }
    quiet_on(&q);
    if (!cc) {
        seterr(msg, sizeof msg, "out of memory");
        rc = -1;
    } else {
        crc32c_init(cc, 1);
        rc = check_inputs(t, nt, s, ns, a, na, rank, msg, sizeof msg);
        if (rc == 0)
            rc = temp_paths(path, tmp, dir, sizeof tmp, msg, sizeof msg);
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;

    /* the same tensors and attributes everywhere: min(h) == max(h) */
    int64_t h = inputs_hash(cc, t, nt, a, na), hh[2] = {h, -h}, hr[2];
    if ((mrc = MPI_Allreduce(hh, hr, 2, MPI_INT64_T, MPI_MIN, comm)) != MPI_SUCCESS) {
        mpierr(msg, sizeof msg, mrc, "MPI_Allreduce (input check)");
        goto fail; /* an MPI failure is not recoverable anyway */
    }
    if (hr[0] != -hr[1]) {
        seterr(msg, sizeof msg, "the tensor list or attributes differ between ranks "
               "(h5store_write needs the same ones on every rank)");
        goto fail;
    }

    /* every shard record everywhere; the shards must tile each tensor */
    rc = gather_records(comm, rank, size, cc, t, nt, s, ns, &rec, &nrec, msg, sizeof msg);
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    for (int i = 0, b = 0; i < nt; i++) {
        int e = b;
        while (e < nrec && rec[e].tensor == i)
            e++;
        if (check_cover(&t[i], rec + b, e - b, 1, msg, sizeof msg))
            goto fail; /* same records on every rank: same verdict */
        b = e;
    }

    /* this rank's non-empty shards grouped by tensor */
    for (int i = 0; i < ns; i++)
        if (s[i].count[0] > 0 && s[i].count[1] > stage_n)
            stage_n = s[i].count[1]; /* a stage holds at least one row */
    nmine = calloc((size_t)nt + 1, sizeof *nmine); /* nmine[i]..nmine[i+1]: offsets into mine */
    mine = malloc((size_t)(ns > 0 ? ns : 1) * sizeof *mine);
    stage = ns > 0 ? malloc((size_t)stage_n * sizeof *stage) : NULL;
    rc = (!nmine || !mine || (ns > 0 && !stage)) ? -1 : 0;
    if (rc)
        seterr(msg, sizeof msg, "out of memory");
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    for (int i = 0; i < ns; i++)
        if (s[i].count[0] > 0 && s[i].count[1] > 0)
            nmine[s[i].tensor + 1]++;
    for (int i = 0; i < nt; i++)
        nmine[i + 1] += nmine[i];
    {
        int *fill = calloc((size_t)(nt > 0 ? nt : 1), sizeof *fill);
        rc = fill ? 0 : -1;
        if (fill) {
            for (int i = 0; i < ns; i++)
                if (s[i].count[0] > 0 && s[i].count[1] > 0)
                    mine[nmine[s[i].tensor] + fill[s[i].tensor]++] = &s[i];
            free(fill);
        } else {
            seterr(msg, sizeof msg, "out of memory");
        }
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;

    /* the file: every rank creates it and every object in it */
    fapl = mpio_fapl(comm, 1, msg, sizeof msg);
    rc = fapl < 0 ? -1 : 0;
    if (rc == 0) {
        file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        if (file < 0) {
            h5err(msg, sizeof msg, "cannot create %s", tmp);
            rc = -1;
        }
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    const off_t reserved = file_bytes_bound(t, nt, nrec);
    rc = rank == 0 ? reserve_space(tmp, reserved, msg, sizeof msg) : 0;
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    /* independent data transfers: each rank writes its own blocks when it
     * gets there (collective ones made every rank wait for every other at
     * every block, and funnelled the data through MPI-IO's aggregators: at
     * 4 ranks on 2 cores the write took twice as long) */
    if (rc == 0 && ((dxpl = H5Pcreate(H5P_DATASET_XFER)) < 0 ||
                    H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_INDEPENDENT) < 0)) {
        h5err(msg, sizeof msg, "cannot set up the data transfers");
        rc = -1;
    }
    if (rc == 0) {
        h5store_attr_t ver = {.key = VERSION_ATTR, .type = H5STORE_INT, .i = H5STORE_VERSION};
        rc = write_attr(file, &ver, msg, sizeof msg);
        for (int i = 0; i < na && rc == 0; i++)
            rc = write_attr(file, &a[i], msg, sizeof msg);
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    for (int i = 0, b = 0; i < nt; i++) {
        int e = b;
        while (e < nrec && rec[e].tensor == i)
            e++;
        rc = write_tensor(file, dxpl, &t[i], rec + b, e - b, mine + nmine[i], nmine[i + 1] - nmine[i], stage,
                          stage_n, msg, sizeof msg);
        if (h5store_agree(comm, rc, msg, sizeof msg))
            goto fail;
        b = e;
    }
    /* H5Fflush(GLOBAL) fsyncs on every rank; H5Fclose then only rewrites
     * the superblock, which rank 0's fsync below makes durable */
    rc = 0;
    if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) {
        h5err(msg, sizeof msg, "cannot flush %s", tmp);
        rc = -1;
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    rc = 0;
    if (H5Pclose(dxpl) < 0 || H5Pclose(fapl) < 0) {
        h5err(msg, sizeof msg, "H5Pclose");
        rc = -1;
    }
    dxpl = fapl = H5I_INVALID_HID;
    if (H5Fclose(file) < 0) {
        h5err(msg, sizeof msg, "cannot close %s", tmp);
        rc = -1;
    }
    file = H5I_INVALID_HID;
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    rc = rank == 0 ? publish(tmp, path, dir, reserved, msg, sizeof msg) : 0;
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;

    free(rec);
    free(nmine);
    free(mine);
    free(stage);
    free(cc);
    quiet_off(&q);
    return 0;

fail:
    /* every rank is here (each step above was agreed on) */
    if (dxpl >= 0 && H5Pclose(dxpl) < 0) {
        /* already failing; the first message is the one that matters */
    }
    if (fapl >= 0 && H5Pclose(fapl) < 0) {
    }
    if (file >= 0 && H5Fclose(file) < 0) {
    }
    if (H5Eclear2(H5E_DEFAULT) < 0) {
    }
    /* the temp file goes; a file at `path` from before is untouched */
    if (rank == 0 && tmp[0] != '\0' && access(tmp, F_OK) == 0 && unlink(tmp) != 0) {
        size_t l = strlen(msg);
        snprintf(msg + l, sizeof msg - l, " (and cannot remove %s: %s)", tmp, strerror(errno));
    }
    /* nobody returns before the temp file is gone */
    if (MPI_Barrier(comm) != MPI_SUCCESS) {
        /* the message already says what failed first */
    }
    seterr(err, errlen, "%s", msg);
    free(rec);
    free(nmine);
    free(mine);
    free(stage);
    free(cc);
    quiet_off(&q);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Reading                                                             */
/* ------------------------------------------------------------------ */

typedef struct visit {
    h5store_t *h;
    char *err;
    size_t errlen;
} visit_t;

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry_t *)a)->t.name, ((const entry_t *)b)->t.name);
}

/* Reads the checksum table of one dataset, if it has one. */
static int read_crc_attr(hid_t dset, entry_t *e, char *err, size_t errlen)
{
    htri_t has = H5Aexists(dset, CRC_ATTR);
    if (has < 0) {
        h5err(err, errlen, "tensor %s: H5Aexists", e->t.name);
        return -1;
    }
    if (has == 0)
        return 0;
    hid_t attr = H5Aopen(dset, CRC_ATTR, H5P_DEFAULT), space = H5I_INVALID_HID;
    int64_t *v = NULL;
    int rc = -1;
    hsize_t dims[2] = {0, 0};
    if (attr < 0 || (space = H5Aget_space(attr)) < 0) {
        h5err(err, errlen, "tensor %s: cannot open its checksum table", e->t.name);
        goto done;
    }
    if (H5Sget_simple_extent_ndims(space) != 2 || H5Sget_simple_extent_dims(space, dims, NULL) < 0 ||
        dims[1] != 5 || dims[0] > INT_MAX) {
        seterr(err, errlen, "tensor %s: checksum table is not [n,5]", e->t.name);
        goto done;
    }
    v = malloc((size_t)(dims[0] > 0 ? dims[0] : 1) * 5 * sizeof *v);
    e->rec = malloc((size_t)(dims[0] > 0 ? dims[0] : 1) * sizeof *e->rec);
    if (!v || !e->rec) {
        seterr(err, errlen, "tensor %s: out of memory for the checksum table", e->t.name);
        goto done;
    }
    if (dims[0] > 0 && H5Aread(attr, H5T_NATIVE_INT64, v) < 0) {
        h5err(err, errlen, "tensor %s: cannot read its checksum table", e->t.name);
        goto done;
    }
    e->nrec = (int)dims[0];
    for (int i = 0; i < e->nrec; i++) {
        const int64_t *x = v + (size_t)i * 5;
        e->rec[i] = (srec_t){.s0 = x[0], .s1 = x[1], .c0 = x[2], .c1 = x[3], .crc = x[4]};
    }
    qsort(e->rec, (size_t)e->nrec, sizeof *e->rec, cmp_srec);
    rc = 0;
done:
    free(v);
    if (space >= 0 && H5Sclose(space) < 0 && rc == 0)
        rc = -1;
    if (attr >= 0 && H5Aclose(attr) < 0 && rc == 0)
        rc = -1;
    return rc;
}

/* Adds one dataset to the catalog if it is a fp32 1-D or 2-D array;
 * other datasets are not tensors of this store and are skipped. */
static int catalog_add(h5store_t *h, const char *name, hid_t dset, char *err, size_t errlen)
{
    hid_t type = H5Dget_type(dset), space = H5I_INVALID_HID, dcpl = H5I_INVALID_HID;
    int rc = -1;
    if (type < 0 || (space = H5Dget_space(dset)) < 0 || (dcpl = H5Dget_create_plist(dset)) < 0) {
        h5err(err, errlen, "dataset %s: cannot get its type, shape or layout", name);
        goto done;
    }
    H5T_class_t cls = H5Tget_class(type);
    int nd = H5Sget_simple_extent_ndims(space);
    if (cls < 0 || nd < 0) {
        h5err(err, errlen, "dataset %s: type class or rank", name);
        goto done;
    }
    if (cls != H5T_FLOAT || H5Tget_size(type) != sizeof(float) || (nd != 1 && nd != 2)) {
        rc = 0; /* not a tensor of ours */
        goto done;
    }
    if (strlen(name) >= H5STORE_NAME_MAX) {
        seterr(err, errlen, "dataset %s: name longer than %d bytes", name, H5STORE_NAME_MAX - 1);
        goto done;
    }
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 64;
        entry_t *e = realloc(h->e, (size_t)cap * sizeof *e);
        if (!e) {
            seterr(err, errlen, "out of memory for the catalog");
            goto done;
        }
        h->e = e;
        h->cap = cap;
    }
    entry_t *e = &h->e[h->n];
    memset(e, 0, sizeof *e);
    snprintf(e->t.name, sizeof e->t.name, "%s", name);
    e->t.ndim = nd;
    hsize_t d[2] = {1, 1}, c[2] = {0, 0};
    if (H5Sget_simple_extent_dims(space, d, NULL) < 0) {
        h5err(err, errlen, "dataset %s: dims", name);
        goto done;
    }
    e->t.shape[0] = (int64_t)d[0];
    e->t.shape[1] = nd == 2 ? (int64_t)d[1] : 1;
    H5D_layout_t lay = H5Pget_layout(dcpl);
    if (lay < 0) {
        h5err(err, errlen, "dataset %s: layout", name);
        goto done;
    }
    if (lay == H5D_CHUNKED && H5Pget_chunk(dcpl, 2, c) < 0) {
        h5err(err, errlen, "dataset %s: chunk shape", name);
        goto done;
    }
    e->t.chunk[0] = (int64_t)c[0];
    e->t.chunk[1] = nd == 2 ? (int64_t)c[1] : 0;
    h->n++; /* from here on freed with the catalog */
    rc = read_crc_attr(dset, e, err, errlen);
done:
    if (dcpl >= 0 && H5Pclose(dcpl) < 0 && rc == 0)
        rc = -1;
    if (space >= 0 && H5Sclose(space) < 0 && rc == 0)
        rc = -1;
    if (type >= 0 && H5Tclose(type) < 0 && rc == 0)
        rc = -1;
    return rc;
}

static herr_t visit_cb(hid_t group, const char *name, const H5L_info_t *info, void *data)
{
    visit_t *v = data;
    if (info->type != H5L_TYPE_HARD)
        return 0; /* soft and external links are not followed */
    hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
    if (obj < 0) {
        h5err(v->err, v->errlen, "cannot open object %s", name);
        return -1;
    }
    H5I_type_t ty = H5Iget_type(obj);
    int rc = 0;
    if (ty == H5I_DATASET)
        rc = catalog_add(v->h, name, obj, v->err, v->errlen);
    if (H5Oclose(obj) < 0 && rc == 0) {
        h5err(v->err, v->errlen, "H5Oclose %s", name);
        rc = -1;
    }
    return rc ? -1 : 0;
}

static void free_handle(h5store_t *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n; i++)
        free(h->e[i].rec);
    free(h->e);
    free(h->list);
    free(h->stage);
    free(h);
}

h5store_t *h5store_open(const char *path, MPI_Comm comm, char *err, size_t errlen)
{
    char msg[MSG_LEN] = "";
    quiet_t q;
    int rc = 0, mrc;
    hid_t fapl = H5I_INVALID_HID;
    h5store_t *h = calloc(1, sizeof *h);
    quiet_on(&q);
    if (!h) {
        seterr(msg, sizeof msg, "out of memory");
        rc = -1;
    } else {
        h->file = h->dxpl = H5I_INVALID_HID;
        h->comm = comm;
        if ((mrc = MPI_Comm_rank(comm, &h->rank)) != MPI_SUCCESS ||
            (mrc = MPI_Comm_size(comm, &h->size)) != MPI_SUCCESS) {
            mpierr(msg, sizeof msg, mrc, "MPI_Comm_rank/size");
            rc = -1;
        } else if (snprintf(h->path, sizeof h->path, "%s", path) >= (int)sizeof h->path) {
            seterr(msg, sizeof msg, "path too long: %.100s...", path);
            rc = -1;
        } else {
            crc32c_init(&h->crc, 1);
        }
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    /* independent metadata reads: ranks may then read different tensors
     * in different orders without matching collective calls */
    fapl = mpio_fapl(comm, 0, msg, sizeof msg);
    if (fapl >= 0) {
        h->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
        if (h->file < 0) {
            h5err(msg, sizeof msg, "cannot open %s", path);
            rc = -1;
        }
        if (H5Pclose(fapl) < 0 && rc == 0) {
            h5err(msg, sizeof msg, "H5Pclose");
            rc = -1;
        }
    } else {
        rc = -1;
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    if ((h->dxpl = H5Pcreate(H5P_DATASET_XFER)) < 0 || H5Pset_dxpl_mpio(h->dxpl, H5FD_MPIO_INDEPENDENT) < 0) {
        h5err(msg, sizeof msg, "%s: transfer properties", path);
        rc = -1;
    }
    if (rc == 0 && h5store_has_attr(h, VERSION_ATTR) == 1) {
        int64_t ver = 0;
        if (h5store_get_int(h, VERSION_ATTR, &ver, msg, sizeof msg))
            rc = -1;
        else if (ver > H5STORE_VERSION) {
            seterr(msg, sizeof msg, "%s: store format version %" PRId64 " is newer than this "
                   "program's (%d): use a newer dtrain", path, ver, H5STORE_VERSION);
            rc = -1;
        }
    }
    if (rc == 0) {
        visit_t v = {h, msg, sizeof msg};
        if (H5Lvisit(h->file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &v) < 0) {
            if (msg[0] == '\0')
                h5err(msg, sizeof msg, "%s: cannot list its datasets", path);
            rc = -1;
        }
    }
    if (rc == 0) {
        qsort(h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
        h->list = malloc((size_t)(h->n > 0 ? h->n : 1) * sizeof *h->list);
        if (!h->list) {
            seterr(msg, sizeof msg, "out of memory for the catalog");
            rc = -1;
        } else {
            for (int i = 0; i < h->n; i++)
                h->list[i] = h->e[i].t;
        }
    }
    if (h5store_agree(comm, rc, msg, sizeof msg))
        goto fail;
    quiet_off(&q);
    return h;
fail:
    if (h && h->dxpl >= 0 && H5Pclose(h->dxpl) < 0) {
        /* already failing */
    }
    if (h && h->file >= 0 && H5Fclose(h->file) < 0) {
    }
    if (H5Eclear2(H5E_DEFAULT) < 0) {
    }
    free_handle(h);
    seterr(err, errlen, "%s", msg);
    quiet_off(&q);
    return NULL;
}

int h5store_close(h5store_t *h, char *err, size_t errlen)
{
    if (!h)
        return 0;
    char msg[MSG_LEN] = "";
    quiet_t q;
    int rc = 0;
    quiet_on(&q);
    if (H5Pclose(h->dxpl) < 0) {
        h5err(msg, sizeof msg, "%s: H5Pclose", h->path);
        rc = -1;
    }
    if (H5Fclose(h->file) < 0) {
        h5err(msg, sizeof msg, "cannot close %s", h->path);
        rc = -1;
    }
    MPI_Comm comm = h->comm;
    free_handle(h);
    quiet_off(&q);
    rc = h5store_agree(comm, rc, msg, sizeof msg);
    if (rc)
        seterr(err, errlen, "%s", msg);
    return rc;
}

int h5store_list(const h5store_t *h, const h5store_tensor_t **tensors)
{
    *tensors = h->list;
    return h->n;
}

static entry_t *find_entry(const h5store_t *h, const char *name)
{
    entry_t key;
    snprintf(key.t.name, sizeof key.t.name, "%s", name);
    return bsearch(&key, h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
}

const h5store_tensor_t *h5store_find(const h5store_t *h, const char *name)
{
    const entry_t *e = find_entry(h, name);
    return e ? &e->t : NULL;
}

/* h->stage holds at least max(stage_elems(), need) floats. */
static int ensure_stage(h5store_t *h, int64_t need, char *err, size_t errlen)
{
    if (need < stage_elems())
        need = stage_elems();
    if (h->stage_n >= need)
        return 0;
    free(h->stage);
    h->stage_n = 0;
    if (!(h->stage = malloc((size_t)need * sizeof *h->stage))) {
        seterr(err, errlen, "out of memory for a %" PRId64 "-float read buffer", need);
        return -1;
    }
    h->stage_n = need;
    return 0;
}

/* Reads rows [s0, s0+c0) x cols [s1, s1+c1) of an open dataset into buf. */
static int read_slab(h5store_t *h, hid_t dset, const entry_t *e, const int64_t s[2],
                     const int64_t c[2], float *buf, char *err, size_t errlen)
{
    hsize_t st[2] = {(hsize_t)s[0], (hsize_t)s[1]}, ct[2] = {(hsize_t)c[0], (hsize_t)c[1]};
    hid_t fs = H5Dget_space(dset), ms = H5I_INVALID_HID;
    int rc = -1;
    if (fs < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, st, NULL, ct, NULL) < 0 ||
        (ms = H5Screate_simple(e->t.ndim, ct, NULL)) < 0) {
        h5err(err, errlen, "tensor %s: selection", e->t.name);
        goto done;
    }
    if (H5Dread(dset, H5T_NATIVE_FLOAT, ms, fs, h->dxpl, buf) < 0) {
        char rg[96];
        h5err(err, errlen, "%s: cannot read tensor %s %s", h->path, e->t.name,
              region_str(rg, sizeof rg, e->t.ndim, e->t.shape, s, c));
        goto done;
    }
    rc = 0;
done:
    if (ms >= 0 && H5Sclose(ms) < 0 && rc == 0)
        rc = -1;
    if (fs >= 0 && H5Sclose(fs) < 0 && rc == 0)
        rc = -1;
    return rc;
}

static void mismatch(char *err, size_t errlen, const h5store_t *h, const entry_t *e, const srec_t *r,
                     uint32_t got)
{
    char rg[96];
    seterr(err, errlen, "%s: checksum mismatch in %s %s (stored %08" PRIx32 ", data %08" PRIx32 ")",
           h->path, e->t.name, rec_str(rg, sizeof rg, &e->t, r), (uint32_t)r->crc, got);
}

int h5store_read(h5store_t *h, const char *name, const int64_t start[2], const int64_t count[2],
                 float *buf, char *err, size_t errlen)
{
    entry_t *e = find_entry(h, name);
    char sh[48];
    if (!e) {
        seterr(err, errlen, "tensor %s: not in %s", name, h->path);
        return -1;
    }
    int64_t s[2] = {start[0], e->t.ndim == 2 ? start[1] : 0};
    int64_t c[2] = {count[0], e->t.ndim == 2 ? count[1] : 1};
    if (count[0] == 0 || count[1] == 0)
        return 0;
    if (s[0] < 0 || s[1] < 0 || c[0] < 0 || c[1] < 0 || s[0] + c[0] > e->t.shape[0] ||
        s[1] + c[1] > e->t.shape[1] || (e->t.ndim == 1 && (start[1] != 0 || count[1] != 1))) {
        seterr(err, errlen, "tensor %s: read of start [%" PRId64 ",%" PRId64 "] count [%" PRId64
               ",%" PRId64 "] outside shape %s", name, start[0], start[1], count[0], count[1],
               shape_str(sh, sizeof sh, e->t.ndim, e->t.shape));
        return -1;
    }
    if (!buf) {
        seterr(err, errlen, "tensor %s: no buffer to read into", name);
        return -1;
    }
    quiet_t q;
    quiet_on(&q);
    int rc = -1, nin = 0;
    uint32_t *crcs = NULL;
    hid_t dset = H5Dopen2(h->file, name, H5P_DEFAULT);
    if (dset < 0) {
        h5err(err, errlen, "%s: cannot open tensor %s", h->path, name);
        goto done;
    }
    /* every recorded shard inside the region read is checked: its CRC
     * runs over the stage, block by block, while the block is in cache */
    for (int i = 0; i < e->nrec; i++) {
        const srec_t *r = &e->rec[i];
        if (r->s0 >= s[0] && r->s0 + r->c0 <= s[0] + c[0] && r->s1 >= s[1] && r->s1 + r->c1 <= s[1] + c[1])
            nin++;
    }
    if (!(crcs = calloc((size_t)nin + 1, sizeof *crcs))) {
        seterr(err, errlen, "tensor %s: out of memory", name);
        goto done;
    }
    if (ensure_stage(h, c[1], err, errlen))
        goto done;
    const int64_t rows = stage_rows(h->stage_n, c[1]);
    for (int64_t r0 = 0; r0 < c[0]; r0 += rows) {
        const int64_t n = c[0] - r0 < rows ? c[0] - r0 : rows, b0 = s[0] + r0;
        const int64_t bs[2] = {b0, s[1]}, bc[2] = {n, c[1]};
        if (read_slab(h, dset, e, bs, bc, h->stage, err, errlen))
            goto done;
        memcpy(buf + r0 * c[1], h->stage, (size_t)(n * c[1]) * sizeof *buf);
        for (int i = 0, k = 0; i < e->nrec; i++) {
            const srec_t *r = &e->rec[i];
            if (r->s0 < s[0] || r->s0 + r->c0 > s[0] + c[0] || r->s1 < s[1] || r->s1 + r->c1 > s[1] + c[1])
                continue;
            /* the record's rows in this block */
            const int64_t lo = r->s0 > b0 ? r->s0 : b0, hi = r->s0 + r->c0 < b0 + n ? r->s0 + r->c0 : b0 + n;
            const float *p = h->stage + (lo - b0) * c[1] + (r->s1 - s[1]);
            if (lo < hi && r->c1 == c[1]) /* full rows: one contiguous piece */
                crcs[k] = crc32c_update(&h->crc, crcs[k], p, (size_t)((hi - lo) * c[1]) * sizeof(float));
            else
                for (int64_t row = lo; row < hi; row++, p += c[1])
                    crcs[k] = crc32c_update(&h->crc, crcs[k], p, (size_t)r->c1 * sizeof(float));
            k++;
        }
    }
    rc = 0;
    for (int i = 0, k = 0; i < e->nrec && rc == 0; i++) {
        srec_t *r = &e->rec[i];
        if (r->s0 < s[0] || r->s0 + r->c0 > s[0] + c[0] || r->s1 < s[1] || r->s1 + r->c1 > s[1] + c[1])
            continue;
        if (crcs[k] != (uint32_t)r->crc) {
            mismatch(err, errlen, h, e, r, crcs[k]);
            rc = -1;
        }
        r->checked = rc == 0;
        k++;
    }
done:
    free(crcs);
    if (dset >= 0 && H5Dclose(dset) < 0 && rc == 0) {
        h5err(err, errlen, "tensor %s: H5Dclose", name);
        rc = -1;
    }
    quiet_off(&q);
    return rc;
}

/* This rank's part of h5store_read_shards: the shape checks and the reads,
 * without agreeing on the result. */
static int read_shards_local(h5store_t *h, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns,
                             char *msg, size_t msglen)
{
    char a[48], b[48];
    int rc = 0;
    for (int i = 0; i < nt && rc == 0; i++) {
        const entry_t *e = find_entry(h, t[i].name);
        if (!e) {
            seterr(msg, msglen, "tensor %s: not in %s", t[i].name, h->path);
            rc = -1;
        } else if (e->t.ndim != t[i].ndim || e->t.shape[0] != t[i].shape[0] ||
                   (t[i].ndim == 2 && e->t.shape[1] != t[i].shape[1])) {
            seterr(msg, msglen, "tensor %s: shape %s in file, expected %s", t[i].name,
                   shape_str(a, sizeof a, e->t.ndim, e->t.shape), shape_str(b, sizeof b, t[i].ndim, t[i].shape));
            rc = -1;
        }
    }
    for (int i = 0; i < ns && rc == 0; i++) {
        if (s[i].tensor < 0 || s[i].tensor >= nt) {
            seterr(msg, msglen, "rank %d: shard %d names tensor %d of %d", h->rank, i, s[i].tensor, nt);
            rc = -1;
        } else {
            rc = h5store_read(h, t[s[i].tensor].name, s[i].start, s[i].count, s[i].buf, msg, msglen);
        }
    }
    return rc;
}

int h5store_read_shards(h5store_t *h, const h5store_tensor_t *t, int nt, const h5store_shard_t *s,
                        int ns, char *err, size_t errlen)
{
    char msg[MSG_LEN] = "";
    int rc = read_shards_local(h, t, nt, s, ns, msg, sizeof msg);
    rc = h5store_agree(h->comm, rc, msg, sizeof msg);
    if (rc)
        seterr(err, errlen, "%s", msg);
    return rc;
}

/* Reads one recorded shard in row blocks and returns its CRC. */
static int shard_crc(h5store_t *h, hid_t dset, const entry_t *e, const srec_t *r, float *tmp,
                     uint32_t *crc, char *err, size_t errlen)
{
    /* one row over the stage: the caller sized it for the longest row */
    const int64_t rows = stage_rows(h->stage_n, r->c1);
    *crc = 0;
    for (int64_t r0 = 0; r0 < r->c0; r0 += rows) {
        int64_t n = r->c0 - r0 < rows ? r->c0 - r0 : rows;
        int64_t s[2] = {r->s0 + r0, r->s1}, c[2] = {n, r->c1};
        if (read_slab(h, dset, e, s, c, tmp, err, errlen))
            return -1;
        *crc = crc32c_update(&h->crc, *crc, tmp, (size_t)(n * r->c1) * sizeof(float));
    }
    return 0;
}

/* Collective: h5store_verify over the records not marked in `done` (all
 * when done is NULL; indexed by record, counting over all tensors in
 * catalog order), the ranks taking turns over those left. */
static int verify_records(h5store_t *h, const unsigned char *done, int64_t *n_shards, int64_t *n_bytes, char *err,
                          size_t errlen)
{
    char msg[MSG_LEN] = "";
    int rc = 0, mrc;
    int64_t stat[3] = {0, 0, 0}; /* shards, bytes, mismatches */
    float *tmp = NULL;
    quiet_t q;
    quiet_on(&q);
    /* records must tile each tensor (metadata only: same verdict on all ranks) */
    for (int i = 0; i < h->n && rc == 0; i++) {
        if (h->e[i].nrec == 0) {
            seterr(msg, sizeof msg, "%s: tensor %s has no checksums", h->path, h->e[i].t.name);
            rc = -1;
        } else {
            rc = check_cover(&h->e[i].t, h->e[i].rec, h->e[i].nrec, 0, msg, sizeof msg);
        }
    }
    if (rc == 0) {
        int64_t maxrow = 1;
        for (int i = 0; i < h->n; i++)
            if (h->e[i].t.shape[1] > maxrow)
                maxrow = h->e[i].t.shape[1];
        if ((rc = ensure_stage(h, maxrow, msg, sizeof msg)) == 0)
            tmp = h->stage;
    }
    /* the k-th record left to check (counting over all tensors) is
     * checked by rank k % size */
    int64_t k = 0, idx = 0;
    for (int i = 0; i < h->n && rc == 0; i++) {
        entry_t *e = &h->e[i];
        hid_t dset = H5I_INVALID_HID;
        for (int j = 0; j < e->nrec && rc == 0; j++, idx++) {
            if (done && done[idx])
                continue;
            if (k++ % h->size != h->rank)
                continue;
            if (dset < 0 && (dset = H5Dopen2(h->file, e->t.name, H5P_DEFAULT)) < 0) {
                h5err(msg, sizeof msg, "%s: cannot open tensor %s", h->path, e->t.name);
                rc = -1;
                break;
            }
            uint32_t crc;
            if (shard_crc(h, dset, e, &e->rec[j], tmp, &crc, msg, sizeof msg)) {
                rc = -1;
                break;
            }
            stat[0]++;
            stat[1] += e->rec[j].c0 * e->rec[j].c1 * (int64_t)sizeof(float);
            if (crc != (uint32_t)e->rec[j].crc) {
                if (stat[2]++ == 0)
                    mismatch(msg, sizeof msg, h, e, &e->rec[j], crc);
            }
        }
        if (dset >= 0 && H5Dclose(dset) < 0 && rc == 0) {
            h5err(msg, sizeof msg, "tensor %s: H5Dclose", e->t.name);
            rc = -1;
        }
    }
    quiet_off(&q);
    if (stat[2] > 0)
        rc = -1;
    if ((mrc = MPI_Allreduce(MPI_IN_PLACE, stat, 3, MPI_INT64_T, MPI_SUM, h->comm)) != MPI_SUCCESS) {
        mpierr(err, errlen, mrc, "MPI_Allreduce (verify)");
        return -1;
    }
    if (stat[2] > 1 && rc != 0 && strstr(msg, "checksum mismatch")) {
        size_t l = strlen(msg);
        snprintf(msg + l, sizeof msg - l, " (+%" PRId64 " more)", stat[2] - 1);
    }
    if (h5store_agree(h->comm, rc, msg, sizeof msg)) {
        seterr(err, errlen, "%s", msg);
        return -1;
    }
    if (n_shards)
        *n_shards = stat[0];
    if (n_bytes)
        *n_bytes = stat[1];
    return 0;
}

int h5store_verify(h5store_t *h, int64_t *n_shards, int64_t *n_bytes, char *err, size_t errlen)
{
    return verify_records(h, NULL, n_shards, n_bytes, err, errlen);
}

int h5store_read_verify(h5store_t *h, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns,
                        char *err, size_t errlen)
{
    char msg[MSG_LEN] = "";
    int64_t total = 0;
    for (int i = 0; i < h->n; i++) {
        for (int j = 0; j < h->e[i].nrec; j++)
            h->e[i].rec[j].checked = 0;
        total += h->e[i].nrec;
    }
    int rc = read_shards_local(h, t, nt, s, ns, msg, sizeof msg), mrc;
    unsigned char *done = calloc((size_t)total + 1, 1);
    if (!done && rc == 0) {
        seterr(msg, sizeof msg, "out of memory for verification");
        rc = -1;
    }
    /* a bad read anywhere is the answer: no need to look further */
    if (h5store_agree(h->comm, rc, msg, sizeof msg)) {
        free(done);
        seterr(err, errlen, "%s", msg);
        return -1;
    }
    int64_t idx = 0;
    for (int i = 0; i < h->n; i++)
        for (int j = 0; j < h->e[i].nrec; j++)
            done[idx++] = (unsigned char)h->e[i].rec[j].checked;
    /* the records some rank's reads checked; the rest are read for their CRC */
    if (total > INT_MAX) {
        seterr(err, errlen, "%s: too many checksum records (%" PRId64 ")", h->path, total);
        rc = -1;
    } else if (total > 0 &&
               (mrc = MPI_Allreduce(MPI_IN_PLACE, done, (int)total, MPI_UNSIGNED_CHAR, MPI_MAX, h->comm)) !=
                   MPI_SUCCESS) {
        mpierr(err, errlen, mrc, "MPI_Allreduce (records checked)");
        rc = -1;
    }
    if (rc == 0)
        rc = verify_records(h, done, NULL, NULL, err, errlen);
    free(done);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Root attributes                                                     */
/* ------------------------------------------------------------------ */

int h5store_has_attr(h5store_t *h, const char *key)
{
    quiet_t q;
    quiet_on(&q);
    htri_t r = H5Aexists(h->file, key);
    if (r < 0 && H5Eclear2(H5E_DEFAULT) < 0) {
    }
    quiet_off(&q);
    return r > 0;
}

/* Opens root attribute `key` holding one value; *cls gets its type class. */
static hid_t open_attr(h5store_t *h, const char *key, H5T_class_t *cls, hid_t *type, char *err, size_t errlen)
{
    htri_t ex = H5Aexists(h->file, key);
    if (ex <= 0) {
        if (ex < 0)
            h5err(err, errlen, "%s: attribute %s", h->path, key);
        else
            seterr(err, errlen, "%s: no attribute %s", h->path, key);
        return H5I_INVALID_HID;
    }
    hid_t attr = H5Aopen(h->file, key, H5P_DEFAULT), space = H5I_INVALID_HID;
    *type = H5I_INVALID_HID;
    if (attr < 0 || (space = H5Aget_space(attr)) < 0 || (*type = H5Aget_type(attr)) < 0 ||
        (*cls = H5Tget_class(*type)) < 0) {
        h5err(err, errlen, "%s: cannot open attribute %s", h->path, key);
        goto fail;
    }
    hssize_t n = H5Sget_simple_extent_npoints(space);
    if (n != 1) {
        seterr(err, errlen, "%s: attribute %s holds %lld values, expected 1", h->path, key, (long long)n);
        goto fail;
    }
    if (H5Sclose(space) < 0) {
        space = H5I_INVALID_HID;
        h5err(err, errlen, "H5Sclose");
        goto fail;
    }
    return attr;
fail:
    if (space >= 0 && H5Sclose(space) < 0) {
    }
    if (*type >= 0 && H5Tclose(*type) < 0) {
    }
    if (attr >= 0 && H5Aclose(attr) < 0) {
    }
    *type = H5I_INVALID_HID;
    return H5I_INVALID_HID;
}

static const char *class_name(H5T_class_t c)
{
    switch (c) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    default: return "not a number or string";
    }
}

static int close_attr(hid_t attr, hid_t type, int rc, char *err, size_t errlen)
{
    if (type >= 0 && H5Tclose(type) < 0 && rc == 0) {
        h5err(err, errlen, "H5Tclose");
        rc = -1;
    }
    if (attr >= 0 && H5Aclose(attr) < 0 && rc == 0) {
        h5err(err, errlen, "H5Aclose");
        rc = -1;
    }
    return rc;
}

/* Integer or float attribute as `want` (H5T_INTEGER -> int64, H5T_FLOAT -> double). */
static int get_num(h5store_t *h, const char *key, H5T_class_t want, void *v, char *err, size_t errlen)
{
    quiet_t q;
    H5T_class_t cls = H5T_NO_CLASS;
    hid_t type, attr;
    int rc = -1;
    quiet_on(&q);
    attr = open_attr(h, key, &cls, &type, err, errlen);
    if (attr >= 0) {
        if (cls != want && !(want == H5T_FLOAT && cls == H5T_INTEGER))
            seterr(err, errlen, "%s: attribute %s is %s, expected %s", h->path, key, class_name(cls),
                   class_name(want));
        else if (H5Aread(attr, want == H5T_INTEGER ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, v) < 0)
            h5err(err, errlen, "%s: cannot read attribute %s", h->path, key);
        else
            rc = 0;
        rc = close_attr(attr, type, rc, err, errlen);
    }
    quiet_off(&q);
    return rc;
}

int h5store_get_int(h5store_t *h, const char *key, int64_t *v, char *err, size_t errlen)
{
    return get_num(h, key, H5T_INTEGER, v, err, errlen);
}

int h5store_get_double(h5store_t *h, const char *key, double *v, char *err, size_t errlen)
{
    return get_num(h, key, H5T_FLOAT, v, err, errlen);
}

/* Root attribute `key` as a string in memory the caller frees. */
static int read_str(h5store_t *h, const char *key, char **out, char *err, size_t errlen)
{
    quiet_t q;
    H5T_class_t cls = H5T_NO_CLASS;
    hid_t type, attr, mt = H5I_INVALID_HID;
    int rc = -1;
    char *s = NULL;
    htri_t var = 0;
    *out = NULL;
    quiet_on(&q);
    attr = open_attr(h, key, &cls, &type, err, errlen);
    if (attr < 0)
        goto done;
    if (cls != H5T_STRING) {
        seterr(err, errlen, "%s: attribute %s is %s, expected a string", h->path, key, class_name(cls));
        goto done;
    }
    var = H5Tis_variable_str(type);
    size_t fixed = H5Tget_size(type);
    H5T_cset_t cset = H5Tget_cset(type); /* ASCII <-> UTF-8 has no conversion path */
    if (var < 0 || cset < 0 || (mt = H5Tcopy(H5T_C_S1)) < 0 ||
        H5Tset_size(mt, var ? H5T_VARIABLE : fixed + 1) < 0 || H5Tset_cset(mt, cset) < 0) {
        h5err(err, errlen, "%s: attribute %s: string type", h->path, key);
        goto done;
    }
    if (var) {
        if (H5Aread(attr, mt, &s) < 0) {
            h5err(err, errlen, "%s: cannot read attribute %s", h->path, key);
            goto done;
        }
    } else {
        /* fixed-length (e.g. numpy bytes): one more byte for the NUL */
        if (!(s = calloc(fixed + 1, 1))) {
            seterr(err, errlen, "out of memory");
            goto done;
        }
        if (H5Aread(attr, mt, s) < 0) {
            h5err(err, errlen, "%s: cannot read attribute %s", h->path, key);
            goto done;
        }
    }
    /* HDF5 allocated a variable-length string: the copy is ours to free */
    if (!(*out = strdup(s ? s : ""))) {
        seterr(err, errlen, "out of memory");
        goto done;
    }
    rc = 0;
done:
    if (s && var) {
        if (H5free_memory(s) < 0 && rc == 0) {
            h5err(err, errlen, "H5free_memory");
            rc = -1;
        }
    } else {
        free(s);
    }
    if (mt >= 0 && H5Tclose(mt) < 0 && rc == 0)
        rc = -1;
    if (attr >= 0)
        rc = close_attr(attr, type, rc, err, errlen);
    if (rc != 0) {
        free(*out);
        *out = NULL;
    }
    quiet_off(&q);
    return rc;
}

int h5store_get_str(h5store_t *h, const char *key, char *out, size_t outlen, char *err, size_t errlen)
{
    char *s;
    if (read_str(h, key, &s, err, errlen) != 0)
        return -1;
    size_t n = strlen(s);
    int rc = 0;
    if (n >= outlen) {
        seterr(err, errlen, "%s: attribute %s is %zu bytes, longer than the %zu-byte buffer", h->path,
               key, n, outlen);
        rc = -1;
    } else {
        memcpy(out, s, n + 1);
    }
    free(s);
    return rc;
}

typedef struct attr_names {
    char **name;
    int n, cap;
} attr_names_t;

static herr_t attr_name_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data)
{
    attr_names_t *a = data;
    (void)loc;
    (void)info;
    if (strncmp(name, RESERVED_PREFIX, strlen(RESERVED_PREFIX)) == 0)
        return 0;
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        char **p = realloc(a->name, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        a->name = p;
        a->cap = cap;
    }
    if (!(a->name[a->n] = strdup(name)))
        return -1;
    a->n++;
    return 0;
}

void h5store_free_attrs(h5store_attr_t *attrs, int n)
{
    if (!attrs)
        return;
    /* the strings were allocated by h5store_get_attrs; const is for readers */
    for (int i = 0; i < n; i++) {
        free((char *)attrs[i].key);
        free((char *)attrs[i].s);
    }
    free(attrs);
}

int h5store_get_attrs(h5store_t *h, h5store_attr_t **attrs, int *n_attrs, char *err, size_t errlen)
{
    attr_names_t names = {NULL, 0, 0};
    h5store_attr_t *a = NULL;
    int rc = 0;
    quiet_t q;
    quiet_on(&q);
    /* names first, then values, so no attribute is opened from inside
     * HDF5's iteration */
    hsize_t idx = 0;
    if (H5Aiterate2(h->file, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_name_cb, &names) < 0) {
        h5err(err, errlen, "%s: cannot list its root attributes", h->path);
        rc = -1;
    }
    quiet_off(&q);
    if (rc == 0 && !(a = calloc((size_t)names.n + 1, sizeof *a))) {
        seterr(err, errlen, "out of memory");
        rc = -1;
    }
    int n = 0;
    for (int i = 0; i < names.n && rc == 0; i++, n++) {
        a[n].key = names.name[i];
        names.name[i] = NULL; /* owned by a[] from here */
        H5T_class_t cls = H5T_NO_CLASS;
        hid_t type, attr;
        quiet_on(&q);
        attr = open_attr(h, a[n].key, &cls, &type, err, errlen);
        quiet_off(&q);
        if (attr < 0 || close_attr(attr, type, 0, err, errlen) != 0) {
            rc = -1;
        } else if (cls == H5T_INTEGER) {
            a[n].type = H5STORE_INT;
            rc = get_num(h, a[n].key, H5T_INTEGER, &a[n].i, err, errlen);
        } else if (cls == H5T_FLOAT) {
            a[n].type = H5STORE_DOUBLE;
            rc = get_num(h, a[n].key, H5T_FLOAT, &a[n].d, err, errlen);
        } else if (cls == H5T_STRING) {
            char *s = NULL;
            a[n].type = H5STORE_STR;
            rc = read_str(h, a[n].key, &s, err, errlen);
            a[n].s = s;
        } else {
            seterr(err, errlen, "%s: attribute %s is %s, expected an integer, a float or a string", h->path,
                   a[n].key, class_name(cls));
            rc = -1;
        }
    }
    for (int i = 0; i < names.n; i++)
        free(names.name[i]);
    free(names.name);
    if (rc != 0) {
        h5store_free_attrs(a, n);
        return -1;
    }
    *attrs = a;
    *n_attrs = n;
    return 0;
}
