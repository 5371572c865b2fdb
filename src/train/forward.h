/* Forward-only passes through the pipeline, shared by validation,
 * --eval-mc, the sample at the end of a run and dtrain-serve: no
 * schedule, one microbatch in slot 0, stage s receiving from s-1 and
 * sending to s+1. */
#ifndef DTRAIN_FORWARD_H
#define DTRAIN_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "mpi/grid.h"
#include "mpi/status.h"
#include "src/model/model.h"

/* One microbatch of b x t tokens (tok, pos and tgt as model_forward takes
 * them) through the stages of g's pipeline (the model's chunks in order,
 * under the interleaved schedule several per stage), in slot 0. *loss: the loss
 * on the last stage (0 elsewhere; a non-finite loss is a value, not a
 * failure). Collective over PP (and TP). */
status_t forward_pipeline(model_t *m, const grid_t *g, const int32_t *tok, const int32_t *pos, const int32_t *tgt,
                          int b, int t, float *loss, char *err, size_t errlen);

/* Row `row` of the logits of the last forward_pipeline, all V columns, on
 * every rank of g: gathered over TP on the last stage, broadcast over PP
 * from it. Collective over TP and PP. */
status_t forward_logits_row(model_t *m, const grid_t *g, int row, float *logits, char *err, size_t errlen);

#endif
