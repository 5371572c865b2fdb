/* h5store_write: the collective write of a new file (see h5store.h).
 *
 * The steps, each agreed on by every rank before the next one starts (so
 * no rank enters a collective HDF5 call that another rank will not):
 * inputs checked and the same everywhere; every shard's record gathered
 * and the shards proved to tile each tensor; this rank's shards grouped by
 * tensor; the temporary file created, its space reserved, its root
 * attributes written; each tensor created and written; the file flushed,
 * closed and published under its final name (h5store_publish.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/h5store_internal.h"
#include "mpi/agree.h"

/* One h5store_write call: what its steps share and its failure path
 * releases. */
typedef struct wjob {
    MPI_Comm comm;
    int rank, size;
    const char *path;
    char tmp[PATH_MAX]; /* "<dir>/.<name>.tmp" */
    char msg[MSG_LEN];  /* the failure, the same on every rank */
    crc32c_t *cc;
    srec_t *rec; /* every rank's shard records, sorted by (tensor, start) */
    int nrec;
    int *nmine; /* nmine[i]..nmine[i+1]: this rank's shards of tensor i in mine */
    const h5store_shard_t **mine;
    float *stage; /* stage_n floats: at least one row of every shard */
    int64_t stage_n;
    hid_t fapl, file, dxpl;
    off_t reserved; /* bytes reserved for the file by rank 0 */
} wjob_t;

/* The end of tensor i's records, which start at b. */
static int rec_end(const wjob_t *w, int i, int b)
{
    while (b < w->nrec && w->rec[b].tensor == i)
        b++;
    return b;
}

/* Collective: the dataset of one tensor over file space `space`
 * (intermediate groups made as needed), chunked as asked. */
static hid_t create_dataset(hid_t file, const h5store_tensor_t *t, hid_t space, char *err, size_t errlen)
{
    hid_t lcpl = H5I_INVALID_HID, dcpl = H5I_INVALID_HID, dset = H5I_INVALID_HID;
    int rc = -1;
    if ((lcpl = H5Pcreate(H5P_LINK_CREATE)) < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        (dcpl = H5Pcreate(H5P_DATASET_CREATE)) < 0 ||
        /* every element is written: skip HDF5's zero fill (seconds per GiB) */
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0) {
        h5s_err(err, errlen, "tensor %s: property lists", t->name);
        goto done;
    }
    if (t->chunk[0] > 0) {
        hsize_t cd[2] = {(hsize_t)t->chunk[0], t->ndim == 2 ? (hsize_t)t->chunk[1] : 1};
        if (H5Pset_chunk(dcpl, t->ndim, cd) < 0) {
            h5s_err(err, errlen, "tensor %s: H5Pset_chunk", t->name);
            goto done;
        }
    }
    dset = H5Dcreate2(file, t->name, H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
    if (dset < 0)
        h5s_err(err, errlen, "cannot create dataset %s", t->name);
    else
        rc = 0;
done:
    rc = h5s_close(dcpl, H5Pclose, rc);
    rc = h5s_close(lcpl, H5Pclose, rc);
    if (rc != 0 && dset >= 0) {
        (void)h5s_close(dset, H5Dclose, -1);
        seterr(err, errlen, "tensor %s: closing HDF5 objects failed", t->name);
        return H5I_INVALID_HID;
    }
    return dset;
}

/* Independent: one shard of this rank into dset (file space `space`), a
 * block of rows at a time copied into the stage of stage_n floats. */
static int write_shard(hid_t dset, hid_t space, hid_t dxpl, const h5store_tensor_t *t, const h5store_shard_t *sh,
                       float *stage, int64_t stage_n, char *err, size_t errlen)
{
    const int64_t rows = h5s_stage_rows(stage_n, sh->count[1]);
    int rc = 0;
    for (int64_t r0 = 0; r0 < sh->count[0] && rc == 0; r0 += rows) {
        const int64_t n = sh->count[0] - r0 < rows ? sh->count[0] - r0 : rows;
        hsize_t st[2] = {(hsize_t)(sh->start[0] + r0), t->ndim == 2 ? (hsize_t)sh->start[1] : 0};
        hsize_t ct[2] = {(hsize_t)n, (hsize_t)sh->count[1]};
        hid_t fs = H5I_INVALID_HID, ms = H5I_INVALID_HID;
        memcpy(stage, sh->buf + r0 * sh->count[1], (size_t)(n * sh->count[1]) * sizeof *stage);
        if ((fs = H5Scopy(space)) < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, st, NULL, ct, NULL) < 0 ||
            (ms = H5Screate_simple(t->ndim, ct, NULL)) < 0) {
            h5s_err(err, errlen, "tensor %s: selection", t->name);
            rc = -1;
        } else if (H5Dwrite(dset, H5T_NATIVE_FLOAT, ms, fs, dxpl, stage) < 0) {
            h5s_err(err, errlen, "cannot write tensor %s", t->name);
            rc = -1;
        }
        rc = h5s_close_msg(fs, H5Sclose, rc, err, errlen, "tensor %s: H5Sclose", t->name);
        rc = h5s_close_msg(ms, H5Sclose, rc, err, errlen, "tensor %s: H5Sclose", t->name);
    }
    return rc;
}

