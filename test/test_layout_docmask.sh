#!/bin/sh
# The layouts train the same model as one process with --doc-mask, on data
# whose documents are mostly shorter than a sequence: the bundled corpus as
# a Megatron dataset (byte tokenizer), one line a document, so the
# boundaries come from the .idx (no boundary token). Every 64-token row
# holds about 2.2 documents (mean length about 30 tokens; checked below
# from the .idx with test/megatron_reader.py), so the mask and the position
# restart act in nearly every row.
#  - one rank with the mask differs from one rank without it by far more
#    than the layout tolerances (step 1's loss and the final validation
#    loss at least 5e-4 relative, 50 times the loss tolerance; measured
#    1.2e-3 to 6.7e-3), so a layout that dropped the mask, or GPT-2's
#    position restart, could not pass;
#  - tiny (learned positions): tp2 with --sequence-parallel, pp2 (1F1B
#    with 4 microbatches, GPipe, interleaved v2, and zb-h1 x dp2 with
#    ZeRO-2), dp2, ZeRO-1/2/3 at dp2, tp2 x pp2 x
#    dp2 with sequence parallelism (8 ranks) against one rank within
#    layout_compare's tolerances (losses 1e-5, norms and parameters 1e-4);
#    ZeRO-1 is bit-identical to --zero 0 at dp2 and --recompute selective
#    to none (at one rank and at tp2 with sequence parallelism), as
#    test_zero.sh and test_recompute.sh require without the mask;
#  - tiny-llama (GQA, RoPE): tp2 with --sequence-parallel, pp2, tp2 x pp2,
#    and tp2 x dp2 with sequence parallelism and ZeRO-3, against one rank;
#    --recompute selective at pp2 bit-identical. RoPE's scores depend only
#    on the difference of two positions, which the mask keeps within one
#    document, so restarting the angles changes only rounding: no output
#    can show a missing RoPE restart (tried: none of these checks, nor
#    test_docmask's, fails without it), while a missing mask fails here.
# test_docmask.sh ties the one-rank packed batch to its documents run one
# by one; with this test, every layout's.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
CORPUS="carroll-alice shakespeare-hamlet shakespeare-macbeth austen-persuasion"
P="$TMP/lines"
"$DTRAIN_PREPARE" --out "$P" --format megatron --doc-separator '\n' --val-fraction 0.1 \
    $(for f in $CORPUS; do echo "$top_srcdir/examples/data/$f.txt"; done) >"$TMP/prepare.log" 2>&1 ||
    { fail "dtrain-prepare: $(tail -n 2 "$TMP/prepare.log")"; finish; }
DATA_TRAIN="${P}_train"
DATA_VAL="${P}_val"
M="--data-format megatron --doc-mask"

