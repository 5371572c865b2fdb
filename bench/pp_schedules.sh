#!/bin/sh
# Pipeline schedules side by side: ms/step, the measured bubble (the
# metrics' bubble_mean: each rank's seconds blocked on pipeline messages
# over its step, averaged over the ranks) and activation bytes per rank
# (mem_peak's activations) for 1f1b, gpipe, interleaved v2 and zb-h1 at pp PP
# (default 4; a pipeline's stages must each have a core, so on a 2-core
# machine PP=2) with M = 8 and 16 microbatches, on the CPU (one thread per
# rank), and each
# schedule's ideal bubble for equal stages (1f1b and gpipe (P-1)/(M+P-1),
# interleaved (P-1)/(V M+P-1), zb-h1 (P-1)/(3M+P-1)). The schedules run interleaved over ROUNDS
# rounds so that load from other processes falls on all alike; medians
# over steps 2..STEPS and over rounds.
#
#   [PP=4] bench/pp_schedules.sh [STEPS [ROUNDS [ARGS...]]]   (run from the build directory)
#
# ARGS replace the default shape: an 8-layer tiny-llama at micro batch 4 x
# seq 128 (e.g. --model gpt2-124m --micro-batch 1 --seq-len 64 for the
# 124M shape, whose 12 layers make 8 chunks of one or two).
set -eu
steps=${1:-6}
rounds=${2:-2}
[ $# -ge 2 ] && shift 2 || shift $#
[ $# -gt 0 ] || set -- --model tiny-llama --n-layer 8 --micro-batch 4 --seq-len 128
dtrain=${DTRAIN:-./src/dtrain}
mpiexec=${MPIEXEC:-mpirun}
data=${DATA:-data/gutenberg_train_*.bin}
P=${PP:-4}
mb=16 # the micro batch ARGS give, dtrain's default 16 if none (the global batch is M of them)
prev=""
for a in "$@"; do
    [ "$prev" = --micro-batch ] && mb=$a
    prev=$a
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median_of() { # values on stdin, one a line
    sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
field() { # FILE KEY: the key's values over steps 2..
    sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1" | tail -n +2
}

echo "dtrain $* at pp $P, one thread per rank, $steps steps, $rounds rounds"
for r in $(seq 1 "$rounds"); do
    for M in 8 16; do
        for sched in 1f1b gpipe interleaved zb-h1; do
            extra=""
            [ $sched = interleaved ] && extra="--pp-virtual 2"
            $mpiexec --oversubscribe -np $P "$dtrain" --data "$data" --val-every 0 --sample-tokens 0 --steps "$steps" \
                --warmup 1 --threads 1 --pp $P --pp-schedule $sched $extra --global-batch $((M * mb)) \
                --metrics "$out/m.json" "$@" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
            field "$out/m.json" ms | median_of >>"$out/ms.$sched.$M"
            field "$out/m.json" bubble_mean | median_of >>"$out/bub.$sched.$M"
            tail -n 1 "$out/m.json" | sed -n 's/.*"activations": \([0-9]*\).*/\1/p' >"$out/acts.$sched.$M"
        done
    done
done
printf '%-12s %3s %10s %10s %10s %14s\n' schedule M ms/step bubble ideal activations
for M in 8 16; do
    for sched in 1f1b gpipe interleaved zb-h1; do
        V=1
        [ $sched = interleaved ] && V=2
        [ $sched = zb-h1 ] && V=3 # its (p-1)/(3m+p-1) with equal F, B and W
        printf '%-12s %3d %10.1f %9.1f%% %9.1f%% %14s\n' $sched $M "$(median_of <"$out/ms.$sched.$M")" \
            "$(median_of <"$out/bub.$sched.$M" | awk '{ print 100 * $1 }')" \
            "$(awk -v p=$P -v m=$M -v v=$V 'BEGIN { print 100 * (p - 1) / (v * m + p - 1) }')" \
            "$(cat "$out/acts.$sched.$M")"
    done
done
