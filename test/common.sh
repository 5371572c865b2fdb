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
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT

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

# ---- layout equivalence (test_layout_*.sh) ----
# tiny / tiny-llama, 20 steps at one global batch of 8 sequences of 64
# tokens, validated at the end, replicas checked every 5 steps.
strip_timing() { sed 's/, "ms": .*//' "$1"; }

# layout_run OUT NP ARGS...: the run's metrics in OUT, its output in OUT.log
layout_run() {
    out=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 \
        --global-batch 8 --seq-len 64 --val-every 20 --val-batches 4 --sample-tokens 0 --check-replicas 5 \
        --metrics "$out" --save-params "$out.h5" "$@" >"$out.log" 2>&1 ||
        { fail "np $np $*: exit status $? $(tail -n 3 "$out.log")"; return 1; }
}

# layout_compare REF OUT LABEL [LOSS NORM PARAMS]: every step's loss and
# the final validation loss within LOSS (default 1e-5) relative, the
# gradient norm within NORM (1e-4: a loss spike amplifies fp32
# reduction-order noise in the norm about 100-fold), and the final
# parameters (--save-params) within PARAMS (1e-4) relative, worst tensor
# (||a-b|| / ||a||; a max-element measure would be ruled by the few weights
# whose gradient is near zero, where AdamW's update direction is noise)
layout_compare() {
    ref=$1
    out=$2
    lc_loss=${4:-1e-5}
    lc_norm=${5:-1e-4}
    lc_params=${6:-1e-4}
    worst=$(awk -v ref="$1" -v out="$2" '
        function val(line, key,   m) { if (match(line, "\"" key "\": [-0-9.e+]+")) return substr(line, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0; return "" }
        BEGIN { nk = split("loss val_loss grad_norm", keys, " ")
                while ((getline l < ref) > 0) { match(l, /"step": [0-9]+/); s = substr(l, RSTART + 8, RLENGTH - 8)
                    for (k = 1; k <= nk; k++) r[s, k] = val(l, keys[k]) }
                n = 0; wl = 0; wn = 0
                while ((getline l < out) > 0) { match(l, /"step": [0-9]+/); s = substr(l, RSTART + 8, RLENGTH - 8)
                    for (k = 1; k <= nk; k++) { x = val(l, keys[k]); y = r[s, k]
                        if (x == "" && y == "") continue
                        if (x == "" || y == "") { print "missing"; exit }
                        d = x - y; if (d < 0) d = -d; d /= (y < 0 ? -y : y); n++
                        if (k == 3) { if (d > wn) wn = d } else if (d > wl) wl = d } }
                printf "%.2e %.2e %d\n", wl, wn, n }')
    set -- "$3" $worst
    if [ "$2" != "missing" ] && [ "${4:-0}" -ge 41 ] &&
        awk -v l="$2" -v n="$3" -v tl="$lc_loss" -v tn="$lc_norm" 'BEGIN { exit !(l + 0 < tl + 0 && n + 0 < tn + 0) }'; then
        pass "$1: $4 values, worst relative difference: losses $2 (< $lc_loss), norms $3 (< $lc_norm)"
    else
        fail "$1: worst relative difference: losses $2, norms ${3:-}, over ${4:-0} values (limits $lc_loss, $lc_norm)"
    fi
    label=$1
    if params=$(/usr/bin/python3 "$top_srcdir/test/compare_params.py" "$ref.h5" "$out.h5" "$lc_params" 2>&1); then
        pass "$label: final parameters: $params (< $lc_params)"
    else
        fail "$label: final parameters: $params"
    fi
}

# layout_twice FIRST SECOND LABEL: two runs of one layout, bit-identical
# losses and parameters
layout_twice() {
    strip_timing "$1" >"$TMP/twice.a" && strip_timing "$2" >"$TMP/twice.b" || { fail "$3: no metrics"; return; }
    if ! cmp -s "$TMP/twice.a" "$TMP/twice.b"; then
        fail "$3 twice: the losses differ: $(diff "$TMP/twice.a" "$TMP/twice.b" | sed -n 2p | cut -c1-160)"
    elif ! out=$(/usr/bin/python3 "$top_srcdir/test/compare_params.py" "$1.h5" "$2.h5" 0 2>&1); then
        fail "$3 twice: the parameters differ: $(echo "$out" | tail -n 1 | cut -c1-160)"
    else
        pass "$3 twice: bit-identical losses and parameters"
    fi
}

# ---- --init-from (test_init_from.sh, test_hf_models.sh) ----
# init_val0 SOURCE TOKENS NP ARGS...: dtrain's validation loss at step 0
# after --init-from SOURCE (the 4 microbatches of 2 x 16 tokens that
# test/ref/hf_ref.py's reference computes), with --save-params of the
# unchanged weights (lr 0) in $TMP/last.h5
init_val0() {
    src=$1
    tok=$2
    np=$3
    shift 3
    rm -f "$TMP/last.json"
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" --init-from "$src" --data "$tok" --val-data "$tok" --steps 1 --lr 0 \
        --min-lr 0 --warmup 0 --micro-batch 2 --seq-len 16 --val-every 1 --val-batches 4 --sample-tokens 0 \
        --peak-gflops 100 --threads 1 --metrics "$TMP/last.json" --save-params "$TMP/last.h5" "$@" \
        >"$TMP/last.log" 2>&1 || { echo "dtrain failed: $(tail -n 2 "$TMP/last.log")" >&2; return 1; }
    json_field "$TMP/last.json" 0 val_loss
}
