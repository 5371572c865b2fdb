#!/bin/sh
# Expert parallelism (--ep, issue 33): each MoE layer's experts split over
# an EP group carved out of the data-parallel ranks, tokens dispatched to
# their experts' ranks by all-to-all and the outputs sent back. tiny-moe
# (GPT-2 experts, top-2 and top-1, with and without capacity dropping)
# and tiny-deepseek-moe (SwiGLU experts, sigmoid top-4, shared expert)
# train the same model as one process at ep2, ep4, ep2 x tp2 (sequence
# parallel), ep2 x pp2 and ep2 x dp4 (expert-DP 2: the expert gradients
# summed over the expert-DP group; bucketed, flat and naive all-reduces):
# every loss and the final validation loss within 1e-5 relative, gradient
# norms and final parameters within 1e-4 (10 steps, as in test_moe.sh:
# discrete routing flips on last-bit differences later on). The same
# layout twice is bit-identical, and so are --recompute full and none. A
# checkpoint written at ep2 resumes at one rank and one written at one
# rank resumes at ep2 (expert tensors are logical [E x rows, cols] in the
# file). Validation with fewer batches than DP ranks does not hang. Bad
# --ep exits 2 with one line. ZeRO with --ep: test_moe_zero.sh.
. "$top_srcdir/test/common.sh"

LC_MIN_VALUES=21
S="--steps 10 --val-every 10"
ep_layouts() { # NAME ARGS...: one rank, then the EP layouts against it
    name=$1
    shift
    layout_run "$TMP/$name.1.json" 1 $S "$@" || return
    layout_run "$TMP/$name.ep2.json" 2 $S "$@" --ep 2 &&
        layout_compare "$TMP/$name.1.json" "$TMP/$name.ep2.json" "$name ep2"
    layout_run "$TMP/$name.dp4.json" 4 $S "$@" --ep 2 --ddp-mode "$DDP" &&
        layout_compare "$TMP/$name.1.json" "$TMP/$name.dp4.json" "$name ep2 x dp4 (expert-DP 2, $DDP all-reduce)"
}
DDP=bucketed ep_layouts top2 --model tiny-moe
DDP=flat ep_layouts top1 --model tiny-moe --moe-top-k 1
DDP=naive ep_layouts cap --model tiny-moe --moe-capacity-factor 1
DDP=bucketed ep_layouts deepseek --model tiny-deepseek-moe --moe-z-coef 0.001
layout_run "$TMP/top2.ep4.json" 4 $S --model tiny-moe --ep 4 &&
    layout_compare "$TMP/top2.1.json" "$TMP/top2.ep4.json" "top2 ep4"
layout_run "$TMP/top2.tp2.json" 4 $S --model tiny-moe --ep 2 --tp 2 --sequence-parallel &&
    layout_compare "$TMP/top2.1.json" "$TMP/top2.tp2.json" "top2 ep2 x tp2 sequence-parallel"
layout_run "$TMP/top2.pp2.json" 4 $S --model tiny-moe --ep 2 --pp 2 &&
    layout_compare "$TMP/top2.1.json" "$TMP/top2.pp2.json" "top2 ep2 x pp2"
grep -q "dropped" "$TMP/cap.ep2.json.log" && pass "capacity 1 at ep2: the step line reports dropped tokens" ||
    fail "capacity 1 at ep2: no dropped tokens reported: $(grep 'step    1' "$TMP/cap.ep2.json.log")"

# ---- determinism ----
layout_run "$TMP/top2.ep2again.json" 2 $S --model tiny-moe --ep 2 &&
    layout_twice "$TMP/top2.ep2.json" "$TMP/top2.ep2again.json" "tiny-moe ep2"
layout_run "$TMP/top2.ep2full.json" 2 $S --model tiny-moe --ep 2 --recompute full &&
    layout_twice "$TMP/top2.ep2.json" "$TMP/top2.ep2full.json" "tiny-moe ep2 --recompute full vs none:"

# ---- checkpoints: ep2 -> one rank, one rank -> ep2 ----
layout_run "$TMP/ck.json" 2 $S --model tiny-moe --ep 2 --ckpt-dir "$TMP/ck" --ckpt-every 5 &&
    layout_run "$TMP/re.json" 1 $S --model tiny-moe --resume "$TMP/ck/step_00000005.h5" &&
    resumed "tiny-moe ep2 checkpoint continued at one rank" "$TMP/ck.json" "$TMP/re.json"
layout_run "$TMP/ck1.json" 1 $S --model tiny-moe --ckpt-dir "$TMP/ck1" --ckpt-every 5 &&
    layout_run "$TMP/re2.json" 2 $S --model tiny-moe --ep 2 --resume "$TMP/ck1/step_00000005.h5" &&
    resumed "tiny-moe one-rank checkpoint continued at ep2" "$TMP/ck1.json" "$TMP/re2.json"

# ---- validation: forwards are collective over the EP group, so with 3
# batches over dp4 the ranks past the last one evaluate one again (a hang
# otherwise, which --comm-timeout turns into a failure) ----
if "$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) --model tiny-moe --ep 2 --threads 1 --steps 2 --micro-batch 2 \
    --global-batch 8 --seq-len 64 --val-every 1 --val-batches 3 --sample-tokens 0 --comm-timeout 60 \
    >"$TMP/val.log" 2>&1 && [ "$(grep -c '| val ' "$TMP/val.log")" -eq 3 ]; then
    pass "ep2 x dp4 with 3 validation batches: $(grep -c '| val ' "$TMP/val.log") validations, no hang"
else
    fail "ep2 x dp4 with 3 validation batches: $(tail -n 2 "$TMP/val.log")"
fi

# ---- bad input: one line, exit 2, on every rank ----
B="$DTRAIN $(tiny_args) --steps 1 --micro-batch 2 --seq-len 64"
expect_exit2 "--ep 3 must divide the model's 8 experts" "$MPIEXEC" --quiet -np 3 $B --global-batch 6 --model tiny-moe \
    --ep 3
expect_exit2 "--ep 2 must divide the data-parallel size 1" "$MPIEXEC" --quiet -np 2 $B --model tiny-moe --ep 2 --tp 2
expect_exit2 "--ep 2 splits a mixture's experts over ranks, but the model has none" "$MPIEXEC" --quiet -np 2 $B \
    --model tiny --ep 2
finish
