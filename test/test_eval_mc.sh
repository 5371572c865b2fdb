#!/bin/sh
# --eval-mc (issue 38): multiple-choice files scored during training.
# Two eval files are made here from the bundled validation corpus by a
# writer written from llm.c's format (version 1, uint16 words): 24
# examples of 2 to 5 completions of 1 to 12 tokens after contexts of 3 to
# 90 tokens (longer than --seq-len 64: cut from the start), and a second
# file of 4 examples. After 20 steps of tiny (and tiny-llama) the scores
# dtrain dumps (--eval-mc-dump) equal, example by example, a float64
# PyTorch computation from the saved parameters (test/ref/mc_ref.py:
# every summed and mean loss within 1e-5 relative, the same picks) at
# 1 rank, tp2 x pp2, tp2 x dp2 with ZeRO-3 and cp2 x dp2 with ZeRO-1; the accuracies in
# --metrics and the step line are the dump's. Bad input is refused in
# one line.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
# make_mc OUT N SEED [SHARD]: N examples from a validation shard's tokens
make_mc() {
    "$PY" - "$1" "$2" "$3" "${4:-$top_builddir/data/gutenberg_val_000000.bin}" <<'EOF'
import random, struct, sys
import numpy as np
out, n, seed, shard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tok = np.fromfile(shard, dtype="<u2", offset=1024).astype(int)
rng = random.Random(seed)
stream, longest = [], 0
for e in range(n):
    at = rng.randrange(0, len(tok) - 200)
    ctx = list(tok[at:at + rng.randint(3, 90)])
    comps = []
    for _ in range(rng.randint(2, 5)):
        b = rng.randrange(0, len(tok) - 20)
        comps.append(list(tok[b:b + rng.randint(1, 12)]))
    label = rng.randrange(len(comps))
    comps[label] = list(tok[at + len(ctx):at + len(ctx) + rng.randint(1, 12)])  # the true continuation
    ex = [65535, 0, e, label, len(comps), len(ctx)] + ctx
    for c in comps:
        ex += [len(c)] + c
    ex[1] = 2 * len(ex)
    longest = max(longest, ex[1])
    stream += ex
hdr = [20240522, 1, n, longest] + [0] * 252
with open(out, "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(np.array(stream, dtype="<u2").tobytes())
EOF
}
make_mc "$TMP/story.bin" 24 1 && make_mc "$TMP/short.bin" 4 2 || { fail "could not write the eval files"; finish; }

ARGS="$(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 --global-batch 8 --seq-len 64 --val-every 0 \
     --sample-tokens 0 --eval-every 10"
run() { # NAME NP ARGS...: metrics, output, dump and parameters under $TMP/NAME.*
    name=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $ARGS --eval-mc "$TMP/story.bin" --eval-mc "$TMP/short.bin" \
        --eval-mc-dump "$TMP/$name.dump" --metrics "$TMP/$name.json" --save-params "$TMP/$name.h5" "$@" \
        >"$TMP/$name.log" 2>&1 || { fail "np $np $*: exit status $? $(tail -n 3 "$TMP/$name.log")"; return 1; }
}
reference() { # NAME LABEL: the dump's step-20 scores against PyTorch's
    for f in story short; do
        if out=$("$PY" "$top_srcdir/test/ref/mc_ref.py" --params "$TMP/$1.h5" --mc "$TMP/$f.bin" --seq-len 64 \
            --dump "$TMP/$1.dump" --step 20 2>&1); then
            pass "$2, $f: $(echo "$out" | tail -n 1)"
        else
            fail "$2, $f: $(echo "$out" | tail -n 3)"
        fi
    done
}

run one 1 && reference one "1 rank"
run tp2pp2 4 --tp 2 --pp 2 && reference tp2pp2 "tp2 x pp2"
run tp2dp2z3 4 --tp 2 --zero 3 && reference tp2dp2z3 "tp2 x dp2, ZeRO-3"
run llama 2 --model tiny-llama --tp 2 && reference llama "tiny-llama tp2"
# --cp: each CP rank sums the scored losses of its chunks, the DP x CP sum
# completes the rows; examples dealt to the data ranks
run cp2dp2 4 --cp 2 --zero 1 && reference cp2dp2 "cp2 x dp2, ZeRO-1"

# the metrics' accuracies are the dump's picks; the step line shows them
if [ -f "$TMP/one.json" ]; then
    out=$("$PY" - "$TMP/one.json" "$TMP/one.dump" <<'EOF'
import json, sys
recs = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "eval_mc" in r}
dump = [json.loads(l) for l in open(sys.argv[2])]
assert sorted(recs) == [10, 20], "eval_mc records at steps %s" % sorted(recs)
for step, r in recs.items():
    for name, m in r["eval_mc"].items():
        ex = [d for d in dump if d["step"] == step and d["file"] == name]
        acc = sum(d["pred_sum"] == d["label"] for d in ex) / len(ex)
        norm = sum(d["pred_mean"] == d["label"] for d in ex) / len(ex)
        assert m["examples"] == len(ex) and abs(m["acc"] - acc) < 1e-6 and abs(m["acc_norm"] - norm) < 1e-6, \
            (step, name, m, acc, norm)
print("steps 10 and 20: acc and acc_norm of story and short equal the dump's picks")
EOF
    ) && pass "metrics: $out" || fail "metrics: $out"
    grep -q "^step   20/20 | loss [0-9.]* | story acc_norm [0-9.]* acc [0-9.]* | short acc_norm" "$TMP/one.log" &&
        pass "the step line shows each file's accuracies" || fail "step line: $(grep '^step   20' "$TMP/one.log")"
fi

# ---- refused in one line ----
expect_exit2 "cannot open eval file $TMP/none.bin" "$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS --eval-mc "$TMP/none.bin"
head -c 2000 "$TMP/story.bin" >"$TMP/cut.bin"
expect_exit2 "cut.bin: example [0-9]*: " "$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS --eval-mc "$TMP/cut.bin"
make_mc "$TMP/gpt2.bin" 3 3 "$top_builddir/data/gutenberg-gpt2_val_000000.bin"
expect_exit2 "outside the model's vocabulary of 256" "$MPIEXEC" --quiet -np 1 "$DTRAIN" $ARGS --eval-mc "$TMP/gpt2.bin"
expect_exit2 "not a multiple-choice eval file (no magic 20240522)" "$MPIEXEC" --quiet -np 1 "$DTRAIN" $ARGS \
    --eval-mc "$top_builddir/data/gutenberg_val_000000.bin"
expect_exit2 "eval-mc-dump $TMP/d.jsonl writes --eval-mc's scores: add --eval-mc FILE" \
    "$MPIEXEC" --quiet -np 1 "$DTRAIN" $ARGS --eval-mc-dump "$TMP/d.jsonl"
finish
