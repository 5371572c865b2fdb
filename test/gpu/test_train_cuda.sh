#!/bin/sh
# Training on the CUDA backend against the CPU backend (CUDA builds only):
# tiny (GPT-2) and tiny-llama, 10 steps each with --device cpu and
# --device cuda, one rank, in both precisions.
#  --dtype fp32: every step's loss and the final validation loss agree
#    within 1e-4 relative (the backends sum in different orders and the
#    GPU's expf/sinf differ by an ulp, which ten AdamW steps amplify to
#    ~1e-6..1e-5), the gradient norm within 1e-3.
#  --dtype bf16: the same bf16 arithmetic on both (bf16 matmul operands,
#    fp32 sums), so the difference is again summation order, made coarser
#    where an fp32 last-bit difference crosses a bf16 rounding boundary:
#    the bounds of test_dtype.sh's bf16 layouts, 1e-4 losses, 1e-3 norms.
# SKIP (77) with the CUDA error string when no GPU is visible.
. "$top_srcdir/test/common.sh"

if ! "$top_builddir/test/gpu/test_ops_cuda" --probe >"$TMP/probe" 2>&1; then
    cat "$TMP/probe"
    exit 77
fi

for model in tiny tiny-llama; do
    for dt in fp32 bf16; do
        for dev in cpu cuda; do
            "$DTRAIN" $(tiny_args) --model "$model" --device "$dev" --dtype "$dt" --threads 2 --steps 10 --warmup 2 \
                --micro-batch 2 --seq-len 64 --val-every 10 --val-batches 2 --sample-tokens 0 \
                --metrics "$TMP/$model.$dt.$dev.jsonl" >"$TMP/$model.$dt.$dev.log" 2>&1 ||
                fail "$model --device $dev --dtype $dt: exit status $? $(tail -n 3 "$TMP/$model.$dt.$dev.log")"
        done
        grep -q "^backend: cuda" "$TMP/$model.$dt.cuda.log" && pass "$model $dt: banner says the CUDA backend ran" ||
            fail "$model $dt: no 'backend: cuda' line in the banner"
        for step in 1 5 10; do
            expect_close "$model $dt step $step loss" "$(json_field "$TMP/$model.$dt.cpu.jsonl" $step loss)" \
                "$(json_field "$TMP/$model.$dt.cuda.jsonl" $step loss)" 1e-4
            expect_close "$model $dt step $step grad_norm" "$(json_field "$TMP/$model.$dt.cpu.jsonl" $step grad_norm)" \
                "$(json_field "$TMP/$model.$dt.cuda.jsonl" $step grad_norm)" 1e-3
        done
        expect_close "$model $dt final val_loss" "$(json_field "$TMP/$model.$dt.cpu.jsonl" 10 val_loss)" \
            "$(json_field "$TMP/$model.$dt.cuda.jsonl" 10 val_loss)" 1e-4
    done
    grep -q "^precision: bf16" "$TMP/$model.bf16.cuda.log" && pass "$model: --dtype bf16 ran bf16 matmuls on CUDA" ||
        fail "$model: no 'precision: bf16' line in the CUDA bf16 run's banner"
done

# dtrain --selftest runs the op comparisons and exits 0
"$DTRAIN" --selftest >"$TMP/selftest" 2>&1 && grep -q "^selftest: .* 0 failed" "$TMP/selftest" &&
    pass "dtrain --selftest: $(tail -n 1 "$TMP/selftest")" ||
    fail "dtrain --selftest: $(grep -E '^FAIL|error' "$TMP/selftest" | head -n 5)"

finish
