/* Reading a store: hyperslabs (independent), the shards of a layout and
 * the verification of every checksum (collective). Data are read a block
 * of rows at a time (straight into the caller's buffer; the verification
 * of records no read covered goes through the handle's stage), and each
 * block's CRCs are taken while it is in cache. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/fsutil.h"
#include "io/h5store_internal.h"
#include "mpi/agree.h"

/* h->stage holds at least max(h5s_stage_elems(), need) floats. */
static int ensure_stage(h5store_t *h, int64_t need, char *err, size_t errlen)
{
    if (need < h5s_stage_elems())
        need = h5s_stage_elems();
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
static int read_slab(h5store_t *h, hid_t dset, const entry_t *e, const int64_t s[2], const int64_t c[2], float *buf,
                     char *err, size_t errlen)
{
    hsize_t st[2] = {(hsize_t)s[0], (hsize_t)s[1]}, ct[2] = {(hsize_t)c[0], (hsize_t)c[1]};
    hid_t fs = H5Dget_space(dset), ms = H5I_INVALID_HID;
    int rc = -1;
    if (fs < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, st, NULL, ct, NULL) < 0 ||
        (ms = H5Screate_simple(e->t.ndim, ct, NULL)) < 0) {
        h5s_err(err, errlen, "tensor %s: selection", e->t.name);
    } else if (H5Dread(dset, H5T_NATIVE_FLOAT, ms, fs, h->dxpl, buf) < 0) {
        char rg[96];
        h5s_err(err, errlen, "%s: cannot read tensor %s %s", h->path, e->t.name,
                h5s_region_str(rg, sizeof rg, e->t.ndim, e->t.shape, s, c));
    } else {
        rc = 0;
    }
    rc = h5s_close(ms, H5Sclose, rc);
    return h5s_close(fs, H5Sclose, rc);
}

static void mismatch(char *err, size_t errlen, const h5store_t *h, const entry_t *e, const srec_t *r, uint32_t got)
{
    char rg[96];
    seterr(err, errlen, "%s: checksum mismatch in %s %s (stored %08" PRIx32 ", data %08" PRIx32 ")", h->path, e->t.name,
           h5s_rec_str(rg, sizeof rg, &e->t, r), (uint32_t)r->crc, got);
}

/* ------------------------------------------------------------------ */
/* One hyperslab                                                       */
/* ------------------------------------------------------------------ */

/* The hyperslab start/count of tensor e as s, c (1-D: column 0 of one),
 * checked against its shape. */
static int read_region(const entry_t *e, const int64_t start[2], const int64_t count[2], int64_t s[2], int64_t c[2],
                       char *err, size_t errlen)
{
    char sh[48];
    s[0] = start[0], s[1] = e->t.ndim == 2 ? start[1] : 0;
    c[0] = count[0], c[1] = e->t.ndim == 2 ? count[1] : 1;
    if (s[0] < 0 || s[1] < 0 || c[0] < 0 || c[1] < 0 || s[0] + c[0] > e->t.shape[0] || s[1] + c[1] > e->t.shape[1] ||
        (e->t.ndim == 1 && (start[1] != 0 || count[1] != 1))) {
        seterr(err, errlen,
               "tensor %s: read of start [%" PRId64 ",%" PRId64 "] count [%" PRId64 ",%" PRId64 "] outside shape %s",
               e->t.name, start[0], start[1], count[0], count[1], h5s_shape_str(sh, sizeof sh, e->t.ndim, e->t.shape));
        return -1;
    }
    return 0;
}

/* Adds the rows [b0, b0+n) held at blk (region s, c; rows ld floats
 * apart) to the CRC of every record inside the region: crcs[k] for the
 * k-th such record. */
static void block_crcs(h5store_t *h, const entry_t *e, const int64_t s[2], const int64_t c[2], int64_t b0, int64_t n,
                       const float *blk, int64_t ld, uint32_t *crcs)
{
    for (int i = 0, k = 0; i < e->nrec; i++) {
        const srec_t *r = &e->rec[i];
        if (!h5s_rec_inside(r, s, c))
            continue;
        /* the record's rows in this block */
        const int64_t lo = r->s0 > b0 ? r->s0 : b0, hi = r->s0 + r->c0 < b0 + n ? r->s0 + r->c0 : b0 + n;
        const float *p = blk + (lo - b0) * ld + (r->s1 - s[1]);
        if (lo < hi && r->c1 == ld) /* whole stored rows: one contiguous piece */
            crcs[k] = crc32c_update(&h->crc, crcs[k], p, (size_t)((hi - lo) * ld) * sizeof(float));
        else
            for (int64_t row = lo; row < hi; row++, p += ld)
                crcs[k] = crc32c_update(&h->crc, crcs[k], p, (size_t)r->c1 * sizeof(float));
        k++;
    }
}

