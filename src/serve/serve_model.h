/* dtrain-serve's model: the grid of tp x pp ranks, the backend, this
 * rank's stage and tensor-parallel slice of the model with its parameters
 * read from --init-from (a dtrain checkpoint or --save-params file through
 * the parameter store, src/ckpt/param_io.h; a Hugging Face directory or an
 * llm.c file through dtrain --init-from's importer, src/convert/hf_import.h),
 * and the tokenizer. */
#ifndef DTRAIN_SERVE_MODEL_H
#define DTRAIN_SERVE_MODEL_H

#include <stddef.h>

#include "io/tokenizer.h"
#include "mpi/grid.h"
#include "mpi/launch.h"
#include "src/backend/backend.h"
#include "src/model/model.h"
#include "src/serve/serve_options.h"

typedef struct serve_model {
    grid_t grid;       /* MPI: where the jobs are dealt out */
    grid_t net;        /* the model's groups (backend_comm_open's copy of grid) */
    int has_grid, has_net;
    backend_t backend;
    model_config_t cfg;
    model_t model;
    int B, T;            /* rows per forward, context length */
    int threads;         /* per rank */
    char source[64];     /* what --init-from held: "dtrain checkpoint", "Hugging Face", ... */
    tokenizer_t *tk;     /* rank 0's (NULL elsewhere) */
    char tk_from[SERVE_PATH_MAX + 64];
    double load_s;       /* the parameters' read, the slowest rank's */
} serve_model_t;

/* Collective over the world: everything above, or -1 with one line in err
 * on every rank (the same verdict everywhere). */
int serve_model_open(serve_model_t *sm, const serve_opts_t *o, const launch_env_t *env, char *err, size_t errlen);
void serve_model_close(serve_model_t *sm);

#endif
