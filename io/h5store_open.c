/* Opening a store: the file (read-only, independent metadata reads) and
 * its catalog, every fp32 1-D or 2-D dataset with its shape, chunk shape
 * and checksum records, sorted by name. Closing it; looking tensors up. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "io/errmsg.h"
#include "io/h5store_internal.h"
#include "mpi/agree.h"

typedef struct visit {
    h5store_t *h;
    char *err;
    size_t errlen;
} visit_t;

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry_t *)a)->t.name, ((const entry_t *)b)->t.name);
}

/* A cleared entry at the end of the catalog (not yet counted in h->n). */
static entry_t *catalog_slot(h5store_t *h, char *err, size_t errlen)
{
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 64;
        entry_t *e = realloc(h->e, (size_t)cap * sizeof *e);
        if (!e) {
            seterr(err, errlen, "out of memory for the catalog");
            return NULL;
        }
        h->e = e;
        h->cap = cap;
    }
    entry_t *e = &h->e[h->n];
    memset(e, 0, sizeof *e);
    return e;
}

/* e's shape and chunk shape from the dataset's space and creation list. */
static int entry_shape(entry_t *e, int nd, hid_t space, hid_t dcpl, char *err, size_t errlen)
{
    const char *name = e->t.name;
    hsize_t d[2] = {1, 1}, c[2] = {0, 0};
    e->t.ndim = nd;
    if (H5Sget_simple_extent_dims(space, d, NULL) < 0) {
        h5s_err(err, errlen, "dataset %s: dims", name);
        return -1;
    }
    e->t.shape[0] = (int64_t)d[0];
    e->t.shape[1] = nd == 2 ? (int64_t)d[1] : 1;
    H5D_layout_t lay = H5Pget_layout(dcpl);
    if (lay < 0) {
        h5s_err(err, errlen, "dataset %s: layout", name);
        return -1;
    }
    if (lay == H5D_CHUNKED && H5Pget_chunk(dcpl, 2, c) < 0) {
        h5s_err(err, errlen, "dataset %s: chunk shape", name);
        return -1;
    }
    e->t.chunk[0] = (int64_t)c[0];
    e->t.chunk[1] = nd == 2 ? (int64_t)c[1] : 0;
    return 0;
}

/* Adds one dataset to the catalog if it is a fp32 1-D or 2-D array;
 * other datasets are not tensors of this store and are skipped. */
