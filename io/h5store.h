/* The parallel-HDF5 tensor store: fp32 logical tensors in one HDF5 file,
 * written by all ranks at once (each rank its own hyperslabs) and read back
 * at any layout. It knows nothing of models: a tensor is a name, a 1-D or
 * 2-D logical shape and, when writing, the pieces ("shards") this rank
 * holds. doc/format.md describes the file.
 *
 *   write:  h5store_write(path, comm, tensors, nt, shards, ns, attrs, na)
 *   read:   h = h5store_open(path, comm)
 *           h5store_list / h5store_find          catalog (names, shapes)
 *           h5store_get_int / _double / _str     root attributes
 *           h5store_get_attrs                    all of them (copying a file)
 *           h5store_read_shards                  collective, layout B
 *           h5store_read                         one hyperslab, independent
 *           h5store_verify                       every checksum, collective
 *           h5store_read_verify                  both, reading the file once
 *           h5store_close(h)
 *
 * Integrity: every shard written gets a CRC-32C of its bytes (row-major
 * fp32, little-endian), kept in an attribute beside the data. A read checks
 * every recorded shard that lies entirely inside the region it read;
 * h5store_verify checks every recorded shard in the file (the ranks share
 * the work).
 *
 * Errors: functions return 0, or -1 with one line in err (never HDF5's
 * error stack). Collective functions return the same status and the same
 * message on every rank (the lowest failing rank's). */
#ifndef DTRAIN_H5STORE_H
#define DTRAIN_H5STORE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#define H5STORE_NAME_MAX 96
#define H5STORE_VERSION 1 /* root attribute h5store_version */

/* One logical tensor; the same list on every rank. */
typedef struct h5store_tensor {
    char name[H5STORE_NAME_MAX]; /* dataset path, "params/h.0.attn.wq": groups made as needed */
    int ndim;                    /* 1 or 2 */
    int64_t shape[2];            /* logical shape; shape[1] = 1 for 1-D */
    int64_t chunk[2];            /* HDF5 chunk (the writer's shard shape); 0 = contiguous */
} h5store_tensor_t;

/* This rank's piece of one tensor: a hyperslab of its logical shape. */
typedef struct h5store_shard {
    int tensor;                 /* index into the tensor list */
    int64_t start[2], count[2]; /* for 1-D: start[1] = 0, count[1] = 1; count may be 0 */
    float *buf;                 /* count[0]*count[1] floats, row-major, host memory */
} h5store_shard_t;

typedef enum { H5STORE_INT = 0, H5STORE_DOUBLE, H5STORE_STR } h5store_attr_type_t;

/* A key-value attribute on the root group. Keys starting "h5store_" are
 * the store's own. */
typedef struct h5store_attr {
    const char *key;
    h5store_attr_type_t type;
    int64_t i;     /* H5STORE_INT */
    double d;      /* H5STORE_DOUBLE */
    const char *s; /* H5STORE_STR */
} h5store_attr_t;

/* Collective over comm. Writes every tensor of the list into a new file at
 * `path`, each rank its `shards` (a rank may hold several shards of one
 * tensor, or none). Every element of every tensor must be written by
 * exactly one shard on one rank: checked before the file is created, as are
 * bounds and that tensors and attrs are the same on every rank.
 *
 * Atomic: the data go to "<dir>/.<name>.tmp", which is flushed (fsync on
 * every rank), closed, fsynced by rank 0 and renamed to `path`; then the
 * directory is fsynced. On failure no file is left under `path` (a file
 * already there is untouched) and the temporary file is removed. */
int h5store_write(const char *path, MPI_Comm comm, const h5store_tensor_t *tensors, int n_tensors,
                  const h5store_shard_t *shards, int n_shards, const h5store_attr_t *attrs, int n_attrs, char *err,
                  size_t errlen);

typedef struct h5store h5store_t;

/* Collective. Opens `path` read-only and reads its catalog: every fp32 1-D
 * or 2-D dataset, its shape and its shard checksums. NULL on failure (on
 * every rank), e.g. "cannot open ckpt.h5: <HDF5's reason>". */
