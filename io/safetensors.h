/* Hugging Face safetensors files: validated reading (memory-mapped, any
 * slice, fp32/fp16/bf16 converted to fp32) and parallel writing.
 *
 * Layout (https://github.com/huggingface/safetensors, "Format"):
 *   8 bytes   N, unsigned little-endian: the header's length
 *   N bytes   a JSON object: "__metadata__" (optional, string -> string)
 *             and one entry per tensor
 *               "name": {"dtype": "F32", "shape": [d0, d1, ...],
 *                        "data_offsets": [begin, end]}
 *             begin/end are byte offsets in the data region; Hugging Face
 *             pads the JSON with spaces to a multiple of 8
 *   rest      the data region: raw little-endian, row-major elements
 *
 * Every function returns 0 on success or -1 with one line in err naming
 * the file and the tensor; nothing here prints, exits or uses MPI (the
 * fuzzer links this file alone, with Jansson). A Hugging Face model
 * directory is model.safetensors, or model.safetensors.index.json whose
 * "weight_map" names each tensor's shard. */
#ifndef DTRAIN_SAFETENSORS_H
#define DTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
/* Headers above this are refused before anything is allocated: the
 * largest real ones (thousands of tensors) are a few MB. */
#define ST_MAX_HEADER_BYTES (100u << 20)
/* Hugging Face's default max_shard_size ("5GB", decimal). */
#define ST_DEFAULT_SHARD_BYTES 5000000000ull

typedef enum {
    ST_F32 = 0,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U8,
    ST_BOOL,
    ST_OTHER /* a known name without a reader here (U16, F8_E4M3, ...):
              * validated by its size, dtype_name says which */
} st_dtype_t;

typedef struct st_tensor {
    char *name;
    st_dtype_t dtype;
    char dtype_name[16];
    int ndim; /* 0 (a scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* byte offsets in the data region */
} st_tensor_t;

typedef struct st_file {
    char *path;          /* NULL after st_parse_header */
    void *map;           /* the whole file (begins with the 8-byte length) */
    size_t size;         /* its length in bytes */
    uint64_t header_len; /* N; the data region starts at 8 + N */
    st_tensor_t *t;      /* in file order (by begin offset) */
    int n;
    char *metadata_json; /* "__metadata__" re-serialised, or NULL */
    int *by_name;        /* t indices sorted by name, for st_find */
    int mapped;          /* 1: st_close unmaps map (st_open); 0: caller's bytes */
} st_file_t;

/* Pure: file_bytes is the whole file, len its size (only the first
 * 8 + N bytes are read, but every tensor is checked against len). Checks
 * the length (8 + N <= len, N <= ST_MAX_HEADER_BYTES), the JSON (an
 * object, no duplicate keys), "__metadata__" (string -> string), each
 * tensor (dtype known, shape of non-negative integers, at most 8 dims,
 * data_offsets [b, e] with b <= e, e - b == elements * itemsize without
 * overflow, e inside the data region) and that no two tensors overlap.
 * Gaps between tensors are allowed. out->map = file_bytes (not owned);
 * st_close frees the rest. */
int st_parse_header(const void *file_bytes, size_t len, st_file_t *out, char *err, size_t errlen);
/* Map and parse one file; errors begin with its path. */
int st_open(st_file_t *f, const char *path, char *err, size_t errlen);
void st_close(st_file_t *f);
/* NULL when absent. O(log n). */
const st_tensor_t *st_find(const st_file_t *f, const char *name);

/* Bytes per element (0 for an unknown name). Sub-byte types (F4, F6_*)
 * answer 0 here; st_dtype_bits gives their bits. */
size_t st_dtype_size(st_dtype_t d);
const char *st_dtype_name(st_dtype_t d);
int64_t st_numel(const st_tensor_t *t); /* product of the shape (1 for a scalar) */

/* Rows [r0, r0+nr) x cols [c0, c0+nc) of a 1-D (read as [1][n]) or 2-D
 * tensor of F32, F16, BF16 or F64, converted to fp32 into dst, row-major
 * [nr][nc]. transpose = 1 reads the same block of the transposed tensor:
 * dst[i][j] = t[c0 + j][r0 + i]. Only the source rows the block covers are
 * touched (a row at a time, the block's columns of it). */
