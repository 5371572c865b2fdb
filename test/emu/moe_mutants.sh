#!/bin/sh
# Mutation check of test_moe_emu: each mutant below is cuda/kernels/moe.cuh
# with one deliberate bug of the kind the emulation test exists to catch
# (an order of summation, an off-by-one, a tie broken the other way, a
# product fused into an FMA), built into test_moe_emu in place of the real
# header, and the test's comparisons (--cases: without its own barrier
# mutations, which do not depend on the mutant) must fail on each (a
# non-zero exit; a crash counts).
# A mutant whose pattern no longer matches the header fails this script
# too, so the list cannot silently go stale.
#
# Sourced by the generated test/emu/test_moe_mutants (Makefile.am), which
# sets EMU_CXX (the compiler and flags test_moe_emu is built with) and
# EMU_LIBS; needs perl (perl-base, in every Debian).
. "$top_srcdir/test/common.sh"

src="$top_srcdir/cuda/kernels/moe.cuh"
n=0
# mutant NAME PERL-SUBSTITUTION (applied to the whole header, -0: one string)
mutant() {
    n=$((n + 1))
    dir="$TMP/m$n"
    mkdir -p "$dir/cuda/kernels"
    perl -0pe "$2" "$src" >"$dir/cuda/kernels/moe.cuh" || { fail "$1: perl failed"; return; }
    if cmp -s "$src" "$dir/cuda/kernels/moe.cuh"; then
        fail "$1: the substitution no longer matches cuda/kernels/moe.cuh"
        return
    fi
    # -iquote: the mutant's header before the source tree's (its own
    # includes, common.cuh, still resolve to the source tree's)
    if ! $EMU_CXX -iquote "$dir" -o "$dir/test_moe_emu" "$top_srcdir/test/emu/test_moe_emu.cpp" $EMU_LIBS \
        >"$dir/build.log" 2>&1; then
        fail "$1: does not compile: $(head -n 3 "$dir/build.log")"
        return
    fi
    "$dir/test_moe_emu" --cases >"$dir/out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        pass "$1: caught (exit $rc; first: $(grep -m 1 '^FAIL' "$dir/out" || echo "no FAIL line"))"
    else
        fail "$1: test_moe_emu still passes"
    fi
}

mutant "combine: the K contributions summed in reverse order of j" \
    's/(void k_moe_combine_fwd\(.*?)where\[n \* K \+ j\](.*?)gate\[n \* K \+ j\]/$1where[n * K + K - 1 - j]$2gate[n * K + K - 1 - j]/s'
mutant "combine: gate x ye fused into one FMA (what moe_mul/moe_add prevent under nvcc)" \
    's/o = moe_add\(o, moe_mul\(gate\[n \* K \+ j\], ye\[\(size_t\)w \* C \+ c\]\)\);/o = fmaf(gate[n * K + j], ye[(size_t)w * C + c], o);/'
mutant "scatter backward: the K contributions summed in reverse order of j" \
    's/(void k_moe_scatter_bwd\(.*?)where\[n \* K \+ j\]/$1where[n * K + K - 1 - j]/s'
mutant "combine backward: dgate's dot product over C in reverse" \
    's/for \(int c = 0; c < C; c\+\+\)\n(\s*)dot = moe_add/for (int c = C - 1; c >= 0; c--)\n$1dot = moe_add/'
mutant "plan: every place one too far (off-by-one offset)" \
    's/int p = cnt\[\(size_t\)blockIdx\.x \* \(E \+ 1\) \+ e\];/int p = cnt[(size_t)blockIdx.x * (E + 1) + e] + 1;/'
mutant "plan: dropped assignments counted as kept" \
    's/c \+= sh\[i\] == e;/c += moe_expert_of(sh[i]) == e;/'
mutant "route: top-k ties broken toward the higher expert" \
    's/v > best_v/v >= best_v/'
mutant "capacity: ties broken toward the later token" \
    's/t0 \+ \(size_t\)i < a/t0 + (size_t)i > a/'
mutant "capacity: one assignment too many kept per expert" \
    's/rank >= cap/rank > cap/'
mutant "stats: the probability sums in float instead of double" \
    's/(void k_moe_psum\(.*?)double p = 0\.0;/$1float p = 0.0f;/s'
mutant "router backward: the z-loss product associated differently" \
    's/moe_mul\(moe_mul\(moe_mul\(zw, 2\.0f\), ls\), expf\(l\[e\] - ls\)\)/moe_mul(zw, moe_mul(2.0f, moe_mul(ls, expf(l[e] - ls))))/'
finish
