/* --eval-mc: multiple-choice files (io/evalmc.h) scored during training
 * the way llm.c scores HellaSwag (issue 38): each completion follows its
 * context in one row of the batch, and its score is the loss of its own
 * tokens, summed (acc: the lowest sum wins) and averaged per token
 * (acc_norm: the lowest mean wins, llm.c's "acc_norm"). A row longer than
 * --seq-len + 1 tokens loses context tokens from its start, as
 * lm-evaluation-harness truncates ((context + continuation)[-max_length:]).
 *
 * Examples are dealt to the data-parallel ranks round robin (example e to
 * DP rank e % dp), their completions packed B rows to a forward; every
 * rank of the grid runs the same forwards (collective under ZeRO-3 and
 * along the pipeline), and the per-completion sums meet by all-reduce,
 * so the scores do not depend on the layout beyond fp32 noise. */
#ifndef DTRAIN_EVAL_MC_H
#define DTRAIN_EVAL_MC_H

#include <stdio.h>

#include "io/evalmc.h"
#include "src/train/metrics.h"

typedef struct mc_file {
    char name[64]; /* the metrics key: base name less extension, [A-Za-z0-9_.-] */
    char path[1024];
    evalmc_file_t f;
    int *row0;   /* [n + 1] example e's first completion in the file's rows */
    double *sum; /* [rows] each completion's summed loss, this evaluation */
} mc_file_t;

typedef struct mc_eval {
    mc_file_t file[METRICS_MC_MAX];
    int n;
    FILE *dump; /* --eval-mc-dump, rank 0's (NULL elsewhere or without it) */
} mc_eval_t;

/* Reads the ','-joined files of list and checks each example fits the
 * model: tokens below vocab, a context of at least one token, each
 * completion at most seq_len tokens. dump (may be "") is opened for
 * appending when write_dump. 0, or -1 with one line in err. */
int mc_eval_open(mc_eval_t *ev, const char *list, int vocab, int seq_len, const char *dump, int write_dump, char *err,
                 size_t errlen);
void mc_eval_close(mc_eval_t *ev);

/* One completion's row of t positions: tok[t] and tgt[t] (-1 where nothing
 * is scored, and on the padding after the row). */
void mc_row(const evalmc_example_t *x, int c, int t, int32_t *tok, int32_t *tgt);

#endif
