#!/bin/sh
# The fused classifier (--logits-chunk): activation and workspace bytes
# (--metrics' mem_peak) and ms/step for each of MODES (default "whole
# auto"), interleaved over ROUNDS rounds so that load from other processes
# falls on all alike. Prints each round's median ms/step over steps
# 2..STEPS (step 1 pays for first touch of memory) and the median over
# rounds, against the first mode.
#
#   bench/classifier.sh [STEPS [ROUNDS [MODES [ARGS...]]]]   (run from the build directory)
#
# MODES: --logits-chunk values, space-separated in one argument (e.g.
# "whole auto 64"). ARGS replace the default shape, the tiny model at micro
# batch 16 x seq 128 on 2 threads (e.g. --model gpt2-124m --micro-batch 4
# --seq-len 128).
set -eu
steps=${1:-12}
rounds=${2:-3}
modes=${3:-whole auto}
[ $# -ge 3 ] && shift 3 || shift $#
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
    for mode in $modes; do
        "$dtrain" --data "$data" --val-every 0 --sample-tokens 0 --steps "$steps" --warmup 1 --threads 2 \
            --logits-chunk "$mode" --metrics "$out/m.json" "$@" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
        sed -n 's/.*"ms": \([0-9.]*\).*/\1/p' "$out/m.json" | tail -n +2 | median_of >>"$out/ms.$mode"
        mem "$out/m.json" activations >"$out/acts.$mode"
        mem "$out/m.json" workspace >"$out/work.$mode"
    done
done
base=
printf '%-14s %14s %14s %s\n' "logits-chunk" "activations" "workspace" "ms/step: median over rounds (each round's), vs the first"
for mode in $modes; do
    ms=$(median_of <"$out/ms.$mode")
    [ -n "$base" ] || base=$ms
    printf '%-14s %14s %14s %.1f (%s) %+.1f%%\n' "$mode" "$(cat "$out/acts.$mode")" "$(cat "$out/work.$mode")" "$ms" \
        "$(tr '\n' ' ' <"$out/ms.$mode" | sed 's/ $//')" "$(awk -v a="$ms" -v b="$base" 'BEGIN { print 100 * (a / b - 1) }')"
done