int st_read_f32(const st_file_t *f, const st_tensor_t *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int transpose,
                float *dst, char *err, size_t errlen);
/* A Hugging Face model directory (or one .safetensors file given as dir):
 * model.safetensors.index.json when present (every tensor of its
 * weight_map must be in the shard it names; shard names are plain file
 * names in dir), else model.safetensors. */
typedef struct st_model_entry {
    const char *name; /* points into the file's tensor */
    int file, tensor;
} st_model_entry_t;

typedef struct st_model {
    st_file_t *files;
    int n_files;
    st_model_entry_t *index; /* sorted by name */
    int n_index;
    char *dir;
} st_model_t;

int st_model_open(st_model_t *m, const char *dir, char *err, size_t errlen);
/* 0 and *f, *t set when found; -1 when absent. f may be NULL. */
int st_model_find(const st_model_t *m, const char *name, const st_file_t **f, const st_tensor_t **t);
void st_model_close(st_model_t *m);

/* ---- Writing ---------------------------------------------------------
 * A plan is a pure function of its arguments, so every rank computes the
 * same one: tensors go to shards in the given order, a new shard starting
 * when the next tensor would take the current one past max_shard_bytes
 * (a tensor larger than that gets a shard to itself), as Hugging Face's
 * split_torch_state_dict_into_shards does. One rank creates the files,
 * then any rank writes any rows of any tensor at its planned offset, then
 * every rank that wrote calls st_plan_sync (before the caller renames its
 * temporary directory). */
typedef struct st_out_tensor {
    const char *name;
    st_dtype_t dtype; /* ST_F32, ST_BF16 or ST_F16 */
    int ndim;         /* 1 or 2 */
    int64_t shape[2];
} st_out_tensor_t;

typedef struct st_plan st_plan_t;

/* metadata_json: a JSON object of strings, or NULL for {"format":"pt"}
 * (transformers refuses files whose metadata lacks a known format). Names
 * must be unique, non-empty and not "__metadata__". */
int st_plan_make(const st_out_tensor_t *t, int n, uint64_t max_shard_bytes, const char *metadata_json_or_NULL,
                 st_plan_t **p, char *err, size_t errlen);
/* One rank: each shard created (truncated) at its full size with its
 * header, 8-byte length + JSON padded with spaces to a multiple of 8. */
int st_plan_create_files(const st_plan_t *p, const char *dir, char *err, size_t errlen);
/* Any rank: rows [r0, r0+nr) of tensor i (a 1-D tensor is one row),
 * rows[nr][cols] in fp32, converted to the tensor's dtype (bf16 and fp16
 * round to nearest even) and written with pwrite at the planned offset. */
int st_plan_write_f32(const st_plan_t *p, const char *dir, int i, int64_t r0, int64_t nr, const float *rows, char *err,
                      size_t errlen);
/* Each rank that wrote: fsync every shard of the plan. */
int st_plan_sync(const st_plan_t *p, const char *dir, char *err, size_t errlen);
/* One rank, when more than one shard: model.safetensors.index.json with
 * metadata.total_size (the sum of the tensors' bytes) and weight_map,
 * written to a .tmp, synced and renamed. A no-op for one shard. */
int st_plan_write_index(const st_plan_t *p, const char *dir, char *err, size_t errlen);
void st_plan_free(st_plan_t *p);

/* Plan queries. */
int st_plan_n_shards(const st_plan_t *p);
const char *st_plan_shard_name(const st_plan_t *p, int s); /* file name in dir */
uint64_t st_plan_shard_size(const st_plan_t *p, int s);    /* whole file */
int st_plan_tensor_shard(const st_plan_t *p, int i);
uint64_t st_plan_tensor_offset(const st_plan_t *p, int i); /* in its file */
uint64_t st_plan_total_size(const st_plan_t *p);           /* tensor bytes */

/* fp16 conversions (IEEE binary16, round to nearest even), exposed for the
 * tests. bf16 uses base/bf16.h's dt_f32_to_bf16 / dt_bf16_to_f32. */
uint16_t st_f32_to_f16(float x);
float st_f16_to_f32(uint16_t h);

#endif
