#!/bin/sh
# Pipeline schedules and executor (test_pipeline.c) at 1, 2, 3 and 4
# stages: schedule properties for P 1..8 x M 1..16, exact gradients of a
# synthetic elementwise model through the executor for both schedules and
# several microbatch counts, and every kind's bubble through the executor
# in virtual time equal to its formula (the wall-clock measurement is
# bench/pp_bubble.sh). Each run prints one line per check and exits 1
# on every rank if any check failed anywhere. A deadlock would hang, so
# each run is limited to 300 s (about 3 s each on 2 cores).
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_pipeline"
for np in 1 2 3 4; do
    timeout 300 "$MPIEXEC" --oversubscribe -np "$np" "$PROG" >"$TMP/np$np.out" 2>"$TMP/np$np.err"
    rc=$?
    cat "$TMP/np$np.out"
    summary=$(tail -n 1 "$TMP/np$np.out")
    if [ "$rc" -eq 0 ] && ! grep -q '^FAIL' "$TMP/np$np.out" && echo "$summary" | grep -q ' 0 failure(s)$'; then
        pass "np $np: $summary"
    else
        fail "np $np: exit $rc: $summary"
        head -c 2000 "$TMP/np$np.err"
    fi
done
finish
