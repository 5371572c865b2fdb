#!/bin/sh
# The MPI communicator and data-parallel gradient averaging (test_comm.c)
# at 1, 2, 3 and 4 ranks: exact collective results, chunked large counts,
# sub-communicators, and DDP buckets in every mode; the bf16 all-reduce and
# reduce-scatter (exact on small integers, within gamma(p-1) sum |x_i| on
# random values, bit-identical on every rank) and DDP with bf16 reductions.
# Each run prints one line per check and exits 1 on every rank if any check
# failed anywhere.
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_comm"
for np in 1 2 3 4; do
    "$MPIEXEC" --oversubscribe -np "$np" "$PROG" >"$TMP/np$np.out" 2>"$TMP/np$np.err"
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
