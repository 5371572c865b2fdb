#!/bin/sh
# SLURM across nodes, on two simulated nodes (test/multinode/nodes.sh:
# network and UTS namespaces node1 and node2, 198.18.0.11 and .12, the
# host's file system shared). slurm/test-cluster.sh starts a real cluster
# on them: munged and slurmctld on node1, one slurmd per node
# (NodeName=node1 NodeAddr=198.18.0.11, node2 .12), each in its node's
# namespaces; every client command runs on node1, the only way to reach
# slurmctld. The jobs, tiny (tiny.conf) at tp2 x pp2, 60 steps:
#  - `sbatch -N 2 --ntasks-per-node 2 slurm/train_small.sbatch`: srun
#    --mpi=pmix starts 4 ranks over both nodes ("launch: srun, 4 ranks on 2
#    nodes", "hosts: node1 ranks 0,1 (local 0,1), node2 ranks 2,3 (local
#    0,1)", "slurm: job N, restart 0, 2 nodes node[1-2]"); COMPLETED; every
#    loss, the validation loss and the gradient norms within 1e-5 / 1e-4 of
#    one rank's (layout_compare), the final parameters within 1e-4;
#  - the same job preempted: `scancel --batch --signal=USR1` at step 3 (the
#    time-limit warning); srun passes it to the ranks on both nodes, they
#    checkpoint to the shared directory at the next step boundary and exit
#    0, the script requeues the job, the second attempt again spans both
#    nodes, resumes from `latest` and completes; its losses and final
#    parameters bit-identical to the uninterrupted 2-node job's;
#  - slurm/train_70b.sbatch in an allocation of 2 nodes x 2 tasks (GPUs,
#    cores and memory overridden to fit; DTRAIN_CONFIG=tiny-llama.conf, 20
#    steps): its layout comes from the allocation, tp 2 (tasks per node) x
#    pp 2 (nodes) with TP inside each node, its --sequence-parallel and
#    --recompute selective as written; COMPLETED, the same losses as one
#    rank;
#  - node2 lost mid-run (every process in its namespace killed: slurmd,
#    step daemon, ranks) at step 12 of a tp2 x pp2 job with --comm-timeout
#    10 and checkpoints every 5 steps: dtrain's watchdog on node1 ends the
#    ranks there within 20 s, in one line (the first rank's to fire) naming
#    the ranks that stopped answering, "ranks 2,3 on node2"; the job exits 1
#    without a requeue; no job process is left;
#    a job on node1 alone (dp 2) resumes from the step-10 checkpoint;
#  - test-cluster.sh down: no process left on either node.
# Skipped (77, one line) where network namespaces cannot be made (not
# root) or SLURM is not installed or its daemons cannot start.
. "$top_srcdir/test/common.sh"
. "$top_srcdir/test/multinode/bed.sh"

PATH=$PATH:/usr/sbin:/sbin
for b in sbatch scontrol scancel squeue sinfo slurmctld slurmd munged; do
    command -v "$b" >/dev/null || { echo "SKIP: $b not found: scripts/install-deps.sh installs slurm-wlm and munge"; exit 77; }
done
bed_up 2
S="$top_srcdir/slurm"
# the bed's addresses (nodes.sh: 198.18.0.(10 + i))
export SLURM_LOCAL_NODES="node1=198.18.0.11 node2=198.18.0.12"
export SLURM_LOCAL_ON="env DTRAIN_NODES_ID=$DTRAIN_NODES_ID $BED_DIR/nodes.sh run"
SLURM_ON="$BED_DIR/nodes.sh run node1"
if ! up=$(bash "$S/test-cluster.sh" up 2>"$TMP/up.err"); then
    echo "SKIP: the SLURM daemons could not start on the simulated nodes: $(tail -n 8 "$TMP/up.err")"
    exit 77
fi
eval "$up"
# the cluster, then the bed (which ends whatever is left in the nodes),
# whatever happens to this script
trap 'bash "$S/test-cluster.sh" down --rm "$SLURM_LOCAL_DIR" >/dev/null 2>&1; bed_cleanup' EXIT
echo "cluster: $SLURM_LOCAL_DIR on $SLURM_LOCAL_NODES"

