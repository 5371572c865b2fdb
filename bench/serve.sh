#!/bin/sh
# dtrain-serve throughput on the CPU (issue 38): requests/s and tokens/s of
# batched log-likelihood scoring (lm-evaluation-harness's payload: B
# prompts of T tokens a request, echo, logprobs 1, max_tokens 1) and of
# generation (B prompts of P tokens, G new tokens each, temperature 0),
# against the forward of a training step at the same batch (B x T: the
# "fwd" spans of dtrain --trace on rank 0, the fastest of steps 2..6), for
# tiny (B 16, T 128) and gpt2-124m (B 4, T 64; random weights: speed does
# not depend on them) at 1 rank and tp2 (2 ranks), one thread per rank
# (THREADS=N for another count: on a machine whose cores other work keeps
# busy, two OpenMP threads spin in each other's barriers and a generation
# request took 6x longer than on one). One client, one request at a time, so each time is one request's
# whole path: HTTP, JSON, the ranks' forwards, the answer. Both sides
# report their fastest (training step, request) after a warm-up: on a
# machine shared with other work the fastest is the one least disturbed.
#
#   bench/serve.sh [REQUESTS]      (run from the build directory; default 8)
#
# Scoring tokens/s counts the prompt tokens scored; the target is at least
# 0.8 of the training forward's tokens/s. Generation tokens/s counts the
# tokens generated (each one a forward over its whole row: no key/value
# cache).
set -eu
reqs=${1:-8}
dtrain=${DTRAIN:-./src/dtrain}
serve=${DTRAIN_SERVE:-./src/dtrain-serve}
data=${DATA:-data/gutenberg_train_*.bin}
out=$(mktemp -d)
spid=""
trap '[ -n "$spid" ] && kill -KILL $spid 2>/dev/null; rm -rf "$out"' EXIT
mpi="mpirun --oversubscribe --bind-to none"

# fwd_tokens_s NP B T ARGS...: tokens/s of a training step's forward
fwd_tokens_s() {
    np=$1
    b=$2
    t=$3
    shift 3
    $mpi -np "$np" "$dtrain" --data "$data" --val-every 0 --sample-tokens 0 --steps 6 --warmup 1 --peak-gflops 100 \
        --micro-batch "$b" --seq-len "$t" --trace "$out/trace.json" "$@" >"$out/train.log" 2>&1 ||
        { cat "$out/train.log"; exit 1; }
    /usr/bin/python3 - "$out/trace.json" "$b" "$t" <<'PYEOF'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
spans = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 0 and e["name"].startswith("fwd")]
# one step's forward: the spans between one "fwd embed" and the next
steps = []
for e in sorted(spans, key=lambda e: e["ts"]):
    if e["name"] == "fwd embed":
        steps.append(0.0)
    steps[-1] += e["dur"]
best = min(s / 1000 for s in steps[1:])
print("%.1f %.0f" % (best, int(sys.argv[2]) * int(sys.argv[3]) / (best / 1000)))
PYEOF
}

# start NP ARGS...: the server in the background, its port in $port
start() {
    np=$1
    shift
    $mpi -np "$np" "$serve" --port 0 "$@" >"$out/serve.log" 2>&1 &
    spid=$!
    port=""
    for _ in $(seq 1 600); do
        port=$(sed -n 's/^dtrain-serve: listening on http:[^ ]*:\([0-9]*\) .*/\1/p' "$out/serve.log")
        [ -n "$port" ] && return 0
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$out/serve.log"
    exit 1
}
stop() {
    kill -TERM "$(pgrep -P "$spid" | head -n 1)"
    wait "$spid" || { cat "$out/serve.log"; exit 1; }
    spid=""
}

# client PORT B T P G VOCAB: "score_req/s score_tok/s gen_req/s gen_tok/s"
client() {
    /usr/bin/python3 - "$@" "$reqs" <<'PYEOF'
import json, random, sys, time, urllib.request
port, B, T, P, G, V, R = (int(a) for a in sys.argv[1:8])
rng = random.Random(1)
def post(body):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.loads(r.read())
    assert len(out["choices"]) == len(body["prompt"])
def rows(n, length):
    return [[rng.randrange(V) for _ in range(length)] for _ in range(n)]
def timed(make, count):
    post(make())  # warm-up: first touch of the activations
    best = None
    for _ in range(count):
        body = make()
        t0 = time.time()
        post(body)
        best = min(best or 1e30, time.time() - t0)
    return best
s = timed(lambda: {"prompt": rows(B, T), "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1234}, R)
g = timed(lambda: {"prompt": rows(B, P), "max_tokens": G, "temperature": 0}, max(1, R // 4))
print("%.2f %.0f %.3f %.1f" % (1 / s, B * T / s, 1 / g, B * G / g))
PYEOF
}

printf '%-10s %-7s %-9s %12s %14s %11s %6s %13s %12s\n' model layout "B x T" "train fwd" "scoring" "req/s" "ratio" \
    "generation" "req/s"
printf '%-10s %-7s %-9s %12s %14s %11s %6s %13s %12s\n' "" "" "" "tok/s" "tok/s" "" "" "tok/s" ""
row() { # model B T P G layout-label np threads serve-args...
    model=$1
    b=$2
    t=$3
    p=$4
    g=$5
    label=$6
    np=$7
    th=$8
    shift 8
    [ -f "$out/$model.h5" ] || $mpi -np 1 "$dtrain" --model "$model" --data "$data" --val-every 0 --sample-tokens 0 \
        --steps 1 --peak-gflops 100 --micro-batch 1 --seq-len 64 --save-params "$out/$model.h5" >"$out/p.log" 2>&1 ||
        { cat "$out/p.log"; exit 1; }
    set -- $(fwd_tokens_s "$np" "$b" "$t" --model "$model" --threads "$th" "$@")
    fwd=$2
    start "$np" --init-from "$out/$model.h5" --batch "$b" --seq-len $((t + 1)) --threads "$th" \
        $([ "$np" -gt 1 ] && echo --tp "$np")
    vocab=$(sed -n 's/.* vocab=\([0-9]*\) .*/\1/p' "$out/serve.log")
    set -- $(client "$port" "$b" "$t" "$p" "$g" "$vocab")
    stop
    printf '%-10s %-7s %-9s %12.0f %14.0f %11.2f %5.2fx %13.1f %12.3f\n' "$model" "$label" "${b}x$t" "$fwd" "$2" "$1" \
        "$(awk -v a="$2" -v b="$fwd" 'BEGIN { print a / b }')" "$4" "$3"
}
th=${THREADS:-1}
row tiny 16 128 32 32 "1 rank" 1 "$th"
row tiny 16 128 32 32 "tp2" 2 "$th" --tp 2
row gpt2-124m 4 64 16 16 "1 rank" 1 "$th"
row gpt2-124m 4 64 16 16 "tp2" 2 "$th" --tp 2
