#!/bin/sh
# Mutation check of test_att_path_emu: each mutant below is one of the
# files of the CUDA attention dispatch (cuda/ops_cuda_attention.cuh, or the
# pack kernels in cuda/kernels/) with one deliberate bug of the kind the
# emulation test exists to catch (a wrong q/k/v offset or extent in the
# pack, a kernel for another head size, a rounding that is not the CPU's, an
# inconsistent D, a grid over the wrong heads, a bf16 output left out or
# truncated), built into test_att_path_emu
# in place of the real file; the test (with --stop: it ends at the first
# failing case) must fail on each (a non-zero exit; a crash counts).
# A mutant whose pattern no longer matches its file fails this script too,
# so the list cannot silently go stale.
#
# Sourced by the generated test/emu/test_att_path_mutants (Makefile.am),
# which sets EMU_CXX (the compiler and flags test_att_path_emu is built
# with) and EMU_LIBS; needs perl (perl-base, in every Debian).
. "$top_srcdir/test/common.sh"

n=0
# mutant NAME FILE PERL-SUBSTITUTION (FILE relative to the source tree;
# applied to the whole file, -0: one string)
mutant() {
    n=$((n + 1))
    dir="$TMP/m$n"
    mkdir -p "$dir/$(dirname "$2")"
    perl -0pe "$3" "$top_srcdir/$2" >"$dir/$2" || { fail "$1: perl failed"; return; }
    if cmp -s "$top_srcdir/$2" "$dir/$2"; then
        fail "$1: the substitution no longer matches $2"
        return
    fi
    # -iquote: the mutant before the source tree's copy (the other files
    # still resolve to the source tree's); -O0: a quarter of -O2's compile
    # time, and each mutant fails within the first case
    if ! $EMU_CXX -O0 -iquote "$dir" -o "$dir/test_att_path_emu" "$top_srcdir/test/emu/test_att_path_emu.cpp" $EMU_LIBS \
        >"$dir/build.log" 2>&1; then
        fail "$1: does not compile: $(head -n 3 "$dir/build.log")"
        return
    fi
    "$dir/test_att_path_emu" --stop >"$dir/out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        pass "$1: caught (exit $rc; first: $(grep -m 1 '^FAIL' "$dir/out" || echo "no FAIL line"))"
    else
        fail "$1: test_att_path_emu still passes"
    fi
}

d=cuda/ops_cuda_attention.cuh
mutant "pack: the v heads left out (rows of NH + NKV heads)" $d \
    's/const size_t n = \(size_t\)B \* T \* \(NH \+ 2 \* NKV\) \* HS;/const size_t n = (size_t)B * T * (NH + NKV) * HS;/'
mutant "backward: the D pass's bf16 qkv with adjacent elements swapped" cuda/kernels/attention_mma_bwd.cuh \
    's/x16\[e\] = dt_f32_to_bf16\(x\[e\]\);/x16[e] = dt_f32_to_bf16(x[e ^ 1]);/'
mutant "backward: the D pass over B T (NH + NKV) rows, the last tokens left out" cuda/kernels/attention_mma_bwd.cuh \
    's/rows = \(size_t\)B \* T \* H;/rows = (size_t)B * T * (H - (size_t)NKV);/'
mutant "forward: head size 64 given the kernel for 128" $d \
    's/CU_LAUNCH\(k_att_fwd_mma<64>/CU_LAUNCH(k_att_fwd_mma<128>/'
mutant "backward: dQ gridded over the KV heads" $d \
    's/(CU_LAUNCH\(k_att_bwd_dq_mma<HS>, dim3\(att_mma_tiles\(T\), \(unsigned\))NH/$1NKV/'
mutant "pack: bf16 by truncation, not round to nearest even" cuda/kernels/attention_mma_common.cuh \
    's/qkv16\[i\] = dt_f32_to_bf16\(qkv\[i\]\);/{ uint32_t u; memcpy(&u, &qkv[i], 4); qkv16[i] = (uint16_t)(u >> 16); }/'
mutant "backward: D from the fp32 dout, dP from the bf16 one" cuda/kernels/attention_mma_bwd.cuh \
    's/acc \+= dt_bf16_to_f32\(gb\) \* o\[e\];/acc += g[e] * o[e];/'
# the bf16 outputs (base/ops.h): truncated, not rounded; a kernel's write
# left out; the v columns' bf16 from dK's values
mutant "bf16 outputs: truncation, not round to nearest even" cuda/kernels/store16.cuh \
    's/\(dst16\)\[i\] = dt_f32_to_bf16\(v\);/(dst16)[i] = (uint16_t)(dt_f32_bits(v) >> 16);/'
mutant "forward (tensor cores): out16 not written" cuda/kernels/attention_mma.cuh \
    's/DT_STORE16\(out16, at \+ 8 \* dt \+ 2 \* t4 \+ e, v\);//'
mutant "forward (fp32): out16 not written" cuda/kernels/attention.cuh \
    's/DT_STORE16\(out16, at \+ col, v\);//'
mutant "backward (tensor cores): dV's bf16 from dK's value" cuda/kernels/attention_mma_bwd.cuh \
    's/DT_STORE16\(dqkv16, vr \+ c, vv\);/DT_STORE16(dqkv16, vr + c, vk);/'
mutant "backward (fp32): dQ's bf16 not written" cuda/kernels/attention.cuh \
    's/DT_STORE16\(dqkv16, at \+ col, v\);//'
finish
