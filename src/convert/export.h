/* Export: a dtrain checkpoint or parameter file written as another
 * framework's model, by dreshard --to-hf DIR and --to-llmc FILE.
 *
 * The driver (src/convert/export.c) is format-blind. src/convert/hf_map.h says where each of
 * dtrain's logical tensors goes in the target format; the driver groups
 * those entries into the target's tensors ("outputs": Hugging Face's
 * transformer.h.0.attn.c_attn.weight holds wq, wk and wv; llm.c's qkvw
 * holds them for one layer), cuts each output into row tiles of about
 * EXPORT_TILE_BYTES that cover whole checksum records of the input, deals
 * the tiles to the ranks (largest first, to the least loaded), and on each
 * rank, a tile at a time, reads the dtrain blocks the tile needs (verifying
 * every record they cover, so every checksum of the parameters is
 * verified), turns them into the target's orientation (Conv1D transpose,
 * rotate-half row order, fused offsets) and hands the tile to the target. Each target is a
 * table of the functions below in its own file (IOR's aiori.h is the
 * model): src/convert/export_hf.c and src/convert/export_llmc.c.
 *
 * Atomic: the target writes under a temporary name beside the destination
 * and renames it only when every rank's tiles are written and synced, so
 * the destination is the complete export or is untouched. */
#ifndef DTRAIN_EXPORT_H
#define DTRAIN_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "io/h5store.h"
#include "mpi/comm.h"
#include "src/convert/hf_map.h"
#include "src/model/model_config.h"

/* Row tiles of about this many fp32 bytes: small enough to balance four
 * ranks on a gpt2-124m (50257 x 768 embedding = 147 MiB), large enough that
 * a 70B model is a few thousand tiles. */
#define EXPORT_TILE_BYTES (16u << 20)

typedef enum { EXPORT_F32 = 0, EXPORT_BF16, EXPORT_F16 } export_dtype_t;
extern const char *const export_dtype_names[]; /* indexed by export_dtype_t, NULL-terminated (dreshard --dtype) */

/* One tensor of the target: the hf_map entries with this src and layer. */
typedef struct export_out {
    char name[HF_SRC_NAME_MAX]; /* the target's tensor name */
    int llmc_id, layer;         /* llm.c: which tensor and layer (-1, 0 for HF) */
    int ndim;                   /* as stored: 1 (one row of cols) or 2 */
    int64_t rows, cols;         /* as stored (a vector: rows 1) */
    int64_t covered;            /* rows [0, covered) come from dtrain; the rest stay zero (llm.c's wte padding) */
    int64_t align;              /* tile row counts are multiples of this (a RoPE head's rows) */
    int first, count;           /* its entries: map[first .. first+count) */
} export_out_t;

typedef struct export_opts {
    const char *input; /* the file exported (never replaced or deleted by --force) */
    const char *dest;  /* the directory (hf) or file (llmc) to create */
    export_dtype_t dtype;
    int force;                /* replace dest if it exists */
    const char *tokenizer;    /* hf: "auto" (the file's record), "none", or a --tokenizer spec */
    const char *tok_recorded; /* the input's "tokenizer" attribute ("" when absent) */
    const char *tok_sha256;   /* and its "tokenizer_sha256" ("" when absent) */
    uint64_t max_shard_bytes; /* hf: safetensors shard size (Hugging Face's default 5 GB) */
    int64_t tile_bytes;       /* 0: EXPORT_TILE_BYTES; tests set DTRAIN_TEST_EXPORT_TILE_BYTES to cut
                               * small models into many tiles */
} export_opts_t;

typedef struct export_ctx {
    const export_opts_t *opt;
    const model_config_t *cfg;
    const export_out_t *out;
    int n_out;
    int rank;
    char tmp[4096];   /* the temporary name dest is renamed from */
    char note[512];   /* rank 0: one line for the summary (the tokenizer files), or "" */
    int input_failed; /* a target's failure was the input's or the options' (exit 2), not the machine's */
    void *impl;       /* the target's own state */
} export_ctx_t;

