/* The memory and throughput planner (`dtrain --plan`): for a model, a
 * layout (tp, pp, dp, ZeRO stage, hybrid shard, sequence parallelism), a
 * batch, a recomputation policy, a precision and a hardware profile, the
 * bytes each rank holds by category, the FLOPs and bytes sent per step by
 * each group, and the predicted step time, tokens/s and MFU. Trains
 * nothing and needs no MPI world: one process plans any layout.
 *
 * fp32 is dtrain as built: parameters, gradients, optimizer state,
 * communication buffers and the activation/workspace arenas are the bytes
 * the trainer allocates (the same parameter table, ZeRO units and arena
 * layout code), checked against a real run's accounting allocator by
 * test/test_plan.sh. bf16 is Megatron's mixed precision: bf16 weights,
 * fp32 gradients, master weights and AdamW moments (2 + 4 + 12 bytes per
 * parameter), activations by Korthikanti et al. 2022. doc/design.md has
 * every formula and assumption. */
#ifndef DTRAIN_PLAN_H
#define DTRAIN_PLAN_H

#include <stdio.h>

#include "src/train/options.h" /* run_options_t, plan_dtype_t */

/* Runs --plan (and --search) for the parsed options. world_size: the MPI
 * world this process is in (dp defaults to world_size / (tp x pp), or 1
 * for a singleton). Prints to out when print is set (rank 0); --metrics
 * FILE gets the plan as one JSON object. Returns 0, or -1 with one line
 * in err (bad input: exit status 2). */
int plan_run(const run_options_t *o, int world_size, int print, FILE *out, char *err, size_t errlen);

#endif