# the documents per row of 64 tokens, as dtrain cuts the file into windows
# (sample k: tokens 64 k .. 64 k + 64; a document starts at every row)
if stats=$("$PY" - "$top_srcdir/test" "$DATA_TRAIN" 64 <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from megatron_reader import MegatronDataset
T = int(sys.argv[3])
lens = np.array([len(d) for d in MegatronDataset(sys.argv[2]).documents()])
starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
rows = (int(lens.sum()) - 1) // T
inside = starts[(starts % T != 0) & (starts < rows * T)]
segs = rows + len(inside)
cut = len(np.unique(inside // T)) / rows
print("%d documents, %d rows of %d: %.2f documents per row, mean document length per row %.1f tokens, %.0f%% of"
      " rows cut by a boundary" % (len(lens), rows, T, segs / rows, rows * T / segs, 100 * cut))
sys.exit(0 if rows * T / segs < T / 2 and cut > 0.8 else 1)
PYEOF
); then
    pass "data: $stats"
else
    fail "data: documents too long for the mask to matter: $stats"
fi

# same REF OUT LABEL: bit-identical losses, norms and final parameters
same() {
    strip_timing "$1" >"$TMP/a" && strip_timing "$2" >"$TMP/b"
    if cmp -s "$TMP/a" "$TMP/b" && out=$("$PY" "$top_srcdir/test/compare_params.py" "$1.h5" "$2.h5" 0 2>&1); then
        pass "$3: $(grep -c '"loss"' "$TMP/a") steps, losses, norms and final parameters bit-identical"
    else
        fail "$3: not bit-identical: $(diff "$TMP/a" "$TMP/b" | sed -n 2p | cut -c1-160) ${out:-}"
    fi
}
# differs REF NOMASK KEY STEP: |a - b| / |a| of KEY at STEP at least 5e-4
differs() {
    a=$(json_field "$1" "$4" "$3")
    b=$(json_field "$2" "$4" "$3")
    if [ -n "$a" ] && [ -n "$b" ] &&
        awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d; exit !(d >= 5e-4) }'; then
        pass "$model: the mask changes step $4's $3: $a masked, $b unmasked (rel $(awk -v a="$a" -v b="$b" \
            'BEGIN { d = (a - b) / a; printf "%.1e", d < 0 ? -d : d }') >= 5e-4)"
    else
        fail "$model: --doc-mask hardly changes step $4's $3: '$a' masked, '$b' unmasked (want rel >= 5e-4)"
    fi
}

for model in tiny tiny-llama; do
    ref="$TMP/$model.1.json"
    layout_run "$ref" 1 --model $model $M || continue
    layout_run "$TMP/$model.nomask.json" 1 --model $model --data-format megatron &&
        { differs "$ref" "$TMP/$model.nomask.json" loss 1; differs "$ref" "$TMP/$model.nomask.json" val_loss 20; }
    layout_run "$TMP/$model.tp2sp.json" 2 --model $model $M --tp 2 --sequence-parallel &&
        layout_compare "$ref" "$TMP/$model.tp2sp.json" "$model --doc-mask tp2 sequence-parallel"
    layout_run "$TMP/$model.pp2.json" 2 --model $model $M --pp 2 &&
        layout_compare "$ref" "$TMP/$model.pp2.json" "$model --doc-mask pp2 1f1b, 4 microbatches"
done

# tiny: data parallelism, ZeRO, all three dimensions, recomputation
ref="$TMP/tiny.1.json"
layout_run "$TMP/tiny.dp2.json" 2 $M --bucket-mb 0.05 &&
    layout_compare "$ref" "$TMP/tiny.dp2.json" "tiny --doc-mask dp2"
layout_run "$TMP/tiny.z1.json" 2 $M --bucket-mb 0.05 --zero 1 &&
    same "$TMP/tiny.dp2.json" "$TMP/tiny.z1.json" "tiny --doc-mask dp2 --zero 1 vs --zero 0"
for z in 2 3; do
    layout_run "$TMP/tiny.z$z.json" 2 $M --zero $z &&
        layout_compare "$ref" "$TMP/tiny.z$z.json" "tiny --doc-mask dp2 --zero $z"
done
layout_run "$TMP/tiny.gpipe.json" 2 $M --pp 2 --pp-schedule gpipe &&
    layout_compare "$ref" "$TMP/tiny.gpipe.json" "tiny --doc-mask pp2 gpipe"
layout_run "$TMP/tiny.v2.json" 2 $M --pp 2 --pp-schedule interleaved --pp-virtual 2 &&
    layout_compare "$ref" "$TMP/tiny.v2.json" "tiny --doc-mask pp2 interleaved v2"
layout_run "$TMP/tiny.zb.json" 4 $M --pp 2 --pp-schedule zb-h1 --zero 2 &&
    layout_compare "$ref" "$TMP/tiny.zb.json" "tiny --doc-mask pp2 zb-h1 x dp2 --zero 2"
layout_run "$TMP/tiny.tp2pp2dp2.json" 8 $M --tp 2 --pp 2 --sequence-parallel --bucket-mb 0.05 &&
    layout_compare "$ref" "$TMP/tiny.tp2pp2dp2.json" "tiny --doc-mask tp2 pp2 dp2 sequence-parallel (8 ranks)"
layout_run "$TMP/tiny.sel.json" 1 $M --recompute selective &&
    same "$ref" "$TMP/tiny.sel.json" "tiny --doc-mask --recompute selective vs none"
layout_run "$TMP/tiny.tp2sp.sel.json" 2 $M --tp 2 --sequence-parallel --recompute selective &&
    same "$TMP/tiny.tp2sp.json" "$TMP/tiny.tp2sp.sel.json" "tiny --doc-mask tp2 sequence-parallel --recompute selective vs none"

# tiny-llama: RoPE over tensor and pipeline parallelism together
ref="$TMP/tiny-llama.1.json"
layout_run "$TMP/tiny-llama.tp2pp2.json" 4 --model tiny-llama $M --tp 2 --pp 2 &&
    layout_compare "$ref" "$TMP/tiny-llama.tp2pp2.json" "tiny-llama --doc-mask tp2 pp2"
layout_run "$TMP/tiny-llama.tp2dp2z3.json" 4 --model tiny-llama $M --tp 2 --sequence-parallel --zero 3 &&
    layout_compare "$ref" "$TMP/tiny-llama.tp2dp2z3.json" "tiny-llama --doc-mask tp2 dp2 sequence-parallel --zero 3"
layout_run "$TMP/tiny-llama.pp2.sel.json" 2 --model tiny-llama $M --pp 2 --recompute selective &&
    same "$TMP/tiny-llama.pp2.json" "$TMP/tiny-llama.pp2.sel.json" "tiny-llama --doc-mask pp2 --recompute selective vs none"
finish