/* The CRCs block_crcs summed for region s, c against the records: marks
 * those that match, or names the first that does not. */
static int check_crcs(h5store_t *h, entry_t *e, const int64_t s[2], const int64_t c[2], const uint32_t *crcs, char *err,
                      size_t errlen)
{
    for (int i = 0, k = 0; i < e->nrec; i++) {
        srec_t *r = &e->rec[i];
        if (!h5s_rec_inside(r, s, c))
            continue;
        r->checked = crcs[k] == (uint32_t)r->crc;
        if (!r->checked) {
            mismatch(err, errlen, h, e, r, crcs[k]);
            return -1;
        }
        k++;
    }
    return 0;
}

/* Zeroed CRCs for every record inside region s, c (one more, so never
 * a zero-byte allocation), or NULL with err. */
static uint32_t *region_crcs(const entry_t *e, const int64_t s[2], const int64_t c[2], char *err, size_t errlen)
{
    int nin = 0;
    for (int i = 0; i < e->nrec; i++)
        nin += h5s_rec_inside(&e->rec[i], s, c);
    uint32_t *crcs = calloc((size_t)nin + 1, sizeof *crcs);
    if (!crcs)
        seterr(err, errlen, "tensor %s: out of memory", e->t.name);
    return crcs;
}

/* Reads region s, c of the open dataset into buf and checks every
 * recorded shard inside it, marking those that match. */
static int read_checked(h5store_t *h, hid_t dset, entry_t *e, const int64_t s[2], const int64_t c[2], float *buf,
                        char *err, size_t errlen)
{
    uint32_t *crcs = region_crcs(e, s, c, err, errlen);
    if (!crcs)
        return -1;
    /* straight into buf, a stage's worth of rows at a time, each block's
     * CRCs taken while it is in cache (through the stage and a copy out of
     * it cost the export a pass over every byte) */
    int rc = 0;
    const int64_t rows = h5s_stage_rows(h5s_stage_elems(), c[1]);
    for (int64_t r0 = 0; r0 < c[0] && rc == 0; r0 += rows) {
        const int64_t n = c[0] - r0 < rows ? c[0] - r0 : rows, b0 = s[0] + r0;
        const int64_t bs[2] = {b0, s[1]}, bc[2] = {n, c[1]};
        if ((rc = read_slab(h, dset, e, bs, bc, buf + r0 * c[1], err, errlen)) != 0)
            break;
        block_crcs(h, e, s, c, b0, n, buf + r0 * c[1], c[1], crcs);
    }
    if (rc == 0)
        rc = check_crcs(h, e, s, c, crcs, err, errlen);
    free(crcs);
    return rc;
}

