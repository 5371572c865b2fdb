#!/bin/sh
# Layouts across nodes: two simulated nodes of 2 ranks each
# (test/multinode/nodes.sh: network and UTS namespaces on a bridge, mpirun
# starting its remote daemon through an rsh agent, MPI over TCP between
# nodes and shared memory within one). tiny and tiny-llama, 20 steps, as
# test_layout_*.sh:
#  - tp2 x pp2 with TP inside a node (mpirun's default by-slot mapping:
#    ranks 0,1 on node1, 2,3 on node2; TP fastest in the grid, so the TP
#    groups are {0,1} and {2,3} and each pipeline stage is one node) and
#    dp2 x tp2 (one replica per node): every step's loss and the final
#    validation loss within 1e-5 relative of one rank, gradient norms within
#    1e-4, final parameters within 1e-4 (layout_compare);
#  - the banner: 4 ranks on 2 nodes, MPI's local ranks agree with
#    OMPI_COMM_WORLD_LOCAL_RANK, the host layout "hosts: node1 ranks 0,1
#    (local 0,1), node2 ranks 2,3 (local 0,1)" (local ranks, by which a GPU
#    is picked, count from 0 on each node, not by world rank), and each
#    group line names its ranks' hosts (tp group 0 on node1, 1 on node2, pp
#    across both); no TP warning;
#  - TP across nodes (--map-by node: ranks 0,2 on node1, 1,3 on node2, so
#    every TP group spans both): the run goes on, to the same losses, and
#    rank 0 prints exactly one warning line naming node1 and node2; the
#    host layout reads "node1 ranks 0,2 (local 0,1), node2 ranks 1,3
#    (local 0,1)";
#    --straggler-every 5 with rank 2 slowed by 150 ms a step names
#    "rank 2 (node1)": the host of that rank, not of rank 2 under the
#    default mapping (node2).
# Skipped (77) where network namespaces cannot be made (not root).
. "$top_srcdir/test/common.sh"
. "$top_srcdir/test/multinode/bed.sh"

bed_up 2

# expect_line LABEL FILE PATTERN: FILE has exactly one line matching PATTERN
expect_line() {
    n=$(grep -c -- "$3" "$2")
    if [ "$n" -eq 1 ]; then pass "$1: $(grep -- "$3" "$2" | cut -c1-200)"; else fail "$1: $n lines match '$3' in $2"; fi
}

for model in tiny tiny-llama; do
    ref="$TMP/$model.1.json"
    MPIEXEC=$LOCAL_MPIEXEC
    layout_run "$ref" 1 --model $model || continue
    MPIEXEC=$BED_MPIEXEC
    out="$TMP/$model.tp2pp2.json"
    layout_run "$out" 4 --model $model --tp 2 --pp 2 &&
        layout_compare "$ref" "$out" "$model tp2 x pp2 on 2 nodes x 2 ranks, TP inside a node"
    expect_line "$model tp2 x pp2: banner" "$out.log" \
        "^launch: mpirun, 4 ranks on 2 nodes, local ranks agree with OMPI_COMM_WORLD_LOCAL_RANK$"
    expect_line "$model tp2 x pp2: hosts and local ranks" "$out.log" \
        "^hosts: node1 ranks 0,1 (local 0,1), node2 ranks 2,3 (local 0,1)$"
    expect_line "$model tp2 x pp2: tp group 0" "$out.log" "^  tp    group 0: ranks 0,1 on node1$"
    expect_line "$model tp2 x pp2: tp group 1" "$out.log" "^  tp    group 1: ranks 2,3 on node2$"
    expect_line "$model tp2 x pp2: pp across nodes" "$out.log" "^  pp    group 0: ranks 0,2 on node1,node2$"
    if grep -q "warning: tensor-parallel" "$out.log"; then fail "$model tp2 x pp2: a TP warning with TP inside nodes"; fi
    out="$TMP/$model.dp2tp2.json"
    layout_run "$out" 4 --model $model --tp 2 &&
        layout_compare "$ref" "$out" "$model dp2 x tp2 on 2 nodes x 2 ranks, a replica per node"
    expect_line "$model dp2 x tp2: tp group 1" "$out.log" "^  tp    group 1: ranks 2,3 on node2$"
    expect_line "$model dp2 x tp2: dp across nodes" "$out.log" "^  dp    group 0: ranks 0,2 on node1,node2$"
done

# TP across nodes: warned once, still correct; the straggler named with its host
out="$TMP/tiny.tp-across.json"
BED_MPIRUN_ARGS="--map-by node -x DTRAIN_TEST_SLOW_RANK=2:150"
layout_run "$out" 4 --model tiny --tp 2 --pp 2 --straggler-every 5 &&
    layout_compare "$TMP/tiny.1.json" "$out" "tiny tp2 x pp2, TP across nodes"
BED_MPIRUN_ARGS=
expect_line "TP across nodes: the warning" "$out.log" \
    "^dtrain: warning: tensor-parallel group 0 (ranks 0,1) spans hosts node1, node2 (2 of 2 tp groups cross nodes)"
expect_line "TP across nodes: hosts and local ranks" "$out.log" \
    "^hosts: node1 ranks 0,2 (local 0,1), node2 ranks 1,3 (local 0,1)$"
expect_line "TP across nodes: tp group 0 on both" "$out.log" "^  tp    group 0: ranks 0,1 on node1,node2$"
n=$(grep -c "^straggler: rank 2 (node1) " "$out.log")
[ "$n" -eq 4 ] && pass "--straggler-every 5: rank 2 (node1) at each of the 4 reports" ||
    fail "--straggler-every 5: $n of 4 reports name rank 2 (node1): $(grep '^straggler' "$out.log" | head -n 2)"
finish
