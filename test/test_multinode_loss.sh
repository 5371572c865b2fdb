#!/bin/sh
# A node lost mid-run, on two simulated nodes of 2 ranks each
# (test/multinode/nodes.sh), tiny at tp2 x pp2 (TP inside each node, the
# pipeline across), checkpoints every 5 steps, --comm-timeout 10. Once step
# 12 is printed, node2 is lost in one of three ways:
#  - killed: SIGKILL to every process in its namespace (power lost, kernel
#    panic): its TCP connections close, Open MPI's mpirun sees its daemon go
#    and ends the job (SIGTERM to the ranks left, SIGKILL 1 s later); at
#    that SIGTERM dtrain's lost-peer report (mpi/lostpeer.h) names the ranks
#    that no longer answer, once: "dtrain: ranks 2,3 on node2 stopped
#    answering: no reply to rank 0 (..., host node1) ...";
#  - cut off: its link taken down, nothing closes; the daemons' TCP
#    keepalive (oob_tcp_keepalive_time 3 s, 3 probes 1 s apart, as
#    doc/multinode.md advises) finds the lost peer on both sides: mpirun ends
#    the job, the same line names ranks 2,3 on node2, and node2's daemon
#    ends its ranks;
#  - frozen: its ranks stopped (SIGSTOP; a hung GPU or a node in swap), its
#    daemon alive: dtrain's watchdog on node1 fires after 10 s; the first
#    rank to fire asks every rank as the report does and names the
#    operation it waited in and the ranks that do not answer ("...: ranks
#    2,3 on node2 stopped answering; aborting the job"), the others' lines
#    are suppressed, and no report follows.
# Each time: the job ends within --comm-timeout + 10 = 20 s of the loss,
# with a non-zero status and exactly one line naming ranks 2,3 on node2; no
# process is left on node1 or node2; `latest` is the step-10 checkpoint,
# and a run resumed from it on node1 alone (dp2) loads it and takes a step.
# And a SIGTERM to mpirun with both nodes up (^C, a batch system ending the
# job) names no rank: mpirun ends node1's ranks 2 s before node2's, and
# those must not look lost to node2's.
# Skipped (77) where network namespaces cannot be made (not root).
. "$top_srcdir/test/common.sh"
. "$top_srcdir/test/multinode/bed.sh"

bed_up 2
echo "node1 slots=2" >"$TMP/node1-only"
BED_MPIRUN_ARGS="--mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3"
ARGS="$(tiny_args) --threads 1 --micro-batch 2 --global-batch 8 --seq-len 64 --sample-tokens 0"

# freeze NODE: SIGSTOP to its dtrain processes (its daemon keeps running)
freeze() {
    for p in $(bed_nodes pids "$1"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dtrain ] && kill -STOP "$p"
    done
}

