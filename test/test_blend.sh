#!/bin/sh
# Megatron indexed datasets as training data (--data-format megatron) and
# weighted blends (--data "W1 PATH1 W2 PATH2 ..."), src/data/data.h, src/data/blend.h:
#  - Megatron files written by an independent writer (test/megatron_writer.py)
#    in every integer dtype train to the same losses as the same tokens in
#    an llm.c shard; with --doc-mask, the index's documents (split into
#    several sentence sequences too) give the losses the boundary tokens give
#  - a blend's share of each dataset within one sample of weight x n for
#    every n; the same sample order at 1 rank, dp2, tp2 and pp2 (the order
#    dumped by the test-only DTRAIN_TEST_DUMP_SAMPLES), losses within the
#    layout tolerances; resuming mid-blend is bit-identical to an
#    uninterrupted run and the checkpoint records each dataset's position
#  - bad inputs: one line, exit 2
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
"$PY" -c "import numpy, h5py" 2>/dev/null || { echo "SKIP: no python3 with numpy and h5py"; exit 77; }
W="$PY $top_srcdir/test/megatron_writer.py"
BYTE="$top_builddir/data/gutenberg_train_000000.bin"
BYTE_VAL="$top_builddir/data/gutenberg_val_000000.bin"
GPT2="$top_builddir/data/gutenberg-gpt2_train_000000.bin"
GPT2_VAL="$top_builddir/data/gutenberg-gpt2_val_000000.bin"
SHORT="--peak-gflops 100 --threads 1 --micro-batch 2 --seq-len 64 --sample-tokens 0 --val-every 4 --val-batches 2"

# train OUT ARGS...: a 4-step tiny run, its metrics in OUT
train() {
    out=$1
    shift
    "$DTRAIN" --model tiny $SHORT --steps 4 --metrics "$out" "$@" >"$out.log" 2>&1 ||
        { fail "$(basename "$out"): exit $? $(tail -n 2 "$out.log")"; return 1; }
}
same_losses() { # A B LABEL
    if [ -s "$1" ] && cmp -s "$(strip_timing "$1" >"$TMP/sa"; echo "$TMP/sa")" \
        "$(strip_timing "$2" >"$TMP/sb"; echo "$TMP/sb")"; then
        pass "$3: the same losses, bit for bit ($(wc -l <"$1") lines)"
    else
        fail "$3: losses differ: $(diff "$TMP/sa" "$TMP/sb" | head -n 3)"
    fi
}

# ---- 1. every integer dtype = the llm.c shard ----
train "$TMP/llmc.json" --data "$BYTE" --val-data "$BYTE_VAL"
$W --from "$BYTE_VAL" "$TMP/val_u16"
for dt in uint8 int16 int32 int64 uint16; do
    $W --from "$BYTE" --dtype $dt --sentences 2 "$TMP/train_$dt" &&
        train "$TMP/$dt.json" --data-format megatron --data "$TMP/train_$dt" --val-data "$TMP/val_u16" &&
        same_losses "$TMP/llmc.json" "$TMP/$dt.json" "megatron $dt vs llm.c shard"
done
# a glob of .idx files (two halves of the corpus) is one dataset, in path order
$W --from "$BYTE" --first 400000 "$TMP/half_a"
$W --from "$BYTE" --skip 400000 "$TMP/half_b"
if train "$TMP/glob.json" --data "megatron:$TMP/half_*.idx" --val-data "$BYTE_VAL" &&
    grep -q "^data: train 797371 tokens" "$TMP/glob.json.log"; then
    pass "a glob of two .idx files is one dataset: $(grep '^data:' "$TMP/glob.json.log" | cut -c1-60)"
else
    fail "glob of .idx files: $(grep '^data:' "$TMP/glob.json.log")"
fi

# ---- 2. --doc-mask: the index's documents = the boundary tokens ----
"$DTRAIN" --model tiny-gpt2 $SHORT --steps 4 --doc-mask --data "$GPT2" --val-data "$GPT2_VAL" \
    --metrics "$TMP/dm_llmc.json" >"$TMP/dm_llmc.log" 2>&1 || fail "doc-mask llmc run: $(tail -n 2 "$TMP/dm_llmc.log")"
