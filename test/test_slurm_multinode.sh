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
        fail "$1: banner: $(grep -E '^(launch|hosts|slurm):' "$out" | tr '\n' '|') $(grep -i error "$out" | head -n 3)"
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
cp "$TMP/logs/full-$full/metrics.restart0.json" "$TMP/full" 2>/dev/null
layout_compare "$TMP/one" "$TMP/full" "tp2 x pp2 over 2 SLURM nodes x 2 tasks vs one rank, $STEPS steps"
losses "$TMP/full" >"$TMP/full.losses"

# ---- preempted across the nodes: checkpoint, requeue, resume ----
check_preempted pre "$pre" "$st_pre" "$LAUNCH" full
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
cp "$TMP/logs/big-$big/metrics.restart0.json" "$TMP/big" 2>/dev/null
layout_compare "$TMP/one-llama" "$TMP/big" "train_70b.sbatch's arguments (tp2 x pp2, sequence parallel, selective recompute) on 2 nodes vs one rank, tiny-llama"

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
