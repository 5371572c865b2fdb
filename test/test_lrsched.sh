#!/bin/sh
# --lr-schedule: the learning rate of every step of short runs, for each
# schedule and decay shape, against the formulas computed here in Python
# (Megatron-LM's optimizer_param_scheduler.py WSD branch and llm.c's
# schedulers.h, written out independently of src/optim/optim.c); a resume inside
# a wsd decay bit-identical to the uninterrupted run; the banner and --plan
# naming the schedule; bad values one line and exit 2.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
STEPS=20
ARGS="$(tiny_args) --threads 1 --steps $STEPS --warmup 3 --lr 2e-3 --min-lr 2e-4 --micro-batch 2 --seq-len 32 \
      --val-every 0 --sample-tokens 0"

# expected lr of 0-based step s; argv: kind shape decay_steps
cat >"$TMP/ref.py" <<'PYEOF'
import math, sys, json
kind, shape, decay = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps, warmup, lr, mn = 20, 3, 2e-3, 2e-4
def at(s):
    if s < warmup:
        return lr * (s + 1) / warmup                      # llm.c's warmup
    if kind == "constant":
        return lr
    if kind == "wsd":
        n = decay if decay > 0 else steps - int(0.8 * steps)  # llm.c's decay point
        start = steps - n                                     # Megatron's wsd_anneal_start
        if s <= start:
            return lr
        r = (s - start) / n
        c = {"linear": 1 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1), "1-sqrt": 1 - math.sqrt(r)}[shape]
        return mn + c * (lr - mn)
    p = (s - warmup) / (steps - warmup - 1)                   # min_lr at the last step
    c = 1 - p if kind == "linear" else 0.5 * (1 + math.cos(math.pi * p))
    return mn + c * (lr - mn)
bad = []
for line in open(sys.argv[4]):
    r = json.loads(line)
    if "lr" not in r:
        continue
    want = at(r["step"] - 1)
    if abs(r["lr"] - want) > 1e-8 * want:
        bad.append("step %d: %.9g, expected %.9g" % (r["step"], r["lr"], want))
print("; ".join(bad[:3]) if bad else "%d steps match" % steps)
sys.exit(1 if bad else 0)
PYEOF

for case in "cosine - 0" "linear - 0" "constant - 0" "wsd linear 8" "wsd cosine 8" "wsd 1-sqrt 8" "wsd - 0"; do
    set -- $case
    extra="--lr-schedule $1"
    [ "$2" != "-" ] && extra="$extra --decay-shape $2"
    [ "$3" != "0" ] && extra="$extra --decay-steps $3"
    shape=$2
    [ "$shape" = "-" ] && shape=1-sqrt
    if "$DTRAIN" $ARGS $extra --metrics "$TMP/m.json" >"$TMP/log" 2>&1 &&
        out=$("$PY" "$TMP/ref.py" "$1" "$shape" "$3" "$TMP/m.json"); then
        pass "$extra: $out"
    else
        fail "$extra: ${out:-$(tail -n 2 "$TMP/log")}"
    fi
done
if grep -q "^lr schedule: wsd: warmup 3, stable at 0.002, 1-sqrt decay over the last 4 of 20 steps towards 0.0002" \
    "$TMP/log"; then
    pass "banner: $(grep '^lr schedule' "$TMP/log")"
else
    fail "banner has no wsd schedule line: $(grep '^lr schedule' "$TMP/log")"
fi

# the default is today's cosine, bit for bit: the same losses as --lr-schedule cosine
"$DTRAIN" $ARGS --metrics "$TMP/d.json" >/dev/null 2>&1
"$DTRAIN" $ARGS --lr-schedule cosine --metrics "$TMP/c.json" >/dev/null 2>&1
if cmp -s "$(strip_timing "$TMP/d.json" >"$TMP/d"; echo "$TMP/d")" "$(strip_timing "$TMP/c.json" >"$TMP/c"; echo "$TMP/c")"; then
    pass "the default schedule is cosine"