$W --from "$GPT2" --split-at 50256 --sentences 3 "$TMP/g2" && $W --from "$GPT2_VAL" --split-at 50256 "$TMP/g2v" &&
    "$DTRAIN" --model tiny-gpt2 $SHORT --steps 4 --doc-mask --data-format megatron --data "$TMP/g2" --val-data "$TMP/g2v" \
        --metrics "$TMP/dm_meg.json" >"$TMP/dm_meg.log" 2>&1 &&
    same_losses "$TMP/dm_llmc.json" "$TMP/dm_meg.json" "--doc-mask: Megatron documents (3 sequences each) vs <|endoftext|> tokens"
# byte data has no boundary token, but an index has documents: masked, and
# different from unmasked
$W --from "$BYTE" --doc-len 20 "$TMP/short_docs"
train "$TMP/dm_byte.json" --doc-mask --data "megatron:$TMP/short_docs" --val-data "$BYTE_VAL" --steps 2 --val-every 0 &&
    train "$TMP/nodm_byte.json" --data "megatron:$TMP/short_docs" --val-data "$BYTE_VAL" --steps 2 --val-every 0 &&
    if cmp -s "$TMP/dm_byte.json" "$TMP/nodm_byte.json"; then fail "--doc-mask on an index changed nothing"; else
        pass "--doc-mask on a byte Megatron dataset (documents of 20) masks: losses differ from unmasked"; fi

# ---- 3. blends ----
$W --from "$BYTE" --first 200000 "$TMP/A" && $W --from "$BYTE" --first 120000 --dtype int32 "$TMP/B"
BLEND="0.5 $TMP/A 0.3 $TMP/B 0.2 llmc:$BYTE"
# the share property over 960 samples, from the dumped order
DTRAIN_TEST_DUMP_SAMPLES="$TMP/share.txt" "$DTRAIN" --model tiny --peak-gflops 100 --threads 2 --micro-batch 16 \
    --seq-len 8 --steps 60 --val-every 0 --sample-tokens 0 --data-format megatron --data "$BLEND" \
    >"$TMP/share.log" 2>&1 || fail "blend run: $(tail -n 2 "$TMP/share.log")"
if out=$("$PY" - "$TMP/share.txt" <<'EOF2'
import sys
rows = sorted({tuple(map(int, l.split())) for l in open(sys.argv[1])})
w = [0.5, 0.3, 0.2]
assert [r[0] for r in rows] == list(range(len(rows))), "samples missing"
c, worst, nxt = [0, 0, 0], 0.0, [0, 0, 0]
for n, (g, i, j) in enumerate(rows, 1):
    assert j == nxt[i], f"sample {g}: dataset {i} draw {j}, expected {nxt[i]}"
    nxt[i] += 1
    c[i] += 1
    worst = max(worst, max(abs(c[k] - w[k] * n) for k in range(3)))
assert worst < 1, f"a share lags or leads by {worst}"
print(f"{len(rows)} samples, shares {c}, worst |count - w n| = {worst:.3f}")
EOF2
); then pass "blend 0.5/0.3/0.2: within one sample of w n for every n: $out"; else fail "blend share: $out"; fi

# the same order and losses at 1 rank, dp2, tp2, pp2
for lay in "1" "2 --dp 2" "2 --tp 2" "2 --pp 2"; do
    set -- $lay
    np=$1
    shift
    name=$(echo "np$np $*" | tr -d ' -')
    DTRAIN_TEST_DUMP_SAMPLES="$TMP/order.$name" layout_run "$TMP/blend.$name.json" "$np" "$@" --data-format megatron \
        --data "$BLEND" --val-data "0.6 $TMP/val_u16 0.4 llmc:$BYTE_VAL" || continue
    sort -n -u "$TMP/order.$name" >"$TMP/order.$name.s"
    if [ "$name" = np1 ]; then
        pass "blend at 1 rank: $(wc -l <"$TMP/order.np1.s") samples"
    else
        if cmp -s "$TMP/order.np1.s" "$TMP/order.$name.s"; then
            pass "blend $*: the same sample order as 1 rank, bit for bit"
        else
            fail "blend $*: sample order differs: $(diff "$TMP/order.np1.s" "$TMP/order.$name.s" | head -n 3)"
        fi
        layout_compare "$TMP/blend.np1.json" "$TMP/blend.$name.json" "blend $*"
    fi
done

