#!/bin/sh
# Mixture-of-experts layers (issue 33): a MoE layer by finite differences
# and its two losses against numpy float64 (test_moe_grad, moe_losses.py);
# tiny-moe (GPT-2 experts, softmax top-2) and tiny-deepseek-moe (Llama
# SwiGLU experts, sigmoid top-4, shared expert, first layer dense) train
# the same model at tp2 with sequence parallelism, pp2 (1f1b and
# interleaved) and dp2 with ZeRO-3 as one process, top-1 and top-2, with
# and without capacity dropping: every loss and the final validation loss
# within 1e-5 relative, gradient norms and final parameters within 1e-4.
# The runs are 10 steps: routing is discrete, so a last-bit difference
# between layouts (a reduction order) that moves one token's k-th choice
# across a near-tie changes the loss by ~1e-4 from that step on; measured
# on tiny-moe, tp2 and pp2 stay within 1e-7 of one rank for 12 steps and
# first flip at step 13. tiny-qwen-moe (Qwen2-MoE's shape: q/k/v biases,
# softmax top-2 not renormalised, a shared expert under its sigmoid gate,
# --moe-shared-gate) trains the same model at tp2 with and without
# sequence parallelism, pp2, dp2 with ZeRO-3 and ep2, and --recompute
# full and selective equal none bit for bit (the gate's tensors are kept
# in the slot). The same layout twice is bit-identical, and so
# are --recompute full and none; a checkpoint written at tp2 x pp2
# resumes at one rank; zb-h1 equals 1f1b bit for bit; bad MoE options
# exit 2 with one line.
. "$top_srcdir/test/common.sh"

# ---- one layer against the formulas ----
if "$top_builddir/test/test_moe_grad" "$TMP/softmax.txt" "$TMP/sigmoid.txt" >"$TMP/grad.log" 2>&1; then
    pass "test_moe_grad: $(grep -c ' ok$' "$TMP/grad.log") checks of forward, losses and gradients vs FD"
else
    fail "test_moe_grad: $(grep FAIL "$TMP/grad.log" | head -n 3)"
fi
if out=$(/usr/bin/python3 "$top_srcdir/test/moe_losses.py" "$TMP/softmax.txt" "$TMP/sigmoid.txt" 2>&1); then
    pass "MoE losses against numpy float64: $(echo "$out" | tr '\n' ';')"
else
    fail "MoE losses against numpy float64: $out"
fi

# ---- layouts ----
LC_MIN_VALUES=21
S="--steps 10 --val-every 10"
moe_layouts() { # NAME ARGS...: one rank, then the layouts against it
    name=$1
    shift
    layout_run "$TMP/$name.1.json" 1 $S "$@" || return
    layout_run "$TMP/$name.tp2.json" 2 $S "$@" --tp 2 --sequence-parallel &&
        layout_compare "$TMP/$name.1.json" "$TMP/$name.tp2.json" "$name tp2 sequence-parallel"
    layout_run "$TMP/$name.pp2.json" 2 $S "$@" --pp 2 &&
        layout_compare "$TMP/$name.1.json" "$TMP/$name.pp2.json" "$name pp2"
    layout_run "$TMP/$name.z3.json" 2 $S "$@" --zero 3 &&
        layout_compare "$TMP/$name.1.json" "$TMP/$name.z3.json" "$name dp2 ZeRO-3"
}
moe_layouts top2 --model tiny-moe
moe_layouts top1 --model tiny-moe --moe-top-k 1
moe_layouts cap --model tiny-moe --moe-capacity-factor 1
moe_layouts deepseek --model tiny-deepseek-moe --moe-z-coef 0.001
moe_layouts qwen --model tiny-qwen-moe
layout_run "$TMP/qwen.tp2nosp.json" 2 $S --model tiny-qwen-moe --tp 2 &&
    layout_compare "$TMP/qwen.1.json" "$TMP/qwen.tp2nosp.json" "qwen tp2"
