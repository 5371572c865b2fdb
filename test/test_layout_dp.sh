#!/bin/sh
# Data parallelism trains the same model as one process: tiny and
# tiny-llama, 20 steps at one global batch of 8 sequences, on 1 rank
# (4 microbatches), dp2 (2 microbatches) in each --ddp-mode, and dp4
# (1 microbatch). The loss at every step and the final validation loss are
# within 1e-5 relative of the 1-rank run; the same layout twice is
# bit-identical; replicas are checked identical every 5 steps.
. "$top_srcdir/test/common.sh"

strip_timing() { sed 's/, "ms": .*//' "$1"; }

run() { # out np args...
    out=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 \
        --global-batch 8 --seq-len 64 --val-every 20 --val-batches 4 --sample-tokens 0 --check-replicas 5 \
        --metrics "$out" "$@" >"$out.log" 2>&1 || { fail "np $np $*: exit status $? $(tail -n 3 "$out.log")"; return 1; }
}

# compare REF OUT LABEL: every step's loss and the final val loss within 1e-5
compare() {
    worst=$(awk -v ref="$1" -v out="$2" '
        function val(line, key,   m) { if (match(line, "\"" key "\": [-0-9.e+]+")) return substr(line, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0; return "" }
        BEGIN { while ((getline l < ref) > 0) { match(l, /"step": [0-9]+/); s = substr(l, RSTART + 8, RLENGTH - 8); a[s] = val(l, "loss"); v[s] = val(l, "val_loss") }
                n = 0; w = 0
                while ((getline l < out) > 0) { match(l, /"step": [0-9]+/); s = substr(l, RSTART + 8, RLENGTH - 8)
                    for (k = 0; k < 2; k++) { x = k ? val(l, "val_loss") : val(l, "loss"); y = k ? v[s] : a[s]
                        if (x == "" && y == "") continue
                        if (x == "" || y == "") { print "missing"; exit }
                        d = x - y; if (d < 0) d = -d; d /= (y < 0 ? -y : y); if (d > w) w = d; n++ } }
                printf "%.2e %d\n", w, n }')
    set -- "$3" $worst
    if [ "$2" != "missing" ] && [ "${3:-0}" -ge 21 ] && awk -v w="$2" 'BEGIN { exit !(w < 1e-5) }'; then
        pass "$1: $3 losses, worst relative difference $2 (< 1e-5)"
    else
        fail "$1: worst relative difference $2 over ${3:-0} losses"
    fi
}

for model in tiny tiny-llama; do
    run "$TMP/$model.1.json" 1 --model $model || continue
    for mode in naive flat bucketed; do
        run "$TMP/$model.dp2.$mode.json" 2 --model $model --ddp-mode $mode --bucket-mb 0.05 &&
            compare "$TMP/$model.1.json" "$TMP/$model.dp2.$mode.json" "$model dp2 $mode"
    done
    run "$TMP/$model.dp4.json" 4 --model $model --bucket-mb 0.05 &&
        compare "$TMP/$model.1.json" "$TMP/$model.dp4.json" "$model dp4 bucketed"
    run "$TMP/$model.dp2.again.json" 2 --model $model --ddp-mode bucketed --bucket-mb 0.05 &&
        strip_timing "$TMP/$model.dp2.bucketed.json" >"$TMP/a" && strip_timing "$TMP/$model.dp2.again.json" >"$TMP/b" &&
        if cmp -s "$TMP/a" "$TMP/b"; then pass "$model dp2 bucketed twice: bit-identical"; else fail "$model dp2 bucketed twice differ"; fi
done

# layout errors: one line, exit 2 on every rank
expect_exit2 "multiple of --micro-batch 2 x dp 2" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --micro-batch 2 --global-batch 6
expect_exit2 "world size is 3" "$MPIEXEC" --quiet -np 3 "$DTRAIN" $(tiny_args) --dp 2
expect_exit2 "not implemented" "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --tp 2
finish
