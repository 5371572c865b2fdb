#!/bin/sh
# Data-parallel gradient all-reduce: naive vs flat vs bucketed (1, 10, 25,
# 100 MiB buckets) for GPT-2 124M at dp 2 (micro batch 4, seq 64, one
# OpenMP thread per rank), step time and exposed communication (time rank 0
# is blocked waiting for the all-reduce after backward).
#
#   bench/ddp_modes.sh [STEPS]     (from the build directory)
set -eu
steps=${1:-6}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { # json key: median over steps 2..
    sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1" | tail -n +2 | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
printf '%-22s %10s %14s\n' "mode" "ms/step" "comm wait ms"
for cfg in "naive 25" "flat 25" "bucketed 1" "bucketed 10" "bucketed 25" "bucketed 100"; do
    set -- $cfg
    mpirun --oversubscribe --bind-to none -np 2 "${DTRAIN:-./src/dtrain}" --model gpt2-124m --micro-batch 4 --seq-len 64 \
        --threads 1 --steps "$steps" --warmup 1 --val-every 0 --sample-tokens 0 --data "${DATA:-data/gutenberg_train_*.bin}" \
        --ddp-mode "$1" --bucket-mb "$2" --metrics "$out/m.json" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
    label="$1"
    [ "$1" = bucketed ] && label="bucketed $2 MiB"
    printf '%-22s %10.1f %14.1f\n' "$label" "$(median "$out/m.json" ms)" "$(median "$out/m.json" comm_ms)"
done
