/* The parameter table mapped onto the tensor store (io/h5store.h): the one
 * place that knows how model tensors become logical datasets.
 *
 * A group of tensors is a prefix ("params", "optim/m", "optim/v") and a
 * host buffer laid out like the rank's flat parameter buffer; tensor
 * <name> of the group is the dataset "<prefix>/<name>" in its logical,
 * unsplit shape, chunked along the writing layout's TP slices. Each element
 * is written by one rank: DP rank 0, TP rank 0 for tensors every TP rank
 * holds, never GPT-2's tied head copy on the last stage, never vocabulary
 * padding rows. Every rank reads every tensor it holds, copies included,
 * so the same file loads at any TP, PP and DP. */
#ifndef DTRAIN_PARAM_IO_H
#define DTRAIN_PARAM_IO_H

#include <stddef.h>

#include "io/h5store.h"
#include "mpi/comm.h"
#include "src/model/model_config.h"
#include "src/model/params.h"

typedef struct param_io_group {
    const char *prefix; /* "params", "optim/m", "optim/v" */
    float *buf;         /* host memory, [table.numel], the flat buffer's layout */
} param_io_group_t;

/* The model-shape attributes every file carries (arch, sizes, eps, theta),
 * and those of the models that need them (head_dim, attn_bias, qk_norm, tie_embed,
 * rope_scaling with its parameters: absent means none): fills out[] (at
 * least PARAM_IO_MODEL_ATTRS entries), returns the count. The strings
 * point into cfg or are static. */
#define PARAM_IO_MODEL_ATTRS 27
int param_io_model_attrs(const model_config_t *cfg, h5store_attr_t *out);

/* The data's tokenizer as the attributes "tokenizer" (its spec) and
 * "tokenizer_sha256" (its vocabulary file's), which dreshard --to-hf reads
 * to add the tokenizer's files: fills out[0..1] and returns 2, or 0 when
 * spec is NULL or "". */
int param_io_tokenizer_attrs(const char *spec, const char *sha256, h5store_attr_t *out);

/* The MoE layers' expert bias (model_moe_has_bias) bias[n_layer][E], as
 * one attribute per MoE layer, moe_bias_<layer>, its E floats in C99
 * hexadecimal (exact). Fills out[] (up to n_layer entries), whose keys
 * and strings live in *text (the caller frees it); returns the count, 0
 * when bias is NULL or the model has none, or -1 out of memory. */
int param_io_moe_bias_attrs(const model_config_t *cfg, const float *bias, h5store_attr_t *out, char **text);

/* Reads what param_io_moe_bias_attrs wrote into bias[n_layer][E]; a file
 * without them (older than the bias, or written with none) gives zeros.
 * A malformed one is an error naming it. Independent. */
int param_io_read_moe_bias(h5store_t *h, const model_config_t *cfg, float *bias, const char *path, char *err,
                           size_t errlen);

/* 0 when the file's model-shape attributes equal cfg's, else -1 with one
 * line naming the first difference ("checkpoint is of d_model 256, this
 * run's model has 128"). Independent. */
int param_io_check_model(h5store_t *h, const model_config_t *cfg, const char *path, char *err, size_t errlen);

/* The model a file holds, from its model-shape attributes (the inverse of
 * param_io_model_attrs), checked with model_config_check. Independent. */
int param_io_read_model(h5store_t *h, model_config_t *cfg, const char *path, char *err, size_t errlen);

/* Every logical tensor of the model, for each group (only the prefixes of
 * groups are used): "<prefix>/<name>", its logical shape, and as chunk the
 * TP slice a layout of tp_size writes (the whole tensor for replicated
 * ones). The same list on every rank; *out is malloc'd. */
int param_io_tensors(const model_config_t *cfg, const param_io_group_t *groups, int n_groups, int tp_size,
                     h5store_tensor_t **out, int *n_out, char *err, size_t errlen);

/* Collective over world (a communicator over MPI_COMM_WORLD, which the
 * file is written with): writes the groups of every rank into one
 * new file (atomically, see h5store_write) with the given root attributes.
 * writer: what this rank writes, PARAM_IO_WRITE_DENSE (every tensor but
 * the routed experts': DP rank 0) | PARAM_IO_WRITE_EXPERTS (its experts'
 * slices: expert-DP rank 0, which under --ep is one rank per EP rank); 0
 * on ranks whose copy another rank writes.
 * tp_size/tp_rank: this rank's TP place (the chunking and who writes
 * replicated tensors). Returns 0, or -1 with one line in err on every rank. */
enum { PARAM_IO_WRITE_DENSE = 1, PARAM_IO_WRITE_EXPERTS = 2 };
int param_io_write(comm_t *world, const char *path, const model_config_t *cfg, const param_table_t *t,
                   const param_io_group_t *groups, int n_groups, int writer, int tp_size, int tp_rank,
                   const h5store_attr_t *attrs, int n_attrs, char *err, size_t errlen);

/* Collective over world, the store's communicator's group: reads every tensor of this
 * rank's table, for each group, from the open file (any layout wrote it),
 * and verifies every checksum in the file (h5store_read_verify). A missing
 * tensor, a shape mismatch or a checksum mismatch is an error naming it. */
int param_io_read(comm_t *world, h5store_t *h, const model_config_t *cfg, const param_table_t *t,
                  const param_io_group_t *groups, int n_groups, char *err, size_t errlen);

#endif
