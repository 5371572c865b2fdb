#!/bin/sh
# The data-parallel strategies (test_dpsync.c, mpi/dpsync.h) at 1, 2, 3
# and 4 ranks: for ZeRO 0..3, one step of a synthetic stage driven as the
# trainer drives it gives the exact DP average in the optimizer's view,
# pieces that cover every element once, the updated parameters on every
# rank after the gather, whole moments on the host and the global norm.
# A deadlock would hang, so each run is limited to 120 s.
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_dpsync"
for np in 1 2 3 4; do
    timeout 120 "$MPIEXEC" --oversubscribe -np "$np" "$PROG" >"$TMP/np$np.out" 2>"$TMP/np$np.err"
    rc=$?
    summary=$(tail -n 1 "$TMP/np$np.out")
    if [ "$rc" -eq 0 ] && ! grep -q '^FAIL' "$TMP/np$np.out" && echo "$summary" | grep -q ' 0 failure(s)$'; then
        pass "np $np: $summary"
    else
        grep '^FAIL' "$TMP/np$np.out"
        fail "np $np: exit $rc: $summary"
        head -c 2000 "$TMP/np$np.err"
    fi
done
finish
