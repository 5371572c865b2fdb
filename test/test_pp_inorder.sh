#!/bin/sh
# The pipeline on a communicator with NCCL's point-to-point semantics,
# without a GPU: DTRAIN_COMM_INORDER=1 gives the pp group the emulation of
# mpi/comm_inorder.c (a rank's launches one at a time in posting order,
# sends complete only when received, matching by order whatever the tag,
# a wrong message one line), and the executor posts in its in-order plan
# (mpi/pipeline.c). Every schedule the trainer runs (1f1b, gpipe,
# interleaved, zb-h1; zbv is the executor's alone, in test_pipeline.c's
# in-order runs) at pp 2, 1f1b at pp 3 and 4, interleaved at pp 4 and a tp2 x pp2 x dp2
# ZeRO-1 layout: losses, gradient norms, validation losses (the pipelined
# forward, src/train/forward.c) and final parameters bit-identical to the
# plain MPI run, with gradient accumulation (4 microbatches a step); one
# run with the CPU ops deferred (DTRAIN_DEFER_OPS=1) as a GPU's are.
# And the reason for it: the MPI path's executor, which pre-posts its
# receives, deadlocks under the same semantics (DTRAIN_COMM_INORDER=
# unflagged), and --comm-timeout ends the run with the watchdog's line on
# the pp group.
. "$top_srcdir/test/common.sh"

# --comm-timeout: a deadlock ends the run with the watchdog's line instead of hanging
S="--steps 6 --warmup 2 --val-every 3 --val-batches 2 --check-replicas 0 --comm-timeout 60"

# inorder_same LABEL NP ARGS...: the run with and without the emulation
inorder_same() {
    label=$1 np=$2
    shift 2
    f="$TMP/$(echo "$label" | tr -c 'a-z0-9\n' '_')"
    layout_run "$f.mpi.json" "$np" "$@" $S || return
    DTRAIN_COMM_INORDER=1 layout_run "$f.io.json" "$np" "$@" $S || return
    if ! grep -q "^communication: mpi (every group; pp with NCCL's in-order point to point: DTRAIN_COMM_INORDER=1)" \
        "$f.io.json.log"; then
        fail "$label: the banner does not show the emulation: $(grep '^communication' "$f.io.json.log")"
        return
    fi
    n=$(grep -c '"loss"' "$f.io.json")
    [ "$n" -eq 6 ] || { fail "$label: $n steps in the metrics, want 6"; return; }
    layout_twice "$f.mpi.json" "$f.io.json" "$label: MPI vs in-order emulation"
}

inorder_same "tiny pp2 1f1b" 2 --model tiny --pp 2
inorder_same "tiny pp2 gpipe" 2 --model tiny --pp 2 --pp-schedule gpipe
inorder_same "tiny pp2 interleaved V2" 2 --model tiny --pp 2 --pp-schedule interleaved --pp-virtual 2
inorder_same "tiny-llama pp2 zb-h1" 2 --model tiny-llama --pp 2 --pp-schedule zb-h1
inorder_same "tiny pp3 1f1b" 3 --model tiny --pp 3 --global-batch 6
inorder_same "tiny pp4 1f1b" 4 --model tiny --pp 4
inorder_same "tiny-llama pp4 interleaved V2" 4 --model tiny-llama --pp 4 --pp-schedule interleaved --pp-virtual 2 \
    --n-layer 8
# ops deferred until the host waits (a GPU's asynchrony on the CPU): the
# messages' copies in and out of their buffers are ops, which the
# emulation, like NCCL's stream, must see finished before it sends
export DTRAIN_DEFER_OPS=1
inorder_same "tiny pp2 zb-h1, deferred ops" 2 --model tiny --pp 2 --pp-schedule zb-h1
unset DTRAIN_DEFER_OPS
inorder_same "tiny-llama tp2 x pp2 x dp2 ZeRO-1" 8 --model tiny-llama --tp 2 --pp 2 --zero 1 --global-batch 16

# the window executor on the same semantics: a deadlock, ended by the
# watchdog with one line naming the pipeline group
t0=$(date +%s)
DTRAIN_COMM_INORDER=unflagged timeout 120 "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --threads 1 --steps 6 \
    --micro-batch 2 --global-batch 8 --seq-len 64 --val-every 0 --sample-tokens 0 --pp 2 --comm-timeout 3 \
    >"$TMP/dead.log" 2>&1
rc=$?
took=$(($(date +%s) - t0))
line=$(grep -E "^dtrain: rank [01] \(tp 0 pp [01] dp 0, host [^)]*\): i?(send|recv) on group pp \(2 ranks, .*\) has not finished after [0-9]+ s \(--comm-timeout 3\)" "$TMP/dead.log" | head -n 1)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ -n "$line" ] && ! grep -q '^step *1/' "$TMP/dead.log"; then
    pass "the MPI path's executor under NCCL's semantics deadlocks in step 1: ended in $took s, status $rc: $line"
else
    fail "unflagged emulation: status $rc after $took s, no watchdog line on group pp: $(grep -v '^ ' "$TMP/dead.log" | tail -n 3)"
fi

expect_exit2 "DTRAIN_COMM_INORDER=2" env DTRAIN_COMM_INORDER=2 "$DTRAIN" $(tiny_args) --steps 1
finish
