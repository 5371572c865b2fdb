#!/bin/sh
# The one command for a lent GPU machine: the numbers bench/README.md
# records beside the published H100 anchors (cuBLAS bf16 GEMM about 790
# TFLOP/s; Megatron-LM about 42 % MFU on 70B-class models; llm.c GPT-2 124M
# about 1.75M tokens/s on 8 A100s).
#
#   ./configure --with-cuda && make && ./bench/gpu.sh [STEPS]   (from the build directory)
#
# 1. dtrain --selftest: every CUDA op against the CPU op;
# 2. dtrain-bench-gemm --device cuda --dtype both: the default large shapes
#    (4096^3, 8192^3, GPT-2 124M's MLP at 16 x 1024 tokens), and --op gelu:
#    GPT-2's fc with its GELU fused into the GEMM vs as a separate kernel;
# 3. GPT-2 124M on one GPU, --dtype bf16, micro batch 16 x seq 1024 (16,384
#    tokens a step), STEPS steps (default 20): median ms/step, tokens/s and
#    MFU over steps 2..STEPS (step 1 pays for first touch of memory), MFU
#    against PEAK_TFLOPS (default 989.4: the H100 SXM's dense bf16 peak, as
#    src/hw.c has it; 312 for an A100);
# then a block of lines to paste into bench/README.md. Logs are kept in
# gpu-bench.XXXXXX/ under the current directory.
#
# DEVICE=cpu runs steps 2 and 3 on the CPU (no self-test) to try the script
# without a GPU; GEMM_ARGS, GELU_ARGS and TRAIN_ARGS replace the shapes and
# the batch, e.g.
#   DEVICE=cpu GEMM_ARGS="--shapes 256x256x256 --iters 3" GELU_ARGS="--shapes 256x64x256 --iters 3" \
#     TRAIN_ARGS="--micro-batch 2 --seq-len 64" ./bench/gpu.sh 3
set -eu
steps=${1:-20}
device=${DEVICE:-cuda}
peak=${PEAK_TFLOPS:-989.4}
gemm_args=${GEMM_ARGS:-}
train_args=${TRAIN_ARGS:---micro-batch 16 --seq-len 1024}
dtrain=${DTRAIN:-./src/dtrain}
bench=${DTRAIN_BENCH_GEMM:-./src/dtrain-bench-gemm}
data=${DATA:-data/gutenberg_train_*.bin}
srcdir=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d gpu-bench.XXXXXX)
echo "logs in $out/"

