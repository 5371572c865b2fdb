#!/usr/bin/env bash
# A throw-away one-node SLURM cluster on the loopback interface, for the test
# suite and for trying the batch scripts without a real cluster: munged,
# slurmctld and slurmd, every file (config, key, state, spool, logs) in one
# temporary directory, nothing written to /etc, no systemd, no cgroups.
#
#   eval "$(slurm/test-cluster.sh up)"     # exports SLURM_CONF and SLURM_LOCAL_DIR
#   sbatch -o out.%j slurm/train_small.sbatch
#   slurm/test-cluster.sh down             # cancels the jobs, stops the daemons by PID
#
# up:   SLURM_LOCAL_DIR (default: a new mktemp dir) holds everything;
#       SLURM_LOCAL_CPUS CPU slots (default 8; more than the cores is fine);
#       SLURM_LOCAL_CTLD_PORT / SLURM_LOCAL_SLURMD_PORT (default: the first
#       free pair from 6817) so that two clusters can run side by side.
#       Exit status 0 with one `export ...` line on stdout; 1 with the reason
#       (and the daemons' log tails) on stderr, everything started stopped.
# down: DIR argument or SLURM_LOCAL_DIR. Stops only the PIDs `up` recorded,
#       keeps DIR (its logs); `down --rm` also deletes it.
#
# Several nodes (test/test_slurm_multinode.sh, on the simulated nodes of
# test/multinode/nodes.sh; doc/multinode.md):
#   SLURM_LOCAL_NODES="node1=198.18.0.11 node2=198.18.0.12"  NAME=ADDRESS of
#       each node (default "localhost=127.0.0.1"): one slurmd per node, with
#       NodeName=NAME, NodeAddr=ADDRESS; munged and slurmctld on the first;
#   SLURM_LOCAL_ON="test/multinode/nodes.sh run"  the command (split at
#       blanks) that runs `ON NODE COMMAND ARGS...` on NODE, as ssh would on
#       a cluster (default: none, everything runs here). The client
#       commands of `up` and `down` (sinfo, squeue, scancel) go through it
#       to the first node, and so must the caller's: sbatch, squeue and
#       scontrol reach slurmctld only from inside the nodes' network.
#   Ports are the defaults (6817, 6818): every node has its own.
#
# The facts behind each setting are in ../shared/notes/slurm-local.md (SLURM
# 22.05, munge 0.5.15, OpenMPI 4.1 with PMIx 4.2 on Debian 12).
set -euo pipefail
PATH=$PATH:/usr/sbin:/sbin

die() { echo "test-cluster: $*" >&2; exit 1; }

# port_free PORT: nothing listens on 127.0.0.1:PORT
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# stop_pid PID: SIGTERM, up to 10 s to exit, then SIGKILL. A zombie counts as
# exited: without an init that reaps promptly, stopped daemons linger as <defunct>.
stop_pid() {
    local p=$1
    kill -TERM "$p" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        kill -0 "$p" 2>/dev/null || return 0
        grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && return 0
        sleep 0.1
    done
    kill -KILL "$p" 2>/dev/null || true
}

cluster_down() {
    local d=$1 on="" head=localhost f
    [ -f "$d/slurm.conf" ] || die "down: $d has no slurm.conf: not a directory made by 'up'"
    export SLURM_CONF="$d/slurm.conf"
    # how `up` reached the first node (several nodes), and its name
    if [ -s "$d/on" ]; then
        on=$(cat "$d/on")
        head=$(cat "$d/head")
    fi
    # running jobs' slurmstepd processes outlive slurmd: cancel them first
    # and give them a few seconds to go
    if [ -s "$d/slurmctld.bgpid" ] && kill -0 "$(cat "$d/slurmctld.bgpid")" 2>/dev/null; then
        client "$on" "$head" scancel --quiet --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 1 100); do
            [ -z "$(client "$on" "$head" squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    # slurmd before slurmctld (slurmd takes ~10 s to exit once the controller
    # is gone), munged last
    for f in "$d"/slurmd*.bgpid "$d/slurmctld.bgpid" "$d/munge/munged.pid"; do
        [ -s "$f" ] && stop_pid "$(cat "$f")"
        rm -f "$f"
    done
    return 0
}