# --lr 1e-3 (the layout tests'): at the configs' 4e-3 the loss spikes at
# step 10 (5.5 -> 9.4 -> 3.3), which blows fp32 reordering noise up to 1e-3
# relative; at 1e-3 tp2 x pp2 stays within 2e-7 of one rank over 60 steps
STEPS=60
ARGS="--data $DATA_TRAIN --val-data $DATA_VAL --peak-gflops 100 --threads 1 --lr 1e-3 --min-lr 1e-4 --warmup 10
      --seq-len 64 --micro-batch 2 --global-batch 8 --sample-tokens 0 --val-batches 4"
export DTRAIN DTRAIN_CONFIG="$top_srcdir/examples/tiny.conf" DTRAIN_LOG_ROOT="$TMP/logs"
LAUNCH="launch: srun, 4 ranks on 2 nodes, local ranks agree with SLURM_LOCALID"
HOSTS="hosts: node1 ranks 0,1 (local 0,1), node2 ranks 2,3 (local 0,1)"

# one rank, here: the references
"$DTRAIN" --config "$DTRAIN_CONFIG" $ARGS --steps $STEPS --val-every $STEPS --metrics "$TMP/one" \
    --save-params "$TMP/one.h5" >"$TMP/one.log" 2>&1 || fail "one rank: $(tail -n 2 "$TMP/one.log")"
"$DTRAIN" --config "$top_srcdir/examples/tiny-llama.conf" $ARGS --steps 20 --val-every 20 --recompute selective \
    --metrics "$TMP/one-llama" --save-params "$TMP/one-llama.h5" >"$TMP/one-llama.log" 2>&1 ||
    fail "one rank, tiny-llama: $(tail -n 2 "$TMP/one-llama.log")"

# submit NAME SBATCH-OPTIONS... -- SCRIPT DTRAIN-ARGS...: the job id, from
# node1; output in $TMP/NAME.out, checkpoints in $TMP/NAME.ckpt, final
# parameters in $TMP/NAME.h5
submit() {
    name=$1
    shift
    DTRAIN_CKPT_DIR="$TMP/$name.ckpt" $SLURM_ON sbatch --parsable -J "$name" -o "$TMP/$name.out" "$@" \
        --save-params "$TMP/$name.h5"
}
# banner NAME JOB ATTEMPTS: the banner of every attempt of job NAME spans
# both nodes, two ranks each
banner() {
    out="$TMP/$1.out"
    if [ "$(grep -c "^$LAUNCH$" "$out")" -eq "$3" ] && [ "$(grep -c "^$HOSTS$" "$out")" -eq "$3" ] &&
        [ "$(grep -Ec "^slurm: job $2, restart [0-9], 2 nodes node\[1-2\], " "$out")" -eq "$3" ]; then
        pass "$1: 4 ranks over node1 and node2 in each of $3 attempt(s): $(grep -E '^(launch|hosts|slurm):' "$out" | head -n 3 | tr '\n' '|')"
    else
        # a crash's frames as OpenMPI's handler prints them, so that a
        # failure in CI says where (the job's files go with $TMP)
        fail "$1: banner: $(grep -E '^(launch|hosts|slurm):' "$out" | tr '\n' '|') $(grep -i error "$out" | head -n 3)" \
            "$(grep -E '^\[[^]]*\] (\*\*\*|\[ *[0-9]+\])' "$out" | head -n 16)"
    fi
}

t0=$(date +%s)
N2="-N 2 --ntasks-per-node 2"
full=$(submit full $N2 "$S/train_small.sbatch" $ARGS --steps $STEPS --val-every $STEPS --tp 2 --pp 2 --ckpt-every 25) ||
    fail "sbatch full: $full"
pre=$(submit pre $N2 "$S/train_small.sbatch" $ARGS --steps $STEPS --val-every $STEPS --tp 2 --pp 2 --ckpt-every 25) ||
    fail "sbatch pre: $pre"
