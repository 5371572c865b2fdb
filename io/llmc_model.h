/* llm.c's GPT-2 model file (karpathy/llm.c: train_gpt2.py write_model,
 * read by train_gpt2.c / train_gpt2.cu gpt2_build_from_checkpoint).
 *
 * A header of 256 little-endian int32:
 *   [0] 20240326 (magic)  [1] version: 3 = every tensor fp32, 5 = bf16
 *   [2] maxT  [3] V  [4] L  [5] NH  [6] C  [7] Vp (V padded, llm.c: to a
 *   multiple of 128; rows V..Vp-1 of wte are zeros), the rest 0
 * then the tensors back to back, row-major, weights [out, in] (llm.c's
 * nn.Linear layout, not Hugging Face GPT-2's Conv1D [in, out]); the
 * per-layer ones stacked over the L layers:
 *   wte[Vp,C] wpe[maxT,C] ln1w[L,C] ln1b[L,C] qkvw[L,3C,C] qkvb[L,3C]
 *   attprojw[L,C,C] attprojb[L,C] ln2w[L,C] ln2b[L,C] fcw[L,4C,C]
 *   fcb[L,4C] fcprojw[L,C,4C] fcprojb[L,C] lnfw[C] lnfb[C]
 * and nothing after them. Verified against llm.c f1e2ace (2025-05-10):
 * train_gpt2.py write_tensors, train_gpt2.c fill_in_parameter_sizes.
 *
 * Functions return 0 or -1 with one line in err naming the file; nothing
 * prints, exits or uses MPI. */
#ifndef DTRAIN_LLMC_MODEL_H
#define DTRAIN_LLMC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define LLMC_MODEL_MAGIC 20240326
#define LLMC_MODEL_VERSION_F32 3
#define LLMC_MODEL_VERSION_BF16 5
#define LLMC_MODEL_HEADER_INTS 256
#define LLMC_MODEL_HEADER_BYTES (LLMC_MODEL_HEADER_INTS * 4)

typedef enum {
    LLMC_WTE = 0,
    LLMC_WPE,
    LLMC_LN1W,
    LLMC_LN1B,
    LLMC_QKVW,
    LLMC_QKVB,
    LLMC_ATTPROJW,
    LLMC_ATTPROJB,
    LLMC_LN2W,
    LLMC_LN2B,
    LLMC_FCW,
    LLMC_FCB,
    LLMC_FCPROJW,
    LLMC_FCPROJB,
    LLMC_LNFW,
    LLMC_LNFB,
    LLMC_N_TENSORS
} llmc_tensor_t;

typedef struct llmc_model {
    /* the shape fields (header [1] .. [7]) */
    int version, max_seq, vocab, padded_vocab, n_layer, n_head, d_model;
    /* derived by llmc_model_layout */
    size_t itemsize;                  /* 4 (version 3) or 2 (version 5) */
    uint64_t offset[LLMC_N_TENSORS];  /* bytes from the file's start */
    int64_t shape[LLMC_N_TENSORS][3]; /* [L or 1][rows][cols]; a vector
                                         * is one row: ln1w [L][1][C] */
    uint64_t file_size;               /* header + every tensor */
    /* set by open/parse */
    void *map;
    size_t size;
    char *path;
    int mapped; /* 1: llmc_model_close unmaps (llmc_model_open) */
} llmc_model_t;

/* Fill itemsize, offset, shape and file_size from the shape fields after
 * checking them: version 3 or 5, every size >= 1, C divisible by NH,
 * V <= Vp, sizes without overflow. Pure. */
int llmc_model_layout(llmc_model_t *m, char *err, size_t errlen);
/* Pure: the whole file in memory (len = its size). Magic, version, the
 * sizes as above, and len == exactly header + all tensors. m->map =
 * file_bytes (not owned). */
int llmc_model_parse(const void *file_bytes, size_t len, llmc_model_t *m, char *err, size_t errlen);
int llmc_model_open(llmc_model_t *m, const char *path, char *err, size_t errlen);
void llmc_model_close(llmc_model_t *m);
const char *llmc_tensor_name(llmc_tensor_t id); /* "wte", "qkvw", ... */

/* Rows [r0, r0+nr) x cols [c0, c0+nc) of tensor id's layer `layer` (0 for
 * wte, wpe, lnfw, lnfb), as fp32 into dst [nr][nc]: from a file opened by
 * llmc_model_open with pread (io/st_block.h), from the bytes otherwise. */
int llmc_model_read_f32(const llmc_model_t *m, llmc_tensor_t id, int layer, int64_t r0, int64_t nr, int64_t c0,
                        int64_t nc, float *dst, char *err, size_t errlen);

/* Writing. One rank: llmc_model_create writes path at its full size, the
 * header from shape_fields' shape fields and zeros after (so wte's padded
 * rows are zero unless written). Then any rank: llmc_model_write_f32
 * writes whole rows [r0, r0+nr) of tensor id's layer (rows[nr][cols],
 * bf16 rounded to nearest even for version 5) with pwrite; layout comes
 * from llmc_model_layout. Then each writer llmc_model_sync, and one rank
 * llmc_model_commit to rename a temporary name to the final one. */
int llmc_model_create(const char *path, const llmc_model_t *shape_fields, char *err, size_t errlen);
int llmc_model_write_f32(const char *path, const llmc_model_t *layout, llmc_tensor_t id, int layer, int64_t r0,
                         int64_t nr, const float *rows, char *err, size_t errlen);
int llmc_model_sync(const char *path, char *err, size_t errlen);
/* fsync tmp, rename it to path, fsync path's directory. */
int llmc_model_commit(const char *tmp, const char *path, char *err, size_t errlen);

#endif
