#!/bin/sh
# Ring attention over MPI (mpi/cp_ring.c, test_cp_ring.c) at cp 2 and 4:
# every rank's out, lse and dqkv rows against attention_fwd/attention_bwd
# over the whole sequence (GQA, HS 16/32, documents crossing chunks and
# ranks), bit-identical reruns, the deferred ops table's bits, the ring's
# byte count, refused shapes. Then a frozen rank: its neighbour's wait on
# the ring must end the job under the watchdog (--comm-timeout) with one
# line naming group cp. A deadlock would hang, so each run is limited.
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_cp_ring"
for np in 2 4; do
    timeout 300 "$MPIEXEC" --oversubscribe -np "$np" "$PROG" >"$TMP/np$np.out" 2>"$TMP/np$np.err"
    rc=$?
    cat "$TMP/np$np.out"
    summary=$(tail -n 1 "$TMP/np$np.out")
    if [ "$rc" -eq 0 ] && ! grep -q '^FAIL' "$TMP/np$np.out" && echo "$summary" | grep -q ' 0 failure(s)$'; then
        pass "cp $np: $summary"
    else
        fail "cp $np: exit $rc: $summary"
        head -c 2000 "$TMP/np$np.err"
    fi
done

# Rank 1 stops itself (SIGSTOP) before the ring; rank 0 blocks in a wait on
# it. The job must end within the timeout plus the watchdog's period and
# MPI_Abort's teardown, non-zero, with exactly one line.
t0=$(date +%s)
CP_FREEZE_PID="$TMP/frozen.pid" timeout 60 "$MPIEXEC" --quiet --oversubscribe -np 2 -x CP_FREEZE_PID \
    "$PROG" --freeze 1 --timeout 2 >"$TMP/freeze.log" 2>&1
rc=$?
took=$(($(date +%s) - t0))
# never leave the stopped process behind
[ -s "$TMP/frozen.pid" ] && kill -KILL "$(cat "$TMP/frozen.pid")" 2>/dev/null
line=$(grep -E "^dtrain: rank 0 \(cp ring test\): i(send|recv) on group cp \(2 ranks, .*peer cp rank 1 = rank 1 on $(hostname)\) has not finished after [0-9]+ s \(--comm-timeout 2\): a peer rank is stuck or dead; aborting the job$" "$TMP/freeze.log")
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ -n "$line" ] && [ "$(grep -c 'has not finished' "$TMP/freeze.log")" -eq 1 ]; then
    pass "frozen rank 1: ended in $took s with status $rc, one line: $line"
else
    fail "frozen rank 1: status $rc after $took s, not one watchdog line on group cp: $(tail -n 5 "$TMP/freeze.log")"
fi
finish
