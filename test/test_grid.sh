#!/bin/sh
# The process grid at several layouts: test/test_grid checks every rank's
# coordinates, group sizes and ranks, and group membership by exact sums
# (see test_grid.c), and where dp is even the --ep 2 groups (EP and
# expert-DP) the same way. Layouts that do not fit the world size must exit 2 on
# every rank with exactly one stderr line (rank 0's) naming the problem.
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_grid"

# good N T P: mpiexec -np N test_grid T P passes.
good() {
    "$MPIEXEC" --oversubscribe -np "$1" "$PROG" "$2" "$3" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^test_grid: ok: $1 ranks, tp $2 x " "$TMP/out"; then
        pass "np $1 tp $2 pp $3: $(tail -n 1 "$TMP/out")"
    else
        fail "np $1 tp $2 pp $3 -> exit $rc: $(head -c 1500 "$TMP/err") $(tail -n 3 "$TMP/out")"
    fi
}

# bad N T P WANT: exit 2, one stderr line containing WANT. --quiet keeps
# mpiexec's own "non-zero exit code" banner off stderr.
bad() {
    expect_exit2 "$4" "$MPIEXEC" --quiet --oversubscribe -np "$1" "$PROG" "$2" "$3"
}

good 1 1 1
good 2 2 1
good 2 1 2
good 4 2 2
good 8 2 2
good 8 2 1
good 8 1 4
good 6 3 1

bad 3 2 1 "world size 3 is not divisible by --tp 2 x --pp 1 = 2: launch a multiple of 2 ranks"
bad 4 3 1 "world size 4 is not divisible by --tp 3 x --pp 1 = 3: launch a multiple of 3 ranks"

finish
