/* What the pieces of the tensor store share; not part of its API (that is
 * io/h5store.h). One file a concern:
 *
 *   h5store.c          HDF5 and MPI error lines, the quiet error stack,
 *                      closing objects, agreement, the staging buffer size,
 *                      the MPI-IO file access list
 *   h5store_records.c  checksum records: gathered from the writers,
 *                      checked to tile each tensor, stored as and read
 *                      from each dataset's crc32c attribute
 *   h5store_check.c    validation of h5store_write's inputs on every rank
 *   h5store_publish.c  the temporary file, its space reservation and its
 *                      durable rename into place (through io/publish.c)
 *   h5store_write.c    h5store_write: the collective write
 *   h5store_open.c     h5store_open/_close: the file and its catalog
 *   h5store_read.c     reading hyperslabs and verifying checksums
 *   h5store_attr.c     root attributes, both ways
 *
 * Internal names start with h5s_. */
#ifndef DTRAIN_H5STORE_INTERNAL_H
#define DTRAIN_H5STORE_INTERNAL_H

#include <hdf5.h>

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "io/crc32c.h"
#include "io/h5store.h"

/* The checksums cover the bytes as stored (IEEE fp32 little-endian) and are
 * computed on host memory, which is the same bytes only on little-endian. */
#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/h5store assumes a little-endian host: add byte swaps before porting"
#endif

#define CRC_ATTR "crc32c"              /* per dataset: int64 [k,5] start0 start1 count0 count1 crc */
#define VERSION_ATTR "h5store_version" /* root: int64 */
#define RESERVED_PREFIX "h5store_"
#define MSG_LEN 512 /* agreed messages travel in fixed buffers */

/* One recorded shard: a hyperslab and the CRC-32C of its bytes. */
typedef struct srec {
    int64_t s0, s1, c0, c1;
    int64_t crc;
    int tensor, rank; /* writer: tensor index and owner (not stored) */
    int checked;      /* reader: a read on this rank matched the CRC (not stored) */
} srec_t;

/* One tensor of an open file and its records, sorted by start. */
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
    entry_t *e;             /* sorted by name */
    h5store_tensor_t *list; /* e[i].t, contiguous, for h5store_list */
    int n, cap;
    crc32c_t crc;
    float *stage; /* the staging buffer of reads, stage_n floats (grown on demand) */
    int64_t stage_n;
    /* h5store_view's read-only mapping of the whole file (made on first
     * use; NULL when it cannot be: views are then refused) */
    const unsigned char *map;
    int64_t map_len, map_base; /* bytes; HDF5's base address (the user block) */
    int map_tried;
};

/* ---- h5store.c ---------------------------------------------------- */

/* Floats in the staging buffer that data pass through between the
 * caller's memory and the file (see h5store.c), and the rows of a
 * [rows, cols] block that fit `elems` of them (>= 1). */
int64_t h5s_stage_elems(void);
int64_t h5s_stage_rows(int64_t elems, int64_t cols);

/* "<what>: <HDF5's reason>" as one line; HDF5's error stack is cleared. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void h5s_err(char *err, size_t errlen, const char *fmt, ...);

/* "<what> failed: <MPI's reason for rc>" */
void h5s_mpierr(char *err, size_t errlen, int rc, const char *what);

/* HDF5 prints its error stack on every rank by default; while the store
 * runs it is off (messages are built by h5s_err), then restored. */
typedef struct h5s_quiet {
    H5E_auto2_t fn;
    void *data;
    int saved;
} h5s_quiet_t;
void h5s_quiet_on(h5s_quiet_t *q);
void h5s_quiet_off(const h5s_quiet_t *q);

/* Closes id with close_fn (H5Dclose, H5Sclose, ...) when it is open
 * (>= 0) and returns rc, or -1 when the close fails and rc was 0: the
 * first error stands. h5s_close leaves err alone; h5s_close_msg puts fmt's
 * line with HDF5's reason there when it turns rc into -1. */