# resume mid-blend: 10 steps vs 5 + resume, bit-identical; the checkpoint's
# data_drawn_<i> = each dataset's samples among the first 5 x 8
R="--model tiny --peak-gflops 100 --threads 1 --micro-batch 2 --global-batch 8 --seq-len 64 --sample-tokens 0 --val-every 0 --data-format megatron --data"
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $R "$BLEND" --dp 2 --steps 10 --metrics "$TMP/full.json" >"$TMP/full.log" 2>&1 &&
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $R "$BLEND" --dp 2 --steps 10 --stop-at-step 5 --ckpt-dir "$TMP/ck" \
        >"$TMP/h1.log" 2>&1 &&
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $R "$BLEND" --dp 2 --steps 10 --ckpt-dir "$TMP/ck" --resume auto \
        --metrics "$TMP/h2.json" >"$TMP/h2.log" 2>&1 || fail "resume runs: $(tail -n 2 "$TMP/h2.log")"
sed -n '/"step": [6-9],\|"step": 10,/p' "$TMP/full.json" | sed 's/, "ms": .*//' >"$TMP/fa"
sed -n '/"step": [6-9],\|"step": 10,/p' "$TMP/h2.json" | sed 's/, "ms": .*//' >"$TMP/fb"
if [ -s "$TMP/fa" ] && cmp -s "$TMP/fa" "$TMP/fb" && ! grep -q "note: the checkpoint drew" "$TMP/h2.log"; then
    pass "blend: 5 steps at dp2 + resume = 10 uninterrupted steps, bit for bit"
else
    fail "blend resume differs: $(diff "$TMP/fa" "$TMP/fb" | head -n 3) $(grep note "$TMP/h2.log")"
fi
if out=$("$PY" - "$TMP/ck/step_00000005.h5" <<'EOF2'
import sys, h5py
a = h5py.File(sys.argv[1], "r").attrs
n = int(a["data_datasets"])
got = [int(a[f"data_drawn_{i}"]) for i in range(n)]
assert got == [20, 12, 8], got   # the first 40 samples at weights 0.5 0.3 0.2
print(f"data_datasets {n}, data_drawn {got}")
EOF2
); then pass "checkpoint records each dataset's position: $out"; else fail "checkpoint data attributes: $out"; fi

# ---- 4. bad inputs: one line, exit 2 ----
$W --tokens 1,2,3,300,4 "$TMP/big_id"
$W --from "$BYTE" --dtype int8 --first 1000 "$TMP/i8" 2>/dev/null
$W --from "$BYTE" --dtype float32 --first 1000 "$TMP/f32"
$W --from "$BYTE" --first 1000 --modes "$TMP/mm"
$W --from "$BYTE" --first 50 "$TMP/tiny_ds"
BAD="--model tiny --steps 1 --peak-gflops 100 --threads 1 --seq-len 64 --val-every 0 --sample-tokens 0 --data"
expect_exit2 "weight 'x' is not a positive number" "$DTRAIN" $BAD "0.5 $TMP/A x $TMP/B" --data-format megatron
expect_exit2 "weight '-0.3' is not a positive number" "$DTRAIN" $BAD "1.3 $TMP/A -0.3 $TMP/B" --data-format megatron
expect_exit2 "weight '0' is not a positive number" "$DTRAIN" $BAD "1 $TMP/A 0 $TMP/B" --data-format megatron
expect_exit2 "weight 0.5 has no path" "$DTRAIN" $BAD "1 $TMP/A 0.5" --data-format megatron
expect_exit2 "no megatron dataset matches '$TMP/nope'" "$DTRAIN" $BAD "0.5 $TMP/A 0.5 $TMP/nope" --data-format megatron
expect_exit2 "no token files match" "$DTRAIN" $BAD "0.5 megatron:$TMP/A 0.5 $TMP/nope_*.bin"
expect_exit2 "hold no sample of --seq-len 64" "$DTRAIN" $BAD "0.5 $TMP/A 0.5 $TMP/tiny_ds" --data-format megatron
expect_exit2 "value 300, outside the model's vocabulary" "$DTRAIN" $BAD "$TMP/big_id" --data-format megatron --seq-len 2
expect_exit2 "dtype int8 (ids up to 127), which cannot hold the model's vocabulary of 256" \
    "$DTRAIN" $BAD "$TMP/i8" --data-format megatron
expect_exit2 "dtype float32, which holds no token ids" "$DTRAIN" $BAD "$TMP/f32" --data-format megatron
expect_exit2 "is multimodal" "$DTRAIN" $BAD "$TMP/mm" --data-format megatron
expect_exit2 "value 300, outside" "$MPIEXEC" --quiet -np 2 "$DTRAIN" $BAD "$TMP/big_id" --data-format megatron \
    --seq-len 2 --dp 2 --micro-batch 1
expect_exit2 "--doc-mask: data" "$DTRAIN" $BAD "0.5 megatron:$TMP/A 0.5 $BYTE" --doc-mask

finish
