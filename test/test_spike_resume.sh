#!/bin/sh
# The loss-spike guard across a resume and its bound on rollbacks
# (src/train/spike.h, checkpoint attribute spike_state, --spike-rollbacks):
#  - window: one microbatch loss of batch 15 times 20; a run stopped at its
#    step-12 checkpoint and resumed skips step 15 as the uninterrupted run
#    does (with an empty window after the resume it would not judge before
#    10 new losses): the same spike lines, losses and final parameters, at
#    1 rank and at dp2;
#  - run of skips: non-finite batches 12 and 13, --spike-max 2, a checkpoint
#    at step 12 (after skipped step 12): the resumed run counts step 13 as
#    the second skip in a row and rolls back as the uninterrupted one;
#  - --spike-rollbacks: non-finite batches 8-11, --spike-max 2: with 1 the
#    second rollback to the step-5 checkpoint stops the run (one line, exit
#    1 on every rank at dp2); with the default 3 it goes on and completes.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
ARGS="$(tiny_args) --threads 1 --steps 20 --warmup 3 --micro-batch 2 --global-batch 8 --seq-len 64 \
      --val-every 0 --sample-tokens 0"
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }
# spikes LOG FROM: the guard's lines about steps after FROM, paths removed
# (the step of "step N/M skipped", the last of "(steps A-B)")
spikes() {
    grep '^spike' "$1" | awk -v f="$2" '{ n = $3; if (match($0, /\(steps [0-9]+-[0-9]+\)/)) { s = substr($0, RSTART, RLENGTH); gsub(/.*-|\)/, "", s); n = s } split(n, a, "/"); if (a[1] + 0 > f) print }' |
        sed 's| back to [^ ]*/| back to |'
}
run() { # name np args...: metrics in $TMP/name.json, output in $TMP/name.log
    name=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $ARGS --metrics "$TMP/$name.json" "$@" >"$TMP/$name.log" 2>&1
}

# same_as_resumed WHAT TAG NP FROM ARGS...: the run with ARGS uninterrupted
# and stopped at step FROM then resumed decide and compute alike
same_as_resumed() {
    what=$1 t=$2 np=$3 from=$4
    shift 4
    run "u$t" "$np" "$@" --ckpt-dir "$TMP/u$t" --save-params "$TMP/u$t.h5" &&
        run "s$t" "$np" "$@" --ckpt-dir "$TMP/s$t" --stop-at-step "$from" &&
        run "r$t" "$np" "$@" --ckpt-dir "$TMP/s$t" --resume auto --save-params "$TMP/r$t.h5" ||
        { fail "$what: runs failed: $(tail -n 1 "$TMP/u$t.log" "$TMP/s$t.log" "$TMP/r$t.log" 2>/dev/null)"; return; }
    spikes "$TMP/u$t.log" "$from" >"$TMP/su$t"
    spikes "$TMP/r$t.log" "$from" >"$TMP/sr$t"
    losses "$TMP/u$t.json" | awk -v f="$from" '$1 > f' >"$TMP/lu$t"
    losses "$TMP/r$t.json" >"$TMP/lr$t"
    if [ -s "$TMP/su$t" ] && cmp -s "$TMP/su$t" "$TMP/sr$t" && cmp -s "$TMP/lu$t" "$TMP/lr$t" &&
        ! grep -q "window starts empty" "$TMP/r$t.log" &&
        out=$("$PY" "$top_srcdir/test/compare_params.py" "$TMP/u$t.h5" "$TMP/r$t.h5" 0); then
        pass "$what: resumed at step $from, the same decisions ($(wc -l <"$TMP/su$t") spike lines: $(head -c 60 "$TMP/su$t")...), $(wc -l <"$TMP/lr$t") losses, parameters $out"
    else
        fail "$what: after the resume at step $from: uninterrupted '$(cat "$TMP/su$t")', resumed '$(cat "$TMP/sr$t")'; losses $(diff "$TMP/lu$t" "$TMP/lr$t" | head -n 3) ${out:-}"
    fi
}

