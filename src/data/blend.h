/* Weighted blends of datasets (--data / --val-data), Megatron-LM's syntax:
 *
 *   "PATH"                        one dataset
 *   "0.7 PATH_A 0.3 PATH_B ..."   weights and paths, separated by blanks
 *
 * A spec is a blend when its first blank-separated word is a number. Each
 * PATH is what --data takes for one dataset (a glob of llm.c shards, a
 * raw-u16 file, a Megatron prefix or glob of .idx files), in --data-format
 * unless it starts with FORMAT: (llmc:, raw-u16: or megatron:), which
 * mixes formats in one blend. Weights are normalised to sum 1.
 *
 * The order: sample n (0, 1, ...) of the blend goes to the dataset that is
 * due first. Dataset i's (c+1)-th sample is due at n = (c+1) / w_i; among
 * the datasets whose count c_i is below w_i (n + 1) the one with the
 * earliest due time is picked (ties: the lower index). This is Tijdeman's
 * solution of the chairman assignment problem: after every n samples
 * |c_i - w_i n| < 1 for every dataset (Megatron's own greedy, the largest
 * lag first, can trail by more than one sample). The order depends on the
 * weights and n only: the same on every rank, layout and resume. */
#ifndef DTRAIN_BLEND_H
#define DTRAIN_BLEND_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokens.h"

#define BLEND_MAX_PARTS 256

typedef struct blend_spec {
    int n;
    double weight[BLEND_MAX_PARTS]; /* normalised: sum 1 */
    char *path[BLEND_MAX_PARTS];    /* without the FORMAT: prefix */
    tokens_format_t fmt[BLEND_MAX_PARTS];
} blend_spec_t;

/* Parse spec (fmt: the format of paths without a prefix). A weight that is
 * not a positive finite number, a weight without a path, more than
 * BLEND_MAX_PARTS datasets: -1 with one line in err. */
int blend_parse(const char *spec, tokens_format_t fmt, blend_spec_t *b, char *err, size_t errlen);
void blend_free(blend_spec_t *b);

/* The dataset of sample n, given count[i] = samples of dataset i among
 * samples 0 .. n-1 (so sum count = n). */
int blend_pick(const double *weight, const uint64_t *count, int n_parts, uint64_t n);

#endif
