#!/usr/bin/env python3
"""extract_gemm.py SRC OUT: copy the GEMM path of cuda/ops_cuda.cu (SRC) into
OUT, verbatim, for test_gemm_emu.cpp to compile on the host.

Taken: the #defines THREADS..WORKSPACE_BYTES, the state struct g, ck ..
grid_for (error checks, finish, wait_all, col_part_room), GRID_STRIDE, the
kernels k_fill_rows, k_gelu_fwd and k_gelu_bwd, everything from COL_ROWS
through matmul_dgelu_bwd_bf16 (column sums, the cuBLASLt plan cache,
lt_gemm, gemm_fwd/gemm_bwd and the matmul ops), and ops_cuda_init's cuBLAS
fallback handle setup, wrapped as emu_init_blas(). Regions are found by
their first lines, so the test follows ops_cuda.cu as it changes; a region
that is not found stops the build with its name.

The one rewrite: `kern<<<cfg>>>(args)` becomes `EMU_LAUNCH(cfg)(kern, args)`,
which g++ can parse (cublaslt_shim.h runs it on the host). #line directives
keep compiler messages and failed checks pointing at ops_cuda.cu."""
import re
import sys

from ops_cuda_source import Source, starts

src = Source(sys.argv[1], "extract_gemm.py")
out_path = sys.argv[2]

parts = [src.through("defines", "#define THREADS ", "#define WORKSPACE_BYTES")]
s = None
for i, line in enumerate(src.lines[:-1]):
    if line.startswith("static struct {") and "ready" in src.lines[i + 1]:
        s = i
        break
if s is None:
    src.fail("the state struct g not found")
parts.append((s, src.block_end(s, "the state struct g"), "state g"))
parts.append(src.region("ck .. grid_for", "static void ck(", "static unsigned grid_for("))
s = src.first(starts("#define GRID_STRIDE"), "#define GRID_STRIDE")
parts.append((s, s + 2, "GRID_STRIDE"))
for k in ("k_fill_rows", "k_gelu_fwd", "k_gelu_bwd"):
    parts.append(src.func("__global__ void %s(" % k)[:2] + (k,))
parts.append(src.region("COL_ROWS .. matmul_dgelu_bwd_bf16", "#define COL_ROWS", "static void matmul_dgelu_bwd_bf16("))

i0, i1, _ = src.func('extern "C" int ops_cuda_init(')
c = src.first(lambda line: "cublasCreate(&g.blas)" in line, "ops_cuda_init's cublasCreate(&g.blas)", i0, i1)
e = src.first(lambda line: "cublasSetWorkspace(g.blas" in line, "ops_cuda_init's cublasSetWorkspace(g.blas", c, i1) + 1

launch = re.compile(r"(\b\w+)<<<(.*?)>>>\(")
src.write(out_path, parts,
          extra=["/* ops_cuda_init's cuBLAS fallback handle setup: lines %d-%d */" % (c + 1, e),
                 "static cublasStatus_t emu_init_blas(void)\n{\n    cublasStatus_t bs;",
                 '#line %d "%s"' % (c + 1, src.path), src.text(c, e), "    return bs;\n}"],
          rewrite=lambda t: launch.sub(lambda m: "EMU_LAUNCH(%s)(%s, " % (m.group(2), m.group(1)), t))