# the 70B script as written, on the allocation's 2 nodes x 2 tasks; it
# asks for --exclusive, so it starts once the two jobs above have left
# both nodes
big=$(DTRAIN_CONFIG="$top_srcdir/examples/tiny-llama.conf" submit big $N2 --gpus-per-node=0 --cpus-per-task=1 --mem=100 \
    "$S/train_70b.sbatch" $ARGS --steps 20 --val-every 20) || fail "sbatch big: $big"
[ "$fails" -eq 0 ] || finish
echo "jobs: full $full, pre $pre, big $big"

signal_at_step "$pre" pre 3
st_full=$(wait_job "$full" 0 300)
st_pre=$(wait_job "$pre" 1 300)
st_big=$(wait_job "$big" 0 300)
echo "all jobs done after $(($(date +%s) - t0)) s"

# ---- sbatch -N 2 --ntasks-per-node 2: both nodes, one rank's losses ----
if [ "$st_full" = COMPLETED ] && grep -q "^done: $STEPS steps" "$TMP/full.out"; then
    pass "sbatch -N 2 --ntasks-per-node 2 train_small.sbatch --tp 2 --pp 2: $st_full, $(grep "^done:" "$TMP/full.out")"
else
    fail "sbatch -N 2 --ntasks-per-node 2 train_small.sbatch: $st_full: $(grep -v '^step\|^  ' "$TMP/full.out" | tail -n 4)"
fi
banner full "$full" 1
if [ "$st_full" = COMPLETED ]; then
    cp "$TMP/logs/full-$full/metrics.restart0.json" "$TMP/full"
    layout_compare "$TMP/one" "$TMP/full" "tp2 x pp2 over 2 SLURM nodes x 2 tasks vs one rank, $STEPS steps"
    losses "$TMP/full" >"$TMP/full.losses"
fi

# ---- preempted across the nodes: checkpoint, requeue, resume ----
[ "$st_full" != COMPLETED ] || check_preempted pre "$pre" "$st_pre" "$LAUNCH" full
banner pre "$pre" 2

# ---- train_70b.sbatch takes its layout from the allocation ----
if [ "$st_big" = COMPLETED ] && grep -q "^done: 20 steps" "$TMP/big.out" &&
    grep -q "^grid: 4 ranks = tp 2 x dp 1 x pp 2 on 2 hosts" "$TMP/big.out" &&
    grep -q "^  tp    group 1: ranks 2,3 on node2$" "$TMP/big.out"; then
    pass "sbatch -N 2 --ntasks-per-node 2 train_70b.sbatch: $st_big, $(grep '^grid:' "$TMP/big.out"), $(grep '^  tp    group 1' "$TMP/big.out" | sed 's/^ *//')"
else
    fail "train_70b.sbatch on 2 x 2: $st_big: $(grep -E '^(grid|done|dtrain)' "$TMP/big.out" | tr '\n' '|') $(tail -n 3 "$TMP/big.out")"
fi
banner big "$big" 1
if [ "$st_big" = COMPLETED ]; then
    cp "$TMP/logs/big-$big/metrics.restart0.json" "$TMP/big"
    layout_compare "$TMP/one-llama" "$TMP/big" \
        "train_70b.sbatch's arguments (tp2 x pp2, sequence parallel, selective recompute) on 2 nodes vs one rank, tiny-llama"
fi

# ---- node2 lost mid-run ----
# every process of node2 (its slurmd, the step daemon, its two ranks)
# killed once step 12 is printed; nothing closes the connections of a
# direct-launched step in a way that ends it, so dtrain's watchdog on node1
# does, --comm-timeout 10 after the loss, naming the peers; srun then waits
# KillWait + 2 = 7 s for node2's step daemon, which never answers. SLURM
# itself notices the node only after SlurmdTimeout (300 s): the job stays
# COMPLETING until then, and is not requeued (it failed, as a hang does).
comms() { for p in "$@"; do cat "/proc/$p/comm" 2>/dev/null; done | sort | tr '\n' ' '; }
lost=$(submit lost $N2 "$S/train_small.sbatch" $ARGS --steps 100000 --val-every 0 --tp 2 --pp 2 --ckpt-every 5 \
    --comm-timeout 10) || fail "sbatch lost: $lost"
