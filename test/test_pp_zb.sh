#!/bin/sh
# The zero-bubble schedule ZB-H1 (--pp-schedule zb-h1: each backward split
# into B, the activation gradients sent upstream at once, and W, the
# matmuls' weight gradients from the output gradients B kept, run in the
# bubbles) trains the same model as one process: 20 steps of tiny (GPT-2,
# the tied embedding summed over the first and last stage) and tiny-llama
# at pp2, tiny at pp4, tiny-llama tp2 x pp2 x dp2 with sequence
# parallelism (the bucketed all-reduce started by the last W), pp2 x dp2
# with ZeRO-1: every step's loss and the final validation loss within 1e-5
# relative of the 1-rank run, gradient norms and final parameters within
# 1e-4; the same layout twice is bit-identical; bf16 equals 1f1b on the
# same stages; a 1f1b checkpoint resumes
# under zb-h1; what it cannot run with exits 2 with one line.
. "$top_srcdir/test/common.sh"

ZB="--pp-schedule zb-h1"
for model in tiny tiny-llama; do
    ref="$TMP/$model.1.json"
    layout_run "$ref" 1 --model $model || continue
    layout_run "$TMP/$model.zb.json" 2 --model $model --pp 2 $ZB &&
        layout_compare "$ref" "$TMP/$model.zb.json" "$model pp2 zb-h1"
done
layout_run "$TMP/tiny.zb.again.json" 2 --model tiny --pp 2 $ZB &&
    layout_twice "$TMP/tiny.zb.json" "$TMP/tiny.zb.again.json" "tiny pp2 zb-h1"
layout_run "$TMP/tiny.zb4.json" 4 --model tiny --pp 4 $ZB &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.zb4.json" "tiny pp4 zb-h1"
layout_run "$TMP/tiny-llama.tp2zbdp2.json" 8 --model tiny-llama --tp 2 --pp 2 $ZB --sequence-parallel \
    --bucket-mb 0.05 &&
    layout_compare "$TMP/tiny-llama.1.json" "$TMP/tiny-llama.tp2zbdp2.json" \
        "tiny-llama tp2 x pp2 zb-h1 x dp2 sequence-parallel (8 ranks)"
layout_run "$TMP/tiny.zbz1.json" 4 --model tiny --pp 2 $ZB --zero 1 &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.zbz1.json" "tiny pp2 zb-h1 x dp2 ZeRO-1"

# bf16 against 1f1b on the same stages: W runs the matmuls B would have,
# in the same order per microbatch, so the steps are the same (measured:
# bit-identical; held to fp32's tolerances, not bf16's looser layout ones)
X="--dtype bf16"
layout_run "$TMP/x.1f1b.json" 2 --model tiny-llama --pp 2 $X &&
    layout_run "$TMP/x.zb.json" 2 --model tiny-llama --pp 2 $ZB $X &&
    layout_compare "$TMP/x.1f1b.json" "$TMP/x.zb.json" "tiny-llama pp2 zb-h1 vs 1f1b, $X"

# a 1f1b checkpoint resumed under zb-h1 continues the uninterrupted run
layout_run "$TMP/ck.full.json" 2 --model tiny --pp 2 &&
    layout_run "$TMP/ck.a.json" 2 --model tiny --pp 2 --ckpt-dir "$TMP/ck" --stop-at-step 10 &&
    layout_run "$TMP/ck.b.json" 2 --model tiny --pp 2 $ZB --resume "$TMP/ck/step_00000010.h5" && {
    a=$(json_field "$TMP/ck.full.json" 20 val_loss)
    b=$(json_field "$TMP/ck.b.json" 20 val_loss)
    expect_close "a 1f1b checkpoint resumed under zb-h1: final val loss" "$a" "$b" 1e-5
}

B="--micro-batch 2 --global-batch 8 --seq-len 32"
expect_exit2 "--pp-schedule zb-h1 needs --pp 2 or more, --recompute none and --zero 0 or 1 (got --pp 2 --recompute none --zero 2)" \
    "$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) $B --pp 2 $ZB --zero 2
expect_exit2 "--pp-schedule zb-h1 needs --pp 2 or more, --recompute none and --zero 0 or 1 (got --pp 2 --recompute selective --zero 0)" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) $B --pp 2 $ZB --recompute selective
expect_exit2 "--pp-schedule zb-h1 needs --pp 2 or more" "$DTRAIN" $(tiny_args) $B $ZB
finish