static int catalog_add(h5store_t *h, const char *name, hid_t dset, char *err, size_t errlen)
{
    hid_t type = H5Dget_type(dset), space = H5I_INVALID_HID, dcpl = H5I_INVALID_HID;
    int rc = -1;
    if (type < 0 || (space = H5Dget_space(dset)) < 0 || (dcpl = H5Dget_create_plist(dset)) < 0) {
        h5s_err(err, errlen, "dataset %s: cannot get its type, shape or layout", name);
        goto done;
    }
    H5T_class_t cls = H5Tget_class(type);
    int nd = H5Sget_simple_extent_ndims(space);
    if (cls < 0 || nd < 0) {
        h5s_err(err, errlen, "dataset %s: type class or rank", name);
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
    entry_t *e = catalog_slot(h, err, errlen);
    if (!e)
        goto done;
    snprintf(e->t.name, sizeof e->t.name, "%s", name);
    if (entry_shape(e, nd, space, dcpl, err, errlen))
        goto done;
    h->n++; /* from here on freed with the catalog */
    rc = h5s_read_crc_attr(dset, e, err, errlen);
done:
    rc = h5s_close(dcpl, H5Pclose, rc);
    rc = h5s_close(space, H5Sclose, rc);
    return h5s_close(type, H5Tclose, rc);
}

static herr_t visit_cb(hid_t group, const char *name, const H5L_info_t *info, void *data)
{
    visit_t *v = data;
    if (info->type != H5L_TYPE_HARD)
        return 0; /* soft and external links are not followed */
    hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
    if (obj < 0) {
        h5s_err(v->err, v->errlen, "cannot open object %s", name);
        return -1;
    }
    H5I_type_t ty = H5Iget_type(obj);
    int rc = 0;
    if (ty == H5I_DATASET)
        rc = catalog_add(v->h, name, obj, v->err, v->errlen);
    rc = h5s_close_msg(obj, H5Oclose, rc, v->err, v->errlen, "H5Oclose %s", name);
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
    if (h->map)
        munmap((void *)h->map, (size_t)h->map_len);
    free(h);
}

/* A new handle for path over comm, no file open yet. */
static int handle_new(const char *path, MPI_Comm comm, h5store_t **out, char *err, size_t errlen)
{
    int mrc;
    h5store_t *h = *out = calloc(1, sizeof *h);
    if (!h) {
        seterr(err, errlen, "out of memory");
        return -1;
    }
    h->file = h->dxpl = H5I_INVALID_HID;
    h->comm = comm;
    if ((mrc = MPI_Comm_rank(comm, &h->rank)) != MPI_SUCCESS || (mrc = MPI_Comm_size(comm, &h->size)) != MPI_SUCCESS) {
        h5s_mpierr(err, errlen, mrc, "MPI_Comm_rank/size");
        return -1;
    }
    if (snprintf(h->path, sizeof h->path, "%s", path) >= (int)sizeof h->path) {
        seterr(err, errlen, "path too long: %.100s...", path);
        return -1;
    }
    crc32c_init(&h->crc, 1);
    return 0;
}

/* The path names a regular file that begins with HDF5's signature (at 0,
 * or after a user block of 512, 1024, 2048, ... bytes). Checked before
 * H5Fopen, whose MPI-IO driver would print a line per read of a directory
 * and whose messages for a short file are HDF5's internals, so that each
 * case is one line saying what the file is. */
static int check_file(const char *path, char *err, size_t errlen)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    struct stat st;
    if (stat(path, &st) != 0) {
        seterr(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        seterr(err, errlen, "%s is a directory, not a checkpoint or parameter file", path);
        return -1;
    }
    FILE *f = S_ISREG(st.st_mode) ? fopen(path, "rb") : NULL;
    if (!f) {
        seterr(err, errlen, "%s: %s", path, S_ISREG(st.st_mode) ? strerror(errno) : "not a regular file");
        return -1;
    }
    int found = 0;
    for (long off = 0; !found && off + 8 <= (long)st.st_size && off <= (1L << 30); off = off ? 2 * off : 512) {
        unsigned char b[8];
        found = fseek(f, off, SEEK_SET) == 0 && fread(b, 1, 8, f) == 8 && memcmp(b, sig, 8) == 0;
    }
    fclose(f);
    if (!found)
        seterr(err, errlen,
               "%s is not an HDF5 file (%lld bytes, no HDF5 signature): not a checkpoint or parameter file", path,
               (long long)st.st_size);
    return found ? 0 : -1;
}

/* Collective: the file, read-only. Independent metadata reads: ranks may
 * then read different tensors in different orders without matching
 * collective calls. */
static int open_file(h5store_t *h, char *err, size_t errlen)
{
    hid_t fapl = h5s_mpio_fapl(h->comm, 0, err, errlen);
    if (fapl < 0)
        return -1;
    int rc = 0;
    if ((h->file = H5Fopen(h->path, H5F_ACC_RDONLY, fapl)) < 0) {
        /* the signature was there: the rest is missing or damaged (HDF5's
         * own words, "truncated file: eof = ...", name no fix) */
        seterr(err, errlen, "%s is damaged or incomplete (a truncated copy?): HDF5 cannot open it; use another copy",
               h->path);
        rc = -1;
    }
    return h5s_close_msg(fapl, H5Pclose, rc, err, errlen, "H5Pclose");
}

/* The file's format version is one this program reads. */
static int check_version(h5store_t *h, char *err, size_t errlen)
{
    int64_t ver = 0;
    if (h5store_has_attr(h, VERSION_ATTR) != 1)
        return 0;
    if (h5store_get_int(h, VERSION_ATTR, &ver, err, errlen))
        return -1;
    if (ver > H5STORE_VERSION) {
        seterr(err, errlen,
               "%s: store format version %" PRId64 " is newer than this "
               "program's (%d): use a newer dtrain",
               h->path, ver, H5STORE_VERSION);
        return -1;
    }
    return 0;
}

/* The transfer properties and the catalog of an open file. */
static int read_catalog(h5store_t *h, char *err, size_t errlen)
{
    if ((h->dxpl = H5Pcreate(H5P_DATASET_XFER)) < 0 || H5Pset_dxpl_mpio(h->dxpl, H5FD_MPIO_INDEPENDENT) < 0) {
        h5s_err(err, errlen, "%s: transfer properties", h->path);
        return -1;
    }
    if (check_version(h, err, errlen))
        return -1;
    visit_t v = {h, err, errlen};
    if (H5Lvisit(h->file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &v) < 0) {
        if (err[0] == '\0')
            h5s_err(err, errlen, "%s: cannot list its datasets", h->path);
        return -1;
    }
    qsort(h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
    if (!(h->list = malloc((size_t)(h->n > 0 ? h->n : 1) * sizeof *h->list))) {
        seterr(err, errlen, "out of memory for the catalog");
        return -1;
    }
    for (int i = 0; i < h->n; i++)
        h->list[i] = h->e[i].t;
    return 0;
}

h5store_t *h5store_open(const char *path, MPI_Comm comm, char *err, size_t errlen)
{
    char msg[MSG_LEN] = "";
    h5store_t *h = NULL;
    h5s_quiet_t q;
    h5s_quiet_on(&q);
    /* each step agreed on before the next: every rank fails at the same one */
    if (agree_mpi(comm, handle_new(path, comm, &h, msg, sizeof msg), msg, sizeof msg) ||
        agree_mpi(comm, check_file(path, msg, sizeof msg), msg, sizeof msg) ||
        agree_mpi(comm, open_file(h, msg, sizeof msg), msg, sizeof msg) ||
        agree_mpi(comm, read_catalog(h, msg, sizeof msg), msg, sizeof msg)) {
        if (h) {
            /* already failing */
            (void)h5s_close(h->dxpl, H5Pclose, -1);
            (void)h5s_close(h->file, H5Fclose, -1);
        }
        if (H5Eclear2(H5E_DEFAULT) < 0) {
        }
        free_handle(h);
        seterr(err, errlen, "%s", msg);
        h = NULL;
    }
    h5s_quiet_off(&q);
    return h;
}

int h5store_close(h5store_t *h, char *err, size_t errlen)
{
    if (!h)
        return 0;
    char msg[MSG_LEN] = "";
    h5s_quiet_t q;
    int rc = 0;
    h5s_quiet_on(&q);
    if (H5Pclose(h->dxpl) < 0) {
        h5s_err(msg, sizeof msg, "%s: H5Pclose", h->path);
        rc = -1;
    }
    if (H5Fclose(h->file) < 0) {
        h5s_err(msg, sizeof msg, "cannot close %s", h->path);
        rc = -1;
    }
    MPI_Comm comm = h->comm;
    free_handle(h);
    h5s_quiet_off(&q);
    rc = agree_mpi(comm, rc, msg, sizeof msg);
    if (rc)
        seterr(err, errlen, "%s", msg);
    return rc;
}

int h5store_list(const h5store_t *h, const h5store_tensor_t **tensors)
{
    *tensors = h->list;
    return h->n;
}

entry_t *h5s_find_entry(const h5store_t *h, const char *name)
{
    entry_t key;
    snprintf(key.t.name, sizeof key.t.name, "%s", name);
    return bsearch(&key, h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
}

const h5store_tensor_t *h5store_find(const h5store_t *h, const char *name)
{
    const entry_t *e = h5s_find_entry(h, name);
    return e ? &e->t : NULL;
}
