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

#include "model_config.h"

#define PARAM_NAME_MAX 48

typedef enum {
    TP_SPLIT_NONE = 0, /* replicated on every TP rank */
    TP_SPLIT_ROWS,     /* dim 0 split: column-parallel linear (output features), vocab-parallel embedding */
    TP_SPLIT_COLS      /* dim 1 split: row-parallel linear (input features) */
} tp_split_t;

typedef enum { INIT_NORMAL = 0, INIT_ZEROS, INIT_ONES } param_init_t;

typedef struct param_desc {
    char name[PARAM_NAME_MAX]; /* e.g. "h.3.attn.wq" */
    int ndim;                  /* 1 or 2 */
    int64_t shape[2];          /* logical shape (layout independent) */
    tp_split_t tp_split;
    int layer;      /* block index; -1 = input embeddings, n_layer = final norm / head */
    int decay;      /* AdamW weight decay applies (2-D tensors) */
    param_init_t init;
    float init_std; /* for INIT_NORMAL */
    /* This rank's slice */
    int64_t start[2], count[2];
    size_t offset; /* in floats, into the rank's flat parameter buffer */
    size_t numel;  /* count[0] * count[1] */
} param_desc_t;

typedef struct param_table {
    param_desc_t *p;
    int n;
    size_t numel;         /* local floats in the flat buffer */
    size_t logical_numel; /* floats of the whole model */
} param_table_t;

/* Builds the table for the model as seen by TP rank tp_rank of tp_size.
 * Tensors are laid out layer by layer, so a layer's parameters are
 * contiguous; within a layer the q, k, v weights (and biases) are adjacent
 * so one GEMM computes the fused qkv, and likewise gate and up of SwiGLU. */
int param_table_build(param_table_t *t, const model_config_t *c, int tp_size, int tp_rank,
                      char *err, size_t errlen);
void param_table_free(param_table_t *t);
/* Index of the tensor called name, or -1. */
int param_table_find(const param_table_t *t, const char *name);

/* Fills this rank's slice of every tensor from the counter-based RNG keyed by
 * (seed, tensor name, logical element index). */
void param_table_init(const param_table_t *t, float *flat, uint64_t seed);

/* Value of logical element (i, j) of tensor d at initialisation. */
float param_init_value(const param_desc_t *d, uint64_t seed, int64_t i, int64_t j);

#endif
