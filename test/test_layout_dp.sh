#!/bin/sh
# Data parallelism trains the same model as one process: tiny and
# tiny-llama, 20 steps at one global batch of 8 sequences, on 1 rank
# (4 microbatches), dp2 (2 microbatches) in each --ddp-mode, and dp4
# (1 microbatch). The loss and gradient norm at every step and the final
# validation loss are within 1e-5 relative of the 1-rank run; the same layout twice is
# bit-identical (also with --comm mpi, auto's choice on the CPU); replicas
# are checked identical every 5 steps.
. "$top_srcdir/test/common.sh"

run() { layout_run "$@"; }
compare() { layout_compare "$@"; }

for model in tiny tiny-llama; do
    run "$TMP/$model.1.json" 1 --model $model || continue
    for mode in naive flat bucketed; do
        run "$TMP/$model.dp2.$mode.json" 2 --model $model --ddp-mode $mode --bucket-mb 0.05 &&
            compare "$TMP/$model.1.json" "$TMP/$model.dp2.$mode.json" "$model dp2 $mode"
    done
    run "$TMP/$model.dp4.json" 4 --model $model --bucket-mb 0.05 &&
        compare "$TMP/$model.1.json" "$TMP/$model.dp4.json" "$model dp4 bucketed"
    run "$TMP/$model.dp2.again.json" 2 --model $model --ddp-mode bucketed --bucket-mb 0.05 &&
        layout_twice "$TMP/$model.dp2.bucketed.json" "$TMP/$model.dp2.again.json" "$model dp2 bucketed"
done

# --comm mpi is what auto picks on the CPU: the same run, bit for bit, and
# the banner names the library
run "$TMP/tiny.dp2.mpi.json" 2 --model tiny --ddp-mode bucketed --bucket-mb 0.05 --comm mpi &&
    layout_twice "$TMP/tiny.dp2.bucketed.json" "$TMP/tiny.dp2.mpi.json" "tiny dp2 --comm mpi vs auto"
for f in "$TMP/tiny.dp2.bucketed.json" "$TMP/tiny.dp2.mpi.json"; do
    grep -q "^communication: mpi (every group)$" "$f.log" && pass "banner: communication: mpi ($(basename "$f"))" ||
        fail "banner of $(basename "$f"): $(grep "^communication" "$f.log")"
done

# layout errors: one line, exit 2 on every rank
expect_exit2 "multiple of --micro-batch 2 x dp 2" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --micro-batch 2 --global-batch 6
expect_exit2 "world size is 3" "$MPIEXEC" --quiet -np 3 "$DTRAIN" $(tiny_args) --dp 2

finish
