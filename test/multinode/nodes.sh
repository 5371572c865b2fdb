#!/bin/sh
# Simulated nodes on one machine, for the multi-node tests (doc/multinode.md).
#
# Each node is a network namespace (its own interfaces, addresses, TCP
# ports) plus a persistent UTS namespace (its own hostname, node1..nodeN),
# held by a bind mount under the state directory. The nodes' interfaces
# (mn0, 198.18.0.(10+i)/24, RFC 2544's benchmarking range) are veth pairs
# into a bridge that lives in a namespace of its own, so nothing is added to
# the host's network and traffic goes only between the nodes. Every node
# sees the host's file systems (one shared checkpoint directory, as on a
# cluster with a parallel file system) and gets an /etc/hosts naming all
# nodes (`ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts).
#
#   nodes.sh check          0 when namespaces can be made here, else 77 and one line
#   nodes.sh up N           make node1..nodeN (2 to 4)
#   nodes.sh run NODE CMD   CMD on NODE (its network, hostname and /etc/hosts)
#   nodes.sh pids NODE      the processes in NODE's network namespace
#   nodes.sh kill NODE      SIGKILL every process of NODE (a node lost)
#   nodes.sh link-down NODE take NODE's link down (a network partition)
#   nodes.sh link-up NODE   bring it back
#   nodes.sh down           end every process of the nodes, remove everything
#   nodes.sh gc             remove the beds of tests that died without their
#                           cleanup (IDs t<PID> whose PID is gone)
#
# DTRAIN_NODES_ID names one test bed (default "dtrain"): beds with different
# IDs coexist (the tests use their PID), so parallel tests never collide.
# test/multinode/rsh-agent uses `run` as OpenMPI's plm_rsh_agent, in place
# of ssh.
set -u
ID=${DTRAIN_NODES_ID:-dtrain}
STATE=${DTRAIN_NODES_RUN:-/run/dtrain-nodes}/$ID
IFACE=mn0
NET=198.18.0

die() {
    echo "nodes.sh: $*" >&2
    exit 1
}

ns() { echo "dtrain-$ID-$1"; }

# node_addr i: node i's address
node_addr() { echo "$NET.$((10 + $1))"; }

# check: can this machine make network and UTS namespaces? One line and 77
# when it cannot (not root, no ip/nsenter/unshare, a container without
# CAP_SYS_ADMIN).
check() {
    for c in ip nsenter unshare; do
        command -v $c >/dev/null 2>&1 || { echo "SKIP: no '$c' command (iproute2, util-linux)"; exit 77; }
    done
    [ "$(id -u)" -eq 0 ] || { echo "SKIP: simulated nodes need root (network namespaces)"; exit 77; }
    probe="dtrain-probe-$$"
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "SKIP: cannot make a network namespace: $err"
        exit 77
    fi
    ok=1 what="a UTS namespace"
    err=$(ip netns exec "$probe" unshare --uts true 2>&1) || ok=0
    # the links the bed is made of: a bridge and a veth pair (kernel
    # modules a container may lack)
    [ $ok -eq 0 ] || { what="a bridge" && err=$(ip -n "$probe" link add br0 type bridge 2>&1); } || ok=0
    [ $ok -eq 0 ] || { what="a veth pair" && err=$(ip -n "$probe" link add va type veth peer name vb 2>&1); } || ok=0
    ip netns del "$probe" 2>/dev/null
    [ $ok -eq 1 ] || { echo "SKIP: cannot make $what: $err"; exit 77; }
}

# make_node i: node i's namespaces, link, address, hostname and hosts file
make_node() {
    n=node$1
    ip netns add "$(ns $n)" || return 1
    ip -n "$(ns br)" link add "p$1" type veth peer name $IFACE netns "$(ns $n)" &&
        ip -n "$(ns br)" link set "p$1" master br0 up &&
        ip -n "$(ns $n)" link set lo up &&
        ip -n "$(ns $n)" addr add "$(node_addr $1)/24" dev $IFACE &&
        ip -n "$(ns $n)" link set $IFACE up || return 1
    : >"$STATE/$n.uts" && unshare --uts="$STATE/$n.uts" hostname $n || return 1
    mkdir -p "/etc/netns/$(ns $n)" && cp "$STATE/hosts" "/etc/netns/$(ns $n)/hosts"
}

