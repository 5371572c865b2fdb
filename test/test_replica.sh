#!/bin/sh
# Replica consistency check at 1, 2 and 3 ranks (see test_replica.c).
. "$top_srcdir/test/common.sh"
for np in 1 2 3; do
    if "$MPIEXEC" --quiet -np $np "$top_builddir/test/test_replica" >"$TMP/out" 2>&1; then
        pass "np $np: $(tail -n 1 "$TMP/out")"
    else
        fail "np $np: $(cat "$TMP/out")"
    fi
done
finish
