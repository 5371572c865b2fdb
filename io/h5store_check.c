/* Validation of h5store_write's inputs, before any file is created: each
 * rank checks what it was handed (names, shapes, chunks, attributes, its
 * shards' bounds and buffers), then the ranks prove they were handed the
 * same tensor list and attributes. Whether the shards of all ranks tile
 * each tensor is checked on the gathered records (h5store_records.c). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/h5store_internal.h"

static int cmp_tensor_ptr(const void *a, const void *b)
{
    const h5store_tensor_t *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int check_name(const char *name, char *err, size_t errlen)
{
    size_t n = strnlen(name, H5STORE_NAME_MAX);
    if (n == 0 || n == H5STORE_NAME_MAX) {
        seterr(err, errlen, "tensor name '%.*s' is empty or not shorter than %d bytes", (int)(n > 40 ? 40 : n), name,
               H5STORE_NAME_MAX);
        return -1;
    }
    if (name[0] == '/' || name[n - 1] == '/' || strstr(name, "//") != NULL || name[0] == '.') {
        seterr(err, errlen,
               "tensor name '%s': want a relative path like 'params/wte' "
               "(no leading '/' or '.', no trailing or double '/')",
               name);
        return -1;
    }
    return 0;
}

/* One tensor's name, ndim, shape and chunk. */
static int check_tensor(const h5store_tensor_t *x, char *err, size_t errlen)
{
    char sh[48];
    if (check_name(x->name, err, errlen))
        return -1;
    if ((x->ndim != 1 && x->ndim != 2) || x->shape[0] < 1 || x->shape[1] < 1 || (x->ndim == 1 && x->shape[1] != 1)) {
        seterr(err, errlen,
               "tensor %s: bad ndim %d / shape [%" PRId64 ",%" PRId64 "] "
               "(want 1-D [n] with shape[1] = 1, or 2-D, all dims >= 1)",
               x->name, x->ndim, x->shape[0], x->shape[1]);
        return -1;
    }
    if (x->chunk[0] != 0 || (x->ndim == 2 && x->chunk[1] != 0)) {
        int64_t c1 = x->ndim == 2 ? x->chunk[1] : 1;
        /* HDF5 limits a chunk to 4 GiB and to the dataset's extent */
        if (x->chunk[0] < 1 || x->chunk[0] > x->shape[0] || c1 < 1 || c1 > x->shape[1] ||
            x->chunk[0] * c1 > (int64_t)(UINT32_MAX / sizeof(float))) {
            seterr(err, errlen,
                   "tensor %s: chunk [%" PRId64 ",%" PRId64 "] does not fit "
                   "shape %s (or is over 4 GiB)",
                   x->name, x->chunk[0], x->chunk[1], h5s_shape_str(sh, sizeof sh, x->ndim, x->shape));
            return -1;
        }
    }
    return 0;
}

/* No name twice in the list (sorted copies of the pointers). */
static int check_unique_names(const h5store_tensor_t *t, int nt, char *err, size_t errlen)
{
    if (nt < 2)
        return 0;
    const h5store_tensor_t **p = malloc((size_t)nt * sizeof *p);
    if (!p) {
        seterr(err, errlen, "out of memory checking %d tensor names", nt);
        return -1;
    }
    for (int i = 0; i < nt; i++)
        p[i] = &t[i];
    qsort(p, (size_t)nt, sizeof *p, cmp_tensor_ptr);
    int rc = 0;
    for (int i = 1; i < nt && rc == 0; i++)
        if (strcmp(p[i - 1]->name, p[i]->name) == 0) {
            seterr(err, errlen, "tensor %s appears twice in the list", p[i]->name);
            rc = -1;
        }
    free(p);
    return rc;
}

