#!/bin/sh
# Loss spikes and non-finite steps (src/train/spike.h), with the test-only
# injection DTRAIN_TEST_INJECT_NAN / DTRAIN_TEST_INJECT_SPIKE:
#  - at 1 rank, dp2, tp2 and pp2: the gradients of batch 6 made non-finite
#    and one microbatch loss of batch 15 times 20; every layout skips exactly steps 6
#    and 15, names the first non-finite gradient, and continues exactly as
#    a run that never saw those batches: the reference stops before each,
#    has its checkpoint's step moved one on (h5py) and resumes, so it
#    never reads them; losses and final parameters bit-identical;
#  - --spike-max 2 with non-finite batches 8 and 9: back to the step-5
#    checkpoint, continuing on batch 10, as a run resumed from that
#    checkpoint with its data_skip set to 4; without a checkpoint, one line
#    and exit 1; --spike-max 0: the old "training diverged", exit 1;
#  - a skipped step still writes its --metrics record, with "skipped" and
#    the reason.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
ARGS="$(tiny_args) --threads 1 --steps 20 --warmup 3 --micro-batch 2 --global-batch 8 --seq-len 64 \
      --val-every 0 --sample-tokens 0"
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }
# bump CKPT ATTR VALUE: sets a checkpoint's integer attribute (the step or data_skip)
bump() { "$PY" -c "import h5py, sys, numpy as np; h5py.File(sys.argv[1], 'r+').attrs[sys.argv[2]] = np.int64(sys.argv[3])" "$@"; }
run() { # name np args...: metrics in $TMP/name.json, output in $TMP/name.log
    name=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $ARGS --metrics "$TMP/$name.json" "$@" >"$TMP/$name.log" 2>&1
}

decisions=""
for layout in "1" "2 --dp 2" "2 --tp 2" "2 --pp 2"; do
    set -- $layout
    np=$1
    shift
    L="np $np $*"
    tag=$(echo "$np$*" | tr -d ' -')
    DTRAIN_TEST_INJECT_NAN=6 DTRAIN_TEST_INJECT_SPIKE=15:20 run "inj$tag" "$np" "$@" --save-params "$TMP/inj$tag.h5" ||
        fail "$L: injected run: $(tail -n 2 "$TMP/inj$tag.log")"
    # the reference: 5 steps, skip batch 6, 8 more, skip batch 15, the rest
    run "r1$tag" "$np" "$@" --ckpt-dir "$TMP/ck$tag" --stop-at-step 5 &&
        bump "$TMP/ck$tag/step_00000005.h5" step 6 &&
        run "r2$tag" "$np" "$@" --ckpt-dir "$TMP/ck$tag" --resume auto --stop-at-step 14 &&
        bump "$TMP/ck$tag/step_00000014.h5" step 15 &&
        run "r3$tag" "$np" "$@" --ckpt-dir "$TMP/ck$tag" --resume auto --save-params "$TMP/ref$tag.h5" ||
        fail "$L: reference runs: $(tail -n 2 "$TMP/r3$tag.log" "$TMP/r2$tag.log" "$TMP/r1$tag.log" 2>/dev/null)"
    skipped=$(sed -n 's/^spike: step \([0-9]*\)\/20 skipped.*/\1/p' "$TMP/inj$tag.log" | tr '\n' ' ')
    decisions="$decisions|$skipped"
    if [ "$skipped" = "6 15 " ] &&
        grep -q "^spike: step 6/20 skipped: loss [0-9.]*, gradient norm -*nan; first non-finite gradient: rank [0-9] (tp [0-9] pp [0-9] dp 0), tensor [a-z]" "$TMP/inj$tag.log" &&
        grep -q "^spike: step 15/20 skipped: loss [0-9.]* is [0-9.]* standard deviations above the mean" "$TMP/inj$tag.log"; then
        pass "$L: steps 6 (non-finite gradients) and 15 (loss x20 on one microbatch) skipped: $(grep -o 'first non-finite gradient: [^;]*' "$TMP/inj$tag.log")"
    else
        fail "$L: skipped steps '$skipped': $(grep '^spike' "$TMP/inj$tag.log" | head -n 3)"
    fi
    losses "$TMP/inj$tag.json" | grep -v '^6 \|^15 ' | awk '$1 > 6' >"$TMP/a$tag"
    { losses "$TMP/r2$tag.json"; losses "$TMP/r3$tag.json"; } >"$TMP/b$tag"
    if [ "$(wc -l <"$TMP/a$tag")" -eq 13 ] && cmp -s "$TMP/a$tag" "$TMP/b$tag" &&
        out=$("$PY" "$top_srcdir/test/compare_params.py" "$TMP/inj$tag.h5" "$TMP/ref$tag.h5" 0); then
        pass "$L: the continuation equals a run that never read batches 6 and 15 (13 losses, parameters: $out)"
    else
        fail "$L: the continuation differs from the reference: $(diff "$TMP/a$tag" "$TMP/b$tag" | head -n 4) ${out:-}"
    fi
