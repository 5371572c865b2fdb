#!/bin/sh
# --trace infrastructure (mpi/trace.c, comm spans of mpi/comm_mpi.c): at np
# 2 and 3, test/test_trace records known spans and real comm calls and
# writes a merged Chrome trace; test/check_trace.py checks it on numbers
# (labels, pids, bytes, call order, durations against the measured ones,
# nonblocking spans inside the caller's post/test windows, proper nesting
# per row, clock alignment). np 3 runs again with the clock ping-pong
# forced, whose offsets must come out within rtt/2 of the true 0.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3 # Debian's: standard library only, never a pyenv shim
PROG="$top_builddir/test/test_trace"
run() { # run NP PINGPONG
    np=$1
    d="$TMP/np$1.pp$2"
    mkdir -p "$d/isdir"
    DTRAIN_TRACE_PINGPONG=$2 "$MPIEXEC" --oversubscribe -x DTRAIN_TRACE_PINGPONG -np "$np" "$PROG" \
        "$d/trace.json" "$d/expect.json" "$d/small.json" "$d/missing/trace.json" "$d/isdir" \
        >"$d/out" 2>"$d/err"
    rc=$?
    cat "$d/out"
    if [ "$rc" -eq 0 ] && ! grep -q '^FAIL' "$d/out" && tail -n 1 "$d/out" | grep -q '^0 failure(s)$'; then
        pass "np $np (ping-pong $2): test_trace"
    else
        fail "np $np (ping-pong $2): test_trace exit $rc: $(head -c 2000 "$d/err")"
        return
    fi
    if [ ! -d "$d/missing" ] && [ -z "$(ls "$d" | grep '\.tmp\.')" ]; then
        pass "np $np: no missing/ created, no temporary left"
    else
        fail "np $np: stray files: $(ls -a "$d")"
    fi
    "$PY" "$top_srcdir/test/check_trace.py" "$d/trace.json" "$d/expect.json" "$d/small.json" "$2" >"$d/check" 2>&1
    rc=$?
    cat "$d/check"
    if [ "$rc" -eq 0 ]; then
        pass "np $np (ping-pong $2): check_trace.py $(tail -n 1 "$d/check")"
    else
        fail "np $np (ping-pong $2): check_trace.py exit $rc"
    fi
}

run 2 0
run 3 0
run 3 1
finish
