# Shared by the shell tests. The harness exports DTRAIN, DTRAIN_PREPARE,
# MPIEXEC, top_srcdir, top_builddir and the OpenMPI settings for running as
# root and oversubscribed.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
: "${DTRAIN:=$top_builddir/src/dtrain}"
: "${MPIEXEC:=mpiexec}"
export OMPI_MCA_mpi_yield_when_idle=1
DATA_TRAIN="$top_builddir/data/gutenberg_train_*.bin"
DATA_VAL="$top_builddir/data/gutenberg_val_*.bin"

# A scratch directory under the build tree, removed on exit.
TMP=$(mktemp -d "$top_builddir/test/tmp.XXXXXX") || exit 99
trap 'rm -rf "$TMP"' EXIT

fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
finish() { echo "$fails failure(s)"; [ "$fails" -eq 0 ]; exit $?; }

# Small, fast runs: the tiny model with the bundled corpus.
tiny_args() {
    echo --model tiny --data "$DATA_TRAIN" --val-data "$DATA_VAL" --peak-gflops 100 --threads 2
}

# json_field FILE STEP KEY: the value of KEY in the JSON line of STEP.
json_field() {
    sed -n "s/^{\"step\": $2,.*\"$3\": \([^,}]*\).*/\1/p" "$1"
}

# expect_close LABEL A B TOL: pass when |A - B| / |A| < TOL.
expect_close() {
    if awk -v a="$2" -v b="$3" -v t="$4" 'BEGIN { d = a - b; if (d < 0) d = -d; if (a < 0) a = -a; exit !(a > 0 && d / a < t) }'; then
        pass "$1: $2 vs $3 (rel < $4)"
    else
        fail "$1: $2 vs $3 (rel >= $4)"
    fi
}

# expect_exit2 WANT CMD ARGS...: CMD exits with status 2 and prints exactly
# one line on stderr, containing WANT (the bad-input contract).
expect_exit2() {
    want=$1
    shift
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$want" "$TMP/err"; then
        pass "exit 2: $(cat "$TMP/err")"
    else
        fail "$* -> exit $rc, $lines stderr line(s), wanted '$want': $(head -c 600 "$TMP/err")"
    fi
}
