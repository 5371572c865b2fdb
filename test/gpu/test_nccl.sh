#!/bin/sh
# The NCCL communicators (CUDA builds only): test/gpu/test_nccl_comm on one
# rank, and on two when two GPUs are visible (see test_nccl_comm.c).
# SKIP (77) with the CUDA error string when no GPU is visible.
. "$top_srcdir/test/common.sh"

if ! "$top_builddir/test/gpu/test_ops_cuda" --probe >"$TMP/probe" 2>&1; then
    cat "$TMP/probe"
    exit 77
fi
ngpu=$(sed -n 's/^test_ops_cuda: \([0-9]*\) GPU.*/\1/p' "$TMP/probe")
for np in 1 2; do
    [ "$np" -gt "${ngpu:-1}" ] && break
    "$MPIEXEC" --quiet -np "$np" "$top_builddir/test/gpu/test_nccl_comm" >"$TMP/out" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^test_nccl_comm: ok: $np rank" "$TMP/out"; then
        pass "np $np: $(tail -n 1 "$TMP/out")"
    else
        fail "np $np -> exit $rc: $(tail -n 8 "$TMP/out")"
    fi
done
finish