layout_run "$TMP/qwen.ep2.json" 2 $S --model tiny-qwen-moe --ep 2 &&
    layout_compare "$TMP/qwen.1.json" "$TMP/qwen.ep2.json" "qwen ep2"
for rc in full selective; do
    layout_run "$TMP/qwen.$rc.json" 1 $S --model tiny-qwen-moe --recompute $rc &&
        layout_twice "$TMP/qwen.1.json" "$TMP/qwen.$rc.json" "tiny-qwen-moe --recompute $rc vs none:"
done
layout_run "$TMP/top2.v2.json" 2 $S --model tiny-moe --pp 2 --pp-schedule interleaved --pp-virtual 2 &&
    layout_compare "$TMP/top2.1.json" "$TMP/top2.v2.json" "top2 pp2 interleaved v2"
layout_run "$TMP/top2.z1.json" 4 $S --model tiny-moe --tp 2 --zero 1 &&
    layout_compare "$TMP/top2.1.json" "$TMP/top2.z1.json" "top2 tp2 x dp2 ZeRO-1"
grep -q "dropped" "$TMP/cap.1.json.log" && pass "capacity 1: the step line reports dropped tokens" ||
    fail "capacity 1: no dropped tokens reported: $(grep 'step    1' "$TMP/cap.1.json.log")"

# ---- bf16: the experts' GEMMs on bf16 operands ----
# test_moe_grad checks that the experts' forward really rounds (3e-3 off
# the float64 reference, not fp32's 1e-7). Across layouts: at step 1 (the
# same parameters) the loss within 1e-5 and the gradient norm within 1e-4
# of one rank (measured at most 1.4e-6 (tp2) and 1.8e-5: the experts' row
# groups and width slices differ by layout, and bf16 operands turn fp32
# last-bit differences into 2^-8 steps); the 10 steps' losses within 1e-3 (measured 1.7e-4 to 3.6e-4:
# AdamW turns the expert biases' rounding noise, few tokens each, into
# full-size steps, and routing amplifies it; dense bf16 layouts stay at
# 1e-5, test_dtype.sh).
bf16_worst() { # REF OUT: the largest relative loss difference over steps 1-10
    awk -v ref="$1" -v out="$2" '
        function loss(l) { if (match(l, /"loss": [-0-9.e+]+/)) return substr(l, RSTART + 8, RLENGTH - 8) + 0; return "" }
        function step(l) { match(l, /"step": [0-9]+/); return substr(l, RSTART + 8, RLENGTH - 8) + 0 }
        BEGIN { while ((getline l < ref) > 0) r[step(l)] = loss(l)
                n = 0; w = 0
                while ((getline l < out) > 0) { s = step(l); x = loss(l)
                    if (s < 1 || s > 10 || x == "" || r[s] == "") continue
                    d = (x - r[s]) / r[s]; if (d < 0) d = -d; n++; if (d > w) w = d }
                if (n < 10) print "missing"; else printf "%.2e\n", w }'
}
if layout_run "$TMP/b16.1.json" 1 $S --model tiny-moe --dtype bf16; then
    for lay in "2 --tp 2 --sequence-parallel" "2 --ep 2" "4 --ep 2 --zero 3"; do
        set -- $lay
        np=$1
        shift
        tag=$(echo "$*" | tr -d ' -')
        layout_run "$TMP/b16.$tag.json" "$np" $S --model tiny-moe --dtype bf16 "$@" || continue
        expect_close "tiny-moe bf16 $*: step-1 loss" "$(json_field "$TMP/b16.1.json" 1 loss)" \
            "$(json_field "$TMP/b16.$tag.json" 1 loss)" 1e-5
        expect_close "tiny-moe bf16 $*: step-1 gradient norm" "$(json_field "$TMP/b16.1.json" 1 grad_norm)" \
            "$(json_field "$TMP/b16.$tag.json" 1 grad_norm)" 1e-4
        w=$(bf16_worst "$TMP/b16.1.json" "$TMP/b16.$tag.json")
        awk -v w="$w" 'BEGIN { exit !(w != "missing" && w + 0 < 1e-3) }' &&
            pass "tiny-moe bf16 $*: 10 steps' losses within $w (< 1e-3) of one rank" ||
            fail "tiny-moe bf16 $*: losses $w from one rank (limit 1e-3)"
    done
