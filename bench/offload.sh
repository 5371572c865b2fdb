#!/bin/sh
# The host AdamW of issue 36 (src/optim/adamw_host.c) against a STREAM-style
# triad on the same cores: GB/s of each vector path (p, m, v read and
# written, g read: 28 bytes an element; 30 with the bf16 copy) at all cores
# and at one, and the CPU ops table's adamw for comparison. Run from a
# build directory after make check has built test/test_adamw_host:
#
#   bench/offload.sh [ELEMENTS] [REPS]     default 2^25 elements (512 MiB of state), 5
#
# Then the step time of gpt2-124m on the CPU backend (one rank, every core)
# with --offload optimizer and without: the mean "ms" of steps 3 to
# STEPS in --metrics (STEPS=8 by default; SEQ=256, MB=2 tokens per step).
set -eu
B=${B:-.}
n=${1:-33554432}
reps=${2:-5}
[ -x "$B/test/test_adamw_host" ] || { echo "bench/offload.sh: $B/test/test_adamw_host is not built: run make check (or make test/test_adamw_host)" >&2; exit 1; }
cores=$(nproc)
echo "## $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
for t in "$cores" 1; do
    echo
    OMP_NUM_THREADS=$t OMP_PROC_BIND=close "$B/test/test_adamw_host" --bench "$n" "$reps"
done

steps=${STEPS:-8}
seq=${SEQ:-256}
mb=${MB:-2}
mean_ms() { # METRICS: the mean step time after the first two
    sed -n 's/^{"step": \([0-9]*\),.*"ms": \([0-9.]*\).*/\1 \2/p' "$1" | awk '$1 > 2 { s += $2; n++ } END { printf "%.1f", s / n }'
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo
echo "gpt2-124m on the CPU backend, 1 rank x $cores threads, micro-batch $mb x seq $seq, steps 3-$steps:"
for off in none optimizer; do
    "$B/src/dtrain" --model gpt2-124m --data "$B/data/gutenberg-gpt2_train_*.bin" --threads "$cores" --steps "$steps" \
        --micro-batch "$mb" --seq-len "$seq" --val-every 0 --sample-tokens 0 --offload "$off" \
        --metrics "$tmp/$off.json" >"$tmp/$off.log" 2>&1 || { tail -n 3 "$tmp/$off.log" >&2; exit 1; }
    echo "  --offload $off: $(mean_ms "$tmp/$off.json") ms per step"
done
