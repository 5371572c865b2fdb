#!/bin/sh
# A run is a pure function of its configuration and seed: two runs give
# bit-identical losses and gradient norms at every step (printed with 9
# significant digits, enough to round-trip fp32), with gradient
# accumulation too; another seed gives different losses.
. "$top_srcdir/test/common.sh"

run() { # out.json extra-args...
    out=$1
    shift
    "$DTRAIN" $(tiny_args) --steps 6 --warmup 2 --micro-batch 4 --seq-len 64 --val-every 3 --val-batches 2 \
        --sample-tokens 0 --metrics "$out" "$@" >/dev/null 2>"$TMP/err" || { fail "run $*: $(cat "$TMP/err")"; return; }
}

# timing fields vary between runs; everything else must be identical
strip_timing() { sed 's/, "ms": .*//' "$1"; }

for model in tiny tiny-llama; do
    run "$TMP/a.json" --model $model
    run "$TMP/b.json" --model $model
    strip_timing "$TMP/a.json" >"$TMP/a.n"
    strip_timing "$TMP/b.json" >"$TMP/b.n"
    n=$(grep -c '"loss"' "$TMP/a.json")
    if [ "$n" -eq 6 ] && cmp -s "$TMP/a.n" "$TMP/b.n"; then
        pass "$model: two runs give identical losses, val losses, lr and norms at all $n steps"
    else
        fail "$model: reruns differ ($n steps)"
        diff "$TMP/a.n" "$TMP/b.n" | head
    fi
done

# gradient accumulation: 2 microbatches of 2 rows
run "$TMP/c.json" --micro-batch 2 --global-batch 4
run "$TMP/d.json" --micro-batch 2 --global-batch 4
strip_timing "$TMP/c.json" >"$TMP/c.n"
strip_timing "$TMP/d.json" >"$TMP/d.n"
if cmp -s "$TMP/c.n" "$TMP/d.n" && [ "$(grep -c '"loss"' "$TMP/c.json")" -eq 6 ]; then
    pass "accumulation 2: reruns identical"
else
    fail "accumulation 2: reruns differ"
fi
# same global batch as 1 x 4: same data, losses equal to fp32 reduction noise
run "$TMP/a.json" --model tiny
for step in 1 6; do
    tol=1e-5
    [ $step -eq 6 ] && tol=1e-4 # five optimizer steps amplify the reduction-order noise
    expect_close "step $step loss, micro 4 x 1 vs micro 2 x 2" \
        "$(json_field "$TMP/a.json" $step loss)" "$(json_field "$TMP/c.json" $step loss)" $tol
done

# nanoGPT's headerless uint16 file of the same tokens trains identically
f=$(ls $DATA_TRAIN | head -n 1)
tail -c +1025 "$f" >"$TMP/train.bin"
tail -c +1025 "$(ls $DATA_VAL | head -n 1)" >"$TMP/val.bin"
run "$TMP/r.json" --model tiny --data "$TMP/train.bin" --val-data "$TMP/val.bin" --data-format raw-u16
strip_timing "$TMP/a.json" >"$TMP/a.n"
strip_timing "$TMP/r.json" >"$TMP/r.n"
if [ -s "$TMP/r.n" ] && cmp -s "$TMP/a.n" "$TMP/r.n"; then
    pass "--data-format raw-u16 on the same tokens: identical losses, val losses and norms"
else
    fail "--data-format raw-u16 differs from the llm.c shard"
fi

run "$TMP/e.json" --model tiny --seed 99
if [ "$(json_field "$TMP/a.json" 1 loss)" != "$(json_field "$TMP/e.json" 1 loss)" ]; then
    pass "another seed gives another loss"
else
    fail "seed 99 gave the same loss as seed 1337"
fi
finish
