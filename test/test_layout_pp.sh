#!/bin/sh
# Pipeline parallelism trains the same model as one process: tiny (GPT-2,
# whose tied embedding lives on the first and the last stage and is summed
# over the embedding group) and tiny-llama, 20 steps at one global batch of
# 8 sequences, at pp2 (1F1B and GPipe), pp2 with uneven --pp-layers 1,3,
# tp2 pp2 (with and without sequence parallelism), pp2 dp2 with 2
# microbatches per step, pp4 (one layer per stage), and tp2 pp2 dp2 on 8
# ranks (with and without sequence parallelism). The loss at every step
# and the final validation loss are within 1e-5 relative of the 1-rank run,
# gradient norms (which count each parameter once across stages and TP
# ranks) and final parameters within 1e-4; the same layout twice is
# bit-identical; layout errors exit 2 with one line.
. "$top_srcdir/test/common.sh"

for model in tiny tiny-llama; do
    ref="$TMP/$model.1.json"
    layout_run "$ref" 1 --model $model || continue
    layout_run "$TMP/$model.pp2.json" 2 --model $model --pp 2 &&
        layout_compare "$ref" "$TMP/$model.pp2.json" "$model pp2 1f1b"
    layout_run "$TMP/$model.tp2pp2dp2.json" 8 --model $model --tp 2 --pp 2 --sequence-parallel --bucket-mb 0.05 &&
        layout_compare "$ref" "$TMP/$model.tp2pp2dp2.json" "$model tp2 pp2 dp2 sequence-parallel (8 ranks)"
    layout_run "$TMP/$model.pp2dp2.json" 4 --model $model --pp 2 --dp 2 --ddp-mode naive &&
        layout_compare "$ref" "$TMP/$model.pp2dp2.json" "$model pp2 dp2 naive, 2 microbatches"
done
layout_run "$TMP/tiny.pp2.gpipe.json" 2 --model tiny --pp 2 --pp-schedule gpipe &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.pp2.gpipe.json" "tiny pp2 gpipe"
layout_run "$TMP/tiny.pp2.uneven.json" 2 --model tiny --pp 2 --pp-layers 1,3 &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.pp2.uneven.json" "tiny pp2 --pp-layers 1,3"
layout_run "$TMP/tiny.tp2pp2.json" 4 --model tiny --tp 2 --pp 2 &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.tp2pp2.json" "tiny tp2 pp2"
layout_run "$TMP/tiny-llama.tp2pp2sp.json" 4 --model tiny-llama --tp 2 --pp 2 --sequence-parallel --ddp-mode flat &&
    layout_compare "$TMP/tiny-llama.1.json" "$TMP/tiny-llama.tp2pp2sp.json" "tiny-llama tp2 pp2 sequence-parallel"
layout_run "$TMP/tiny.tp2pp2dp2.nosp.json" 8 --model tiny --tp 2 --pp 2 --ddp-mode flat &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.tp2pp2dp2.nosp.json" "tiny tp2 pp2 dp2 (8 ranks)"
layout_run "$TMP/tiny.tp2pp2sp.json" 4 --model tiny --tp 2 --pp 2 --sequence-parallel &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.tp2pp2sp.json" "tiny tp2 pp2 sequence-parallel"
layout_run "$TMP/tiny-llama.tp2pp2.json" 4 --model tiny-llama --tp 2 --pp 2 &&
    layout_compare "$TMP/tiny-llama.1.json" "$TMP/tiny-llama.tp2pp2.json" "tiny-llama tp2 pp2"
layout_run "$TMP/tiny.pp4.json" 4 --model tiny --pp 4 &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.pp4.json" "tiny pp4"
layout_run "$TMP/tiny.pp2.again.json" 2 --model tiny --pp 2 &&
    layout_twice "$TMP/tiny.pp2.json" "$TMP/tiny.pp2.again.json" "tiny pp2"

# layout errors: one line from rank 0, exit 2 on every rank
expect_exit2 "--pp 8 exceeds the model's 4 layers" "$MPIEXEC" --quiet -np 8 "$DTRAIN" $(tiny_args) --pp 8
expect_exit2 "--pp 2 needs at least 2 microbatches per step, got 1" \
    "$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) --pp 2 --micro-batch 2 --global-batch 4
expect_exit2 "--pp-layers '2,1': needs 2 counts (one per stage) summing to the model's 4 layers" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --pp 2 --micro-batch 4 --global-batch 8 --pp-layers 2,1
expect_exit2 "--pp-layers '2,x': expected a comma-separated list" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --pp 2 --micro-batch 4 --global-batch 8 --pp-layers 2,x
expect_exit2 "--pp-schedule 'zb': allowed values are 1f1b|gpipe" "$DTRAIN" $(tiny_args) --pp-schedule zb
finish
