/* Where each of dtrain's logical tensors lives in a Hugging Face model
 * directory (safetensors) or in an llm.c model file, and how its elements
 * are arranged there. Pure (no I/O): --init-from reads with it, and
 * dreshard --to-hf / --to-llmc write with it, so both directions share one
 * description.
 *
 * An entry says: dtrain's logical element (i, j) of tensor `name` (shape
 * [R, K]; a 1-D tensor is [R, 1]) is element
 *
 *     1-D:                      src[off + i]                (a row vector)
 *     2-D:                      src[off + i][j]             ([out, in] like dtrain)
 *     2-D, HF_MAP_TRANSPOSE:    src[j][off + i]             (GPT-2 Conv1D, [in, out])
 *
 * of the source tensor, where, with HF_MAP_ROPE, i is first replaced by
 * hf_rope_src_row(i, head_size). off is nonzero only inside fused tensors
 * (HF GPT-2's c_attn [C, 3C]: q at 0, k at C, v at 2C of the output
 * dimension; llm.c's qkvw [3C, C] likewise). With HF_MAP_VOCAB the source
 * has exactly V rows (llm.c: the first V of its Vp) and dtrain's padding
 * rows, which exist only in memory, are neither read nor written.
 *
 * Conventions (dtrain: doc/format.md; its tensors are [out, in]):
 *
 *  dtrain            HF GPT2LMHeadModel [transformer.]   llm.c gpt2 .bin
 *  wte [V,C]         wte.weight [V,C]                    wte [Vp,C], rows < V
 *  wpe [S,C]         wpe.weight [S,C]                    wpe [S,C]
 *  h.l.ln1.w/.b      h.l.ln_1.weight/.bias               ln1w/ln1b [l]
 *  h.l.attn.wq/k/v   h.l.attn.c_attn.weight [C,3C] T     qkvw [l][3C,C]
 *                    (cols 0, C, 2C)                     (rows 0, C, 2C)
 *  h.l.attn.bq/k/v   h.l.attn.c_attn.bias [3C]           qkvb [l][3C]
 *  h.l.attn.wo/.bo   h.l.attn.c_proj.weight T / .bias    attprojw / attprojb
 *  h.l.ln2.w/.b      h.l.ln_2.weight/.bias               ln2w/ln2b
 *  h.l.mlp.wfc/.bfc  h.l.mlp.c_fc.weight T / .bias       fcw / fcb
 *  h.l.mlp.wproj/b.. h.l.mlp.c_proj.weight T / .bias     fcprojw / fcprojb
 *  lnf.w/.b          ln_f.weight/.bias                   lnfw/lnfb
 *  (head)            tied to wte; an lm_head.weight in the file must equal wte
 *  (T: HF_MAP_TRANSPOSE; GELU is the tanh form, HF "gelu_new")
 *
 *  dtrain            HF LlamaForCausalLM (and Llama-shaped Mistral, Qwen2, Qwen3)
 *  tok_emb [V,C]     model.embed_tokens.weight
 *  h.l.ln1.w         model.layers.l.input_layernorm.weight
 *  h.l.attn.wq       model.layers.l.self_attn.q_proj.weight   R
 *  h.l.attn.wk       model.layers.l.self_attn.k_proj.weight   R
 *  h.l.attn.wv       model.layers.l.self_attn.v_proj.weight
 *  h.l.attn.bq/bk/bv model.layers.l.self_attn.q/k/v_proj.bias   R (q, k)  (Qwen2)
 *  h.l.attn.qnorm    model.layers.l.self_attn.q_norm.weight   R          (Qwen3)
 *  h.l.attn.knorm    model.layers.l.self_attn.k_norm.weight   R          (Qwen3)
 *  h.l.attn.wo       model.layers.l.self_attn.o_proj.weight
 *  h.l.ln2.w         model.layers.l.post_attention_layernorm.weight
 *  h.l.mlp.wgate     model.layers.l.mlp.gate_proj.weight
 *  h.l.mlp.wup       model.layers.l.mlp.up_proj.weight
 *  h.l.mlp.wproj     model.layers.l.mlp.down_proj.weight
 *  lnf.w             model.norm.weight
 *  lm_head.w         lm_head.weight (untied; tie_word_embeddings: none, the head is tok_emb)
 *  (R: HF_MAP_ROPE. dtrain rotates interleaved pairs (x[2i], x[2i+1]) of a
 *  head by pos * theta^(-2i/HS); Hugging Face rotates (x[i], x[i+HS/2])
 *  ("rotate_half") by the same angle. So dtrain row h*HS + 2i + j of wq/wk
 *  is HF row h*HS + j*HS/2 + i, for pair i < HS/2, j in {0, 1}. Both put
 *  query head h's rows at [h*HS, (h+1)*HS) and let KV head h / (NH/NKV)
 *  serve it, as HF's repeat_kv does. The q/k biases and the q/k norm
 *  weights, one value per such row, are permuted alike; RMSNorm over a
 *  head does not depend on the order of its elements.)
 *
 *  dtrain (MoE layer l, expert x; F = moe.ffn, FS = moe.shared_ffn)
 *                    HF MixtralForCausalLM              HF Qwen2MoeForCausalLM
 *  h.l.moe.router    model.layers.l.block_sparse_moe.   model.layers.l.mlp.gate.weight [E, C]
 *                    gate.weight [E, C]
 *  h.l.moe.wfc rows  ...block_sparse_moe.experts.x.     ...mlp.experts.x.gate_proj.weight [F, C]
 *   [2xF, 2xF+F)     w1.weight [F, C]
 *   [2xF+F, 2xF+2F)  ...experts.x.w3.weight             ...mlp.experts.x.up_proj.weight
 *  h.l.moe.wproj     ...experts.x.w2.weight [C, F]      ...mlp.experts.x.down_proj.weight [C, F]
 *   rows [xC, xC+C)
 *  h.l.mlp.wgate/    (none: no shared expert)           ...mlp.shared_expert.gate_proj/up_proj/
 *   wup/wproj                                            down_proj.weight ([FS, C], [C, FS])
 *  h.l.moe.shared_gate                                  ...mlp.shared_expert_gate.weight [1, C]
 *  (a MoE Llama with a shared expert is Qwen2-MoE, one without Mixtral:
 *  hf_moe_family. One dtrain expert stack is many source tensors: an
 *  entry covers dtrain rows [row0, row0 + nrows) of its tensor; a dense
 *  layer of a Qwen2-MoE (mlp_only_layers) is a Llama layer.)
 *
 * The source names of HF GPT-2 carry "transformer." when saved from
 * GPT2LMHeadModel and nothing when saved from GPT2Model (the hub's gpt2):
 * the prefix argument. */