# lose LABEL HOW NAMED: HOW (kill, link-down, freeze) node2 at step 12;
# NAMED: an extended regex for the one line that must name its ranks
lose() {
    label=$1 how=$2 named=$3 ct=10
    log="$TMP/$label.log"
    "$MPIEXEC" -np 4 "$DTRAIN" $ARGS --steps 100000 --val-every 0 --comm-timeout $ct --tp 2 --pp 2 \
        --ckpt-dir "$TMP/$label" --ckpt-every 5 >"$log" 2>&1 &
    job=$!
    i=0
    until grep -q '^step *12/' "$log" 2>/dev/null || [ $i -gt 1200 ]; do
        i=$((i + 1))
        sleep 0.1
    done
    t0=$(date +%s)
    case $how in
    kill) bed_nodes kill node2 || fail "$label: processes of node2 survived SIGKILL" ;;
    link-down) bed_nodes link-down node2 ;;
    freeze) freeze node2 ;;
    esac
    while kill -0 $job 2>/dev/null && [ $(($(date +%s) - t0)) -le 30 ]; do
        sleep 0.2
    done
    if kill -0 $job 2>/dev/null; then
        fail "$label: the job still runs 30 s after node2 was lost"
        kill $job
    fi
    wait $job
    rc=$?
    dt=$(($(date +%s) - t0))
    # one line names the ranks that stopped answering, whoever prints it:
    # the lost-peer report, or the watchdog of the first rank to fire (the
    # other ranks' watchdogs, of node2's ranks too once mpirun's SIGCONT
    # wakes them, stay quiet)
    n=$(grep -c 'stopped answering' "$log")
    line=$(grep -m 1 'stopped answering' "$log")
    if [ $rc -ne 0 ] && [ $dt -le $((ct + 10)) ] && [ "$n" -eq 1 ] && echo "$line" | grep -Eq "$named"; then
        pass "$label: the job ended in $dt s (<= $((ct + 10))), exit status $rc, one line: $line"
    else
        fail "$label: exit status $rc after $dt s, $n line(s), wanted one /$named/: $(grep -v '^step\|^  ' "$log" | tail -n 4)"
    fi
    # what is left is ended by the bed's own `down` at exit; here it must be nothing
    left="$(bed_nodes pids node1) $(bed_nodes pids node2)"
    [ -z "$(echo $left)" ] && pass "$label: no process left on node1 or node2" ||
        fail "$label: processes left: $(for p in $left; do printf '%s(%s) ' "$p" "$(cat /proc/$p/comm)"; done)"
    bed_nodes kill node1
    bed_nodes kill node2
    [ "$how" = link-down ] && bed_nodes link-up node2
    last=$(cat "$TMP/$label/latest" 2>/dev/null)
    BED_HOSTFILE="$TMP/node1-only"
    if "$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS --dp 2 --ckpt-dir "$TMP/$label" --resume auto --steps 11 --val-every 0 \
        >"$TMP/$label.after.log" 2>&1 && grep -q "resume: $TMP/$label/step_00000010.h5, step 10" "$TMP/$label.after.log"; then
        pass "$label: latest is $last, and a run on node1 resumes from it"
    else
        fail "$label: latest '$last' does not resume: $(grep -m 2 'resume\|error' "$TMP/$label.after.log")"
    fi
    BED_HOSTFILE=
}

report="^dtrain: ranks 2,3 on node2 stopped answering: no reply to rank 0 \(tp 0 pp 0 dp 0, host node1\) within 0\.5 s when the job was being ended \(SIGTERM\)"
lose "node2 killed" kill "$report"
lose "node2 cut off" link-down "$report"
lose "node2 frozen" freeze "^dtrain: rank [01] \(tp [01] pp 0 dp 0, host node1\): [a-z ]+ on group [a-z]+ \(.*\) has not finished after [0-9]+ s \(--comm-timeout 10\): ranks 2,3 on node2 stopped answering; aborting the job$"

# mpirun ended by SIGTERM, both nodes up: it ends node1's ranks (its own)
# first, node2's 2 s later; no rank is named, and none is left
log="$TMP/term.log"
"$MPIEXEC" -np 4 "$DTRAIN" $ARGS --steps 100000 --val-every 0 --comm-timeout 10 --tp 2 --pp 2 >"$log" 2>&1 &
job=$!
i=0
until grep -q '^step *12/' "$log" 2>/dev/null || [ $i -gt 1200 ]; do
    i=$((i + 1))
    sleep 0.1
done
t0=$(date +%s)
kill -TERM $job
while kill -0 $job 2>/dev/null && [ $(($(date +%s) - t0)) -le 30 ]; do
    sleep 0.2
done
kill -0 $job 2>/dev/null && { fail "mpirun SIGTERM: the job still runs 30 s later"; kill -KILL $job; }
wait $job
rc=$?
dt=$(($(date +%s) - t0))
left="$(bed_nodes pids node1) $(bed_nodes pids node2)"
if [ $rc -ne 0 ] && [ -z "$(echo $left)" ] && ! grep -q 'stopped answering' "$log"; then
    pass "mpirun SIGTERM, both nodes up: ended in $dt s, status $rc, no rank named, no process left"
else
    fail "mpirun SIGTERM: status $rc after $dt s, left: '$(echo $left)': $(grep -v '^step\|^  ' "$log" | tail -n 4)"
fi
finish