median() { # json key: over steps 2..
    sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1" | tail -n +2 | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# 1. the self-test (its failure is recorded, and the benchmarks still run)
if [ "$device" = cuda ]; then
    echo "== $dtrain --selftest"
    if "$dtrain" --selftest >"$out/selftest.txt" 2>&1; then selftest="pass"; else selftest="FAIL (exit $?)"; fi
    tail -n 3 "$out/selftest.txt"
else
    selftest="not run (DEVICE=$device)"
fi

# 2. the GEMMs
echo "== $bench --device $device --dtype both $gemm_args"
gemm_rc=0
# shellcheck disable=SC2086 # gemm_args is a list of options
"$bench" --device "$device" --dtype both $gemm_args >"$out/gemm.txt" 2>&1 || gemm_rc=$?
cat "$out/gemm.txt"
[ "$gemm_rc" -le 1 ] || { echo "dtrain-bench-gemm failed (exit $gemm_rc)"; exit 1; }
where=$(sed -n 's/^# dtrain-bench-gemm: \([^;]*\);.*/\1/p' "$out/gemm.txt")
best() { # dtype: "TFLOP/s NxICxOC" of its fastest row
    awk -v d="$1" '!/^#/ && $1 == d && $2 == "gemm" && $7 + 0 > b { b = $7 + 0; s = $3 "x" $4 "x" $5 } END { if (b) printf "%.4g %s\n", b, s; else print "- -" }' "$out/gemm.txt"
}
# shellcheck disable=SC2046 # two words each
set -- $(best bf16) $(best fp32)
bf16_best=$1 bf16_shape=$2 fp32_best=$3 fp32_shape=$4
gemm_check=$([ "$gemm_rc" -eq 0 ] && echo "0 wrong" || echo "WRONG VALUES (exit 1)")

# 2b. GPT-2's fc with its GELU: one GEMM with cuBLASLt's GELU epilogue vs
# the GEMM and the elementwise kernel (bf16, the MLP shape of step 3)
gelu_args=${GELU_ARGS:---shapes 16384x768x3072}
echo "== $bench --device $device --dtype bf16 --op gelu $gelu_args"
gelu_rc=0
# shellcheck disable=SC2086 # gelu_args is a list of options
"$bench" --device "$device" --dtype bf16 --op gelu $gelu_args >"$out/gelu.txt" 2>&1 || gelu_rc=$?
cat "$out/gelu.txt"
[ "$gelu_rc" -le 1 ] || { echo "dtrain-bench-gemm --op gelu failed (exit $gelu_rc)"; exit 1; }
us() { # op: "microseconds NxICxOC" of its first row
    awk -v o="$1" '!/^#/ && $2 == o { printf "%.1f %s\n", $6, $3 "x" $4 "x" $5; f = 1; exit } END { if (!f) print "- -" }' "$out/gelu.txt"
}
# shellcheck disable=SC2046 # two words each
set -- $(us gemm+gelu) $(us gemm,gelu)
gelu_fused=$1 gelu_shape=$2 gelu_separate=$3
gelu_check=$([ "$gelu_rc" -eq 0 ] && echo "0 wrong" || echo "WRONG VALUES (exit 1)")

# 3. training throughput
echo "== gpt2-124m, --device $device --dtype bf16 $train_args, $steps steps"
# shellcheck disable=SC2086 # train_args is a list of options
"$dtrain" --device "$device" --dtype bf16 --model gpt2-124m $train_args --data "$data" --steps "$steps" \
    --warmup 1 --val-every 0 --sample-tokens 0 --peak-gflops "$(awk -v p="$peak" 'BEGIN { print p * 1000 }')" \
    --metrics "$out/train.json" >"$out/train.txt" 2>&1 || { tail -n 20 "$out/train.txt"; exit 1; }
grep -E "^(backend|compute):" "$out/train.txt" || true
ms=$(awk -v m="$(median "$out/train.json" ms)" 'BEGIN { printf "%.1f", m }')
tps=$(awk -v t="$(median "$out/train.json" tokens_per_s)" 'BEGIN { printf "%.0f", t }')
mfu=$(awk -v m="$(median "$out/train.json" mfu)" 'BEGIN { printf "%.1f", 100 * m }')

commit=$(git -C "$srcdir" rev-parse --short HEAD 2>/dev/null || echo unknown)
cat <<EOF

---- for bench/README.md, "GPU runs" ----
Measured $(date -u +%Y-%m-%d) on $where, commit $commit, \`bench/gpu.sh $steps\`:
dtrain --selftest: $selftest.

| what | dtrain | published anchor (H100) |
|---|---:|---|
| bf16 GEMM, fastest row (\`dtrain-bench-gemm\`, $gemm_check) | $bf16_best TFLOP/s ($bf16_shape) | cuBLAS bf16: about 790 TFLOP/s |
| fp32 GEMM, no TF32, fastest row | $fp32_best TFLOP/s ($fp32_shape) | (datasheet fp32 peak 67 TFLOP/s) |
| GPT-2 fc + bias + GELU, bf16, $gelu_shape ($gelu_check): GELU epilogue vs GEMM then GELU kernel | $gelu_fused us vs $gelu_separate us | |
| gpt2-124m, 1 GPU, bf16, $train_args | $ms ms/step, $tps tokens/s | llm.c: about 1.75M tokens/s on 8 A100s (about 218K per GPU) |
| MFU of that run vs $peak TFLOP/s | $mfu % | Megatron-LM: about 42 % on 70B-class models |
EOF