int h5store_read(h5store_t *h, const char *name, const int64_t start[2], const int64_t count[2], float *buf, char *err,
                 size_t errlen)
{
    entry_t *e = h5s_find_entry(h, name);
    int64_t s[2], c[2];
    if (!e) {
        seterr(err, errlen, "tensor %s: not in %s", name, h->path);
        return -1;
    }
    if (count[0] == 0 || count[1] == 0)
        return 0;
    if (read_region(e, start, count, s, c, err, errlen))
        return -1;
    if (!buf) {
        seterr(err, errlen, "tensor %s: no buffer to read into", name);
        return -1;
    }
    h5s_quiet_t q;
    h5s_quiet_on(&q);
    int rc = -1;
    hid_t dset = H5Dopen2(h->file, name, H5P_DEFAULT);
    if (dset < 0)
        h5s_err(err, errlen, "%s: cannot open tensor %s", h->path, name);
    else
        rc = read_checked(h, dset, e, s, c, buf, err, errlen);
    rc = h5s_close_msg(dset, H5Dclose, rc, err, errlen, "tensor %s: H5Dclose", name);
    h5s_quiet_off(&q);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Shards and verification                                             */
/* ------------------------------------------------------------------ */

/* This rank's part of h5store_read_shards: the shape checks and the reads,
 * without agreeing on the result. */
static int read_shards_local(h5store_t *h, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns,
                             char *msg, size_t msglen)
{
    char a[48], b[48];
    int rc = 0;
    for (int i = 0; i < nt && rc == 0; i++) {
        const entry_t *e = h5s_find_entry(h, t[i].name);
        if (!e) {
            seterr(msg, msglen, "tensor %s: not in %s", t[i].name, h->path);
            rc = -1;
        } else if (e->t.ndim != t[i].ndim || e->t.shape[0] != t[i].shape[0] ||
                   (t[i].ndim == 2 && e->t.shape[1] != t[i].shape[1])) {
            seterr(msg, msglen, "tensor %s: shape %s in file, expected %s", t[i].name,
                   h5s_shape_str(a, sizeof a, e->t.ndim, e->t.shape),
                   h5s_shape_str(b, sizeof b, t[i].ndim, t[i].shape));
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

int h5store_read_shards(h5store_t *h, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns, char *err,
                        size_t errlen)
{
    char msg[MSG_LEN] = "";
    int rc = read_shards_local(h, t, nt, s, ns, msg, sizeof msg);
    rc = agree_mpi(h->comm, rc, msg, sizeof msg);
    if (rc)
        seterr(err, errlen, "%s", msg);
    return rc;
}

/* Reads one recorded shard in row blocks through the stage and returns
 * its CRC. */
static int shard_crc(h5store_t *h, hid_t dset, const entry_t *e, const srec_t *r, uint32_t *crc, char *err,
                     size_t errlen)
{
    /* one row over the stage: the caller sized it for the longest row */
    const int64_t rows = h5s_stage_rows(h->stage_n, r->c1);
    *crc = 0;
    for (int64_t r0 = 0; r0 < r->c0; r0 += rows) {
        int64_t n = r->c0 - r0 < rows ? r->c0 - r0 : rows;
        int64_t s[2] = {r->s0 + r0, r->s1}, c[2] = {n, r->c1};
        if (read_slab(h, dset, e, s, c, h->stage, err, errlen))
            return -1;
        *crc = crc32c_update(&h->crc, *crc, h->stage, (size_t)(n * r->c1) * sizeof(float));
    }
    return 0;
}

/* Every tensor has records and they tile it (metadata only: the same
 * verdict on every rank); the stage holds the longest row. */
static int verify_prepare(h5store_t *h, char *err, size_t errlen)
{
    int64_t maxrow = 1;
    for (int i = 0; i < h->n; i++) {
        if (h->e[i].nrec == 0) {
            seterr(err, errlen, "%s: tensor %s has no checksums", h->path, h->e[i].t.name);
            return -1;
        }
        if (h5s_check_cover(&h->e[i].t, h->e[i].rec, h->e[i].nrec, 0, err, errlen))
            return -1;
        if (h->e[i].t.shape[1] > maxrow)
            maxrow = h->e[i].t.shape[1];
    }
    return ensure_stage(h, maxrow, err, errlen);
}

/* This rank's turns: the k-th record not marked in `done` (counting over
 * all tensors in catalog order) is checked by rank k % size. stat: shards
 * and bytes checked, mismatches (the first one's message in err). */
static int verify_turns(h5store_t *h, const unsigned char *done, int64_t stat[3], char *err, size_t errlen)
{
    int rc = 0;
    int64_t k = 0, idx = 0;
    for (int i = 0; i < h->n && rc == 0; i++) {
        entry_t *e = &h->e[i];
        hid_t dset = H5I_INVALID_HID;
        for (int j = 0; j < e->nrec && rc == 0; j++, idx++) {
            if ((done && done[idx]) || k++ % h->size != h->rank)
                continue;
            if (dset < 0 && (dset = H5Dopen2(h->file, e->t.name, H5P_DEFAULT)) < 0) {
                h5s_err(err, errlen, "%s: cannot open tensor %s", h->path, e->t.name);
                rc = -1;
                break;
            }
            uint32_t crc;
            if ((rc = shard_crc(h, dset, e, &e->rec[j], &crc, err, errlen)) != 0)
                break;
            stat[0]++;
            stat[1] += e->rec[j].c0 * e->rec[j].c1 * (int64_t)sizeof(float);
            if (crc != (uint32_t)e->rec[j].crc && stat[2]++ == 0)
                mismatch(err, errlen, h, e, &e->rec[j], crc);
        }
        rc = h5s_close_msg(dset, H5Dclose, rc, err, errlen, "tensor %s: H5Dclose", e->t.name);
    }
    return stat[2] > 0 ? -1 : rc;
}

/* Collective: h5store_verify over the records not marked in `done` (all
 * when done is NULL; indexed by record, counting over all tensors in
 * catalog order), the ranks taking turns over those left. */
static int verify_records(h5store_t *h, const unsigned char *done, int64_t *n_shards, int64_t *n_bytes, char *err,
                          size_t errlen)
{
    char msg[MSG_LEN] = "";
    int64_t stat[3] = {0, 0, 0}; /* shards, bytes, mismatches */
    h5s_quiet_t q;
    h5s_quiet_on(&q);
    int rc = verify_prepare(h, msg, sizeof msg), mrc;
    if (rc == 0)
        rc = verify_turns(h, done, stat, msg, sizeof msg);
    h5s_quiet_off(&q);
    if ((mrc = MPI_Allreduce(MPI_IN_PLACE, stat, 3, MPI_INT64_T, MPI_SUM, h->comm)) != MPI_SUCCESS) {
        h5s_mpierr(err, errlen, mrc, "MPI_Allreduce (verify)");
        return -1;
    }
    if (stat[2] > 1 && rc != 0 && strstr(msg, "checksum mismatch")) {
        size_t l = strlen(msg);
        snprintf(msg + l, sizeof msg - l, " (+%" PRId64 " more)", stat[2] - 1);
    }
    if (agree_mpi(h->comm, rc, msg, sizeof msg)) {
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

int h5store_read_verify(h5store_t *h, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns, char *err,
                        size_t errlen)
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
    if (agree_mpi(h->comm, rc, msg, sizeof msg)) {
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
    } else if (total > 0 && (mrc = MPI_Allreduce(MPI_IN_PLACE, done, (int)total, MPI_UNSIGNED_CHAR, MPI_MAX,
                                                 h->comm)) != MPI_SUCCESS) {
        h5s_mpierr(err, errlen, mrc, "MPI_Allreduce (records checked)");
        rc = -1;
    }
    if (rc == 0)
        rc = verify_records(h, done, NULL, NULL, err, errlen);
    free(done);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Views into a mapping of the file                                    */
/* ------------------------------------------------------------------ */

/* h->map: the whole file, read-only, made once. 0 when mapped. */
static int ensure_map(h5store_t *h)
{
    if (h->map_tried)
        return h->map ? 0 : -1;
    h->map_tried = 1;
    hsize_t ub = 0;
    hid_t fcpl = H5Fget_create_plist(h->file);
    const int ok = fcpl >= 0 && H5Pget_userblock(fcpl, &ub) >= 0;
    if (h5s_close(fcpl, H5Pclose, ok ? 0 : -1) != 0)
        return -1;
    const int fd = open(h->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return -1;
    void *m = fstat(fd, &st) == 0 && st.st_size > 0 ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)
                                                    : MAP_FAILED;
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED)
        return -1;
    h->map = m;
    h->map_len = (int64_t)st.st_size;
    h->map_base = (int64_t)ub;
    return 0;
}

/* Where region s, c of the open dataset lies in the file: *off, the byte
 * offset of the stored block holding it (a chunk, or the whole contiguous
 * dataset), o[2] that block's first element and *ld its row length. 0, or
 * 1 when the layout allows no view (filters, another type, a region over
 * two chunks, storage not allocated). */
static int locate(h5store_t *h, hid_t dset, const entry_t *e, const int64_t s[2], const int64_t c[2], int64_t *off,
                  int64_t o[2], int64_t *ld)
{
    hid_t dcpl = H5Dget_create_plist(dset), type = H5Dget_type(dset);
    const H5D_layout_t lay = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    int none = dcpl < 0 || type < 0 || H5Pget_nfilters(dcpl) != 0 || H5Tequal(type, H5T_IEEE_F32LE) <= 0;
    hsize_t cd[2] = {(hsize_t)e->t.shape[0], (hsize_t)e->t.shape[1]}, co[2] = {0, 0}, size = 0;
    haddr_t addr = HADDR_UNDEF;
    unsigned mask = 0;
    if (!none && lay == H5D_CHUNKED && H5Pget_chunk(dcpl, 2, cd) == e->t.ndim) {
        if (e->t.ndim == 1)
            cd[1] = 1;
        for (int d = 0; d < 2; d++) /* the chunk of the region's first element; its last must be in it */
            co[d] = (hsize_t)s[d] / cd[d] * cd[d];
        none = (hsize_t)(s[0] + c[0]) > co[0] + cd[0] || (hsize_t)(s[1] + c[1]) > co[1] + cd[1] ||
               H5Dget_chunk_info_by_coord(dset, co, &mask, &addr, &size) < 0 || mask != 0 ||
               size != cd[0] * cd[1] * sizeof(float);
    } else if (!none && lay == H5D_CONTIGUOUS) {
        addr = H5Dget_offset(dset);
        size = H5Dget_storage_size(dset);
        none = size != cd[0] * cd[1] * sizeof(float);
    } else {
        none = 1;
    }
    h5s_close(type, H5Tclose, 0);
    h5s_close(dcpl, H5Pclose, 0);
    none = none || addr == HADDR_UNDEF || (int64_t)(addr + size) + h->map_base > h->map_len;
    if (none) {
        H5Eclear2(H5E_DEFAULT);
        return 1;
    }
    *off = (int64_t)addr + h->map_base;
    o[0] = (int64_t)co[0], o[1] = (int64_t)co[1];
    *ld = (int64_t)cd[1];
    return 0;
}

/* The mapping's page-table entries for n floats at p, made in one call
 * (MADV_POPULATE_READ, Linux 5.14) instead of a fault per 16 pages as the
 * checksums first touch them. */
static void populate(const float *p, int64_t n)
{
#ifdef MADV_POPULATE_READ
    fs_advise(p, (size_t)n * sizeof *p, MADV_POPULATE_READ);
#else
    (void)p, (void)n;
#endif
}

/* Checks every record inside region s, c, held at p with rows ld floats
 * apart, marking those that match. */
static int view_crcs(h5store_t *h, entry_t *e, const int64_t s[2], const int64_t c[2], const float *p, int64_t ld,
                     char *err, size_t errlen)
{
    uint32_t *crcs = region_crcs(e, s, c, err, errlen);
    if (!crcs)
        return -1;
    block_crcs(h, e, s, c, s[0], c[0], p, ld, crcs);
    const int rc = check_crcs(h, e, s, c, crcs, err, errlen);
    free(crcs);
    return rc;
}

int h5store_view(h5store_t *h, const char *name, const int64_t start[2], const int64_t count[2], const float **p,
                 int64_t *ld, char *err, size_t errlen)
{
    entry_t *e = h5s_find_entry(h, name);
    int64_t s[2], c[2], off = 0, o[2] = {0, 0};
    if (!e) {
        seterr(err, errlen, "tensor %s: not in %s", name, h->path);
        return -1;
    }
    if (read_region(e, start, count, s, c, err, errlen))
        return -1;
    if (count[0] == 0 || count[1] == 0 || ensure_map(h) != 0)
        return 0;
    h5s_quiet_t q;
    h5s_quiet_on(&q);
    int rc = 0;
    hid_t dset = H5Dopen2(h->file, name, H5P_DEFAULT);
    if (dset < 0) {
        h5s_err(err, errlen, "%s: cannot open tensor %s", h->path, name);
        rc = -1;
    } else if (locate(h, dset, e, s, c, &off, o, ld) == 0 && off % (int64_t)sizeof(float) == 0) {
        *p = (const float *)(h->map + off) + (s[0] - o[0]) * *ld + (s[1] - o[1]);
        populate(*p, (c[0] - 1) * *ld + c[1]);
        rc = view_crcs(h, e, s, c, *p, *ld, err, errlen) == 0 ? 1 : -1;
    }
    if (dset >= 0 && H5Dclose(dset) < 0 && rc >= 0) { /* a view (1) is no view if the close failed */
        h5s_err(err, errlen, "tensor %s: H5Dclose", name);
        rc = -1;
    }
    h5s_quiet_off(&q);
    return rc;
}
