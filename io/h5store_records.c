/* Checksum records (see h5store_internal.h): one per shard written, a
 * hyperslab and the CRC-32C of its bytes. The writer gathers every rank's
 * records and proves they tile each tensor; they are stored beside the
 * data as the dataset's crc32c attribute, int64 [n,5]: start0 start1
 * count0 count1 crc; the reader loads them with the catalog. Also the
 * shape and region strings that name them in messages. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/errmsg.h"
#include "io/h5store_internal.h"

const char *h5s_shape_str(char *buf, size_t n, int ndim, const int64_t shape[2])
{
    if (ndim == 1)
        snprintf(buf, n, "[%" PRId64 "]", shape[0]);
    else
        snprintf(buf, n, "[%" PRId64 ",%" PRId64 "]", shape[0], shape[1]);
    return buf;
}

const char *h5s_region_str(char *buf, size_t n, int ndim, const int64_t shape[2], const int64_t s[2],
                           const int64_t c[2])
{
    if (ndim == 1)
        snprintf(buf, n, "elements %" PRId64 "..%" PRId64, s[0], s[0] + c[0] - 1);
    else if (s[1] == 0 && c[1] == shape[1])
        snprintf(buf, n, "rows %" PRId64 "..%" PRId64, s[0], s[0] + c[0] - 1);
    else
        snprintf(buf, n, "rows %" PRId64 "..%" PRId64 " cols %" PRId64 "..%" PRId64, s[0], s[0] + c[0] - 1, s[1],
                 s[1] + c[1] - 1);
    return buf;
}

const char *h5s_rec_str(char *buf, size_t n, const h5store_tensor_t *t, const srec_t *r)
{
    int64_t s[2] = {r->s0, r->s1}, c[2] = {r->c0, r->c1};
    return h5s_region_str(buf, n, t->ndim, t->shape, s, c);
}

int h5s_rec_inside(const srec_t *r, const int64_t s[2], const int64_t c[2])
{
    return r->s0 >= s[0] && r->s0 + r->c0 <= s[0] + c[0] && r->s1 >= s[1] && r->s1 + r->c1 <= s[1] + c[1];
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

/* Each element has exactly one checksum, written exactly once. */
int h5s_check_cover(const h5store_tensor_t *t, const srec_t *r, int n, int writer, char *err, size_t errlen)
{
    char a[96], b[96], sh[48];
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].s0 < 0 || r[i].s1 < 0 || r[i].c0 < 1 || r[i].c1 < 1 || r[i].s0 + r[i].c0 > t->shape[0] ||
            r[i].s1 + r[i].c1 > t->shape[1]) {
            seterr(err, errlen, "tensor %s: shard %s outside shape %s", t->name, h5s_rec_str(a, sizeof a, t, &r[i]),
                   h5s_shape_str(sh, sizeof sh, t->ndim, t->shape));
            return -1;
        }
        sum += r[i].c0 * r[i].c1;
        for (int j = i + 1; j < n && r[j].s0 < r[i].s0 + r[i].c0; j++) {
            if (r[j].s1 < r[i].s1 + r[i].c1 && r[i].s1 < r[j].s1 + r[j].c1) {
                if (writer)
                    seterr(err, errlen, "tensor %s: shards of rank %d (%s) and rank %d (%s) overlap", t->name,
                           r[i].rank, h5s_rec_str(a, sizeof a, t, &r[i]), r[j].rank,
                           h5s_rec_str(b, sizeof b, t, &r[j]));
                else
                    seterr(err, errlen, "tensor %s: checksummed shards %s and %s overlap", t->name,
                           h5s_rec_str(a, sizeof a, t, &r[i]), h5s_rec_str(b, sizeof b, t, &r[j]));
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
/* Gathering the writers' records                                      */
/* ------------------------------------------------------------------ */

enum { GATHER_F = 7 }; /* int64 fields of a gathered record: tensor s0 s1 c0 c1 crc rank */

/* This rank's non-empty shards as GATHER_F-field rows (with their CRCs)
 * into a malloc'd *out; their count into *n. */
static int local_records(int rank, const crc32c_t *cc, const h5store_tensor_t *t, const h5store_shard_t *s, int ns,
                         int64_t **out, int *n, char *err, size_t errlen)
{
    int nloc = 0;
    for (int i = 0; i < ns; i++)
        nloc += s[i].count[0] > 0 && s[i].count[1] > 0;
    int64_t *mine = malloc((size_t)(nloc > 0 ? nloc : 1) * GATHER_F * sizeof *mine);
    if (!mine) {
        seterr(err, errlen, "out of memory for %d shard records", nloc);
        return -1;
    }
    int k = 0;
    for (int i = 0; i < ns; i++) {
        if (s[i].count[0] <= 0 || s[i].count[1] <= 0)
            continue;
        int64_t *m = mine + (size_t)k++ * GATHER_F;
        m[0] = s[i].tensor;
        m[1] = s[i].start[0];
        m[2] = t[s[i].tensor].ndim == 1 ? 0 : s[i].start[1];
        m[3] = s[i].count[0];
        m[4] = s[i].count[1];
        m[5] = crc32c_update(cc, 0, s[i].buf, (size_t)(s[i].count[0] * s[i].count[1]) * sizeof(float));
        m[6] = rank;
    }
    *out = mine;
    *n = nloc;
    return 0;
}

/* The proof that the shards tile each tensor and the tables written
 * beside the data both need every rank's records on every rank. */
int h5s_gather_records(MPI_Comm comm, int rank, int size, const crc32c_t *cc, const h5store_tensor_t *t,
                       const h5store_shard_t *s, int ns, srec_t **out, int *n_out, char *err, size_t errlen)
{
    int nloc = 0, rc = -1, mrc;
    int64_t *mine = NULL, *all = NULL;
    srec_t *r = NULL;
    int *cnt = NULL;
    if (local_records(rank, cc, t, s, ns, &mine, &nloc, err, errlen))
        goto done;
    if (!(cnt = malloc(2 * (size_t)size * sizeof *cnt))) {
        seterr(err, errlen, "out of memory for %d shard records", nloc);
        goto done;
    }
    int nf = nloc * GATHER_F;
    if ((mrc = MPI_Allgather(&nf, 1, MPI_INT, cnt, 1, MPI_INT, comm)) != MPI_SUCCESS) {
        h5s_mpierr(err, errlen, mrc, "MPI_Allgather (shard counts)");
        goto done;
    }
    int *displ = cnt + size;
    int64_t total = 0;
    for (int p = 0; p < size; p++) {
        displ[p] = (int)total;
        total += cnt[p];
    }
    if (total > INT_MAX) {
        seterr(err, errlen, "too many shards (%" PRId64 " records)", total / GATHER_F);
        goto done;
    }
    const int n = (int)(total / GATHER_F);
    all = malloc((size_t)(total > 0 ? total : 1) * sizeof *all);
    r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    if (!all || !r) {
        seterr(err, errlen, "out of memory for %" PRId64 " shard records", total / GATHER_F);
        goto done;
    }
    mrc = MPI_Allgatherv(mine, nf, MPI_INT64_T, all, cnt, displ, MPI_INT64_T, comm);
    if (mrc != MPI_SUCCESS) {
        h5s_mpierr(err, errlen, mrc, "MPI_Allgatherv (shard records)");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const int64_t *m = all + (size_t)i * GATHER_F;
        r[i] = (srec_t){
            .tensor = (int)m[0], .s0 = m[1], .s1 = m[2], .c0 = m[3], .c1 = m[4], .crc = m[5], .rank = (int)m[6]};
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

/* ------------------------------------------------------------------ */
/* The crc32c attribute                                                */
/* ------------------------------------------------------------------ */

int h5s_write_crc_attr(hid_t dset, const h5store_tensor_t *t, const srec_t *r, int n, char *err, size_t errlen)
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
    if (space < 0)
        h5s_err(err, errlen, "tensor %s: checksum table space", t->name);
    else if ((attr = H5Acreate2(dset, CRC_ATTR, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
             H5Awrite(attr, H5T_NATIVE_INT64, v) < 0)
        h5s_err(err, errlen, "tensor %s: cannot write the checksum table", t->name);
    else
        rc = 0;
    rc = h5s_close_msg(attr, H5Aclose, rc, err, errlen, "tensor %s: H5Aclose", t->name);
    rc = h5s_close_msg(space, H5Sclose, rc, err, errlen, "tensor %s: H5Sclose", t->name);
    free(v);
    return rc;
}

/* The table's values (n rows of 5) into e's records, sorted by start. */
static int unpack_records(entry_t *e, const int64_t *v, int n, char *err, size_t errlen)
{
    if (!(e->rec = malloc((size_t)(n > 0 ? n : 1) * sizeof *e->rec))) {
        seterr(err, errlen, "tensor %s: out of memory for the checksum table", e->t.name);
        return -1;
    }
    e->nrec = n;
    for (int i = 0; i < n; i++) {
        const int64_t *x = v + (size_t)i * 5;
        e->rec[i] = (srec_t){.s0 = x[0], .s1 = x[1], .c0 = x[2], .c1 = x[3], .crc = x[4]};
    }
    qsort(e->rec, (size_t)n, sizeof *e->rec, cmp_srec);
    return 0;
}

int h5s_read_crc_attr(hid_t dset, entry_t *e, char *err, size_t errlen)
{
    htri_t has = H5Aexists(dset, CRC_ATTR);
    if (has < 0) {
        h5s_err(err, errlen, "tensor %s: H5Aexists", e->t.name);
        return -1;
    }
    if (has == 0)
        return 0;
    hid_t attr = H5Aopen(dset, CRC_ATTR, H5P_DEFAULT), space = H5I_INVALID_HID;
    int64_t *v = NULL;
    int rc = -1;
    hsize_t dims[2] = {0, 0};
    if (attr < 0 || (space = H5Aget_space(attr)) < 0) {
        h5s_err(err, errlen, "tensor %s: cannot open its checksum table", e->t.name);
        goto done;
    }
    if (H5Sget_simple_extent_ndims(space) != 2 || H5Sget_simple_extent_dims(space, dims, NULL) < 0 || dims[1] != 5 ||
        dims[0] > INT_MAX) {
        seterr(err, errlen, "tensor %s: checksum table is not [n,5]", e->t.name);
        goto done;
    }
    if (!(v = malloc((size_t)(dims[0] > 0 ? dims[0] : 1) * 5 * sizeof *v))) {
        seterr(err, errlen, "tensor %s: out of memory for the checksum table", e->t.name);
        goto done;
    }
    if (dims[0] > 0 && H5Aread(attr, H5T_NATIVE_INT64, v) < 0) {
        h5s_err(err, errlen, "tensor %s: cannot read its checksum table", e->t.name);
        goto done;
    }
    rc = unpack_records(e, v, (int)dims[0], err, errlen);
done:
    free(v);
    rc = h5s_close(space, H5Sclose, rc);
    return h5s_close(attr, H5Aclose, rc);
}
