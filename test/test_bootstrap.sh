#!/bin/sh
# The NCCL id-broadcast bootstrap logic without a GPU: test/test_bootstrap
# runs mpi/bootstrap.c (the code cuda/nccl_comm.c calls with
# ncclGetUniqueId) with a fake id maker over every group of several grids
# and checks every member got its group's id (see test_bootstrap.c). Then
# an id maker failing on one rank: the members of the groups it leads get
# its message, the others succeed, nobody hangs.
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_bootstrap"

# run WANT_FAILED N T P [FAIL_RANK]
run() {
    want=$1
    shift
    "$MPIEXEC" --oversubscribe -np "$1" "$PROG" "$2" "$3" ${4:-} >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^test_bootstrap: ok: $1 ranks, .* $want rank(s) saw the injected failure" "$TMP/out"; then
        pass "np $1 tp $2 pp $3${4:+ failing rank $4}: $(tail -n 1 "$TMP/out")"
    else
        fail "np $1 tp $2 pp $3${4:+ failing rank $4} -> exit $rc: $(head -c 1500 "$TMP/err") $(tail -n 3 "$TMP/out")"
    fi
}

run 0 1 1 1
run 0 2 2 1
run 0 2 1 2
run 0 4 2 2
run 0 8 2 2
run 0 6 3 1
run 0 8 1 4
# failures: rank 0 leads every world/tp/dp/pp group it is in, so every rank
# (the world group) sees it; rank 2 of np 4 tp 2 pp 1 leads the tp group
# {2,3} and its own one-rank pp and embed groups (dp groups are {0,2},
# {1,3}); rank 4 of np 8 tp 2 pp 2 (tp 0, dp 0, pp 1) leads tp {4,5} and
# dp {4,6} (pp and embed groups are led by stage 0)
run 4 4 2 1 0
run 2 4 2 1 2
run 3 8 2 2 4

finish
