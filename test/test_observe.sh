#!/bin/sh
# Seeing a run (issue 22):
#  - --tensorboard DIR (missing parents made): a tiny run's event file, read
#    by implementations that share nothing with io/tfevents.c (the TFRecord
#    framing and both masked CRC-32Cs of every record recomputed in
#    /usr/bin/python3, each payload parsed by python3-protobuf classes from
#    test/tbmin.proto, protoc --decode_raw on every payload), holds one
#    Event per --metrics line with the same values (test/tfevents_reader.py
#    --metrics), also when SIGUSR1 stops the run; a DIR that cannot be
#    made ends the run with one line; a --tensorboard or --metrics write
#    that fails mid-run (a file size limit) gives one warning each and the
#    run completes, exit 0 at dp2;
#  - the step line's time left to --steps and to the next checkpoint
#    ("| 2s left, ckpt in 1s"; days and hours for a long --steps);
#  - --straggler-every: one rank slowed by the test-only delay
#    DTRAIN_TEST_SLOW_RANK=R:MS is named, with its host and its ratio to the
#    median, by the first report (within 5 steps), at dp2, dp4 and
#    tp2 x dp2, printed and in --metrics; a malformed delay is refused.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3 # Debian's, with python3-protobuf and python3-crc32c
RUN="$(tiny_args) --threads 1 --micro-batch 2 --seq-len 64 --sample-tokens 0"

# ---- --tensorboard against --metrics ----
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN --steps 6 --val-every 3 --val-batches 2 --tensorboard "$TMP/tb/a/b" \
    --metrics "$TMP/tb.json" >"$TMP/tb.log" 2>&1 || fail "--tensorboard run: $(tail -n 3 "$TMP/tb.log")"
events=$(ls "$TMP"/tb/a/b/events.out.tfevents.* 2>/dev/null)
mkdir -p "$TMP/pb2" "$TMP/pay"
if [ "$(echo "$events" | wc -w)" -ne 1 ]; then
    fail "--tensorboard: wanted one event file in $TMP/tb/a/b, found '$events'"
elif ! command -v protoc >/dev/null 2>&1; then
    fail "protoc not found: install Debian package protobuf-compiler (scripts/install-deps.sh)"
elif ! out=$(protoc -I "$top_srcdir/test" --python_out="$TMP/pb2" "$top_srcdir/test/tbmin.proto" 2>&1); then
    fail "protoc --python_out: $out"