/* Collective: create one dataset and its checksum table; then this rank
 * writes its shards of the tensor (mine[0..nmine)) with independent
 * transfers. A rank with no shard of the tensor writes nothing: the ranks
 * do not wait for each other over the data, only the dataset's creation
 * is collective. */
static int write_tensor(const wjob_t *w, const h5store_tensor_t *t, const srec_t *rec, int nrec,
                        const h5store_shard_t *const *mine, int nmine, char *err, size_t errlen)
{
    hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
    hid_t space = H5Screate_simple(t->ndim, dims, NULL), dset = H5I_INVALID_HID;
    int rc = -1;
    if (space < 0) {
        h5s_err(err, errlen, "tensor %s: property lists", t->name);
        return -1;
    }
    if ((dset = create_dataset(w->file, t, space, err, errlen)) >= 0 &&
        h5s_write_crc_attr(dset, t, rec, nrec, err, errlen) == 0) {
        rc = 0;
        for (int j = 0; j < nmine && rc == 0; j++)
            rc = write_shard(dset, space, w->dxpl, t, mine[j], w->stage, w->stage_n, err, errlen);
    }
    rc = h5s_close_msg(dset, H5Dclose, rc, err, errlen, "tensor %s: H5Dclose", t->name);
    if (h5s_close(space, H5Sclose, 0) != 0 && rc == 0) {
        seterr(err, errlen, "tensor %s: closing HDF5 objects failed", t->name);
        rc = -1;
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* The steps                                                           */
/* ------------------------------------------------------------------ */

/* Each rank's inputs are sound, and the same as every other rank's. */
static int step_inputs(wjob_t *w, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns,
                       const h5store_attr_t *a, int na)
{
    int rc;
    if (!w->cc) {
        seterr(w->msg, sizeof w->msg, "out of memory");
        rc = -1;
    } else {
        crc32c_init(w->cc, 1);
        rc = h5s_check_inputs(t, nt, s, ns, a, na, w->rank, w->msg, sizeof w->msg);
        if (rc == 0)
            rc = h5s_temp_path(w->path, w->tmp, sizeof w->tmp, w->msg, sizeof w->msg);
    }
    if (agree_mpi(w->comm, rc, w->msg, sizeof w->msg))
        return -1;
    return h5s_check_same_inputs(w->comm, w->cc, t, nt, a, na, w->msg, sizeof w->msg);
}

/* Every shard record everywhere; the shards must tile each tensor. */
static int step_records(wjob_t *w, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns)
{
    int rc = h5s_gather_records(w->comm, w->rank, w->size, w->cc, t, s, ns, &w->rec, &w->nrec, w->msg, sizeof w->msg);
    if (agree_mpi(w->comm, rc, w->msg, sizeof w->msg))
        return -1;
    for (int i = 0, b = 0; i < nt; i++) {
        const int e = rec_end(w, i, b);
        if (h5s_check_cover(&t[i], w->rec + b, e - b, 1, w->msg, sizeof w->msg))
            return -1; /* same records on every rank: same verdict */
        b = e;
    }
    return 0;
}

/* This rank's non-empty shards grouped by tensor, and the stage. */
static int step_group(wjob_t *w, int nt, const h5store_shard_t *s, int ns)
{
    for (int i = 0; i < ns; i++)
        if (s[i].count[0] > 0 && s[i].count[1] > w->stage_n)
            w->stage_n = s[i].count[1]; /* a stage holds at least one row */
    w->nmine = calloc((size_t)nt + 1, sizeof *w->nmine);
    w->mine = malloc((size_t)(ns > 0 ? ns : 1) * sizeof *w->mine);
    w->stage = ns > 0 ? malloc((size_t)w->stage_n * sizeof *w->stage) : NULL;
    int *fill = calloc((size_t)(nt > 0 ? nt : 1), sizeof *fill);
    int rc = (!w->nmine || !w->mine || (ns > 0 && !w->stage) || !fill) ? -1 : 0;
    if (rc) {
        seterr(w->msg, sizeof w->msg, "out of memory");
    } else {
        for (int i = 0; i < ns; i++)
            if (s[i].count[0] > 0 && s[i].count[1] > 0)
                w->nmine[s[i].tensor + 1]++;
        for (int i = 0; i < nt; i++)
            w->nmine[i + 1] += w->nmine[i];
        for (int i = 0; i < ns; i++)
            if (s[i].count[0] > 0 && s[i].count[1] > 0)
                w->mine[w->nmine[s[i].tensor] + fill[s[i].tensor]++] = &s[i];
    }
    free(fill);
    return agree_mpi(w->comm, rc, w->msg, sizeof w->msg);
}

/* The temporary file, every rank creating it; its space; the transfer
 * properties; the root attributes. */
static int step_create(wjob_t *w, const h5store_tensor_t *t, int nt, const h5store_attr_t *a, int na)
{
    w->fapl = h5s_mpio_fapl(w->comm, 1, w->msg, sizeof w->msg);
    int rc = w->fapl < 0 ? -1 : 0;
    if (rc == 0 && (w->file = H5Fcreate(w->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, w->fapl)) < 0) {
        h5s_err(w->msg, sizeof w->msg, "cannot create %s", w->tmp);
        rc = -1;
    }
    if (agree_mpi(w->comm, rc, w->msg, sizeof w->msg))
        return -1;
    w->reserved = h5s_file_bytes_bound(t, nt, w->nrec);
    rc = w->rank == 0 ? h5s_reserve_space(w->tmp, w->reserved, w->msg, sizeof w->msg) : 0;
    if (agree_mpi(w->comm, rc, w->msg, sizeof w->msg))
        return -1;
    /* independent data transfers: each rank writes its own blocks when it
     * gets there (collective ones made every rank wait for every other at
     * every block, and funnelled the data through MPI-IO's aggregators: at
     * 4 ranks on 2 cores the write took twice as long) */
    if ((w->dxpl = H5Pcreate(H5P_DATASET_XFER)) < 0 || H5Pset_dxpl_mpio(w->dxpl, H5FD_MPIO_INDEPENDENT) < 0) {
        h5s_err(w->msg, sizeof w->msg, "cannot set up the data transfers");
        rc = -1;
    }
    if (rc == 0) {
        h5store_attr_t ver = {.key = VERSION_ATTR, .type = H5STORE_INT, .i = H5STORE_VERSION};
        rc = h5s_write_attr(w->file, &ver, w->msg, sizeof w->msg);
        for (int i = 0; i < na && rc == 0; i++)
            rc = h5s_write_attr(w->file, &a[i], w->msg, sizeof w->msg);
    }
    return agree_mpi(w->comm, rc, w->msg, sizeof w->msg);
}

static int step_tensors(wjob_t *w, const h5store_tensor_t *t, int nt)
{
    for (int i = 0, b = 0; i < nt; i++) {
        const int e = rec_end(w, i, b);
        const int rc = write_tensor(w, &t[i], w->rec + b, e - b, w->mine + w->nmine[i], w->nmine[i + 1] - w->nmine[i],
                                    w->msg, sizeof w->msg);
        if (agree_mpi(w->comm, rc, w->msg, sizeof w->msg))
            return -1;
        b = e;
    }
    return 0;
}

/* Flushed, closed, and in place under the final name. */
static int step_finish(wjob_t *w)
{
    /* H5Fflush(GLOBAL) fsyncs on every rank; H5Fclose then only rewrites
     * the superblock, which rank 0's fsync in h5s_publish makes durable */
    int rc = 0;
    if (H5Fflush(w->file, H5F_SCOPE_GLOBAL) < 0) {
        h5s_err(w->msg, sizeof w->msg, "cannot flush %s", w->tmp);
        rc = -1;
    }
    if (agree_mpi(w->comm, rc, w->msg, sizeof w->msg))
        return -1;
    if (H5Pclose(w->dxpl) < 0 || H5Pclose(w->fapl) < 0) {
        h5s_err(w->msg, sizeof w->msg, "H5Pclose");
        rc = -1;
    }
    w->dxpl = w->fapl = H5I_INVALID_HID;
    if (H5Fclose(w->file) < 0) {
        h5s_err(w->msg, sizeof w->msg, "cannot close %s", w->tmp);
        rc = -1;
    }
    w->file = H5I_INVALID_HID;
    if (agree_mpi(w->comm, rc, w->msg, sizeof w->msg))
        return -1;
    rc = w->rank == 0 ? h5s_publish(w->tmp, w->path, w->reserved, w->msg, sizeof w->msg) : 0;
    return agree_mpi(w->comm, rc, w->msg, sizeof w->msg);
}

/* Every rank is here (each step was agreed on): the temporary file goes;
 * a file at the final path from before is untouched. */
static void write_failed(wjob_t *w)
{
    /* already failing; the first message is the one that matters */
    (void)h5s_close(w->dxpl, H5Pclose, -1);
    (void)h5s_close(w->fapl, H5Pclose, -1);
    (void)h5s_close(w->file, H5Fclose, -1);
    if (H5Eclear2(H5E_DEFAULT) < 0) {
    }
    if (w->rank == 0 && w->tmp[0] != '\0' && access(w->tmp, F_OK) == 0 && unlink(w->tmp) != 0) {
        size_t l = strlen(w->msg);
        snprintf(w->msg + l, sizeof w->msg - l, " (and cannot remove %s: %s)", w->tmp, strerror(errno));
    }
    /* nobody returns before the temporary file is gone */
    if (MPI_Barrier(w->comm) != MPI_SUCCESS) {
        /* the message already says what failed first */
    }
}

int h5store_write(const char *path, MPI_Comm comm, const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns,
                  const h5store_attr_t *a, int na, char *err, size_t errlen)
{
    wjob_t w = {.comm = comm,
                .path = path,
                .stage_n = h5s_stage_elems(),
                .fapl = H5I_INVALID_HID,
                .file = H5I_INVALID_HID,
                .dxpl = H5I_INVALID_HID};
    int mrc;
    if ((mrc = MPI_Comm_rank(comm, &w.rank)) != MPI_SUCCESS || (mrc = MPI_Comm_size(comm, &w.size)) != MPI_SUCCESS) {
        h5s_mpierr(err, errlen, mrc, "MPI_Comm_rank/size");
        return -1;
    }
    h5s_quiet_t q;
    h5s_quiet_on(&q);
    w.cc = malloc(sizeof *w.cc);
    const int rc = step_inputs(&w, t, nt, s, ns, a, na) || step_records(&w, t, nt, s, ns) ||
                           step_group(&w, nt, s, ns) || step_create(&w, t, nt, a, na) || step_tensors(&w, t, nt) ||
                           step_finish(&w)
                       ? -1
                       : 0;
    if (rc != 0) {
        write_failed(&w);
        seterr(err, errlen, "%s", w.msg);
    }
    free(w.rec);
    free(w.nmine);
    free(w.mine);
    free(w.stage);
    free(w.cc);
    h5s_quiet_off(&q);
    return rc;
}
