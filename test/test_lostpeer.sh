#!/bin/sh
# The lost-peer report (mpi/lostpeer.h) on one machine: at SIGTERM the
# lowest rank still there names, in one line, the ranks that no longer
# answer, and a SIGTERM to a job whose ranks all answer prints nothing.
# The multi-node test (test_multinode_loss.sh) loses a real simulated node
# under mpirun; here the rules are checked one by one, without root:
#  - test_lostpeer (4 ranks playing two hosts): which ranks are named, by
#    whom, exactly once; no line for preemption, for a launcher that ends
#    one node's ranks before the others', or after the watchdog's line; the
#    first watchdog line is the job's (the others are told to stay quiet),
#    and of watchdogs that fire at once the lowest rank's;
#    the start-up check names a rank that cannot be reached;
#  - dtrain at tp2 x pp2: ranks 2,3 stopped (SIGSTOP: they answer nothing),
#    ranks 0,1 get SIGTERM as from mpirun: the line names ranks 2,3 within
#    1 s (mpirun's SIGKILL follows its SIGTERM after 1 s), with what rank 0
#    was waiting in; a SIGTERM to every rank stops the run with a checkpoint
#    and no line.
. "${top_srcdir:-.}/test/common.sh"

host=$(hostname)
LP="$top_builddir/test/test_lostpeer"

# lp_run LABEL WANT MODE [RANKS]: WANT is the one line's regex, or "" for none
lp_run() {
    label=$1 want=$2
    shift 2
    "$MPIEXEC" --quiet -np 4 "$LP" "$@" >"$TMP/lp.log" 2>&1
    rc=$?
    n=$(grep -c 'stopped answering' "$TMP/lp.log")
    checks=$(grep -c '^check: rank [0-3]: ok$' "$TMP/lp.log")
    if [ -z "$want" ]; then
        [ "$rc" -eq 0 ] && [ "$n" -eq 0 ] && [ "$checks" -eq 4 ] && pass "$label: no line" ||
            fail "$label: status $rc, $n line(s), $checks checks: $(grep -v '^check: rank [0-3]: ok' "$TMP/lp.log" | head -c 600)"
    else
        line=$(grep 'stopped answering' "$TMP/lp.log")
        [ "$rc" -eq 0 ] && [ "$n" -eq 1 ] && [ "$checks" -eq 4 ] && echo "$line" | grep -Eq "$want" &&
            pass "$label: one line: $line" ||
            fail "$label: status $rc, $n line(s), $checks checks, wanted /$want/: $(grep -v '^check: rank [0-3]: ok' "$TMP/lp.log" | head -c 600)"
    fi
}

tail_ok=' within 0\.5 s when the job was being ended \(SIGTERM\)$'
lp_run "hostB lost" "^dtrain: ranks 2,3 on hostB stopped answering: no reply to rank 0$tail_ok" lost 2,3
lp_run "one rank of hostB lost" "^dtrain: rank 3 on hostB stopped answering: no reply to rank 0$tail_ok" lost 3
# rank 0's host: hostB's first rank, finding no rank below it, judges
lp_run "hostA lost" "^dtrain: ranks 0,1 on hostA stopped answering: no reply to rank 2$tail_ok" lost 0,1
# rank 0 alone: rank 1, the lowest left, judges, and hostB asks it to
lp_run "rank 0 lost" "^dtrain: rank 0 on hostA stopped answering: no reply to rank 1$tail_ok" lost 0
lp_run "SIGTERM to every rank" "" all
lp_run "hostA ended 1 s before hostB" "" staggered
lp_run "rank 2 printed its own line first" "" ending 2

# the watchdog's line: the first rank to claim it prints, the others not
"$MPIEXEC" --quiet -np 4 "$LP" claim >"$TMP/claim.log" 2>&1
if grep -qx 'claim: rank 0: first' "$TMP/claim.log" && [ "$(grep -c '^claim: rank [1-3]: quiet$' "$TMP/claim.log")" -eq 3 ]; then
    pass "the job's line claimed by rank 0: ranks 1-3 told to stay quiet"
else
    fail "claims: $(grep -v ': ok$' "$TMP/claim.log" | head -c 600)"
fi

# every rank's watchdog fires in the same instant (rank 0 waiting on a lost
# peer, rank 1 on rank 0): the lowest rank prints, the others stay quiet
"$MPIEXEC" --quiet -np 4 "$LP" together >"$TMP/together.log" 2>&1
if grep -qx 'claim: rank 0: first' "$TMP/together.log" && [ "$(grep -c '^claim: rank [1-3]: quiet$' "$TMP/together.log")" -eq 3 ]; then
    pass "the job's line claimed by all 4 ranks at once: rank 0 prints, ranks 1-3 stay quiet"