up() {
    case ${1:-} in 2 | 3 | 4) ;; *) die "up N: N must be 2, 3 or 4 (got '${1:-}')" ;; esac
    [ ! -e "$STATE" ] || die "test bed '$ID' exists ($STATE): 'nodes.sh down' first"
    mkdir -p "$STATE" || die "cannot make $STATE"
    printf '127.0.0.1 localhost\n' >"$STATE/hosts"
    i=1
    while [ $i -le "$1" ]; do
        printf '%s node%d\n' "$(node_addr $i)" $i >>"$STATE/hosts"
        i=$((i + 1))
    done
    echo "$1" >"$STATE/count"
    ip netns add "$(ns br)" && ip -n "$(ns br)" link add br0 type bridge &&
        ip -n "$(ns br)" link set br0 up || { down; die "cannot make the bridge"; }
    i=1
    while [ $i -le "$1" ]; do
        make_node $i || { down; die "cannot make node$i"; }
        i=$((i + 1))
    done
}

count() { cat "$STATE/count" 2>/dev/null || echo 0; }

# node_of NAME: node1..nodeN from a name or an address (the rsh agent may
# get either, as ssh would)
node_of() {
    case $1 in
    node[1-4]) echo "$1" ;;
    "$NET".*) echo "node$((${1##*.} - 10))" ;;
    *) die "unknown node '$1' (node1..node$(count) or $NET.11..)" ;;
    esac
}

run() {
    n=$(node_of "$1")
    shift
    [ -e "$STATE/$n.uts" ] || die "no $n in test bed '$ID'"
    exec ip netns exec "$(ns $n)" nsenter --uts="$STATE/$n.uts" -- "$@"
}

pids() { ip netns pids "$(ns "$(node_of "$1")")" 2>/dev/null; }

# kill NODE: SIGKILL until none is left (a process may fork while we look)
kill_node() {
    tries=0
    while p=$(pids "$1") && [ -n "$p" ] && [ $tries -lt 50 ]; do
        kill -9 $p 2>/dev/null
        sleep 0.1
        tries=$((tries + 1))
    done
    [ -z "$(pids "$1")" ]
}

down() {
    i=1
    while [ $i -le "$(count)" ]; do
        n=node$i
        kill_node $n
        ip netns del "$(ns $n)" 2>/dev/null
        umount "$STATE/$n.uts" 2>/dev/null
        rm -rf "/etc/netns/$(ns $n)"
        i=$((i + 1))
    done
    ip netns del "$(ns br)" 2>/dev/null
    rm -rf "$STATE"
    rmdir /etc/netns 2>/dev/null
    return 0
}

# gc: a test killed with SIGKILL (a CI timeout) leaves its bed; its ID is
# t<PID> (test/multinode/bed.sh), so a bed whose process is gone is stale
gc() {
    for d in "${DTRAIN_NODES_RUN:-/run/dtrain-nodes}"/t*; do
        [ -d "$d" ] || continue
        id=${d##*/}
        pid=${id#t}
        case $pid in '' | *[!0-9]*) continue ;; esac
        kill -0 "$pid" 2>/dev/null || DTRAIN_NODES_ID=$id "$0" down
    done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
check) check ;;
up) up "$@" ;;
run) [ $# -ge 2 ] || die "run NODE CMD..."; run "$@" ;;
pids) pids "$@" ;;
kill) kill_node "$1" ;;
link-down) ip -n "$(ns "$(node_of "$1")")" link set $IFACE down ;;
link-up) ip -n "$(ns "$(node_of "$1")")" link set $IFACE up ;;
down) down ;;
gc) gc ;;
*) die "usage: nodes.sh check | up N | run NODE CMD... | pids NODE | kill NODE | link-down|link-up NODE | down | gc" ;;
esac