/* A target. Every function returns 0, or -1 with one line in err; the
 * driver agrees on every status over all ranks. */
typedef struct export_target {
    const char *name;       /* "hf", "llmc" */
    hf_format_t map_format; /* which hf_map names the outputs */
    const char *map_prefix; /* hf_map_build's prefix */
    /* Every rank: check the options against the model (a dtype the format
     * lacks) and plan; the same on each. */
    int (*prepare)(export_ctx_t *x, char *err, size_t errlen);
    /* Rank 0: the temporary destination, every file at its full size; it
     * may start work of its own (the HF target's tokenizer thread). */
    int (*create)(export_ctx_t *x, char *err, size_t errlen);
    /* Any rank: rows [r0, r0+nr) of output i, rows[nr][cols] fp32. Called
     * on the rank's tile writer thread (src/convert/export.c), one call at a time,
     * while the rank's main thread reads the next tiles. */
    int (*write_rows)(export_ctx_t *x, int i, int64_t r0, int64_t nr, const float *rows, char *err, size_t errlen);
    /* Every rank that wrote: its writes are durable; rank 0's own work
     * is done (a failure of the input or options sets input_failed). */
    int (*sync)(export_ctx_t *x, char *err, size_t errlen);
    /* Rank 0, after every rank synced: the remaining files (index, config,
     * tokenizer), a check of what was written, then the rename. */
    int (*publish)(export_ctx_t *x, char *err, size_t errlen);
    /* Rank 0, on failure: remove the temporary destination. */
    void (*discard)(export_ctx_t *x);
    void (*destroy)(export_ctx_t *x); /* every rank: free impl */
} export_target_t;

extern const export_target_t export_target_hf;
extern const export_target_t export_target_llmc;

const char *export_dtype_name(export_dtype_t d); /* "fp32", "bf16", "fp16" */

/* The target's map of model c and its outputs, in the map's order (both
 * malloc'd). */
int export_outputs(const export_target_t *tg, const model_config_t *c, hf_map_t **map, int *n_map, export_out_t **out,
                   int *n_out, char *err, size_t errlen);

typedef struct export_report {
    int n_out, n_tiles;
    int64_t in_bytes;                /* fp32 bytes read from the input (this rank) */
    double t_read, t_write, t_total; /* this rank: reading, the rest, all (seconds) */
    char note[512];
} export_report_t;

/* Collective over world (an MPI communicator): writes the parameters of the open file h
 * (their checksum records verified as they are read: the optimizer state
 * of a checkpoint is not read, so not verified)
 * (model cfg; params_list: its "params/<name>" tensors as param_io_tensors
 * gives them) as target tg. STATUS_INPUT when the input or the options
 * are wrong (a damaged tensor included), STATUS_FAIL when writing fails.
 * The same status and message on every rank. */
status_t export_run(comm_t *world, const export_target_t *tg, const export_opts_t *o, h5store_t *h,
                    const model_config_t *cfg, const h5store_tensor_t *params_list, int n_params, export_report_t *rep,
                    char *err, size_t errlen);

/* Shared by the targets (src/convert/export.c). */
/* dest's temporary sibling: "<dir>/.<base>.tmp". */
int export_tmp_name(const char *dest, char *tmp, size_t len, char *err, size_t errlen);
/* rename(tmp, dest) (a file replaces a file atomically); over an existing
 * directory (--force) an atomic exchange (renameat2 RENAME_EXCHANGE), or
 * where the file system lacks it the old one moved aside first, and the
 * old one removed; then the parent directory is synced (io/publish.h). */
int export_commit(const char *tmp, const char *dest, char *err, size_t errlen);
/* rm -r of path (a file or a directory of files); errors ignored. */
void export_remove(const char *path);

#endif
