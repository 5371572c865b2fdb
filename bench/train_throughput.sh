#!/bin/sh
# Training throughput on this machine: ms/step, tokens/s and MFU for
# GPT-2 124M (micro batch 4, seq 64, fwd+bwd+AdamW) at 1 and 2 threads, and
# for the tiny model; then the same at 2 threads with --dtype bf16 (bf16
# matmul operands, which the CPU widens back to fp32: the cost of the casts). Speed does not depend on token values, so the bundled
# byte-level corpus serves GPT-2's 50257-token vocabulary too.
#
#   bench/train_throughput.sh [STEPS]      (run from the build directory)
#
# Reports the median over steps 2..STEPS (step 1 pays for first touch of
# memory). MFU is against the sgemm peak measured at each run's start.
set -eu
steps=${1:-8}
dtrain=${DTRAIN:-./src/dtrain}
data=${DATA:-data/gutenberg_train_*.bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median() { # json key
    sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1" | tail -n +2 | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

printf '%-28s %8s %10s %10s %7s\n' "run" "threads" "ms/step" "tokens/s" "MFU"
run() { # label threads args...
    label=$1
    threads=$2
    shift 2
    OMP_NUM_THREADS=$threads "$dtrain" --data "$data" --val-every 0 --sample-tokens 0 --steps "$steps" \
        --warmup 1 --metrics "$out/m.json" "$@" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
    printf '%-28s %8s %10.1f %10.0f %6.1f%%\n' "$label" "$threads" "$(median "$out/m.json" ms)" \
        "$(median "$out/m.json" tokens_per_s)" "$(awk -v m="$(median "$out/m.json" mfu)" 'BEGIN { print 100 * m }')"
}
run "gpt2-124m B=4 T=64" 1 --model gpt2-124m --micro-batch 4 --seq-len 64
run "gpt2-124m B=4 T=64" 2 --model gpt2-124m --micro-batch 4 --seq-len 64
run "tiny B=16 T=128" 2 --model tiny --micro-batch 16 --seq-len 128
run "tiny-llama B=16 T=128" 2 --model tiny-llama --micro-batch 16 --seq-len 128
run "gpt2-124m B=4 T=64 bf16" 2 --model gpt2-124m --micro-batch 4 --seq-len 64 --dtype bf16
run "tiny B=16 T=128 bf16" 2 --model tiny --micro-batch 16 --seq-len 128 --dtype bf16
run "tiny-llama B=16 T=128 bf16" 2 --model tiny-llama --micro-batch 16 --seq-len 128 --dtype bf16