for layout in "1" "2 --dp 2"; do
    set -- $layout
    np=$1
    shift
    tag=$(echo "$np$*" | tr -d ' -')
    DTRAIN_TEST_INJECT_SPIKE=15:20 same_as_resumed "np $np $*: spike at step 15 (window)" "w$tag" "$np" 12 \
        --ckpt-every 12 "$@"
    DTRAIN_TEST_INJECT_NAN=12,13 same_as_resumed "np $np $*: skips at steps 12-13 (run of skips)" "k$tag" "$np" 12 \
        --spike-max 2 --ckpt-every 4 "$@"
done
if grep -q "^spike: step 15/20 skipped: loss" "$TMP/uw1.log" &&
    grep -q "^spike: 2 steps skipped in a row (steps 12-13): back to .*step_00000012.h5" "$TMP/uk1.log"; then
    pass "the uninterrupted runs skip step 15 and roll back at step 13"
else
    fail "the uninterrupted runs did not decide as planned: $(grep '^spike' "$TMP/uw1.log" "$TMP/uk1.log")"
fi
"$PY" -c "import h5py, sys; del h5py.File(sys.argv[1], 'r+').attrs['spike_state']" "$TMP/sw1/step_00000012.h5" &&
    DTRAIN_TEST_INJECT_SPIKE=15:20 run old 1 --resume "$TMP/sw1/step_00000012.h5" --ckpt-dir "$TMP/old" ||
    fail "resume from a checkpoint without spike_state: $(tail -n 1 "$TMP/old.log")"
if [ "$(grep -c "resume: note: .* has no loss-spike window .*: the --spike-z window starts empty" "$TMP/old.log")" -eq 1 ] &&
    ! grep -q '^spike' "$TMP/old.log"; then
    pass "a checkpoint without spike_state (an older dtrain's): one note, an empty window (step 15 not judged)"
else
    fail "older checkpoint: $(grep 'note\|^spike' "$TMP/old.log")"
fi

# ---- the bound on rollbacks ----
R="--spike-max 2 --ckpt-every 5"
DTRAIN_TEST_INJECT_NAN=8,9,10,11 run rb1 2 --dp 2 $R --ckpt-dir "$TMP/rb1" --spike-rollbacks 1
rc=$?
line="spike: 2 steps skipped in a row (steps 6-7) after 1 rollback to $TMP/rb1/step_00000005.h5 with no newer checkpoint (--spike-rollbacks 1): stopping"
if [ "$rc" -eq 1 ] && grep -q "^dtrain: error: $line" "$TMP/rb1.log" && ! grep -q -i "watchdog\|timed out" "$TMP/rb1.log"; then
    pass "--spike-rollbacks 1: exit 1 on the second rollback: $(grep 'error' "$TMP/rb1.log" | head -n 1)"
else
    fail "--spike-rollbacks 1: exit $rc, $(tail -n 3 "$TMP/rb1.log")"
fi
DTRAIN_TEST_INJECT_NAN=8,9,10,11 run rb3 2 --dp 2 $R --ckpt-dir "$TMP/rb3"
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c '^spike: 2 steps skipped in a row .*back to' "$TMP/rb3.log")" -eq 2 ] &&
    grep -q "steps 6-7): back to $TMP/rb3/step_00000005.h5 (step 5), .* (step 6 reads batch 12)" "$TMP/rb3.log"; then
    pass "default --spike-rollbacks 3: two rollbacks to step 5, on from batch 12, the run completes"
else
    fail "default --spike-rollbacks: exit $rc, $(grep '^spike' "$TMP/rb3.log" | tail -n 2)"
fi
D="--data $DATA_TRAIN --val-data $DATA_VAL"
expect_exit2 "--spike-window 1025: out of range (0 to 1024)" "$DTRAIN" --spike-window 1025 $D
expect_exit2 "--spike-rollbacks -1: out of range" "$DTRAIN" --spike-rollbacks -1 $D
finish
