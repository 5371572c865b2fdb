#!/bin/sh
# Communication within a node and across the simulated nodes of
# test/multinode/nodes.sh (as root, from a build directory):
#  - dtrain-bench-comm all-reduce on 2 ranks of one node (shared memory,
#    vader) and on 2 ranks, one on each node (TCP over the veth pair);
#  - the step time of tiny at tp2 x pp2 on 2 nodes x 2 ranks with TP inside
#    a node (mpirun's by-slot mapping) and across nodes (--map-by node): the
#    mean "ms" of steps 3 to STEPS in --metrics.
#
#   bench/multinode.sh          STEPS=30 by default
#
# The simulated link is a kernel veth pair: it copies memory like vader
# does, so the gap here is TCP's protocol cost, not a real network's
# bandwidth (doc/multinode.md says what a real cluster's numbers look like).
set -u
B=${B:-.}
S=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-30}
export DTRAIN_NODES_ID="bench$$" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
N="$S/test/multinode/nodes.sh"
why=$("$N" check) || { echo "bench/multinode.sh: $why" >&2; exit 1; }
TMP=$(mktemp -d) || exit 1
trap '"$N" down; rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
"$N" up 2 || exit 1
printf 'node1 slots=2\nnode2 slots=2\n' >"$TMP/hosts"
mpx() { # mpirun on node1 across the bed, MPI over TCP between nodes
    "$N" run node1 env OMPI_MCA_plm_rsh_agent="$S/test/multinode/rsh-agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
        OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=mn0 OMPI_MCA_oob_tcp_if_include=mn0 \
        mpirun --quiet --hostfile "$TMP/hosts" --bind-to none "$@"
}
echo "## $(uname -n), $(nproc) cores, commit $(git -C "$S" rev-parse --short HEAD 2>/dev/null || echo unknown), load $(cut -d' ' -f1-3 /proc/loadavg)"
for where in "one node:--map-by slot" "two nodes:--map-by node"; do
    echo
    echo "### all-reduce, 2 ranks, ${where%%:*} (${where#*:})"
    mpx -np 2 ${where#*:} "$B/src/dtrain-bench-comm" --op allreduce --min-bytes 1K --max-bytes 64M --step-factor 8 \
        --iters 10 --warmup 3
done
mean_ms() { # METRICS: the mean step time after the first two
    sed -n 's/^{"step": \([0-9]*\),.*"ms": \([0-9.]*\).*/\1 \2/p' "$1" | awk '$1 > 2 { s += $2; n++ } END { printf "%.1f", s / n }'
}
echo
echo "### tiny, tp2 x pp2 on 2 nodes x 2 ranks, $steps steps"
echo "| TP | mapping | ms/step (steps 3-$steps) |"
echo "|---|---|---:|"
for where in "inside a node:--map-by slot" "across nodes:--map-by node"; do
    mpx -np 4 ${where#*:} "$B/src/dtrain" --model tiny --data "$B/data/gutenberg_train_*.bin" --threads 1 --tp 2 --pp 2 \
        --steps "$steps" --micro-batch 2 --global-batch 8 --seq-len 64 --val-every 0 --sample-tokens 0 \
        --metrics "$TMP/m.json" >"$TMP/log" 2>&1 || { echo "bench/multinode.sh: dtrain failed: $(tail -n 3 "$TMP/log")" >&2; exit 1; }
    echo "| ${where%%:*} | \`${where#*:}\` | $(mean_ms "$TMP/m.json") |"
done
