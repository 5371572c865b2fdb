#!/bin/sh
# The fused classifier (--logits-chunk) trains the model the whole logits
# train, in every layout that moves its work: test/test_logits_chunk (one
# process, the model's own checks: per-token losses bit-identical, every
# gradient within 2e-6, logits rows, bytes, the accum contract), then 20
# steps of tiny (GPT-2, its head tied to wte) at micro batch 2 x seq 64, 4
# microbatches a step, with chunks of 24 rows (5 chunks of the 128 rows,
# the last partial) against --logits-chunk whole in the same layout: one
# rank, tp2 (the vocabulary-parallel softmax's max and sum all-reduced
# chunk by chunk), tp2 with sequence parallelism, pp2 1F1B (the tied copy
# on the last stage), pp2 GPipe (every forward's head gradient added before
# the first backward), pp2 interleaved, pp2 zb-h1 (B right after F), dp2
# ZeRO-2 (the head's gradient reduce-scattered after every microbatch),
# full recomputation and --dtype bf16: every loss within 1e-6 relative,
# gradient norms within 1e-5 and final parameters within 1e-5 (bf16: 2e-4,
# 4e-3 and 1e-2, since the head's fp32 sums in another order flip bf16
# roundings of the blocks' backward operands; seen 3e-5, 4e-4 and 1e-3). Where
# test/act_bytes.py has the layout (1F1B), both runs' activation and
# workspace bytes (--metrics' mem_peak, the maximum over ranks) equal the
# formula, and at one stage the fused run's activations are below whole's
# (by the logits, r(N*Vl) per microbatch in flight). A bad --logits-chunk exits 2.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
mem() { # FILE KEY: KEY's bytes in the last metrics line's mem_peak
    tail -n 1 "$1" | sed -n "s/.*\"$2\": \([0-9]*\).*/\1/p"
}

if "$top_builddir/test/test_logits_chunk" >"$TMP/unit.log" 2>&1; then
    pass "test_logits_chunk: $(grep -c '^ok' "$TMP/unit.log") checks"
else
    fail "test_logits_chunk: $(grep -v '^ok' "$TMP/unit.log" | head -n 5)"
fi

# NP TP SP PP RECOMPUTE DTYPE [ARGS...]; TP 0: no formula for the layout
for layout in "1 1 0 1 none fp32" "2 2 0 1 none fp32 --tp 2" "2 2 1 1 none fp32 --tp 2 --sequence-parallel" \
    "2 1 0 2 none fp32 --pp 2" "2 0 0 0 none fp32 --pp 2 --pp-schedule gpipe" \
    "2 0 0 0 none fp32 --pp 2 --pp-schedule interleaved --pp-virtual 2" "2 0 0 0 none fp32 --pp 2 --pp-schedule zb-h1" \
    "2 0 0 0 none fp32 --dp 2 --zero 2" "1 1 0 1 full fp32 --recompute full" "1 1 0 1 none bf16 --dtype bf16"; do
    set -- $layout
    np=$1 tp=$2 sp=$3 pp=$4 mode=$5 dtype=$6
    shift 6
    label="tiny np $np${*:+ $*}"
    tag=$(echo "$np $*" | tr -c 'a-z0-9\n' '_')
    layout_run "$TMP/whole.$tag.json" "$np" "$@" --logits-chunk whole || continue
    layout_run "$TMP/fused.$tag.json" "$np" "$@" --logits-chunk 24 || continue
    if [ "$dtype" = bf16 ]; then # the head's last bits flip bf16 roundings in the blocks' backward
        layout_compare "$TMP/whole.$tag.json" "$TMP/fused.$tag.json" "$label --logits-chunk 24 vs whole" 2e-4 4e-3 1e-2
    else
        layout_compare "$TMP/whole.$tag.json" "$TMP/fused.$tag.json" "$label --logits-chunk 24 vs whole" 1e-6 1e-5 1e-5
    fi
    [ "$tp" = 0 ] && continue
    whole="$(mem "$TMP/whole.$tag.json" activations) $(mem "$TMP/whole.$tag.json" workspace)"
    fused="$(mem "$TMP/fused.$tag.json" activations) $(mem "$TMP/fused.$tag.json" workspace)"
    want_whole=$("$PY" "$top_srcdir/test/act_bytes.py" tiny 2 64 "$tp" "$sp" "$pp" 4 1f1b $mode $dtype whole)
    want_fused=$("$PY" "$top_srcdir/test/act_bytes.py" tiny 2 64 "$tp" "$sp" "$pp" 4 1f1b $mode $dtype 24)
    # at pp2 the peak is stage 0's (two microbatches in flight), the same in both
    if [ "$whole" = "$want_whole" ] && [ "$fused" = "$want_fused" ] &&
        { [ "$pp" -gt 1 ] || [ "${fused% *}" -lt "${whole% *}" ]; }; then
        pass "$label: activations + workspace $fused bytes fused, $whole whole (the formula's)"
    else
        fail "$label: activations + workspace fused '$fused' (formula '$want_fused'), whole '$whole' (formula '$want_whole')"
    fi
done

expect_exit2 "--logits-chunk 'some': give auto, whole or a number of rows >= 1" "$DTRAIN" $(tiny_args) \
    --logits-chunk some
expect_exit2 "--logits-chunk '0': give auto, whole or a number of rows >= 1" "$DTRAIN" $(tiny_args) --logits-chunk 0
finish
