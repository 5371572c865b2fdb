#!/bin/sh
# The data loader's share of step time, for a blend of three Megatron
# datasets (the bundled books, one dataset each, made by dtrain-prepare
# --format megatron), at the tiny and gpt2-124m shapes.
#
#   bench/loader.sh [STEPS]      (run from the build directory)
#
# Each run writes a --trace; the loader's time is the sum of its "data"
# spans (drawing a microbatch: the blend's order, the permutation, the
# copy out of the mapped .bin and the read-ahead hint for the next
# microbatch) on rank 0, against the sum of the step times (--metrics ms)
# over steps 2..STEPS (step 1 pays for first touch of memory).
set -eu
steps=${1:-6}
dtrain=${DTRAIN:-./src/dtrain}
prepare=${DTRAIN_PREPARE:-./src/dtrain-prepare}
src=${SRCDIR:-.}/examples/data
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for b in carroll-alice shakespeare-hamlet austen-persuasion; do
    "$prepare" --out "$out/$b" --format megatron --doc-separator '\n\n' --val-fraction 0 "$src/$b.txt" >/dev/null
done
blend="0.5 $out/carroll-alice_train 0.3 $out/shakespeare-hamlet_train 0.2 $out/austen-persuasion_train"

printf '%-10s %10s %12s %12s %8s\n' shape steps "step ms" "loader ms" share
run() { # label args...
    label=$1
    shift
    "$dtrain" --data-format megatron --data "$blend" --val-every 0 --sample-tokens 0 --steps "$steps" --warmup 1 \
        --metrics "$out/m.json" --trace "$out/t.json" "$@" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
    /usr/bin/python3 - "$out/m.json" "$out/t.json" "$label" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
ms = sum(s["ms"] for s in steps[1:])
ev = json.load(open(sys.argv[2]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
data = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 0 and e.get("name") == "data"]
per = len(data) // len(steps)           # microbatches per step
loader = sum(e["dur"] for e in data[per:]) / 1000.0
print("%-10s %10d %12.1f %12.3f %7.3f%%" % (sys.argv[3], len(steps) - 1, ms / (len(steps) - 1),
                                         loader / (len(steps) - 1), 100 * loader / ms))
PY
}
run tiny --model tiny --micro-batch 8 --seq-len 256
run gpt2-124m --model gpt2-124m --micro-batch 1 --seq-len 1024
