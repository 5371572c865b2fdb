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

# dtrain --trace at tp2 x dp2, 3 steps of 2 microbatches, bucketed DDP:
# every rank has a forward and a backward span of each of the 4 layers per
# microbatch, TP all-reduces, and DP bucket all-reduces that overlap a
# backward span (the point of bucketing)
"$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) --threads 1 --steps 3 --micro-batch 2 --global-batch 8 \
    --seq-len 64 --tp 2 --val-every 0 --sample-tokens 0 --bucket-mb 0.05 --trace "$TMP/dtrain.json" \
    >"$TMP/dtrain.out" 2>&1 || fail "dtrain --trace: exit $? $(tail -n 3 "$TMP/dtrain.out")"
"$PY" - "$TMP/dtrain.json" >"$TMP/dtrain.check" 2>&1 <<'PYEOF'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
bad = 0
for pid in range(4):
    mine = [e for e in ev if e["pid"] == pid]
    for kind in ("fwd", "bwd"):
        for layer in range(4):
            n = sum(1 for e in mine if e["name"] == "%s h.%d" % (kind, layer))
            if n != 3 * 2:
                print("rank %d: %d '%s h.%d' spans, want 6" % (pid, n, kind, layer)); bad += 1
    mb = sorted({e["args"]["microbatch"] for e in mine if e["name"].startswith("fwd h.")})
    if mb != [0, 1]:
        print("rank %d: microbatches %s" % (pid, mb)); bad += 1
    tp = sum(1 for e in mine if e["name"] == "allreduce tp")
    dp = [e for e in mine if e["name"] == "iallreduce dp"]
    back = [e for e in mine if e["name"].startswith("bwd h.")]
    over = sum(1 for d in dp if any(b["ts"] < d["ts"] + d["dur"] and d["ts"] < b["ts"] + b["dur"] for b in back))
    if tp == 0 or not dp or over == 0 or any(d["args"].get("bytes", 0) <= 0 for d in dp):
        print("rank %d: %d tp all-reduces, %d dp buckets, %d overlapping backward" % (pid, tp, len(dp), over)); bad += 1
    print("rank %d: %d spans, %d tp all-reduces, %d of %d dp buckets overlap a backward span" % (pid, len(mine), tp, over, len(dp)))
sys.exit(1 if bad else 0)
PYEOF
if [ $? -eq 0 ]; then
    pass "dtrain --trace tp2 dp2: $(tail -n 1 "$TMP/dtrain.check")"
else
    fail "dtrain --trace: $(cat "$TMP/dtrain.check")"
fi
finish
