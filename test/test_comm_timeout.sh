#!/bin/sh
# --comm-timeout: a rank whose peer stopped responding ends the job with
# one line naming the operation it was blocked in and the rank that no
# longer answers, instead of hanging.
# The peer is frozen with SIGSTOP in the middle of training (a hung GPU, a
# node in swap and a dead process look the same from the other ranks).
# Also: the watchdog changes no number, and a bad value is refused.
. "${top_srcdir:-.}/test/common.sh"

timeout=3
# The job must be over this long after the freeze: the timeout, the
# watchdog's wake-up period (timeout / 8) and MPI_Abort's teardown, with
# room for an oversubscribed CI machine.
limit=45

# pid_of TAG RANK: the process of world rank RANK of the job tagged TAG
pid_of() {
    for p in $(pgrep -x dtrain); do
        env=$({ tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null) || continue
        if printf '%s\n' "$env" | grep -qx "DTRAIN_TEST_TAG=$1" &&
            printf '%s\n' "$env" | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# freeze_run LABEL NP RANK GROUPS ARGS...: starts a long run, stops world
# rank RANK with SIGSTOP once step 3 is printed, and expects the job to end
# within $limit s, non-zero, with a watchdog line naming one of GROUPS
# (an extended regex).
freeze_run() {
    label=$1 np=$2 rank=$3 groups=$4
    shift 4
    tag="$$-$label"
    log="$TMP/$label.log"
    "$MPIEXEC" --quiet -np "$np" -x DTRAIN_TEST_TAG="$tag" "$DTRAIN" $(tiny_args) --threads 1 --steps 100000 \
        --micro-batch 2 --seq-len 64 --val-every 0 --sample-tokens 0 --comm-timeout "$timeout" "$@" \
        >"$log" 2>&1 &
    job=$!
    i=0
    until grep -q '^step *3/' "$log" 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt 600 ] || ! kill -0 "$job" 2>/dev/null; then
            fail "$label: the run did not reach step 3: $(tail -n 3 "$log")"
            kill "$job" 2>/dev/null
            wait "$job"
            return
        fi
        sleep 0.1
    done
    victim=$(pid_of "$tag" "$rank") || { fail "$label: no process for rank $rank"; kill "$job"; wait "$job"; return; }
    kill -STOP "$victim"
    t0=$(date +%s)
    # wait for the job, but never longer than $limit s
    while kill -0 "$job" 2>/dev/null && [ $(($(date +%s) - t0)) -le "$limit" ]; do
        sleep 0.2
    done
    if kill -0 "$job" 2>/dev/null; then
        fail "$label: the job still runs $limit s after rank $rank was stopped (the watchdog did not end it)"
        for r in $(seq 0 $((np - 1))); do
            p=$(pid_of "$tag" "$r") && kill -KILL "$p" 2>/dev/null
        done
        wait "$job"
        return
    fi
    wait "$job"
    rc=$?
    took=$(($(date +%s) - t0))
    # the frozen process may outlive mpirun for a moment: never leave it
    p=$(pid_of "$tag" "$rank") && kill -KILL "$p" 2>/dev/null
    line=$(grep -E "^dtrain: rank [0-9]+ \(tp [0-9]+ pp [0-9]+ dp [0-9]+, host [^)]*\): .* on group ($groups) \([0-9]+ ranks.*\) has not finished after [0-9]+ s \(--comm-timeout $timeout\): rank $rank on $(hostname) stopped answering; aborting the job$" "$log")
    # one line: the first rank to fire asks every rank (mpi/lostpeer.h) and
    # names the one that does not answer; the others' watchdogs and the
    # lost-peer report at mpirun's SIGTERM stay quiet
    if [ "$rc" -ne 0 ] && [ -n "$line" ] && [ "$(grep -c 'has not finished\|stopped answering' "$log")" -eq 1 ]; then
        pass "$label: rank $rank frozen, job ended in $took s with status $rc, one line: $line"
    else
        fail "$label: status $rc after $took s, not one watchdog line on group ($groups) naming rank $rank: $(grep -v '^step' "$log" | tail -n 5)"
    fi
}

# data parallelism: rank 0 waits for rank 1's gradients
freeze_run dp2 2 1 'dp|world'
# tensor x pipeline parallelism: the last stage's second TP rank stops; its
# TP partner blocks in a TP all-reduce, the first stage in a pipeline
# receive or the step's world all-reduce
freeze_run tp2pp2 4 3 'tp|pp|dp|world|embed' --tp 2 --pp 2 --global-batch 4
# ZeRO-3: parameter all-gathers of the next block
freeze_run zero3 2 0 'dp|world' --zero 3
# expert parallelism: rank 0 waits wherever it next needs rank 1, in a MoE
# layer's all-to-all over the EP group ("alltoallv ep") or, as often, the
# gradient all-reduce or the step's world all-reduce
freeze_run ep2 2 1 'ep|dp|world' --model tiny-moe --ep 2

# A rank that failed waits in the world agreement while its peer is stuck
# elsewhere (test_fail_agree.c): the watchdog ends the job, and its line
# carries the failure, which no agreement can print.
t0=$(date +%s)
"$MPIEXEC" --quiet -np 2 "$top_builddir/test/test_fail_agree" 2 >"$TMP/fa.log" 2>&1
rc=$?
took=$(($(date +%s) - t0))
line=$(grep -E "^dtrain: rank 1: .* has not finished after [0-9]+ s \(--comm-timeout 2\): .*aborting the job; this rank had failed first: injected failure on rank 1$" "$TMP/fa.log")
if [ "$rc" -ne 0 ] && [ "$took" -lt 40 ] && [ -n "$line" ]; then
    pass "failed rank in the agreement, peer stuck: ended in $took s, status $rc: $line"
else
    fail "failed rank in the agreement: status $rc after $took s, no line with the failure: $(tail -n 5 "$TMP/fa.log")"
fi

# The watchdog changes no number: 10 steps at dp 2 with a watchdog that is
# armed around every call (timeout 60 s) and without one, bit-identical.
for t in 0 60; do
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --threads 1 --steps 10 --warmup 2 --micro-batch 2 --seq-len 64 \
        --val-every 10 --val-batches 2 --sample-tokens 0 --comm-timeout $t --metrics "$TMP/m$t.json" \
        >"$TMP/m$t.log" 2>&1 || fail "--comm-timeout $t run: $(tail -n 3 "$TMP/m$t.log")"
    strip_timing "$TMP/m$t.json" >"$TMP/m$t.cmp"
done
if [ "$(grep -c "\"loss\"" "$TMP/m0.cmp")" -eq 10 ] && cmp -s "$TMP/m0.cmp" "$TMP/m60.cmp"; then
    pass "--comm-timeout 60 and 0: bit-identical losses over 10 steps (last: $(json_field "$TMP/m60.json" 10 loss))"
else
    fail "--comm-timeout 60 and 0 differ"
fi

expect_exit2 "comm-timeout" "$DTRAIN" --comm-timeout -1
expect_exit2 "comm-timeout" "$DTRAIN" --comm-timeout soon

finish
