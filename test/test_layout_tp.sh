#!/bin/sh
# Tensor parallelism trains the same model as one process: tiny and
# tiny-llama (GQA: its 2 KV heads split too), 20 steps at one global batch
# of 8 sequences, at tp2, tp2 with --sequence-parallel, tp2 x dp2 (with 2
# microbatches of accumulation), and for tiny tp4, where the 256-token
# vocabulary is padded to 512 so that ranks 2 and 3 hold only padding rows
# (padded logits must never reach the loss). The loss and the gradient norm
# at every step and the final validation loss are within 1e-5 relative of
# the 1-rank run (the norm counts replicated tensors once, so a T-fold
# count would show); the same layout twice is bit-identical.
. "$top_srcdir/test/common.sh"

for model in tiny tiny-llama; do
    ref="$TMP/$model.1.json"
    layout_run "$ref" 1 --model $model || continue
    layout_run "$TMP/$model.tp2.json" 2 --model $model --tp 2 &&
        layout_compare "$ref" "$TMP/$model.tp2.json" "$model tp2"
    layout_run "$TMP/$model.tp2sp.json" 2 --model $model --tp 2 --sequence-parallel &&
        layout_compare "$ref" "$TMP/$model.tp2sp.json" "$model tp2 sequence-parallel"
    layout_run "$TMP/$model.tp2dp2.json" 4 --model $model --tp 2 --bucket-mb 0.05 &&
        layout_compare "$ref" "$TMP/$model.tp2dp2.json" "$model tp2 dp2"
    layout_run "$TMP/$model.tp2dp2sp.json" 4 --model $model --tp 2 --sequence-parallel --ddp-mode flat &&
        layout_compare "$ref" "$TMP/$model.tp2dp2sp.json" "$model tp2 dp2 sequence-parallel, flat"
done
layout_run "$TMP/tiny.tp4.json" 4 --model tiny --tp 4 &&
    layout_compare "$TMP/tiny.1.json" "$TMP/tiny.tp4.json" "tiny tp4 (vocab padded 256 -> 512)"
layout_run "$TMP/tiny.tp2sp.again.json" 2 --model tiny --tp 2 --sequence-parallel &&
    layout_twice "$TMP/tiny.tp2sp.json" "$TMP/tiny.tp2sp.again.json" "tiny tp2 sequence-parallel"

# layout errors: one line from rank 0, exit 2 on every rank
expect_exit2 "--tp 4 must divide the attention heads (4), the KV heads (2)" \
    "$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) --model tiny-llama --tp 4
expect_exit2 "--tp 3 must divide" "$MPIEXEC" --quiet -np 3 "$DTRAIN" $(tiny_args) --tp 3
expect_exit2 "--sequence-parallel shards over the tensor-parallel group: it needs --tp above 1" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --sequence-parallel
expect_exit2 "--seq-len 63 must be a multiple of --tp 2" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --tp 2 --sequence-parallel --seq-len 63
finish
