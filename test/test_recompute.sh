#!/bin/sh
# Activation recomputation trains the identical model: --recompute
# selective (the MLP activation redone in
# backward) and full (each block's forward redone from its input, TP
# collectives included) give losses, gradient norms, the final validation
# loss and the final parameters bit-identical to --recompute none, at
# 1 rank (tiny and tiny-llama), tp2, pp2 1F1B (2 microbatches in flight on
# stage 0) and tp2 with sequence parallelism, and under --dtype bf16 (where
# ln1, ln2 and fc_act are kept in bf16) at 1 rank and tp2 with sequence
# parallelism. The activation and workspace
# bytes (--metrics' mem_peak, the maximum over ranks) equal the formula of
# model.c's layout_acts (test/act_bytes.py) exactly, and each mode keeps
# fewer activation bytes than the one before.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
mem() { # FILE KEY: KEY's bytes in the last metrics line's mem_peak
    tail -n 1 "$1" | sed -n "s/.*\"$2\": \([0-9]*\).*/\1/p"
}
same() { # REF OUT LABEL
    strip_timing "$1" >"$TMP/a" && strip_timing "$2" >"$TMP/b"
    if cmp -s "$TMP/a" "$TMP/b" && out=$("$PY" "$top_srcdir/test/compare_params.py" "$1.h5" "$2.h5" 0 2>&1); then
        pass "$3: $(grep -c '"loss"' "$TMP/a") steps, losses, norms and final parameters bit-identical to none"
    else
        fail "$3: differs from none: $(diff "$TMP/a" "$TMP/b" | head -n 3) ${out:-}"
    fi
}

# NP MODEL TP SP PP DTYPE [ARGS...]; layout_run: micro batch 2 x seq 64, 4 microbatches per step
for layout in "1 tiny 1 0 1 fp32" "1 tiny-llama 1 0 1 fp32" "2 tiny 2 0 1 fp32 --tp 2" \
    "2 tiny-llama 1 0 2 fp32 --pp 2" "2 tiny 2 1 1 fp32 --tp 2 --sequence-parallel" \
    "1 tiny-llama 1 0 1 bf16 --dtype bf16" "2 tiny 2 1 1 bf16 --tp 2 --sequence-parallel --dtype bf16"; do
    set -- $layout
    np=$1 model=$2 tp=$3 sp=$4 pp=$5 dtype=$6
    shift 6
    label="$model np $np${*:+ $*}"
    tag=$(echo "$np $model $*" | tr -c 'a-z0-9\n' '_')
    prev=
    for mode in none selective full; do
        run="$TMP/$mode.$tag.json"
        layout_run "$run" "$np" --model "$model" --recompute $mode "$@" || continue 2
        [ "$mode" = none ] || same "$TMP/none.$tag.json" "$run" "$label --recompute $mode"
        want=$("$PY" "$top_srcdir/test/act_bytes.py" "$model" 2 64 "$tp" "$sp" "$pp" 4 1f1b $mode $dtype)
        got="$(mem "$run" activations) $(mem "$run" workspace)"
        acts=${got% *}
        if [ "$got" = "$want" ] && { [ -z "$prev" ] || [ "$acts" -lt "$prev" ]; }; then
            pass "$label --recompute $mode: activations + workspace $got bytes (formula $want)${prev:+, activations below $prev of the previous mode}"
        else
            fail "$label --recompute $mode: activations + workspace '$got' bytes, formula '$want', previous mode's activations '$prev'"
        fi
        prev=$acts
    done
done

expect_exit2 "--recompute 'some': allowed values are none|selective|full" "$DTRAIN" $(tiny_args) --recompute some
finish