static int check_attrs(const h5store_attr_t *a, int na, char *err, size_t errlen)
{
    for (int i = 0; i < na; i++) {
        if (!a[i].key || !a[i].key[0] || strncmp(a[i].key, RESERVED_PREFIX, strlen(RESERVED_PREFIX)) == 0 ||
            (a[i].type != H5STORE_INT && a[i].type != H5STORE_DOUBLE && a[i].type != H5STORE_STR) ||
            (a[i].type == H5STORE_STR && !a[i].s)) {
            seterr(err, errlen, "attribute %d ('%s'): empty or reserved key, bad type, or NULL string", i,
                   a[i].key ? a[i].key : "(null)");
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(a[i].key, a[j].key) == 0) {
                seterr(err, errlen, "attribute '%s' appears twice", a[i].key);
                return -1;
            }
    }
    return 0;
}

/* Shard i of this rank names a tensor, lies inside it and has a buffer
 * (an empty shard need do neither). */
static int check_shard(const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int i, int rank, char *err,
                       size_t errlen)
{
    char sh[48], rg[96];
    if (s->tensor < 0 || s->tensor >= nt) {
        seterr(err, errlen, "rank %d: shard %d names tensor %d of %d", rank, i, s->tensor, nt);
        return -1;
    }
    const h5store_tensor_t *x = &t[s->tensor];
    if (s->count[0] == 0 || s->count[1] == 0)
        return 0; /* nothing to write; start is not looked at */
    int64_t n1 = x->ndim == 1 ? 1 : x->shape[1];
    if (s->start[0] < 0 || s->start[1] < 0 || s->count[0] < 0 || s->count[1] < 0 ||
        s->start[0] + s->count[0] > x->shape[0] || s->start[1] + s->count[1] > n1) {
        seterr(err, errlen,
               "rank %d: shard %d of tensor %s (start [%" PRId64 ",%" PRId64 "] count [%" PRId64 ",%" PRId64
               "]) outside shape %s",
               rank, i, x->name, s->start[0], s->start[1], s->count[0], s->count[1],
               h5s_shape_str(sh, sizeof sh, x->ndim, x->shape));
        return -1;
    }
    if (!s->buf) {
        int64_t c[2] = {s->count[0], s->count[1]};
        seterr(err, errlen, "rank %d: shard %d of tensor %s (%s) has no buffer", rank, i, x->name,
               h5s_region_str(rg, sizeof rg, x->ndim, x->shape, s->start, c));
        return -1;
    }
    return 0;
}

int h5s_check_inputs(const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns, const h5store_attr_t *a,
                     int na, int rank, char *err, size_t errlen)
{
    if (nt < 0 || ns < 0 || na < 0 || (nt > 0 && !t) || (ns > 0 && !s) || (na > 0 && !a)) {
        seterr(err, errlen, "h5store_write: bad counts or NULL lists");
        return -1;
    }
    for (int i = 0; i < nt; i++)
        if (check_tensor(&t[i], err, errlen))
            return -1;
    if (check_unique_names(t, nt, err, errlen) || check_attrs(a, na, err, errlen))
        return -1;
    for (int i = 0; i < ns; i++)
        if (check_shard(t, nt, &s[i], i, rank, err, errlen))
            return -1;
    return 0;
}

/* A checksum of the tensor list and attributes. */
static uint32_t inputs_hash(const crc32c_t *cc, const h5store_tensor_t *t, int nt, const h5store_attr_t *a, int na)
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

/* The same tensors and attributes everywhere: min(h) == max(h). */
int h5s_check_same_inputs(MPI_Comm comm, const crc32c_t *cc, const h5store_tensor_t *t, int nt, const h5store_attr_t *a,
                          int na, char *err, size_t errlen)
{
    int64_t h = inputs_hash(cc, t, nt, a, na), hh[2] = {h, -h}, hr[2];
    int mrc = MPI_Allreduce(hh, hr, 2, MPI_INT64_T, MPI_MIN, comm);
    if (mrc != MPI_SUCCESS) {
        h5s_mpierr(err, errlen, mrc, "MPI_Allreduce (input check)");
        return -1; /* an MPI failure is not recoverable anyway */
    }
    if (hr[0] != -hr[1]) {
        seterr(err, errlen,
               "the tensor list or attributes differ between ranks "
               "(h5store_write needs the same ones on every rank)");
        return -1;
    }
    return 0;
}