end=$(($(date +%s) + 120))
until grep -q '^step *12/' "$TMP/lost.out" 2>/dev/null || [ "$(date +%s)" -ge "$end" ]; do sleep 0.1; done
t1=$(date +%s)
bed_nodes kill node2 || fail "node2 lost: processes of node2 survived SIGKILL"
ranks_gone="" job_gone=""
while [ $(($(date +%s) - t1)) -le 60 ] && [ -z "$job_gone" ]; do
    [ -n "$ranks_gone" ] || case " $(comms $(bed_nodes pids node1)) " in *" dtrain "*) ;; *) ranks_gone=$(($(date +%s) - t1)) ;; esac
    [ "$(job_field "$lost" JobState)" = RUNNING ] || job_gone=$(($(date +%s) - t1))
    sleep 0.2
done
# one line, from the first watchdog to fire: the others stay quiet
line=$(grep -E "^dtrain: rank [01] \(tp [01] pp 0 dp 0, host node1\): [a-z ]+ on group [a-z]+ \(.*\) has not finished after [0-9]+ s \(--comm-timeout 10\): ranks 2,3 on node2 stopped answering; aborting the job$" "$TMP/lost.out")
[ "$(grep -c 'stopped answering' "$TMP/lost.out")" -eq 1 ] || line=""
# (the batch script: the ranks' 20 s, srun's 7 s wait, a few s of slack)
if [ -n "$ranks_gone" ] && [ "$ranks_gone" -le 20 ] && [ -n "$job_gone" ] && [ "$job_gone" -le 30 ] &&
    [ "$(job_field "$lost" ExitCode)" = 1:0 ] &&
    [ "$(job_field "$lost" Restarts)" = 0 ] && [ -n "$line" ]; then
    pass "node2 lost: the ranks on node1 ended in $ranks_gone s (<= 20), the batch script in $job_gone s (<= 30), exit code 1, not requeued: $line"
else
    fail "node2 lost: ranks ended after '${ranks_gone:-never}' s, script after '${job_gone:-never}' s, exit code $(job_field "$lost" ExitCode), line '$line': $(grep -v '^step\|^  ' "$TMP/lost.out" | tail -n 4)"
fi
# left on node1: SLURM's daemons only (node2 has nothing left at all)
left=$(comms $(bed_nodes pids node1) $(bed_nodes pids node2))
[ "$left" = "munged slurmctld slurmd slurmscriptd " ] && pass "node2 lost: no job process left on node1 or node2 (node1 runs $left)" ||
    fail "node2 lost: left on the nodes: $left"
# the last checkpoint continues on node1 alone, dp 2 (node2 is down)
last=$(cat "$TMP/lost.ckpt/latest" 2>/dev/null)
after=$(submit lost -N 1 --ntasks-per-node 2 -w node1 "$S/train_small.sbatch" $ARGS --steps 11 --val-every 0 --dp 2 \
    --ckpt-every 5) || fail "sbatch after: $after"
st=$(wait_job "$after" 0 120)
if [ "$st" = COMPLETED ] && [ "$last" = step_00000010.h5 ] && grep -q "^resume: $TMP/lost.ckpt/step_00000010.h5, step 10," "$TMP/lost.out" &&
    grep -q "^done: 1 steps" "$TMP/lost.out"; then
    pass "node2 lost: latest is $last, and a job on node1 alone resumes from it at dp 2: $st"
else
    fail "node2 lost: latest '$last', the job on node1: $st: $(grep -E '^(resume|done|dtrain)' "$TMP/lost.out" | tail -n 3 | tr '\n' '|')"
fi

# ---- nothing left behind ----
bash "$S/test-cluster.sh" down "$SLURM_LOCAL_DIR" >/dev/null
left="$(bed_nodes pids node1) $(bed_nodes pids node2)"
if [ -z "$(echo $left)" ]; then
    pass "test-cluster.sh down: no process left on node1 or node2"
else
    fail "left on the nodes: $(for p in $left; do printf '%s(%s) ' "$p" "$(cat /proc/$p/comm 2>/dev/null)"; done)"
fi
echo "total $(($(date +%s) - t0)) s"
finish
