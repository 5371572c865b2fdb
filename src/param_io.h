/* The parameter table mapped onto the tensor store (io/h5store.h): the one
 * place that knows how model tensors become logical datasets. A dataset is
 * "params/<name>" with the tensor's logical shape; each rank contributes
 * the hyperslab it holds, and a tensor held by several ranks (DP replicas,
 * a replicated tensor on every TP rank, GPT-2's tied head copy on the last
 * stage) is written by one of them only. */
#ifndef DTRAIN_PARAM_IO_H
#define DTRAIN_PARAM_IO_H

#include <stddef.h>

#include "model_config.h"
#include "params.h"

/* Writes every parameter of the model as a consolidated file of logical
 * tensors (no optimizer state): what inference and export want. host is
 * this rank's flat parameter buffer in host memory; writer = 0 on ranks
 * whose copy another rank writes (DP ranks other than 0). Collective over
 * MPI_COMM_WORLD. Attributes record the model shape, the layout that wrote
 * the file and the step. Returns 0, or -1 with one line in err on every rank. */
int param_io_save(const char *path, const model_config_t *cfg, const param_table_t *t, const float *host,
                  int writer, int tp_rank, const int layout[3], int step, char *err, size_t errlen);

#endif