typedef herr_t (*h5s_close_fn)(hid_t);
int h5s_close(hid_t id, h5s_close_fn close_fn, int rc);
#if defined(__GNUC__)
__attribute__((format(printf, 6, 7)))
#endif
int h5s_close_msg(hid_t id, h5s_close_fn close_fn, int rc, char *err, size_t errlen, const char *fmt, ...);

/* A file access list for MPI-IO over comm; collective_metadata: all
 * metadata reads and writes collective (the writer), else independent
 * (the reader). H5I_INVALID_HID with a message on failure. */
hid_t h5s_mpio_fapl(MPI_Comm comm, int collective_metadata, char *err, size_t errlen);

/* ---- h5store_records.c -------------------------------------------- */

/* "[37,24]" or "[13]" */
const char *h5s_shape_str(char *buf, size_t n, int ndim, const int64_t shape[2]);
/* A hyperslab for messages, ranges inclusive: "elements 0..12",
 * "rows 0..127", "rows 0..127 cols 64..127" (cols only when partial). */
const char *h5s_region_str(char *buf, size_t n, int ndim, const int64_t shape[2], const int64_t s[2],
                           const int64_t c[2]);
const char *h5s_rec_str(char *buf, size_t n, const h5store_tensor_t *t, const srec_t *r);

/* Record r lies entirely inside the hyperslab start s, count c. */
int h5s_rec_inside(const srec_t *r, const int64_t s[2], const int64_t c[2]);

/* The records of one tensor (sorted by start) lie inside its shape, do not
 * overlap and cover every element. writer: the records are the shards
 * being written (messages name their ranks), else those of a file. */
int h5s_check_cover(const h5store_tensor_t *t, const srec_t *r, int n, int writer, char *err, size_t errlen);

/* Collective: every rank's non-empty shards as records with their CRCs,
 * sorted by (tensor, start), on every rank (malloc'd into *out). */
int h5s_gather_records(MPI_Comm comm, int rank, int size, const crc32c_t *cc, const h5store_tensor_t *t,
                       const h5store_shard_t *s, int ns, srec_t **out, int *n_out, char *err, size_t errlen);

/* The crc32c attribute of one dataset: written from n records (none: no
 * attribute), read into e->rec/e->nrec sorted by start (no attribute: no
 * records). */
int h5s_write_crc_attr(hid_t dset, const h5store_tensor_t *t, const srec_t *r, int n, char *err, size_t errlen);
int h5s_read_crc_attr(hid_t dset, entry_t *e, char *err, size_t errlen);

/* ---- h5store_check.c ---------------------------------------------- */

/* Local checks of everything this rank was handed to h5store_write. */
int h5s_check_inputs(const h5store_tensor_t *t, int nt, const h5store_shard_t *s, int ns, const h5store_attr_t *a,
                     int na, int rank, char *err, size_t errlen);

/* Collective: every rank passed the same tensor list and attributes.
 * -1 on every rank otherwise. */
int h5s_check_same_inputs(MPI_Comm comm, const crc32c_t *cc, const h5store_tensor_t *t, int nt, const h5store_attr_t *a,
                          int na, char *err, size_t errlen);

/* ---- h5store_publish.c -------------------------------------------- */

/* "<dir>/.<base>.tmp" beside path, in tmp of n bytes. */
int h5s_temp_path(const char *path, char *tmp, size_t n, char *err, size_t errlen);
/* Bytes a file of these tensors and nrec records can take. */
off_t h5s_file_bytes_bound(const h5store_tensor_t *t, int nt, int nrec);
/* Rank 0: reserve `bytes` for the new temporary file (or check they are free). */
int h5s_reserve_space(const char *tmp, off_t bytes, char *err, size_t errlen);
/* Rank 0: the closed temporary file, durable under its final name. */
int h5s_publish(const char *tmp, const char *path, off_t reserved, char *err, size_t errlen);

/* ---- h5store_open.c ----------------------------------------------- */

/* The catalog entry of `name`, or NULL. */
entry_t *h5s_find_entry(const h5store_t *h, const char *name);

/* ---- h5store_attr.c ----------------------------------------------- */

/* Creates and writes one scalar attribute on loc (the root group). */
int h5s_write_attr(hid_t loc, const h5store_attr_t *a, char *err, size_t errlen);

#endif
