#!/bin/sh
# Mutation check of test_ring_emu: each mutant below is one of the files of
# the CUDA ring attention ops (cuda/kernels/ring.cuh, cuda/ops_cuda_ring.cuh)
# with one deliberate bug of the kind the emulation test exists to catch (the
# causal test on local instead of global positions, documents ignored, a
# gradient written instead of accumulated, a row without keys not given
# lse = -inf and out = 0, the merge's weights swapped, a pack or unpack
# offset, a key tile left out), built into test_ring_emu in place of the real
# file; the test (with --stop: it ends at the first failing case) must fail on
# each (a non-zero exit; a crash counts). A mutant whose pattern no longer
# matches its file fails this script too, so the list cannot go stale.
#
# Sourced by the generated test/emu/test_ring_mutants (Makefile.am), which
# sets EMU_CXX (the compiler and flags test_ring_emu is built with) and
# EMU_LIBS; needs perl (perl-base, in every Debian).
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
    if ! $EMU_CXX -O0 -iquote "$dir" -o "$dir/test_ring_emu" "$top_srcdir/test/emu/test_ring_emu.cpp" $EMU_LIBS \
        >"$dir/build.log" 2>&1; then
        fail "$1: does not compile: $(head -n 3 "$dir/build.log")"
        return
    fi
    "$dir/test_ring_emu" --stop >"$dir/out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        pass "$1: caught (exit $rc; first: $(grep -m 1 '^FAIL' "$dir/out" || echo "no FAIL line"))"
    else
        fail "$1: test_ring_emu still passes"
    fi
}

k=cuda/kernels/ring.cuh
mutant "causal test on the local key index instead of the global position kpos" $k \
    's/if \(kpos\[m\] <= qp\)/if (m <= qp)/'
mutant "document start ignored (qdoc not read)" $k \
    's/const int qd = qdoc \? qdoc\[\(size_t\)b \* k.Tq \+ t\] : RING_NO_DOC;/const int qd = RING_NO_DOC;/'
mutant "backward: dq written, not accumulated" $k \
    's/dq\[col\] \+= scale \* acc\[c\]\[i\];/dq[col] = scale * acc[c][i];/'
mutant "backward: dk written, not accumulated" $k \
    's/row\[\(size_t\)kh \* HS \+ col\] \+= scale \* dk\[c\]\[i\];/row[(size_t)kh * HS + col] = scale * dk[c][i];/'
mutant "forward: a row without keys given lse = 0 instead of -inf" $k \
    's/l > 0.0f \? m \+ logf\(l\) : -INFINITY;/l > 0.0f ? m + logf(l) : 0.0f;/'
mutant "forward: a row without keys left with out = acc / l (NaN)" $k \
    's/o\[col\] = l > 0.0f \? acc\[c\]\[i\] \* inv : 0.0f;/o[col] = acc[c][i] \/ l;/'
mutant "merge: the partial weight applied to the running output" $k \
    's/o\[e\] = wa \* o\[e\] \+ wp \* po\[e\];/o[e] = wp * o[e] + wa * po[e];/'
mutant "unpack: accumulation ignored" $k \
    's/\*d = accum \? \*d \+ dkv\[i\] : dkv\[i\];/*d = dkv[i];/'
mutant "pack: the k columns taken from the q heads" $k \
    's/kv\[i\] = qkv\[row \* R \+ OC \+ j\];/kv[i] = qkv[row * R + j];/'
mutant "dK/dV: the last partial key tile skipped" cuda/ops_cuda_ring.cuh \
    's/\(k.nk \+ ATT_BC - 1\) \/ ATT_BC/k.nk \/ ATT_BC/'
finish