else
    fail "the default differs from --lr-schedule cosine"
fi

# ---- a resume inside the decay: 14 steps (--stop-at-step) + 6 at dp2 == 20 straight ----
W="--lr-schedule wsd --decay-steps 10 --decay-shape cosine"
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS $W --metrics "$TMP/full.json" --save-params "$TMP/full.h5" \
    >"$TMP/full.log" 2>&1 || fail "wsd straight run: $(tail -n 2 "$TMP/full.log")"
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS $W --ckpt-dir "$TMP/ck" --stop-at-step 14 --metrics "$TMP/h1.json" \
    >"$TMP/h1.log" 2>&1 || fail "wsd first half: $(tail -n 2 "$TMP/h1.log")"
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS $W --ckpt-dir "$TMP/ck" --resume auto --metrics "$TMP/h2.json" \
    --save-params "$TMP/half.h5" >"$TMP/h2.log" 2>&1 || fail "wsd resumed half: $(tail -n 2 "$TMP/h2.log")"
losses "$TMP/full.json" | tail -n 6 >"$TMP/a"
losses "$TMP/h2.json" >"$TMP/b"
if [ "$(wc -l <"$TMP/b")" -eq 6 ] && cmp -s "$TMP/a" "$TMP/b" &&
    out=$("$PY" "$top_srcdir/test/compare_params.py" "$TMP/full.h5" "$TMP/half.h5" 0); then
    pass "wsd resumed at step 14, inside the decay: losses and parameters bit-identical ($out)"
else
    fail "wsd resume inside the decay differs: $(diff "$TMP/a" "$TMP/b" | head -n 4)"
fi
if "$PY" -c "import h5py,sys; a=h5py.File(sys.argv[1],'r').attrs; \
sys.exit(0 if (a['lr_schedule'], int(a['decay_steps']), a['decay_shape']) == ('wsd', 10, 'cosine') else 1)" \
    "$TMP/ck/step_00000014.h5"; then
    pass "the checkpoint records lr_schedule wsd, decay_steps 10, decay_shape cosine"
else
    fail "the checkpoint's schedule attributes are wrong or missing"
fi

# ---- --plan names the schedule ----
if "$DTRAIN" --plan $(tiny_args) --lr-schedule wsd --steps 100 --decay-steps 30 --decay-shape linear >"$TMP/plan" 2>&1 &&
    grep -q "^lr schedule: wsd: warmup 50, stable at 0.001, linear decay over the last 30 of 100 steps" "$TMP/plan"; then
    pass "--plan: $(grep '^lr schedule' "$TMP/plan")"
else
    fail "--plan has no schedule line: $(grep -i 'lr\|error' "$TMP/plan" | head -n 2)"
fi

# ---- bad values ----
D="--data $DATA_TRAIN --val-data $DATA_VAL"
expect_exit2 "--lr-schedule 'step': allowed values are cosine|linear|wsd|constant" "$DTRAIN" --lr-schedule step $D
expect_exit2 "--decay-shape 'exp': allowed values are linear|cosine|1-sqrt" "$DTRAIN" --lr-schedule wsd --decay-shape exp $D
expect_exit2 "--decay-steps shapes the decay of --lr-schedule wsd; this run's schedule is cosine" "$DTRAIN" \
    --decay-steps 10 $D
expect_exit2 "--decay-shape shapes the decay of --lr-schedule wsd; this run's schedule is linear" "$DTRAIN" \
    --lr-schedule linear --decay-shape cosine $D
expect_exit2 "--lr-schedule wsd: --warmup 50 plus 60 decay steps exceed --steps 100" "$DTRAIN" --lr-schedule wsd \
    --steps 100 --decay-steps 60 $D
expect_exit2 "--decay-steps -1: out of range" "$DTRAIN" --lr-schedule wsd --decay-steps -1 $D
finish
