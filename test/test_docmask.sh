#!/bin/sh
# --doc-mask (src/model/docmask.h): attention within documents, positions
# restarting at each document.
#  - test/test_docmask: at one rank, a packed batch's loss and every
#    gradient equal those of its documents run one by one (within 1e-6),
#    for GPT-2 (learned positions) and Llama (RoPE); --recompute selective
#    and full reuse the mask (bit-identical); the same checks directly at
#    tp2 with --sequence-parallel and at pp2 (test_docmask --grid, 2 ranks).
#  - the layouts agree with --doc-mask as they do without it
#    (layout_compare's tolerances): tiny and tiny-llama at one rank, dp2,
#    tp2 with --sequence-parallel, pp2 and ZeRO-2, on the byte corpus with
#    a sidecar that names '\n' as the document start (tiny) and '.' as the
#    document end (tiny-llama). With the one-rank check above, this ties
#    every layout's packed batch to its documents run one by one.
#  - the mask changes the result (a run without it differs);
#  - tiny-gpt2 on the GPT-2 corpus (its sidecar's doc_start <|endoftext|>)
#    trains with --doc-mask;
#  - data that records no boundary (the byte corpus's own sidecar: no
#    doc_start, no doc_end) is one line, exit 2.
. "$top_srcdir/test/common.sh"

if "$top_builddir/test/test_docmask" >"$TMP/unit.log" 2>&1; then
    pass "test_docmask: $(grep -c ' ok$' "$TMP/unit.log") checks (packed = one by one, recompute)"
else
    fail "test_docmask: $(grep FAIL "$TMP/unit.log" | head -n 3)"
fi

for g in tp2sp pp2; do
    if timeout 300 "$MPIEXEC" --quiet -np 2 "$top_builddir/test/test_docmask" --grid $g >"$TMP/unit_$g.log" 2>&1; then
        pass "test_docmask --grid $g: $(grep -c ' ok$' "$TMP/unit_$g.log") checks (packed = one by one, recompute)"
    else
        fail "test_docmask --grid $g: $(grep -E 'FAIL|runs on|rror' "$TMP/unit_$g.log" | head -n 3)"
    fi
done

# the byte corpus under a sidecar with a document boundary token
for split in train val; do
    cp $top_builddir/data/gutenberg_${split}_000000.bin "$TMP/nl_${split}_000000.bin" &&
        cp $top_builddir/data/gutenberg_${split}_000000.bin "$TMP/dot_${split}_000000.bin" || exit 99
done
sed 's/"doc_start": null/"doc_start": 10/' "$top_builddir/data/gutenberg.tokenizer.json" >"$TMP/nl.tokenizer.json"
sed 's/"doc_end": null/"doc_end": 46/' "$top_builddir/data/gutenberg.tokenizer.json" >"$TMP/dot.tokenizer.json"

for model in tiny tiny-llama; do
    [ $model = tiny ] && d=nl || d=dot
    DATA_TRAIN="$TMP/${d}_train_*.bin"
    DATA_VAL="$TMP/${d}_val_*.bin"
    ref="$TMP/$model.1.json"
    layout_run "$ref" 1 --model $model --doc-mask || continue
    layout_run "$TMP/$model.dp2.json" 2 --model $model --doc-mask &&
        layout_compare "$ref" "$TMP/$model.dp2.json" "$model --doc-mask dp2"
    layout_run "$TMP/$model.tp2sp.json" 2 --model $model --doc-mask --tp 2 --sequence-parallel &&
        layout_compare "$ref" "$TMP/$model.tp2sp.json" "$model --doc-mask tp2 sequence-parallel"
    layout_run "$TMP/$model.pp2.json" 2 --model $model --doc-mask --pp 2 --recompute full &&
        layout_compare "$ref" "$TMP/$model.pp2.json" "$model --doc-mask pp2, recompute full"
    layout_run "$TMP/$model.z2.json" 2 --model $model --doc-mask --zero 2 &&
        layout_compare "$ref" "$TMP/$model.z2.json" "$model --doc-mask zero 2 dp2"
    layout_run "$TMP/$model.nomask.json" 1 --model $model &&
        if [ "$(json_field "$ref" 20 loss)" != "$(json_field "$TMP/$model.nomask.json" 20 loss)" ]; then
            pass "$model: the mask changes the run (step 20 loss $(json_field "$ref" 20 loss) vs" \
                "$(json_field "$TMP/$model.nomask.json" 20 loss) unmasked)"
        else
            fail "$model: --doc-mask changed nothing"
        fi
done

DATA_TRAIN="$top_builddir/data/gutenberg_train_*.bin"
DATA_VAL="$top_builddir/data/gutenberg_val_*.bin"
if "$DTRAIN" --model tiny-gpt2 --data "$top_builddir/data/gutenberg-gpt2_train_*.bin" --val-data \
    "$top_builddir/data/gutenberg-gpt2_val_*.bin" --peak-gflops 100 --threads 2 --steps 2 --micro-batch 2 \
    --global-batch 2 --seq-len 64 --val-every 2 --val-batches 1 --sample-tokens 0 --doc-mask \
    >"$TMP/gpt2.log" 2>&1; then
    pass "tiny-gpt2 --doc-mask on the GPT-2 corpus (doc_start <|endoftext|>): $(tail -n 1 "$TMP/gpt2.log")"
else
    fail "tiny-gpt2 --doc-mask: $(tail -n 3 "$TMP/gpt2.log")"
fi

expect_exit2 "--doc-mask: data .* records no document boundary" "$DTRAIN" $(tiny_args) --steps 1 --doc-mask
finish
