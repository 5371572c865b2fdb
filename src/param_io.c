#include "param_io.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h5store.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

/* Every logical tensor of the model, as the store names them: the table of
 * the whole model on one rank, so the list is the same on every rank. */
static int logical_tensors(const model_config_t *cfg, h5store_tensor_t **out, int *n, char *err, size_t errlen)
{
    param_table_t whole;
    if (param_table_build(&whole, cfg, NULL, err, errlen) != 0)
        return -1;
    h5store_tensor_t *t = calloc((size_t)whole.n, sizeof *t);
    if (!t) {
        param_table_free(&whole);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < whole.n; i++) {
        const param_desc_t *d = &whole.p[i];
        snprintf(t[i].name, sizeof t[i].name, "params/%s", d->name);
        t[i].ndim = d->ndim;
        t[i].shape[0] = d->shape[0];
        t[i].shape[1] = d->shape[1];
    }
    *out = t;
    *n = whole.n;
    param_table_free(&whole);
    return 0;
}

static int tensor_index(const h5store_tensor_t *t, int n, const char *name)
{
    char full[H5STORE_NAME_MAX];
    snprintf(full, sizeof full, "params/%s", name);
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, full) == 0)
            return i;
    return -1;
}

int param_io_save(const char *path, const model_config_t *cfg, const param_table_t *t, const float *host,
                  int writer, int tp_rank, const int layout[3], int step, char *err, size_t errlen)
{
    h5store_tensor_t *tensors = NULL;
    h5store_shard_t *shards = calloc((size_t)t->n + 1, sizeof *shards);
    int nt = 0, ns = 0, rc = 0;
    if (!shards) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    if (rc == 0)
        rc = logical_tensors(cfg, &tensors, &nt, err, errlen);
    for (int i = 0; rc == 0 && writer && i < t->n; i++) {
        const param_desc_t *d = &t->p[i];
        /* replicated over TP: TP rank 0 writes it; the tied copy: never */
        if (d->tied_copy || (d->tp_split == TP_SPLIT_NONE && tp_rank != 0) || d->count[0] == 0)
            continue;
        int k = tensor_index(tensors, nt, d->name);
        if (k < 0) {
            snprintf(err, errlen, "internal error: tensor %s is not in the model's table", d->name);
            rc = -1;
            break;
        }
        /* the real rows come first in the buffer, padding rows after */
        shards[ns++] = (h5store_shard_t){.tensor = k, .start = {d->start[0], d->start[1]},
                                         .count = {d->count[0], d->count[1]}, .buf = (float *)host + d->offset};
    }
    char layout_s[64];
    snprintf(layout_s, sizeof layout_s, "tp %d pp %d dp %d", layout[0], layout[1], layout[2]);
    const h5store_attr_t attrs[] = {
        {.key = "dtrain_version", .type = H5STORE_STR, .s = PACKAGE_VERSION},
        {.key = "content", .type = H5STORE_STR, .s = "params"},
        {.key = "arch", .type = H5STORE_STR, .s = model_arch_name(cfg->arch)},
        {.key = "vocab_size", .type = H5STORE_INT, .i = cfg->vocab_size},
        {.key = "n_layer", .type = H5STORE_INT, .i = cfg->n_layer},
        {.key = "n_head", .type = H5STORE_INT, .i = cfg->n_head},
        {.key = "n_kv_head", .type = H5STORE_INT, .i = cfg->n_kv_head},
        {.key = "d_model", .type = H5STORE_INT, .i = cfg->d_model},
        {.key = "d_ff", .type = H5STORE_INT, .i = cfg->d_ff},
        {.key = "max_seq", .type = H5STORE_INT, .i = cfg->max_seq},
        {.key = "norm_eps", .type = H5STORE_DOUBLE, .d = cfg->norm_eps},
        {.key = "rope_theta", .type = H5STORE_DOUBLE, .d = cfg->rope_theta},
        {.key = "layout", .type = H5STORE_STR, .s = layout_s},
        {.key = "step", .type = H5STORE_INT, .i = step},
    };
    /* a failure above is agreed on, so every rank skips the write together */
    rc = h5store_agree(MPI_COMM_WORLD, rc, err, errlen);
    if (rc == 0)
        rc = h5store_write(path, MPI_COMM_WORLD, tensors, nt, shards, ns, attrs,
                           (int)(sizeof attrs / sizeof attrs[0]), err, errlen);
    free(tensors);
    free(shards);
    return rc;
}