elif out=$($PY "$top_srcdir/test/tfevents_reader.py" --metrics "$events" "$TMP/tb.json" "$TMP/pb2" "$TMP/pay" 2>&1); then
    pass "--tensorboard: $out"
    n=0
    bad=""
    for p in "$TMP"/pay/*.bin; do
        n=$((n + 1))
        protoc --decode_raw <"$p" >"$TMP/raw" 2>"$TMP/raw.err" && [ ! -s "$TMP/raw.err" ] ||
            bad="$bad $(basename "$p"): $(cat "$TMP/raw.err")"
    done
    # the 8 step records: steps 1-6 (tag 2), step 0's val/loss only (no tag 2, one value)
    protoc --decode_raw <"$TMP/pay/002.bin" >"$TMP/raw" && ! grep -q '^2: ' "$TMP/raw" &&
        [ "$(grep -c '^    1: "' "$TMP/raw")" -eq 1 ] && grep -q '"val/loss"' "$TMP/raw" || bad="$bad 002.bin: not step 0's val/loss"
    protoc --decode_raw <"$TMP/pay/008.bin" >"$TMP/raw" && grep -qx '2: 6' "$TMP/raw" || bad="$bad 008.bin: not step 6"
    if [ -z "$bad" ] && [ "$n" -eq 8 ]; then
        pass "protoc --decode_raw: all $n payloads (header, step 0, steps 1-6)"
    else
        fail "protoc --decode_raw: $n payloads:$bad"
    fi
else
    fail "--tensorboard: $out"
fi
: >"$TMP/plain"
expect_exit2 "^dtrain: error: --tensorboard $TMP/plain/sub: cannot create directory '$TMP/plain': a file of that name exists$" \
    "$DTRAIN" $RUN --steps 2 --val-every 0 --tensorboard "$TMP/plain/sub"

# a write failure mid-run: the trainer's processes (not mpiexec's) under a
# 4-block file size limit with SIGXFSZ ignored, so a write past it fails
# with EFBIG: one warning from rank 0 per file, no more events or metrics
# lines, the run goes on to its end and every rank exits 0 (before: rank 0
# ended alone and rank 1 waited for --comm-timeout)
"$MPIEXEC" --quiet -np 2 sh -c 'trap "" XFSZ; ulimit -f 4; exec "$@"' sh "$DTRAIN" $RUN --dp 2 --steps 40 \
    --val-every 0 --comm-timeout 60 --tensorboard "$TMP/full" --metrics "$TMP/full.json" >"$TMP/full.log" 2>&1
rc=$?
events=$(ls "$TMP"/full/events.out.tfevents.* 2>/dev/null)
if [ "$rc" -eq 0 ] && [ "$(grep -c 'warning' "$TMP/full.log")" -eq 2 ] &&
    grep -q "^dtrain: warning: --tensorboard $TMP/full: cannot write '$events': File too large: check free space and permissions; training goes on without TensorBoard events from step [0-9]* on" "$TMP/full.log" &&
    grep -q "^dtrain: warning: --metrics $TMP/full.json: write failed: File too large: check free space and permissions; training goes on without metrics lines from step [0-9]* on" "$TMP/full.log" &&
    grep -q '^step   40/40 ' "$TMP/full.log" && [ "$(wc -c <"$events")" -le 4096 ]; then
    pass "--tensorboard and --metrics write failures: exit 0, the run completed, $(grep -o 'warning: .*' "$TMP/full.log" | sed "s|$TMP/||g" | tr '\n' ' ')"
else
    fail "--tensorboard/--metrics write failure: exit $rc, $(grep -i 'warning\|error' "$TMP/full.log" | head -n 3) $(tail -n 1 "$TMP/full.log")"
fi

# a stop signal: the run ends at the next step boundary with every reported step in the file
DTRAIN_TEST_SLOW_RANK=0:200 "$DTRAIN" $RUN --steps 50 --val-every 0 --tensorboard "$TMP/sig" \
    --metrics "$TMP/sig.json" >"$TMP/sig.log" 2>&1 &
pid=$!
n=0
until grep -q '^step    2/50 ' "$TMP/sig.log" 2>/dev/null || [ $n -ge 300 ]; do sleep 0.1; n=$((n + 1)); done
kill -USR1 $pid
wait $pid
rc=$?
events=$(ls "$TMP"/sig/events.out.tfevents.* 2>/dev/null)
rm -rf "$TMP/pay" && mkdir -p "$TMP/pay"
if [ "$rc" -eq 0 ] && grep -q '^stopping at step [0-9]*: SIGUSR1 received' "$TMP/sig.log" && [ -f "$events" ] &&
    out=$($PY "$top_srcdir/test/tfevents_reader.py" --metrics "$events" "$TMP/sig.json" "$TMP/pb2" "$TMP/pay" 2>&1); then
    pass "SIGUSR1: $(grep '^stopping' "$TMP/sig.log" | cut -d: -f1); --tensorboard: $out"
else
    fail "SIGUSR1: exit $rc, $(grep '^stopping' "$TMP/sig.log"): ${out:-no event file}"
fi

# ---- time left ----
# 300 ms of test-only delay per step: steps 1..6 left 1.5 s, a checkpoint 3 steps away 0.9 s
DTRAIN_TEST_SLOW_RANK=0:300 "$DTRAIN" $RUN --steps 6 --val-every 0 --ckpt-dir "$TMP/ck" --ckpt-every 4 \
    >"$TMP/eta.log" 2>&1 || fail "time-left run: $(tail -n 3 "$TMP/eta.log")"
s1=$(grep '^step    1/6 ' "$TMP/eta.log")
s4=$(grep '^step    4/6 ' "$TMP/eta.log")
s6=$(grep '^step    6/6 ' "$TMP/eta.log")
if echo "$s1" | grep -Eq ' \| MFU [0-9.]+% \| [1-5]s left, ckpt in [1-3]s$' && echo "$s4" | grep -Eq ' \| MFU [0-9.]+% \| [1-3]s left, ckpt in [1-3]s$' &&
    echo "$s6" | grep -Eq ' \| MFU [0-9.]+%$'; then
    pass "time left: '${s1##*MFU}' at step 1, '${s4##*MFU}' at step 4 (ckpt then at the last step), none at the last"
else
    fail "time left: step 1 '$s1', step 4 '$s4', step 6 '$s6'"
fi
# a long --steps, this job 2 of them: days and hours; no --ckpt-every, no "ckpt in"
DTRAIN_TEST_SLOW_RANK=0:300 "$DTRAIN" $RUN --steps 1000000 --stop-at-step 2 --ckpt-dir "$TMP/long-ck" --val-every 0 \
    >"$TMP/long.log" 2>&1 ||
    fail "long --steps run: $(tail -n 3 "$TMP/long.log")"
s1=$(grep '^step      1/1000000 ' "$TMP/long.log")
if echo "$s1" | grep -Eq ' \| MFU [0-9.]+% \| ([3-9]|[1-9][0-9]+)d[0-2][0-9]h left$'; then
    pass "time left to a long --steps: '${s1##*MFU}'"
else
    fail "time left to a long --steps: '$s1'"
fi

# ---- stragglers ----
host=$(uname -n | tr -c 'A-Za-z0-9._\n-' '?' | cut -c 1-63)
# straggler LABEL NP SLOW ARGS...: rank SLOW sleeps 300 ms a step (above a
# tiny step even on a loaded machine, where the others wait for cores); the
# report at step 5 names it
straggler() {
    label=$1 np=$2 slow=$3
    shift 3
    DTRAIN_TEST_SLOW_RANK=$slow:300 "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $RUN --steps 5 --val-every 0 \
        --straggler-every 5 --metrics "$TMP/s$np.json" "$@" >"$TMP/s$np.log" 2>&1 ||
        { fail "$label: exit status $? $(tail -n 3 "$TMP/s$np.log")"; return; }
    line=$(grep '^straggler: ' "$TMP/s$np.log")
    re="^straggler: rank $slow \\($host\\) compute ([0-9.]+) ms/step, ([0-9.]+)x the median ([0-9.]+) ms \\(steps 1-5\\)$"
    ratio=$(echo "$line" | sed -En "s#$re#\\2#p")
    jr=$(json_field "$TMP/s$np.json" 5 straggler_rank)
    jh=$(json_field "$TMP/s$np.json" 5 straggler_host)
    jf=$(json_field "$TMP/s$np.json" 5 straggler_first_step)
    if [ -n "$ratio" ] && awk -v r="$ratio" 'BEGIN { exit !(r > 1.2) }' && [ "$(grep -c '^straggler: ' "$TMP/s$np.log")" -eq 1 ] &&
        [ "$jr" = "$slow" ] && [ "$jh" = "\"$host\"" ] && [ "$jf" = 1 ] && [ "$(grep -c straggler_rank "$TMP/s$np.json")" -eq 1 ]; then
        pass "$label: $line"
    else
        fail "$label: rank $slow slowed, report '$line', --metrics rank '$jr' host '$jh' first '$jf'"
    fi
}
straggler "dp2, rank 1 slowed" 2 1
straggler "dp4, rank 2 slowed" 4 2
straggler "tp2 x dp2, rank 3 slowed" 4 3 --tp 2
expect_exit2 "^dtrain: error: DTRAIN_TEST_SLOW_RANK '1,100': expected RANK:MILLISECONDS (a test-only delay)$" \
    env DTRAIN_TEST_SLOW_RANK=1,100 "$DTRAIN" $RUN --steps 2 --val-every 0
finish
