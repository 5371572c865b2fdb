#!/bin/sh
# ZeRO stages 0-3 at one data-parallel size: median ms/step, median exposed
# communication per step (the rank-max "comm wait" dtrain prints), and the
# per-rank peak bytes of parameters, gradients and optimizer state from
# --metrics' mem_peak. The stages are interleaved over ROUNDS rounds so that
# load from other processes falls on all of them alike.
#
#   bench/zero.sh [NP [STEPS [ROUNDS [ARGS...]]]]   (run from the build directory)
#
# ARGS replace the default shape: a 12-block GPT-2 of width 256 (12.6M
# parameters, byte vocabulary), micro batch 4 x seq 128, 1 thread per rank.
set -eu
np=${1:-2}
steps=${2:-10}
rounds=${3:-3}
[ $# -ge 3 ] && shift 3 || shift $#
[ $# -gt 0 ] || set -- --model tiny --n-layer 12 --d-model 256 --n-head 8 --d-ff 1024 --micro-batch 4 --seq-len 128
dtrain=${DTRAIN:-./src/dtrain}
data=${DATA:-data/gutenberg_train_*.bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

median_of() { # values on stdin, one a line
    sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
mem() { # FILE KEY
    tail -n 1 "$1" | sed -n "s/.*\"$2\": \([0-9]*\).*/\1/p"
}

echo "mpirun -np $np dtrain $* --threads 1 --zero S, $steps steps, $rounds rounds"
for r in $(seq 1 "$rounds"); do
    for z in 0 1 2 3; do
        mpirun --oversubscribe --bind-to none --quiet -np "$np" "$dtrain" --data "$data" --val-every 0 \
            --sample-tokens 0 --steps "$steps" --warmup 1 --threads 1 --zero $z --metrics "$out/m.json" "$@" \
            >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
        # step 1 pays for first touch of memory
        sed -n 's/.*"ms": \([0-9.]*\).*/\1/p' "$out/m.json" | tail -n +2 | median_of >>"$out/ms.$z"
        sed -n 's/.*comm wait \([0-9.]*\)\/.*/\1/p' "$out/log" | tail -n +2 | median_of >>"$out/comm.$z"
        echo $(($(mem "$out/m.json" parameters) + $(mem "$out/m.json" gradients) + $(mem "$out/m.json" optimizer))) \
            >"$out/bytes.$z"
    done
done
base=$(median_of <"$out/ms.0")
bytes0=$(cat "$out/bytes.0")
printf '%-6s %12s %12s %22s %s\n' "zero" "ms/step" "vs zero 0" "exposed comm ms/step" "params+grads+optim bytes/rank"
for z in 0 1 2 3; do
    ms=$(median_of <"$out/ms.$z")
    printf '%-6s %12.1f %+11.1f%% %22.1f %s (%.3fx)\n' $z "$ms" "$(awk -v a="$ms" -v b="$base" 'BEGIN { print 100 * (a / b - 1) }')" \
        "$(median_of <"$out/comm.$z")" "$(cat "$out/bytes.$z")" "$(awk -v a="$(cat "$out/bytes.$z")" -v b="$bytes0" 'BEGIN { print a / b }')"
done
