#!/bin/sh
# Context parallelism on the CPU (issue 34): tiny-llama, micro batch 1, at
# --cp 1, 2 and 4 (one rank per CP rank) for each sequence length: median
# ms per step, tokens/s per rank, the ring's exposed wait as a share of
# the ring attention's time (--metrics ring_ms / ring_attn_ms, rank max),
# the CP group's balance (the busiest rank's ring compute over the mean,
# ring_busy_ms / ring_busy_ms_mean) and the activation memory per rank
# (the allocator's peak). Then the memory limit: --plan at the longest
# length against a device of LIMIT GiB between what cp4 and cp1 need
# (DOES NOT FIT at cp1, FITS at cp4), and cp4 trains that length.
#
#   bench/cp.sh [LENGTHS [STEPS [LONG]]]   (run from the build directory)
#
# LENGTHS: default "4096 8192"; STEPS per run: default 4 (step 1, paying
# for first touch, is left out of the medians); LONG: the memory demo's
# length, default 16384 (0: skip it). One thread per rank.
set -eu
lengths=${1:-4096 8192}
steps=${2:-4}
long=${3:-16384}
dtrain=${DTRAIN:-./src/dtrain}
data=${DATA:-data/gutenberg_train_*.bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model="--model tiny-llama"

median_of() { # values on stdin, one a line
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
field() { # KEY: the medians of KEY over steps 2.. of $out/m.json
    sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" "$out/m.json" | tail -n +2 | median_of
}
run() { # T CP [STEPS]: one run, its metrics in $out/m.json
    mpirun --oversubscribe --bind-to none --quiet -np "$2" "$dtrain" $model --data "$data" --val-every 0 \
        --steps "${3:-$steps}" --warmup 1 --threads 1 --micro-batch 1 --global-batch 1 --seq-len "$1" --cp "$2" \
        --metrics "$out/m.json" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
}

echo "mpirun -np CP dtrain $model --micro-batch 1 --threads 1 --cp CP, $steps steps (medians of steps 2..$steps)"
printf '%6s %3s %10s %14s %11s %12s %9s %16s\n' T cp ms/step "tok/s per rank" "ring wait" "ring attn" exposed \
    "balance max/mean"
for T in $lengths; do
    for cp in 1 2 4; do
        run "$T" "$cp"
        ms=$(field ms)
        tok=$(awk -v t="$(field tokens_per_s)" -v n="$cp" 'BEGIN { print t / n }')
        act=$(sed -n 's/.*"activations": \([0-9]*\).*/\1/p' "$out/m.json" | tail -n 1)
        if [ "$cp" -gt 1 ]; then
            wait_ms=$(field ring_ms)
            attn_ms=$(field ring_attn_ms)
            bal=$(awk -v a="$(field ring_busy_ms)" -v b="$(field ring_busy_ms_mean)" 'BEGIN { printf "%.3f", a / b }')
            share=$(awk -v a="$wait_ms" -v b="$attn_ms" 'BEGIN { printf "%.1f%%", 100 * a / b }')
        else
            wait_ms=- attn_ms=- share=- bal=-
        fi
        printf '%6d %3d %10.1f %14.0f %11s %12s %9s %16s   activations %s B\n' "$T" "$cp" "$ms" "$tok" "$wait_ms" \
            "$attn_ms" "$share" "$bal" "$act"
    done
done

[ "$long" -gt 0 ] || exit 0
plan() { # CP [GIB]: the planner's total bytes per rank (or FITS/DOES NOT FIT with GIB)
    "$dtrain" --plan --hw cpu --plan-dtype fp32 --gpus "$1" $model --cp "$1" --micro-batch 1 --global-batch 1 \
        --seq-len "$long" ${2:+--gpu-mem "$2"} >"$out/plan" 2>&1 || { cat "$out/plan"; exit 1; }
}
plan 1
need1=$(sed -n 's/^  total .* \([0-9]*\) B .*/\1/p' "$out/plan")
plan 4
need4=$(sed -n 's/^  total .* \([0-9]*\) B .*/\1/p' "$out/plan")
# a limit halfway between, plus the profile's reserve (256 MiB on cpu)
limit=$(awk -v a="$need1" -v b="$need4" 'BEGIN { printf "%.3f", ((a + b) / 2) / 1073741824 + 0.25 }')
plan 1 "$limit"
v1=$(grep -E '^(FITS|DOES NOT FIT)' "$out/plan")
plan 4 "$limit"
v4=$(grep -E '^(FITS|DOES NOT FIT)' "$out/plan")
echo "seq $long against $limit GiB per rank: cp1 needs $need1 B: $v1"
echo "seq $long against $limit GiB per rank: cp4 needs $need4 B: $v4"
run "$long" 4 2
echo "cp4 at seq $long: trained 2 steps, $(sed -n 's/.*"ms": \([0-9.]*\).*/\1/p' "$out/m.json" | tail -n 1) ms the last," \
    "peak $(sed -n 's/.*"total": \([0-9]*\)}.*/\1/p' "$out/m.json" | tail -n 1) B per rank"