done
# the skipped steps keep their --metrics records, with the reason
s6=$(grep '^{"step": 6,' "$TMP/inj1.json")
s15=$(grep '^{"step": 15,' "$TMP/inj1.json")
if echo "$s6" | grep -q '"skipped": "nonfinite"}$' && echo "$s15" | grep -q '"skipped": "loss_spike"}$' &&
    [ "$(grep -c '"skipped"' "$TMP/inj1.json")" -eq 2 ] && [ "$(grep -c '"loss"' "$TMP/inj1.json")" -eq 20 ]; then
    pass "--metrics: 20 records, steps 6 and 15 with \"skipped\": nonfinite and loss_spike"
else
    fail "--metrics records of the skipped steps: '$s6' '$s15'"
fi
if [ "$decisions" = "|6 15 |6 15 |6 15 |6 15 " ]; then
    pass "the same decisions at every layout"
else
    fail "decisions differ between layouts: $decisions"
fi

# ---- rollback: non-finite batches 8 and 9 with --spike-max 2 ----
R="--spike-max 2 --ckpt-every 5"
DTRAIN_TEST_INJECT_NAN=8,9 run rb 2 --dp 2 $R --ckpt-dir "$TMP/rb" --save-params "$TMP/rb.h5" ||
    fail "rollback run: $(tail -n 2 "$TMP/rb.log")"
run rr1 2 --dp 2 $R --ckpt-dir "$TMP/rr" --stop-at-step 5 && bump "$TMP/rr/step_00000005.h5" data_skip 4 &&
    run rr2 2 --dp 2 $R --ckpt-dir "$TMP/rr" --resume auto --save-params "$TMP/rr.h5" ||
    fail "rollback reference: $(tail -n 2 "$TMP/rr2.log" "$TMP/rr1.log")"
losses "$TMP/rb.json" | awk '$1 > 5' | tail -n 15 >"$TMP/a"
losses "$TMP/rr2.json" >"$TMP/b"
if grep -q "^spike: 2 steps skipped in a row (steps 8-9): back to $TMP/rb/step_00000005.h5 (step 5), continuing on the data after the skipped batches (step 6 reads batch 10)" "$TMP/rb.log" &&
    [ "$(wc -l <"$TMP/b")" -eq 15 ] && cmp -s "$TMP/a" "$TMP/b" &&
    out=$("$PY" "$top_srcdir/test/compare_params.py" "$TMP/rb.h5" "$TMP/rr.h5" 0); then
    pass "rollback to step 5 on batch 10 on: equals a resume with data_skip 4 ($out)"
else
    fail "rollback: $(grep '^spike' "$TMP/rb.log" | tail -n 1); $(diff "$TMP/a" "$TMP/b" | head -n 4) ${out:-}"
fi
if "$PY" -c "import h5py,sys; sys.exit(0 if int(h5py.File(sys.argv[1],'r').attrs['data_skip']) == 4 else 1)" \
    "$TMP/rb/step_00000020.h5"; then
    pass "the checkpoints after the rollback record data_skip 4"
else
    fail "the step-20 checkpoint's data_skip is not 4"
fi

# ---- no checkpoint; the guard off ----
DTRAIN_TEST_INJECT_NAN=8,9 run nock 1 --spike-max 2
rc=$?
if [ "$rc" -eq 1 ] && grep -q "spike: 2 steps skipped in a row (steps 8-9) and no checkpoint to go back to: stopping" "$TMP/nock.log"; then
    pass "no checkpoint: exit 1, $(grep 'no checkpoint' "$TMP/nock.log")"
else
    fail "no checkpoint: exit $rc, $(tail -n 1 "$TMP/nock.log")"
fi
DTRAIN_TEST_INJECT_NAN=4 run off 1 --spike-max 0
rc=$?
if [ "$rc" -eq 1 ] && grep -q "step 4: loss [0-9.]*, gradient norm -*nan: training diverged" "$TMP/off.log"; then
    pass "--spike-max 0: exit 1, $(grep 'diverged' "$TMP/off.log")"
else
    fail "--spike-max 0: exit $rc, $(tail -n 1 "$TMP/off.log")"
fi
D="--data $DATA_TRAIN --val-data $DATA_VAL"
expect_exit2 "--spike-z -1: out of range" "$DTRAIN" --spike-z -1 $D
expect_exit2 "--spike-max 'x': not an integer" "$DTRAIN" --spike-max x $D
finish
