#!/bin/sh
# Activation recomputation: activation and workspace bytes (--metrics'
# mem_peak) and ms/step for --recompute none, selective and full, the
# modes interleaved over ROUNDS rounds so that load from other processes
# falls on all three alike. Prints each round's median ms/step over steps
# 2..STEPS (step 1 pays for first touch of memory) and the median over rounds.
#
#   bench/recompute.sh [STEPS [ROUNDS [ARGS...]]]   (run from the build directory)
#
# ARGS replace the default shape, the tiny model at micro batch 16 x seq 128
# on 2 threads (e.g. --model gpt2-124m --micro-batch 4 --seq-len 64).
set -eu
steps=${1:-12}
rounds=${2:-3}
[ $# -ge 2 ] && shift 2 || shift $#
[ $# -gt 0 ] || set -- --model tiny --micro-batch 16 --seq-len 128
dtrain=${DTRAIN:-./src/dtrain}
data=${DATA:-data/gutenberg_train_*.bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median_of() { # values on stdin, one a line
    sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
mem() { # FILE KEY
    tail -n 1 "$1" | sed -n "s/.*\"$2\": \([0-9]*\).*/\1/p"
}

echo "dtrain $* --threads 2, $steps steps, $rounds rounds"
for r in $(seq 1 "$rounds"); do
    for mode in none selective full; do
        "$dtrain" --data "$data" --val-every 0 --sample-tokens 0 --steps "$steps" --warmup 1 --threads 2 \
            --recompute $mode --metrics "$out/m.json" "$@" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
        sed -n 's/.*"ms": \([0-9.]*\).*/\1/p' "$out/m.json" | tail -n +2 | median_of >>"$out/ms.$mode"
        mem "$out/m.json" activations >"$out/acts.$mode"
        mem "$out/m.json" workspace >"$out/work.$mode"
    done
done
base=$(median_of <"$out/ms.none")
printf '%-10s %14s %14s %s\n' "recompute" "activations" "workspace" "ms/step: median over rounds (each round's), vs none"
for mode in none selective full; do
    ms=$(median_of <"$out/ms.$mode")
    printf '%-10s %14s %14s %.1f (%s) %+.1f%%\n' $mode "$(cat "$out/acts.$mode")" "$(cat "$out/work.$mode")" "$ms" \
        "$(tr '\n' ' ' <"$out/ms.$mode" | sed 's/ $//')" "$(awk -v a="$ms" -v b="$base" 'BEGIN { print 100 * (a / b - 1) }')"
done