fi

# ---- determinism ----
layout_run "$TMP/top2.again.json" 1 $S --model tiny-moe && layout_twice "$TMP/top2.1.json" "$TMP/top2.again.json" "tiny-moe"
layout_run "$TMP/top2.full.json" 1 $S --model tiny-moe --recompute full &&
    layout_twice "$TMP/top2.1.json" "$TMP/top2.full.json" "tiny-moe --recompute full vs none:"

# ---- a tp2 x pp2 checkpoint resumes at one rank ----
layout_run "$TMP/ck.json" 4 $S --model tiny-moe --tp 2 --pp 2 --ckpt-dir "$TMP/ck" --ckpt-every 5 &&
    layout_run "$TMP/re.json" 1 $S --model tiny-moe --resume "$TMP/ck/step_00000005.h5" &&
    {
        losses "$TMP/ck.json" | awk '{ print $1, $2 }' | tail -n 5 >"$TMP/ck.l"
        losses "$TMP/re.json" | awk '{ print $1, $2 }' >"$TMP/re.l"
        worst=$(paste "$TMP/ck.l" "$TMP/re.l" |
            awk '{ d = $2 - $4; if (d < 0) d = -d; d /= $2; if (d > w) w = d; n++ } END { printf "%.2e %d", w, n }')
        set -- $worst
        if [ "$2" -eq 5 ] && [ "$(cut -d' ' -f1 "$TMP/re.l" | tr '\n' ' ')" = "6 7 8 9 10 " ] && awk -v w="$1" 'BEGIN { exit !(w < 1e-5) }'; then
            pass "tiny-moe tp2 x pp2 checkpoint continued at one rank: 5 losses within $1 of the uninterrupted run"
        else
            fail "tiny-moe tp2 x pp2 checkpoint continued at one rank: worst $1 over $2 losses"
        fi
    }

# ---- zb-h1: B computes the experts' weight gradients, W the dense and
# shared-expert matmuls' from the same operands: the 1f1b run bit for bit ----
for model in tiny-moe tiny-deepseek-moe tiny-qwen-moe; do
    layout_run "$TMP/$model.zb1f1b.json" 2 $S --model $model --pp 2 &&
        layout_run "$TMP/$model.zb.json" 2 $S --model $model --pp 2 --pp-schedule zb-h1 &&
        layout_compare "$TMP/$model.zb1f1b.json" "$TMP/$model.zb.json" "$model pp2 zb-h1 vs 1f1b" 1e-12 1e-12 1e-12
done
layout_run "$TMP/ep.1f1b.json" 4 $S --model tiny-moe --pp 2 --ep 2 &&
    layout_run "$TMP/ep.zb.json" 4 $S --model tiny-moe --pp 2 --ep 2 --pp-schedule zb-h1 &&
    layout_compare "$TMP/ep.1f1b.json" "$TMP/ep.zb.json" "tiny-moe pp2 x ep2 zb-h1 vs 1f1b" 1e-12 1e-12 1e-12

# ---- bad input ----
B="$DTRAIN $(tiny_args) --steps 1"
expect_exit2 "--moe-top-k 9 must be between 1 and --moe-experts 8" $B --model tiny-moe --moe-top-k 9
expect_exit2 "need --moe-experts" $B --model tiny --moe-capacity-factor 1.25
expect_exit2 "--moe-experts 1: a mixture needs 2 to 4096 experts" $B --model tiny --moe-experts 1
expect_exit2 "--moe-shared-gate 1 gates the shared expert: it needs --moe-shared-ffn" $B --model tiny-moe --moe-shared-gate 1
finish