else
    fail "claims at once: $(grep -v ': ok$' "$TMP/together.log" | head -c 600)"
fi

"$MPIEXEC" --quiet -np 4 "$LP" badport >"$TMP/bp.log" 2>&1
if grep -qx 'check: rank 0: rank 3 (host hostB) did not answer over UDP within 3 s' "$TMP/bp.log" &&
    [ "$(grep -c '^check: rank [1-3]: ok$' "$TMP/bp.log")" -eq 3 ]; then
    pass "start-up check, rank 3 unreachable from rank 0: $(grep '^check: rank 0' "$TMP/bp.log")"
else
    fail "start-up check: $(head -c 600 "$TMP/bp.log")"
fi

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

# start LABEL: a long tp2 x pp2 run tagged LABEL, once it printed step 3
start() {
    tag="$$-$1"
    log="$TMP/$1.log"
    "$MPIEXEC" --quiet -np 4 -x DTRAIN_TEST_TAG="$tag" "$DTRAIN" $(tiny_args) --threads 1 --steps 100000 \
        --micro-batch 2 --global-batch 4 --seq-len 64 --val-every 0 --sample-tokens 0 --comm-timeout 60 \
        --tp 2 --pp 2 --ckpt-dir "$TMP/$1" --ckpt-every 1000 >"$log" 2>&1 &
    job=$!
    i=0
    until grep -q '^step *3/' "$log" 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt 600 ] || ! kill -0 "$job" 2>/dev/null; then
            fail "$1: the run did not reach step 3: $(tail -n 3 "$log")"
            kill "$job" 2>/dev/null
            return 1
        fi
        sleep 0.1
    done
    pids=""
    for r in 0 1 2 3; do
        p=$(pid_of "$tag" $r) || { fail "$1: no process for rank $r"; kill "$job"; return 1; }
        pids="$pids $p"
    done
    set -- $pids
    p0=$1 p1=$2 p2=$3 p3=$4
}

ms() { echo $(($(date +%s%N) / 1000000)); }

# stopped PID...: every thread of every PID is in the stopped state (T), so
# that none can still answer a question (a SIGSTOP takes effect on each
# thread only when it next runs, which on a loaded machine is not at once)
stopped() {
    for p in "$@"; do
        for t in /proc/"$p"/task/*/stat; do
            # the state follows the command name's closing parenthesis
            st=$(sed 's/.*) //' "$t" 2>/dev/null | cut -d' ' -f1)
            [ "$st" = T ] || [ "$st" = t ] || return 1
        done
    done
}

# ranks 2,3 stopped, ranks 0,1 get SIGTERM: the line within 1 s
if start stopped; then
    kill -STOP "$p2" "$p3"
    i=0
    until stopped "$p2" "$p3" || [ "$i" -gt 100 ]; do
        i=$((i + 1))
        sleep 0.02
    done
    t0=$(ms)
    kill -TERM "$p0" "$p1"
    until grep -q 'stopped answering' "$log" || [ $(($(ms) - t0)) -gt 5000 ]; do
        sleep 0.05
    done
    dt=$(($(ms) - t0))
    sleep 1 # a second line would come now
    kill -KILL "$p0" "$p1" "$p2" "$p3" 2>/dev/null
    wait "$job"
    n=$(grep -c 'stopped answering' "$log")
    line=$(grep 'stopped answering' "$log")
    want="^dtrain: ranks 2,3 on $host stopped answering: no reply to rank 0 \(tp 0 pp 0 dp 0, host $host\)$(echo "$tail_ok" | sed 's/\$$//'); rank 0 was waiting [0-9.]+ s in [a-z0-9_ ]+ on group [a-z]+"
    if [ "$n" -eq 1 ] && [ "$dt" -le 1000 ] && echo "$line" | grep -Eq "$want"; then
        pass "dtrain, ranks 2,3 stopped: the line after $dt ms (<= 1000): $line"
    else
        fail "dtrain, ranks 2,3 stopped: $n line(s) after $dt ms, wanted /$want/: $(grep -v '^step\|^  ' "$log" | tail -n 4)"
    fi
fi

# every rank gets SIGTERM: the run stops with a checkpoint, status 0, no line
if start everyone; then
    kill -TERM "$p0" "$p1" "$p2" "$p3"
    wait "$job"
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q '^stopping at step [0-9]*: SIGTERM received, checkpoint' "$log" &&
        ! grep -q 'stopped answering' "$log"; then
        pass "dtrain, SIGTERM to every rank: $(grep '^stopping at step' "$log" | cut -c1-60)..., no line"
    else
        fail "dtrain, SIGTERM to every rank: status $rc: $(grep -v '^step\|^  ' "$log" | tail -n 4)"
    fi
fi

finish