h5store_t *h5store_open(const char *path, MPI_Comm comm, char *err, size_t errlen);

/* Collective: closes the file and frees h. Returns 0 or -1. */
int h5store_close(h5store_t *h, char *err, size_t errlen);

/* The catalog, sorted by name (chunk = the file's chunk shape, 0 if none). */
int h5store_list(const h5store_t *h, const h5store_tensor_t **tensors);
const h5store_tensor_t *h5store_find(const h5store_t *h, const char *name);

/* Root attributes (independent). -1 with a message when the key is
 * missing or holds another type; h5store_has_attr says which keys exist.
 * An integer attribute also reads as a double. */
int h5store_has_attr(h5store_t *h, const char *key);
int h5store_get_int(h5store_t *h, const char *key, int64_t *v, char *err, size_t errlen);
int h5store_get_double(h5store_t *h, const char *key, double *v, char *err, size_t errlen);
int h5store_get_str(h5store_t *h, const char *key, char *out, size_t outlen, char *err, size_t errlen);

/* Independent: every root attribute but the store's own (h5store_*), in
 * name order, each as an integer, a double or a string (malloc'd copies;
 * free the array with h5store_free_attrs). So a file can be rewritten with
 * its attributes carried over. An attribute of another type or not a
 * scalar is an error naming it. */
int h5store_get_attrs(h5store_t *h, h5store_attr_t **attrs, int *n_attrs, char *err, size_t errlen);
void h5store_free_attrs(h5store_attr_t *attrs, int n_attrs);

/* Independent (any rank, any order): reads the hyperslab start/count of
 * `name` (1-D: start[1] = 0, count[1] = 1) into buf, row-major, and checks
 * the checksum of every recorded shard lying entirely inside it. */
int h5store_read(h5store_t *h, const char *name, const int64_t start[2], const int64_t count[2], float *buf, char *err,
                 size_t errlen);

/* Independent: the hyperslab start/count of `name` (as h5store_read) as a
 * read-only view into a mapping of the file instead of a copy, when the
 * layout allows one: an allocated, unfiltered fp32 dataset whose
 * region lies in one chunk (or a contiguous dataset). *p: the region's
 * first element; *ld: floats from one of its rows to the next (1-D: 1).
 * Every recorded shard lying entirely inside the region is checked from
 * the mapping, as h5store_read checks it. 1: the view; 0: no view (read
 * with h5store_read); -1: an error (a checksum mismatch included) in err.
 * The view stays valid until h5store_close. */
int h5store_view(h5store_t *h, const char *name, const int64_t start[2], const int64_t count[2], const float **p,
                 int64_t *ld, char *err, size_t errlen);

/* Collective: the reader's side of h5store_write. Checks every tensor in
 * the list is in the file with that ndim and shape ("tensor params/foo:
 * shape [3,4] in file, expected [4,4]"), then reads this rank's shards
 * (layout B need not be the writer's layout A). Same status on all ranks. */
int h5store_read_shards(h5store_t *h, const h5store_tensor_t *tensors, int n_tensors, const h5store_shard_t *shards,
                        int n_shards, char *err, size_t errlen);

/* Collective: h5store_read_shards and h5store_verify in one pass over the
 * file. The records this rank's reads lie over are checked as they are
 * read (as h5store_read does); the ranks then pool which records some read
 * checked, and only the others are read again for their CRC, the ranks
 * taking turns. Same checks and messages as the two calls, but a loader
 * whose ranks together read the whole file reads it once, not twice. */
int h5store_read_verify(h5store_t *h, const h5store_tensor_t *tensors, int n_tensors, const h5store_shard_t *shards,
                        int n_shards, char *err, size_t errlen);

/* Collective: recomputes the checksum of every recorded shard (the ranks
 * take turns) and checks each tensor's records cover it exactly. Counts of
 * shards and bytes checked (whole file) go to the non-NULL out-arguments.
 * Error: "ckpt.h5: checksum mismatch in params/foo rows 0..127 (+2 more)". */
int h5store_verify(h5store_t *h, int64_t *n_shards, int64_t *n_bytes, char *err, size_t errlen);

#endif
