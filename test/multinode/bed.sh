# Sourced by the multi-node tests, after test/common.sh: a test bed of the
# test's own (test/multinode/nodes.sh, named after the test's PID so that
# tests run side by side never share one), removed on exit whatever
# happens, and `mpirun` across it.
#
#   bed_up N        node1..nodeN, a hostfile of 2 slots each in $BED_HOSTS,
#                   and $MPIEXEC replaced by $BED_MPIEXEC, so common.sh's
#                   layout_run starts its ranks across the nodes; exits 77
#                   with one line where namespaces cannot be made
#   $BED_MPIEXEC    mpirun started on node1 with the hostfile ($BED_HOSTFILE
#                   when set, else $BED_HOSTS); extra mpirun
#                   options in $BED_MPIRUN_ARGS (e.g. --map-by node)
#   bed_nodes ...   test/multinode/nodes.sh on this bed

BED_DIR=$(cd "$top_srcdir/test/multinode" && pwd)
export DTRAIN_NODES_ID="t$$"
BED_HOSTS="$TMP/hostfile"
BED_MPIEXEC="$TMP/mpiexec-nodes"
LOCAL_MPIEXEC=$MPIEXEC
export BED_MPIRUN_ARGS= BED_HOSTFILE=

bed_nodes() { "$BED_DIR/nodes.sh" "$@"; }

# Runs on EXIT (and on INT/TERM through exit): the bed, then the scratch
# directory, as common.sh's own trap would.
bed_cleanup() {
    [ -n "${BED_IS_UP:-}" ] && bed_nodes down
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}
trap bed_cleanup EXIT
trap 'exit 130' INT TERM

bed_up() {
    why=$(bed_nodes check) || { echo "$why"; exit 77; }
    bed_nodes gc
    BED_IS_UP=1
    bed_nodes up "$1" || exit 99
    : >"$BED_HOSTS"
    i=1
    while [ $i -le "$1" ]; do
        echo "node$i slots=2" >>"$BED_HOSTS"
        i=$((i + 1))
    done
    # mpirun on node1; its daemons on the other nodes through the rsh agent
    # (no tree spawn: every daemon straight from mpirun); MPI between nodes
    # over TCP on mn0 only, shared memory (vader) within a node
    cat >"$BED_MPIEXEC" <<EOS
#!/bin/sh
exec "$BED_DIR/nodes.sh" run node1 env OMPI_MCA_plm_rsh_agent="$BED_DIR/rsh-agent" \\
    OMPI_MCA_plm_rsh_no_tree_spawn=1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=mn0 \\
    OMPI_MCA_oob_tcp_if_include=mn0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
    mpirun --hostfile "\${BED_HOSTFILE:-$BED_HOSTS}" --bind-to none \${BED_MPIRUN_ARGS:-} "\$@"
EOS
    chmod +x "$BED_MPIEXEC"
    MPIEXEC=$BED_MPIEXEC
}
