#!/usr/bin/env python3
"""extract_kernels.py SRC OUT: copy the row, reduction, attention,
embedding and cross-entropy kernels of cuda/ops_cuda.cu (SRC) into OUT,
verbatim, for test_kernels_emu.cpp to run on the host.

Taken: the #defines THREADS..WORKSPACE_BYTES, grid_for, the block reductions
(warp_sum .. block_max), GRID_STRIDE, k_sumsq, COL_ROWS through
k_colsum_fold, the layernorm and rmsnorm kernels, everything from ATT_BR
up to att_dims_ok (tile sizes, att_load, the quad reductions, k_att_fwd,
k_att_bwd_dq, k_att_bwd_dkv), att_nc and att_grid_x, the embedding
kernels and the cross-entropy kernels. Regions are found by their first
lines; a region that is not found stops the build with its name. Host
wrappers are not taken (test_kernels_emu.cpp launches the kernels with
the wrappers' grids). #line directives keep compiler messages pointing at
ops_cuda.cu."""
import sys

from ops_cuda_source import Source, starts

src = Source(sys.argv[1], "extract_kernels.py")
parts = [src.through("defines", "#define THREADS ", "#define WORKSPACE_BYTES"), src.func("static unsigned grid_for("),
         src.region("warp_sum .. block_max", "template <typename T> __device__ T warp_sum(",
                    "__device__ float block_max(")]
s = src.first(starts("#define GRID_STRIDE"), "#define GRID_STRIDE")
parts.append((s, s + 2, "GRID_STRIDE"))
parts.append(src.func("__global__ void k_sumsq("))
parts.append(src.region("COL_ROWS .. k_colsum_fold", "#define COL_ROWS", "__global__ void k_colsum_fold("))
for k in ("k_layernorm_fwd", "k_layernorm_bwd_dx", "k_layernorm_bwd_dw_part",
          "k_rmsnorm_fwd", "k_rmsnorm_bwd_dx", "k_rmsnorm_bwd_dw_part"):
    parts.append(src.func("__global__ void %s(" % k))
s = src.first(starts("#define ATT_BR"), "#define ATT_BR")
parts.append((s, src.first(starts("static int att_dims_ok("), "att_dims_ok", s), "ATT_BR .. k_att_bwd_dkv"))
parts.append(src.func("static int att_nc("))
parts.append(src.func("static unsigned att_grid_x("))
for k in ("k_embedding_fwd", "k_emb_keys", "k_emb_rows", "k_embedding_bwd_wpe",
          "k_xent_max", "k_xent_sumexp", "k_xent_finish"):
    parts.append(src.func("__global__ void %s(" % k))
for k in ("k_att_fwd", "k_att_bwd_dq", "k_att_bwd_dkv"):
    src.first(lambda line: line.strip().startswith(k + "("), k)
src.write(sys.argv[2], parts)