#ifndef DTRAIN_HF_MAP_H
#define DTRAIN_HF_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "src/model/model_config.h"
#include "src/model/params.h"

#define HF_SRC_NAME_MAX 96

typedef enum { HF_FMT_HF = 0, HF_FMT_LLMC = 1 } hf_format_t;

#define HF_MAP_TRANSPOSE 1u /* source stored [in, out] (GPT-2's Conv1D) */
#define HF_MAP_ROPE 2u      /* rows in rotate-half order within each head */
#define HF_MAP_VOCAB 4u     /* V rows in the source; dtrain's padding rows are memory only */

typedef struct hf_map {
    char name[PARAM_NAME_MAX]; /* dtrain's logical tensor, e.g. "h.3.attn.wq" */
    char src[HF_SRC_NAME_MAX]; /* HF tensor name; llm.c: its tensor's name ("qkvw") */
    int llmc_id;               /* llm.c: llmc_tensor_t (io/llmc_model.h); -1 for HF */
    int layer;                 /* llm.c: the layer of a stacked tensor, else 0 */
    unsigned flags;            /* HF_MAP_* */
    int ndim;                  /* dtrain's: 1 or 2 */
    int64_t shape[2];          /* dtrain's logical shape ([R, 1] for 1-D) */
    int src_ndim;              /* the source tensor as stored (llm.c: one layer of it; */
    int64_t src_shape[2];      /* a vector is [n]; src_shape[1] = 1 for 1-D) */
    int64_t off;               /* first row of dtrain's tensor in the source's output dim */
    int head_size;             /* HF_MAP_ROPE: HS */
    /* the dtrain rows this entry covers, [row0, row0 + nrows): all of them
     * (0, shape[0]) but for a MoE expert stack, whose every expert's
     * matrix (Llama: its gate and its up) is a source tensor of its own */
    int64_t row0, nrows;
} hf_map_t;

