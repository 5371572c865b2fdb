/* The parameter table: one record per logical tensor. It is the single
 * description that drives initialisation, the optimizer (which tensors get
 * weight decay), tensor-parallel slicing, gradient buckets, and checkpoint
 * I/O. A rank's slice of a tensor is a hyperslab [start, start+count) of the
 * logical shape, so the same record describes what to write and what to read
 * at any other layout. */
#ifndef DTRAIN_PARAMS_H
#define DTRAIN_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "src/model/model_config.h"

#define PARAM_NAME_MAX 48

typedef enum {
    TP_SPLIT_NONE = 0, /* replicated on every TP rank */
    TP_SPLIT_ROWS,     /* dim 0 split: column-parallel linear (output features) */
    TP_SPLIT_COLS,     /* dim 1 split: row-parallel linear (input features) */
    TP_SPLIT_VOCAB     /* dim 0 split after padding to param_padded_vocab(): vocab-parallel
                          embedding and output head; the padding rows exist only in memory */
} tp_split_t;

/* Runs of blocks one pipeline stage may hold: one, or under the
 * interleaved schedule one per virtual stage (chunk). */
#define PARAM_MAX_RUNS 16

/* Which part of the model one rank holds. */
typedef struct param_layout {
    int tp_size, tp_rank;
    /* --ep: a MoE layer's experts are split over ep_size ranks, this one
     * holding experts [ep_rank * E/ep_size, (ep_rank+1) * E/ep_size) (0 is
     * read as 1: no expert parallelism) */
    int ep_size, ep_rank;
    /* --etp: the experts' TP size, tp_size (0 is read so: each expert's
     * MLP split over TP as the dense one) or 1 (whole experts; ep_rank
     * then counts over the TP x DP plane, so TP ranks hold other experts) */
    int etp;
    /* blocks [run_begin[k], run_end[k]) for k < n_runs, ascending and
     * disjoint (an empty run holds none); local block i counts through
     * them in order (param_layout_layer) */
    int n_runs;
    int run_begin[PARAM_MAX_RUNS], run_end[PARAM_MAX_RUNS];
    int has_embed, has_head; /* first stage: embeddings; last: final norm and head */
} param_layout_t;

/* One run of blocks [begin, end). */
param_layout_t param_layout_range(int tp_size, int tp_rank, int begin, int end, int has_embed, int has_head);
/* Blocks held (Ls). */
int param_layout_blocks(const param_layout_t *p);
/* The model layer of local block i (0 <= i < Ls). */
int param_layout_layer(const param_layout_t *p, int i);
/* The local index of model layer l, or -1 where the rank does not hold it. */
int param_layout_local(const param_layout_t *p, int l);
/* The local index of run k's first block (k = n_runs: Ls). */
int param_layout_run_first(const param_layout_t *p, int k);
/* 0 when the runs are in range, ascending and disjoint; else -1. */
int param_layout_check(const param_layout_t *p, int n_layer);

typedef enum { INIT_NORMAL = 0, INIT_ZEROS, INIT_ONES } param_init_t;

typedef struct param_desc {
    char name[PARAM_NAME_MAX]; /* e.g. "h.3.attn.wq" */
    int ndim;                  /* 1 or 2 */
    int64_t shape[2];          /* logical shape (layout independent) */
    tp_split_t tp_split;
    /* TP_SPLIT_ROWS of a stack of `groups` equal blocks of rows (a MoE
     * layer's experts, [E * rows, cols], and Llama's gate and up of each
     * expert as two blocks): each block is split on its own, so the rank
     * holds rows [start[0], start[0] + count[0]) of every block, block g's
     * at local rows [g * count[0], (g+1) * count[0]). 1 elsewhere. */
    int groups;
    /* the blocks held: [group0, group0 + held) of the groups (all of them
     * but under --ep, where a rank holds its experts' blocks); held is 1
     * for a tensor of one group, whose expert rows --ep splits through
     * start[0] and count[0] instead */
    int group0, held;
    /* a routed expert's tensor (moe.wfc, .bfc, .wproj, .bproj): split over
     * the EP group, its gradient averaged over the expert-DP group */
    int expert;
    /* an expert tensor under --etp 1 at tp > 1: held whole, and TP ranks
     * hold other experts (its slice is not replicated over TP, even where
     * tp_split is TP_SPLIT_NONE) */
    int ep_spans_tp;
    int layer;     /* block index; -1 = input embeddings, n_layer = final norm / head */
    int decay;     /* AdamW weight decay applies (2-D tensors) */
    int norm;      /* a norm's weight or bias: under sequence parallelism each TP
                       rank sees some rows only, so its gradient is a partial sum */
    int tied_copy; /* GPT-2's output head on a last stage that is not the first:
                       a copy of "wte" whose gradient is summed with the original's */
    param_init_t init;
    float init_std; /* for INIT_NORMAL */
    /* This rank's slice: logical hyperslab [start, start+count) */
    int64_t start[2], count[2];
    int64_t local_rows; /* rows in the buffer: count[0] (times groups), plus zero padding rows
                           for TP_SPLIT_VOCAB (never trained, never saved) */
    size_t offset;      /* in floats, into the rank's flat parameter buffer */
    size_t numel;       /* local_rows * count[1] */
} param_desc_t;

typedef struct param_table {
    param_desc_t *p;
    int n;
    size_t numel;         /* local floats in the flat buffer */
    size_t logical_numel; /* floats of the whole logical tensors this table names */
} param_table_t;

/* Builds the table of the tensors a rank with layout lay holds. Tensors are
 * laid out layer by layer, so a layer's parameters are contiguous; within a
 * layer the q, k, v weights (and biases) are adjacent so one GEMM computes
 * the fused qkv, and likewise gate and up of SwiGLU. lay == NULL: the whole
 * model on one rank. */
int param_table_build(param_table_t *t, const model_config_t *c, const param_layout_t *lay, char *err, size_t errlen);
/* The whole model on one rank. */
param_layout_t param_layout_whole(const model_config_t *c);
/* Vocabulary rows in memory: V rounded up to a multiple of 128 * tp_size,
 * so every TP rank holds the same number and the head GEMM is aligned. */
int64_t param_padded_vocab(int64_t V, int tp_size);
void param_table_free(param_table_t *t);
/* Index of the tensor called name, or -1. */
int param_table_find(const param_table_t *t, const char *name);

/* Fills this rank's slice of every tensor from the counter-based RNG keyed by
 * (seed, tensor name, logical element index). */
void param_table_init(const param_table_t *t, float *flat, uint64_t seed);

/* The logical row of local row r of tensor d (r < the rows it holds). */
static inline int64_t param_logical_row(const param_desc_t *d, int64_t r)
{
    if (d->groups <= 1)
        return d->start[0] + r;
    const int64_t blk = d->shape[0] / d->groups;
    return (d->group0 + r / d->count[0]) * blk + d->start[0] + r % d->count[0];
}

/* Value of logical element (i, j) of tensor d at initialisation. */
float param_init_value(const param_desc_t *d, uint64_t seed, int64_t i, int64_t j);

#endif