# client ON NODE COMMAND ARGS...: COMMAND here, or on NODE through ON (a
# prefix split at blanks) when ON is set
client() {
    local on=$1 node=$2
    shift 2
    if [ -n "$on" ]; then
        # shellcheck disable=SC2086 # ON is a command prefix, split on purpose
        $on "$node" "$@"
    else
        "$@"
    fi
}

cluster_up() {
    local d ncpus ctld_port slurmd_port on nodes head head_addr n name state
    d=${SLURM_LOCAL_DIR:-$(mktemp -d /tmp/dtrain-slurm.XXXXXX)}
    ncpus=${SLURM_LOCAL_CPUS:-8}
    on=${SLURM_LOCAL_ON:-}
    nodes=${SLURM_LOCAL_NODES:-localhost=127.0.0.1}
    for b in munged slurmctld slurmd sbatch sinfo; do
        command -v "$b" >/dev/null || die "up: $b not found: install slurm-wlm and munge (scripts/install-deps.sh)"
    done
    for n in $nodes; do
        case $n in
        [A-Za-z]*=[0-9]*.[0-9]*.[0-9]*.[0-9]*) ;;
        *) die "up: SLURM_LOCAL_NODES: '$n' is not NAME=ADDRESS (e.g. node1=198.18.0.11)" ;;
        esac
    done
    head=${nodes%%=*}
    head_addr=${nodes#*=}
    head_addr=${head_addr%% *}
    if [ -n "$on" ]; then
        # every node has its own ports; the defaults
        ctld_port=${SLURM_LOCAL_CTLD_PORT:-6817}
    else
        ctld_port=${SLURM_LOCAL_CTLD_PORT:-}
    fi
    if [ -z "$ctld_port" ]; then
        ctld_port=6817
        while ! port_free "$ctld_port" || ! port_free $((ctld_port + 1)); do
            ctld_port=$((ctld_port + 2))
            [ "$ctld_port" -lt 6917 ] || die "up: no free port pair in 6817-6916 on 127.0.0.1"
        done
    fi
    slurmd_port=${SLURM_LOCAL_SLURMD_PORT:-$((ctld_port + 1))}

    mkdir -p "$d/munge" "$d/state" "$d/log"
    for n in $nodes; do
        mkdir -p "$d/spool/${n%%=*}" "$d/tmp/${n%%=*}"
    done
    # munged refuses a socket whose every parent directory is not o+x
    # (mktemp -d makes 0700 directories)
    chmod 755 "$d"
    chmod 711 "$d/munge"
    if [ ! -s "$d/munge/munge.key" ]; then
        dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "$d/munge/munge.key"
    fi
    # down reads how to reach the first node from here
    if [ -n "$on" ]; then
        echo "$on" >"$d/on"
        echo "$head" >"$d/head"
    fi
    # from here on, a failure stops whatever was started
    trap 'cluster_down "$d" >/dev/null 2>&1 || true' ERR
    # one munged for every node: its socket is a file, reachable from every
    # network namespace (on a cluster each node runs its own, with one key)
    client "$on" "$head" munged --key-file="$d/munge/munge.key" --socket="$d/munge/munge.socket" \
        --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" \
        --seed-file="$d/munge/munged.seed" || die "up: munged failed: $(tail -n 3 "$d/munge/munged.log" 2>/dev/null)"

    # Why the non-default settings:
    #   SlurmctldHost: slurmctld only runs on a host of that name ("not a
    #     valid controller" otherwise); localhost(127.0.0.1) on one node;
    #   AuthInfo cred_expire=10: a requeued job waits cred_expire+1 s (default
    #     120 s) before it may start again;
    #   proctrack/linuxproc, task/none, jobacct_gather/none: the cgroup plugins
    #     fail ("cgroup namespace 'freezer' not mounted") in containers;
    #   SlurmdParameters=config_overrides: more CPU slots than cores without
    #     draining the node ("Low CPUs");
    #   EnforcePartLimits=ALL: too many tasks fail at once instead of pending
    #     forever;
    #   batch_sched_delay=0, sched_interval=2: jobs start within a second;
    #   MpiDefault=pmix: Debian's OpenMPI only talks PMIx to srun;
    #   jobcomp/filetxt: there is no accounting database, so finished jobs
    #     are logged to log/jobcomp.log;
    #   %n (the node's name) in the slurmd's spool, PID and log files and in
    #     TmpFS: the nodes share this file system, and srun's PMIx server
    #     puts its per-step directories under both (two nodes' steps of one
    #     job would collide in one directory).
    {
        cat <<EOF
ClusterName=dtrain-test
SlurmctldHost=$head($head_addr)
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.socket,cred_expire=10
CommunicationParameters=NoInAddrAny
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
TmpFS=$d/tmp/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$d/log/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2
EnforcePartLimits=ALL
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
EOF
        for n in $nodes; do
            echo "NodeName=${n%%=*} NodeAddr=${n#*=} CPUs=$ncpus RealMemory=1000 State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=$(echo "$nodes" | sed 's/=[^ ]*//g; s/ /,/g') Default=YES MaxTime=INFINITE State=UP"
    } >"$d/slurm.conf"
    # slurmd sets up its cgroup plugin even when no cgroup plugin is used,
    # and the autodetection fails where /sys/fs/cgroup is not mounted: in a
    # simulated node, whose /sys is the network namespace's own ("No
    # filesystem mounted on /sys/fs/cgroup"). Naming the v1 plugin skips the
    # detection; with proctrack/linuxproc and task/none nothing uses it.
    [ -z "$on" ] || echo "CgroupPlugin=cgroup/v1" >"$d/cgroup.conf"
    export SLURM_CONF="$d/slurm.conf"
    # in the foreground (-D) under setsid, so that we know their PIDs and they
    # leave the caller's process group and terminal alone
    # shellcheck disable=SC2086 # ON is a command prefix, split on purpose
    setsid $on ${on:+"$head"} slurmctld -D -i >"$d/log/slurmctld.out" 2>&1 </dev/null &
    echo $! >"$d/slurmctld.bgpid"
    for n in $nodes; do
        name=${n%%=*}
        # shellcheck disable=SC2086
        setsid $on ${on:+"$name"} slurmd -D -N "$name" >"$d/log/slurmd.$name.out" 2>&1 </dev/null &
        echo $! >"$d/slurmd.$name.bgpid"
    done
    # the nodes are idle about 1 s after the start
    state=""
    for _ in $(seq 1 150); do
        state=$(client "$on" "$head" sinfo -h -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true)
        [ "$state" = "idle " ] && break
        sleep 0.2
    done
    if [ "$state" != "idle " ]; then
        {
            echo "test-cluster: up: node state '${state:-unknown}' after 30 s, not idle; logs in $d/log:"
            tail -n 5 "$d/log/slurmctld.log" "$d"/log/slurmd.*.log "$d/log/slurmctld.out" "$d"/log/slurmd.*.out
        } >&2 || true
        cluster_down "$d" >/dev/null 2>&1 || true
        exit 1
    fi
    trap - ERR
    echo "export SLURM_CONF=$d/slurm.conf SLURM_LOCAL_DIR=$d"
}

case "${1:-}" in
up)
    cluster_up
    ;;
down)
    rm_dir=0
    [ "${2:-}" = --rm ] && { rm_dir=1; shift; }
    d=${2:-${SLURM_LOCAL_DIR:-}}
    [ -n "$d" ] || die "down: give the directory 'up' printed, or set SLURM_LOCAL_DIR"
    cluster_down "$d"
    [ "$rm_dir" -eq 0 ] || rm -rf "$d"
    ;;
*)
    echo "usage: $0 up | down [--rm] [DIR]" >&2
    exit 2
    ;;
esac
