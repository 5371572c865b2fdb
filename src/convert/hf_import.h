/* dtrain --init-from PATH: start a run from a Hugging Face model directory
 * (config.json + model.safetensors, or shards with
 * model.safetensors.index.json; GPT2LMHeadModel, LlamaForCausalLM and the
 * Llama-shaped MistralForCausalLM, Qwen2/Qwen3ForCausalLM,
 * MixtralForCausalLM and Qwen2MoeForCausalLM; F32, F16 or BF16 tensors) or from an
 * llm.c GPT-2 model file (version 3 fp32, version 5 bf16), recognised by
 * content: a directory, or a config.json / .safetensors file in one, is
 * Hugging Face; a file beginning with llm.c's magic 20240326 is llm.c.
 *
 * The model configuration comes from the file. Each rank reads only the
 * hyperslab its parameter table holds of each tensor (with pread, from
 * safetensors and llm.c files alike: io/st_block.h; see src/convert/hf_map.h for which
 * source element each dtrain element is), straight into the host buffer of its
 * local tensors (the model's parameters themselves where they are host
 * memory: model_params_in_place); the only staging is one attention head
 * (the RoPE permutation), one slice of a tensor (comparing a stored GPT-2
 * lm_head with wte) and the 256 KiB of source rows a converted or
 * transposed read passes through (twice that for a transposed bf16 or
 * fp16 one). Whatever dtrain cannot represent is refused with one
 * line naming the file and the field or tensor. */
#ifndef DTRAIN_HF_IMPORT_H
#define DTRAIN_HF_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "src/model/model_config.h"
#include "src/model/params.h"

typedef enum { INIT_FROM_HF = 0, INIT_FROM_LLMC = 1 } init_from_kind_t;

/* What PATH is (by content) and the model it holds. For Hugging Face, dir
 * receives the model directory. Returns 0, or -1 with one line in err. */
int init_from_probe(const char *path, init_from_kind_t *kind, char *dir, size_t dirlen, model_config_t *c, char *err,
                    size_t errlen);

typedef struct init_from_report {
    init_from_kind_t kind;
    char dtypes[32];         /* the source dtypes seen, e.g. "bf16" or "f32+bf16" */
    int n_files;             /* safetensors shards (1 for llm.c) */
    uint64_t bytes_read;     /* source bytes this rank's slices cover */
    uint64_t local_bytes;    /* fp32 bytes of this rank's tensors (table.numel * 4) */
    uint64_t staging_peak;   /* largest temporary buffer, bytes */
    uint64_t largest_tensor; /* fp32 bytes of the largest local tensor */
    long rss_growth_kb;      /* peak resident set during the import minus before it (-1: unknown) */
    double seconds;
} init_from_report_t;

/* Fills this rank's slice of every tensor of t (host: [t->numel], the
 * flat buffer's layout; vocabulary padding rows are set to 0) from path,
 * whose model is c, on --threads threads (omp_get_max_threads), each
 * holding one tensor's staging at a time. fresh: host is memory not yet
 * faulted in (a loader then faults each tensor's range in one call).
 * Independent (no MPI). Returns 0, or -1 with one line in err naming the
 * file and the tensor (the first in t's order that failed). */
int init_from_load(const char *path, const model_config_t *c, const param_table_t *t, float *host, int fresh,
                   init_from_report_t *rep, char *err, size_t errlen);

#endif
