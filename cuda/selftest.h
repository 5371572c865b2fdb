/* Every op of a GPU ops table against the CPU ops table on random inputs of
 * several shapes, each with a stated relative error bound. Shared by
 * `dtrain --selftest` and test/gpu/test_ops_cuda (make check on CUDA
 * builds), so the two run exactly the same comparisons. */
#ifndef DTRAIN_CUDA_SELFTEST_H
#define DTRAIN_CUDA_SELFTEST_H

#include <stdio.h>

#include "base/ops.h"

/* Compares every op of the CUDA table gpu (made for --dtype fp32) with the
 * CPU table cpu (the caller's: cuda/ does not reach into src/, where the
 * CPU backend lives), and the attention of gpu16 (a table of the same
 * device made for --dtype bf16: the tensor-core path) in bf16 bounds.
 * Runs every comparison, one line each on out ("ok   ..." / "FAIL ..."),
 * then a summary line. graphs: the caller's graph table over gpu
 * (ops_graph_create with own_base 0, src/backend: --cuda-graphs), whose
 * results must equal gpu's bit for bit (four runs of one op sequence:
 * plain, captured, launched, and after gpu's workspace moved: the caller
 * checks its counts for 1 capture, 2 launches, 1 stale); NULL skips it.
 * Returns the number of failed comparisons (0 = the backends agree), or
 * -1 with one line in err when the test itself could not run (out of
 * memory). */
int cuda_selftest(const ops_t *gpu, const ops_t *gpu16, const ops_t *cpu, const ops_t *graphs, FILE *out, char *err,
                  size_t errlen);

#endif