/* The Hugging Face architecture of a mixture of experts. */
typedef enum { HF_MOE_NONE = 0, HF_MOE_MIXTRAL, HF_MOE_QWEN2 } hf_moe_family_t;

/* c's Hugging Face MoE family (HF_MOE_NONE for a dense model), or -1 with
 * one line in err naming what neither MixtralForCausalLM (softmax top-k
 * renormalised, every layer MoE, no shared expert, no biases) nor
 * Qwen2MoeForCausalLM (softmax, q/k/v biases, a shared expert under its
 * sigmoid gate) holds. */
int hf_moe_family(const model_config_t *c, char *err, size_t errlen);

/* Every logical tensor of the whole model c (the table of
 * param_table_build(lay = NULL), in its order; GPT-2's tied head copy is
 * "wte" again, so it is not listed twice). HF GPT-2 names get prefix
 * ("transformer." or ""); Llama ignores it. *out is malloc'd. Returns 0, or
 * -1 with one line in err (an architecture the format lacks: llm.c is GPT-2
 * only). */
int hf_map_build(const model_config_t *c, hf_format_t fmt, const char *prefix, hf_map_t **out, int *n_out, char *err,
                 size_t errlen);
/* The entry of dtrain tensor name, or NULL. */
const hf_map_t *hf_map_find(const hf_map_t *m, int n, const char *name);

/* The block of the source to read (or write) for dtrain's logical block
 * rows [r0, r0+nr) x cols [c0, c0+nc) (1-D: c0 = 0, nc = 1; the rows
 * within the entry's [row0, row0 + nrows)), in the
 * arguments of st_read_f32 / llmc_model_read_f32: *sr0, *snr, *sc0, *snc
 * and *transpose, so that the result is [nr][nc] in dtrain's orientation.
 * With HF_MAP_ROPE the block's rows must be whole heads and arrive in
 * source order: apply hf_rope_to_dtrain afterwards. */
void hf_map_src_block(const hf_map_t *e, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int64_t *sr0, int64_t *snr,
                      int64_t *sc0, int64_t *snc, int *transpose);

/* dtrain row r of a q/k weight (heads of hs rows) -> its HF row, and back. */
static inline int64_t hf_rope_src_row(int64_t r, int64_t hs)
{
    const int64_t h = r / hs, k = r % hs;
    return h * hs + (k & 1) * (hs / 2) + k / 2;
}

static inline int64_t hf_rope_dtrain_row(int64_t s, int64_t hs)
{
    const int64_t h = s / hs, k = s % hs, half = hs / 2;
    return h * hs + (k % half) * 2 + k / half;
}

/* In place on rows[nr][cols] that hold whole heads: source (HF) row order
 * -> dtrain's (import), or the reverse (export). tmp: hs * cols floats. */
void hf_rope_to_dtrain(float *rows, int64_t nr, int64_t cols, int64_t hs, float *tmp);
void hf_rope_to_hf(float *rows, int64_t nr, int64_t cols, int64_t hs, float *tmp);

/* HF tensors that are buffers, not parameters, and are skipped on import
 * (GPT-2's attn.bias / attn.masked_bias causal masks, Llama's
 * rotary_emb.inv_freq). */
int hf_map_ignorable(const char *src_name);

#endif
