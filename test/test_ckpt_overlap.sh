#!/bin/sh
# --ckpt-async with the host copy overlapped with the next step (the
# writer thread copies the live parameters and AdamW moments while the
# next step's forward and backward run; the trainer waits for the copy
# before its optimizer update): the checkpoint holds exactly the state at
# its step. The test-only DTRAIN_TEST_CKPT_COPY_DELAY_MS=400 holds the
# writer's copy back until the next step has long reached its update, so
# without that wait the checkpoint would hold the next step's state.
# Per layout, 10 steps (micro batch 2 of a global 8: accumulation),
# checkpoints at 5 and 10, asynchronous against synchronous: every tensor
# of both checkpoints bit-identical, the same losses. Layouts: 1 rank and
# pp2 (the writer's copy), 1 rank and pp2 under DTRAIN_DEFER_OPS=1 (the
# deferred table: the copy begun on the backend's "side stream" with
# to_host_begin, as on CUDA, and ended before the update; the writer must
# wait for that end), dp2 ZeRO-1 (sharded: the copy stays at the
# boundary, checked too).
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
ARGS="$(tiny_args) --threads 1 --steps 10 --warmup 2 --micro-batch 2 --global-batch 8 --seq-len 64 \
      --val-every 0 --sample-tokens 0 --ckpt-every 5"
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }
same_ckpt() { # A B: every tensor of checkpoints A and B bit-identical (in $TMP/same)
    "$PY" "$top_srcdir/test/same_ckpt.py" "$1" "$2" 20 >"$TMP/same" 2>&1
}

export DTRAIN_TEST_CKPT_COPY_DELAY_MS=400 DTRAIN_DEFER_OPS=0
for layout in "1 overlap" "2 overlap --pp 2" "1 device" "2 device --pp 2" "2 boundary --dp 2 --zero 1"; do
    set -- $layout
    np=$1
    how=$2
    shift 2
    DTRAIN_DEFER_OPS=0
    [ "$how" = device ] && DTRAIN_DEFER_OPS=1
    name="np$np${1:+ $*}$([ "$how" = device ] && echo " deferred ops")"
    d="$TMP/np$np$(echo "$*" | tr -d ' -')$how"
    "$MPIEXEC" --quiet -x DTRAIN_DEFER_OPS -np "$np" "$DTRAIN" $ARGS "$@" --ckpt-dir "$d/sync" \
        --metrics "$d/sync.json" >"$d.sync.log" 2>&1 ||
        { fail "$name sync: exit status $? $(tail -n 3 "$d.sync.log")"; continue; }
    "$MPIEXEC" --quiet -x DTRAIN_TEST_CKPT_COPY_DELAY_MS -x DTRAIN_DEFER_OPS -np "$np" "$DTRAIN" $ARGS "$@" \
        --ckpt-dir "$d/async" --ckpt-async --metrics "$d/async.json" >"$d.async.log" 2>&1 ||
        { fail "$name async: exit status $? $(tail -n 3 "$d.async.log")"; continue; }
    # the path this layout must take
    if [ "$how" = boundary ]; then want="copied to host"; else want="handed to the writer"; fi
    if grep -q "^checkpoint: step 5 $want" "$d.async.log" &&
        { [ "$how" != device ] || grep -q "DTRAIN_DEFER_OPS=1" "$d.async.log"; }; then
        pass "$name: the step-5 checkpoint's copy: $want"
    else
        fail "$name: no 'checkpoint: step 5 $want' line: $(grep '^checkpoint' "$d.async.log" | head -n 2)"
    fi
    for s in 5 10; do
        f=$(printf step_%08d.h5 "$s")
        if same_ckpt "$d/sync/$f" "$d/async/$f"; then
            pass "$name: --ckpt-async step-$s checkpoint bit-identical to the synchronous one: $(cat "$TMP/same")"
        else
            fail "$name: --ckpt-async step-$s checkpoint against the synchronous one: $(cat "$TMP/same")"
        fi
    done
    if losses "$d/sync.json" >"$TMP/a" && losses "$d/async.json" >"$TMP/b" && [ "$(wc -l <"$TMP/a")" -eq 10 ] &&
        cmp -s "$TMP/a" "$TMP/b"; then
        pass "$name: the 10 losses bit-identical with and without --ckpt-async"
    else
        fail "$name: losses differ: $(diff "$TMP/a" "$TMP/b" | head -n 4)"
    fi
done
finish
