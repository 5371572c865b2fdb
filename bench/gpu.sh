#!/usr/bin/env bash
# The whole GPU checklist in one command, for a GPU machine lent for a few
# minutes (doc/gpu.md): from an unpacked bundle (scripts/bundle.sh --cuda)
#
#   dtrain-bundle-cuda/bench/gpu.sh [--out DIR] [STEPS]
#
# or from a CUDA build directory (./bench/gpu.sh). In order, each step's
# failure recorded and the next step still run:
#  1. dtrain --selftest: every CUDA op against the CPU op;
#  2. the test/gpu suite: test_ops_cuda, test_train_cuda.sh, test_nccl.sh;
#  3. dtrain-bench-gemm --device cuda --dtype both: 4096^3, 8192^3 and GPT-2
#     124M's MLP at 16 x 1024 tokens, fastest bf16 row = the measured cuBLAS
#     bf16 peak; and --op gelu: GPT-2's fc with its GELU in the GEMM's
#     epilogue vs a separate kernel; and --op attention: the attention ops
#     alone, causal, forward and backward TFLOP/s in FlashAttention's
#     convention (4 B S^2 NH HS / 2 forward, 2.5x backward; hidden 2048,
#     16K tokens) at S 1024..8192, head sizes 64 and 128, under bf16 (the
#     tensor-core kernels) and, at S 1024 and 2048, under fp32 (the
#     CUDA-core kernels, for comparison), beside FlashAttention-2's published
#     H100 figures;
#  4. training throughput on one GPU, fp32 and bf16: GPT-2 124M (micro batch
#     16 x 1024) and tiny (micro batch 32 x 256), STEPS steps (default 20):
#     median ms/step and tokens/s over steps 2..STEPS, MFU against
#     PEAK_TFLOPS (default 989.4, the H100 SXM dense bf16 peak; also the
#     H200's) and against the measured bf16 GEMM peak of step 3;
#  5. Hugging Face: when python3 has torch and transformers,
#     test/gpu/hf_logits.sh: transformers loads what dtrain trained on the
#     GPU and exported, and must get dtrain's loss;
#  6. offload: an 8.5B-parameter Llama (OFFLOAD_ARGS) that --plan finds
#     does not fit in this GPU's memory without --offload must train with
#     40 % of its optimizer state in host memory (--offload-fraction 0.4).
# Step 4 trains bf16 with and without --cuda-graphs.
# It writes DIR/results.md (default gpu-bench.XXXXXX/ under the current
# directory), markdown rows for bench/README.md beside the published anchors,
# and DIR/logs.tar.gz with every log. Exit status 0 when every step passed,
# 1 otherwise; without a GPU it says so in one line and exits 1.
#
# Each command runs under timeout(1), STEP_TIMEOUT seconds (default 240): a
# hang is recorded as that step's failure (exit 124) and the next step runs,
# so a lease always gets results.md back.
#
# DEVICE=cpu runs steps 3 and 4 on the CPU to try the script without a GPU
# (no self-test, no GPU tests; attention at the CPU's small default shapes);
# GEMM_ARGS, GELU_ARGS, ATT_ARGS, ATT_FP32_ARGS, TRAIN_ARGS (GPT-2 124M) and
# TINY_ARGS replace the shapes and batches, MODELS the models (default
# "gpt2-124m tiny"), e.g.
#   DEVICE=cpu GEMM_ARGS="--shapes 256x256x256 --iters 3" GELU_ARGS="--shapes 256x64x256 --iters 3" \
#     ATT_ARGS="--iters 2 --warmup 1" TRAIN_ARGS="--micro-batch 2 --seq-len 64" \
#     TINY_ARGS="--micro-batch 2 --seq-len 64" ./bench/gpu.sh 3
set -euo pipefail
me=gpu.sh
die() { echo "$me: $*" >&2; exit 1; }

outdir=
steps=20
while [ $# -gt 0 ]; do
    case $1 in
        --out) [ $# -ge 2 ] || die "--out needs a directory"; outdir=$2; shift ;;
        --out=*) outdir=${1#--out=} ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        [0-9]*) steps=$1 ;;
        *) die "unknown argument $1 (try --help)" ;;
    esac
    shift
done
[ "$steps" -ge 2 ] 2>/dev/null || die "STEPS must be a number >= 2"
device=${DEVICE:-cuda}
peak=${PEAK_TFLOPS:-989.4}
gemm_args=${GEMM_ARGS:-}
gelu_args=${GELU_ARGS:---shapes 16384x768x3072}
train_args=${TRAIN_ARGS:---micro-batch 16 --seq-len 1024}
tiny_args=${TINY_ARGS:---micro-batch 32 --seq-len 256}
att_args=${ATT_ARGS:-}
if [ "$device" = cuda ]; then att_fp32_def="--seqs 1024,2048 --iters 5 --warmup 1"; else att_fp32_def="--iters 2 --warmup 1"; fi
att_fp32_args=${ATT_FP32_ARGS:-$att_fp32_def}

# ---- where the programs are: a bundle (env.sh beside bench/) or a build ----
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -f "$root/env.sh" ]; then
    # shellcheck disable=SC1091
    . "$root/env.sh" || die "sourcing $root/env.sh failed"
    top_srcdir=$root
    top_builddir=$root
    mpiexec=$root/usr/bin/mpirun
    commit=$(sed -n 's/^commit: //p' "$root/MANIFEST.txt" 2>/dev/null | head -n 1)
    where_from="bundle $root"
else
    top_srcdir=$root
    top_builddir=$(pwd)
    [ -x "$top_builddir/src/dtrain" ] || die "run it from a build directory (./bench/gpu.sh) or from an unpacked bundle"
    mpiexec=$(command -v mpiexec || command -v mpirun || echo mpiexec)
    commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
    where_from="build $top_builddir"
fi
dtrain=${DTRAIN:-$top_builddir/src/dtrain}
bench=${DTRAIN_BENCH_GEMM:-$top_builddir/src/dtrain-bench-gemm}
probe=$top_builddir/test/gpu/test_ops_cuda
data=${DATA:-$top_builddir/data/gutenberg_train_*.bin}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_coll_libnbc_iallreduce_algorithm=1

# ---- a GPU, or one line and exit 1 ----
if [ "$device" = cuda ]; then
    [ -x "$probe" ] || die "no GPU checks here: $probe missing (not a CUDA build: ./configure --with-cuda, or scripts/bundle.sh --cuda)"
    if ! probe_out=$("$probe" --probe 2>&1); then
        die "no GPU: $(echo "$probe_out" | grep -m1 . || echo "test_ops_cuda --probe failed")"
    fi
fi

# --out DIR gets results.md and logs.tar.gz only (a machine may send back
# few files); without it gpu-bench.XXXXXX/ keeps the logs/ folder as well
if [ -n "$outdir" ]; then
    mkdir -p "$outdir" || die "cannot create $outdir"
    out=$(cd "$outdir" && pwd)
    work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench.XXXXXX")
    trap 'rm -rf "$work"' EXIT
else
    out=$(mktemp -d "$(pwd)/gpu-bench.XXXXXX")
    work=$out
fi
logs=$work/logs
mkdir -p "$logs"
echo "$me: logs in $logs/, results in $out/results.md"
failed=0
t_all=$(date +%s)
step_timeout=${STEP_TIMEOUT:-240}
tmo() { timeout -k 10 "$step_timeout" "$@"; }
declare -A took=()
stamp() { took[$1]=$(($(date +%s) - $2))s; }

# Python for the tests' h5py checks and the Hugging Face step, run without
# the bundle's libraries (PyTorch brings its own)
plain() { LD_LIBRARY_PATH=${DTRAIN_BUNDLE_SAVED_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}} "$@"; }
python=
for p in python3 /usr/bin/python3 /opt/torch/.venv/bin/python3; do
    if command -v "$p" >/dev/null && plain "$p" -c 'import h5py, numpy' 2>/dev/null; then python=$(command -v "$p"); break; fi
done
if [ -n "$python" ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "${DTRAIN_BUNDLE_SAVED_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" \
        "$python" >"$work/python3"
    chmod +x "$work/python3"
    export DTRAIN_PYTHON=$work/python3
fi

card="CPU ($(nproc) cores)"
if [ "$device" = cuda ]; then
    card=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1 ||
        echo "$probe_out")
    nvidia-smi >"$logs/nvidia-smi.txt" 2>&1 || true
    echo "== $card"
fi

# ---- 1. self-test ----
if [ "$device" = cuda ]; then
    echo "== dtrain --selftest"
    t=$(date +%s)
    if tmo "$dtrain" --selftest >"$logs/selftest.txt" 2>&1; then selftest="pass: $(tail -n 1 "$logs/selftest.txt")"
    else selftest="FAIL (exit $?): $(grep -m1 -E '^FAIL|^dtrain: error' "$logs/selftest.txt" || tail -n 1 "$logs/selftest.txt")"; failed=1; fi
    stamp selftest "$t"
    echo "   $selftest"
else
    selftest="not run (DEVICE=$device)"
fi

# ---- 2. the test/gpu suite ----
suite=()
if [ "$device" = cuda ]; then
    t=$(date +%s)
    export top_srcdir top_builddir MPIEXEC=$mpiexec DTRAIN=$dtrain DTRAIN_BENCH_GEMM=$bench \
        DTRAIN_PREPARE=$top_builddir/src/dtrain-prepare DRESHARD=$top_builddir/src/dreshard
    for t1 in test/gpu/test_ops_cuda test/gpu/test_train_cuda.sh test/gpu/test_nccl.sh; do
        name=$(basename "$t1")
        echo "== $t1"
        case $t1 in *.sh) cmd=(bash "$top_srcdir/$t1") ;; *) cmd=("$top_builddir/$t1") ;; esac
        rc=0
        tmo "${cmd[@]}" >"$logs/$name.log" 2>&1 || rc=$?
        case $rc in
            0) verdict=PASS ;;
            77) verdict="SKIP ($(grep -m1 SKIP "$logs/$name.log" || echo 77))" ;;
            *) verdict="FAIL (exit $rc; $(grep -c '^FAIL' "$logs/$name.log" || true) failed checks: $(grep -m1 '^FAIL' "$logs/$name.log" | cut -c1-160))"; failed=1 ;;
        esac
        oks=$(grep -c '^ok ' "$logs/$name.log" || true)
        suite+=("$name: $verdict${oks:+, $oks ok}")
        echo "   ${suite[-1]}"
    done
    stamp suite "$t"
fi

# ---- 3. the GEMMs ----
t=$(date +%s)
echo "== dtrain-bench-gemm --device $device --dtype both $gemm_args"
gemm_rc=0
# shellcheck disable=SC2086 # gemm_args is a list of options
tmo "$bench" --device "$device" --dtype both $gemm_args >"$logs/gemm.txt" 2>&1 || gemm_rc=$?
cat "$logs/gemm.txt"
best() { # dtype: "TFLOP/s NxICxOC" of its fastest row
    awk -v d="$1" '!/^#/ && $1 == d && $2 == "gemm" && $7 + 0 > b { b = $7 + 0; s = $3 "x" $4 "x" $5 } END { if (b) printf "%.4g %s\n", b, s; else print "- -" }' "$logs/gemm.txt"
}
read -r bf16_best bf16_shape < <(best bf16)
read -r fp32_best fp32_shape < <(best fp32)
case $gemm_rc in
    0) gemm_check="0 wrong" ;;
    1) gemm_check="WRONG VALUES (exit 1)"; failed=1 ;;
    *) gemm_check="FAILED (exit $gemm_rc)"; failed=1 ;;
esac
where=$(sed -n 's/^# dtrain-bench-gemm: \([^;]*\);.*/\1/p' "$logs/gemm.txt" | head -n 1)

echo "== dtrain-bench-gemm --device $device --dtype bf16 --op gelu $gelu_args"
gelu_rc=0
# shellcheck disable=SC2086 # gelu_args is a list of options
tmo "$bench" --device "$device" --dtype bf16 --op gelu $gelu_args >"$logs/gelu.txt" 2>&1 || gelu_rc=$?
cat "$logs/gelu.txt"
us() { # op: "microseconds NxICxOC" of its first row
    awk -v o="$1" '!/^#/ && $2 == o { printf "%.1f %s\n", $6, $3 "x" $4 "x" $5; f = 1; exit } END { if (!f) print "- -" }' "$logs/gelu.txt"
}
read -r gelu_fused gelu_shape < <(us gemm+gelu)
read -r gelu_separate _ < <(us gemm,gelu)
case $gelu_rc in
    0) gelu_check="0 wrong" ;;
    1) gelu_check="WRONG VALUES (exit 1)"; failed=1 ;;
    *) gelu_check="FAILED (exit $gelu_rc)"; failed=1 ;;
esac
stamp gemm "$t"

# ---- 3b. attention alone ----
t=$(date +%s)
att_check=
for dt in bf16 fp32; do
    if [ "$dt" = bf16 ]; then aargs=$att_args; else aargs=$att_fp32_args; fi
    echo "== dtrain-bench-gemm --device $device --op attention --dtype $dt $aargs"
    rc=0
    # shellcheck disable=SC2086 # aargs is a list of options
    tmo "$bench" --device "$device" --op attention --dtype "$dt" $aargs >"$logs/attention.$dt.txt" 2>&1 || rc=$?
    cat "$logs/attention.$dt.txt"
    case $rc in
        0) att_check="$att_check$dt 0 wrong; " ;;
        1) att_check="$att_check$dt WRONG VALUES (exit 1); "; failed=1 ;;
        *) att_check="$att_check$dt FAILED (exit $rc); "; failed=1 ;;
    esac
done
att_check=${att_check%; }
att_tf() { # dtype op S HS: its TFLOP/s, or -
    awk -v d="$1" -v o="$2" -v s="$3" -v h="$4" '!/^#/ && $1 == d && $2 == o && $4 == s && $6 == h { v = $8 } END { print (v == "" ? "-" : v) }' \
        "$logs/attention.$1.txt" 2>/dev/null || echo -
}
att_path() { # dtype HS: the path line
    sed -n "s/^# --dtype $1, head size $2: \([^(]*\).*/\1/p" "$logs/attention.$1.txt" 2>/dev/null | head -n 1 | sed 's/ *$//'
}
# FlashAttention-2 on an H100 SXM5 (the FA3 paper's charts as transcribed in
# ../shared/notes/anchors-wave3.md 1c): forward hdim 128 causal, forward
# hdim 64 (non-causal: no causal figure), backward
fa2() { # HS S: "fwd / bwd"
    case $1.$2 in
        64.1024) echo "306 (non-causal) / 238" ;; 64.2048) echo "318 (non-causal) / 264" ;;
        64.4096) echo "321 (non-causal) / 279" ;; 64.8192) echo "322 (non-causal) / 287" ;;
        128.1024) echo "260 / 260" ;; 128.2048) echo "298 / 291" ;; 128.4096) echo "319 / 310" ;; 128.8192) echo "333 / 318" ;;
        *) echo "-" ;;
    esac
}
att_rows=()
# shellcheck disable=SC2013 # numbers, one a word
for hs in $(awk '!/^#/ && NF == 10 { print $6 }' "$logs/attention.bf16.txt" 2>/dev/null | sort -un); do
    # shellcheck disable=SC2013 # numbers, one a word
    for s in $(awk -v h="$hs" '!/^#/ && NF == 10 && $6 == h { print $4 }' "$logs/attention.bf16.txt" | sort -un); do
        shape=$(awk -v h="$hs" -v s1="$s" '!/^#/ && $6 == h && $4 == s1 { print "B " $3 " x NH " $5; exit }' "$logs/attention.bf16.txt")
        att_rows+=("| attention, HS $hs, S $s ($shape, causal; bf16 path: $(att_path bf16 "$hs")) | $(att_tf bf16 attn-fwd "$s" "$hs") / $(att_tf bf16 attn-bwd "$s" "$hs") | $(att_tf fp32 attn-fwd "$s" "$hs") / $(att_tf fp32 attn-bwd "$s" "$hs") | $(fa2 "$hs" "$s") |")
    done
done
stamp attention "$t"

# ---- 4. training throughput ----
median() { # json key: over steps 2..
    sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1" | tail -n +2 | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
train_rows=()
if [ "$device" = cuda ]; then on="1 GPU"; else on=CPU; fi
t=$(date +%s)
for model in ${MODELS:-gpt2-124m tiny}; do
    if [ "$model" = tiny ]; then margs=$tiny_args; else margs=$train_args; fi
    # bf16 with and without --cuda-graphs (CUDA only: the CPU has none)
    variants="bf16 fp32"
    if [ "$device" = cuda ]; then variants="bf16 bf16+graphs fp32"; fi
    for variant in $variants; do
        dt=${variant%%+*}
        graphs=""
        if [ "$variant" != "$dt" ]; then graphs=--cuda-graphs; fi
        tag=$model.${variant/+/-}
        echo "== $model, --device $device --dtype $dt $graphs $margs, $steps steps"
        rc=0
        # shellcheck disable=SC2086 # margs is a list of options, graphs empty or one
        tmo "$dtrain" --device "$device" --dtype "$dt" $graphs --model "$model" $margs --data "$data" --steps "$steps" \
            --warmup 1 --val-every 0 --sample-tokens 0 --peak-gflops "$(awk -v p="$peak" 'BEGIN { print p * 1000 }')" \
            --metrics "$logs/$tag.json" >"$logs/$tag.txt" 2>&1 || rc=$?
        if [ "$rc" -ne 0 ]; then
            failed=1
            train_rows+=("| $model, $on, $variant, \`$margs\` | FAILED (exit $rc): $(grep -m1 -iE 'error|dtrain:' "$logs/$tag.txt" | cut -c1-160) | | |")
            tail -n 5 "$logs/$tag.txt"
            continue
        fi
        grep -E "^(backend|precision|compute):|^graphs " "$logs/$tag.txt" || true
        ms=$(awk -v m="$(median "$logs/$tag.json" ms)" 'BEGIN { printf "%.1f", m }')
        tps=$(awk -v v="$(median "$logs/$tag.json" tokens_per_s)" 'BEGIN { printf "%.0f", v }')
        mfu=$(median "$logs/$tag.json" mfu)
        mfu_peak=$(awk -v m="$mfu" 'BEGIN { printf "%.1f", 100 * m }')
        mfu_meas=$(awk -v m="$mfu" -v p="$peak" -v g="$bf16_best" 'BEGIN { if (g + 0 > 0) printf "%.1f %%", 100 * m * p / g; else print "-" }')
        if [ "$model" = gpt2-124m ]; then anchor="llm.c: about 1.75M tokens/s on 8 A100s (about 218K per GPU); Megatron-LM about 42 % MFU at 70B"
        else anchor=""; fi
        train_rows+=("| $model, $on, $variant, \`$margs\` | $ms ms/step, $tps tokens/s | $mfu_peak % | $mfu_meas | $anchor |")
        echo "   $ms ms/step, $tps tokens/s, MFU $mfu_peak % of $peak TFLOP/s, $mfu_meas of the measured bf16 GEMM peak"
    done
done
stamp train "$t"

# ---- 5. Hugging Face transformers on a dtrain export ----
t=$(date +%s)
if ! "$top_builddir/src/dreshard" --help 2>&1 | grep -q -- '--to-hf'; then
    hf="skipped: no export yet (dreshard --to-hf, issue 19)"
elif [ "$device" != cuda ]; then
    hf="skipped (DEVICE=$device)"
elif ! plain python3 -c 'import torch, transformers' 2>/dev/null; then
    hf="skipped: python3 has no torch/transformers"
elif [ ! -f "$top_srcdir/test/gpu/hf_logits.sh" ]; then
    hf="skipped: dreshard --to-hf exists but test/gpu/hf_logits.sh (the logits comparison) does not yet"
else
    echo "== test/gpu/hf_logits.sh"
    rc=0
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec python3 "$@"\n' \
        "${DTRAIN_BUNDLE_SAVED_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" >"$work/hf-python3"
    chmod +x "$work/hf-python3"
    HF_PYTHON=$work/hf-python3 tmo bash "$top_srcdir/test/gpu/hf_logits.sh" >"$logs/hf_logits.log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then hf="pass: $(tail -n 1 "$logs/hf_logits.log")"
    else hf="FAIL (exit $rc): $(grep -m1 '^FAIL' "$logs/hf_logits.log" || tail -n 1 "$logs/hf_logits.log")"; failed=1; fi
fi
stamp hf "$t"
echo "== Hugging Face logits: $hf"

# ---- 6. a model the GPU cannot hold without --offload (issue 36) ----
# llama-7b's shapes at 40 layers and GPT-2's vocabulary: 8.5B parameters,
# 143.8 GiB of device memory in bf16 without offload (--plan, 139 GiB), so
# the plan must say it does not fit; with 40 % of the optimizer state in
# host memory 117.7 GiB on the device and 57 GiB of pinned host memory
# (this machine class has 128 GiB), where it trains OFFLOAD_STEPS steps.
t=$(date +%s)
offload_args=${OFFLOAD_ARGS:---config $top_srcdir/examples/llama-7b.conf --vocab-size 50304 --n-layer 40 --micro-batch 1 --seq-len 1024 --global-batch 1 --recompute full}
offload="skipped (DEVICE=$device)"
if [ "$device" = cuda ]; then
    echo "== offload: $offload_args planned without, trained with --offload optimizer --offload-fraction 0.4"
    # without offload: the planner at this GPU's memory (a run would
    # first spend a minute initialising 8.5B parameters, then fail)
    gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1 |
        awk '{ printf "%.1f", $1 / 1024 }')
    rc=0
    # shellcheck disable=SC2086 # offload_args is a list of options
    "$dtrain" --plan --plan-dtype bf16 --dtype bf16 --gpus 1 --gpu-mem "${gib:-139}" $offload_args \
        >"$logs/offload.plan.txt" 2>&1 || rc=$?
    plain_line=$(grep -m1 -E '^(FITS|DOES NOT FIT)' "$logs/offload.plan.txt" | cut -c1-120)
    rc2=0
    # shellcheck disable=SC2086
    tmo "$dtrain" --device cuda --dtype bf16 $offload_args --offload optimizer --offload-fraction 0.4 --data "$data" \
        --steps "${OFFLOAD_STEPS:-4}" --warmup 1 --val-every 0 --sample-tokens 0 --metrics "$logs/offload.json" \
        >"$logs/offload.txt" 2>&1 || rc2=$?
    if [ "$rc" -eq 0 ] && [ "${plain_line#DOES NOT FIT}" != "$plain_line" ] && [ "$rc2" -eq 0 ]; then
        offload="pass: without offload on ${gib:-139} GiB: $plain_line; with 40 % offloaded $(awk -v m="$(median "$logs/offload.json" ms)" 'BEGIN { printf "%.0f", m }') ms/step, $(grep -m1 '^memory' "$logs/offload.txt" | cut -c1-160)"
    else
        offload="FAIL: without offload (plan exit $rc) '$plain_line', with offload exit $rc2: $(grep -m1 -iE 'error' "$logs/offload.txt" | cut -c1-160)"
        failed=1
    fi
fi
stamp offload "$t"
echo "== offload: $offload"

# ---- results ----
total=$(($(date +%s) - t_all))
{
    echo "### GPU checklist: $card"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $card (${where:-$device}), commit ${commit:-unknown}, from the $where_from:"
    echo "\`bench/gpu.sh $steps\` in ${total} s (self-test ${took[selftest]:--}, test/gpu ${took[suite]:--}, GEMMs ${took[gemm]:--}, attention ${took[attention]:--}, training ${took[train]:--}, offload ${took[offload]:--})."
    echo
    echo "- dtrain --selftest: $selftest"
    for s in "${suite[@]}"; do echo "- $s"; done
    echo "- Hugging Face logits: $hf"
    echo "- a model beyond the GPU's memory, with --offload: $offload"
    echo
    echo "| what | dtrain | MFU vs $peak TFLOP/s | MFU vs measured bf16 GEMM peak | published anchor (H100) |"
    echo "|---|---:|---:|---:|---|"
    echo "| bf16 GEMM, fastest row (\`dtrain-bench-gemm\`, $gemm_check) | $bf16_best TFLOP/s ($bf16_shape) | | | cuBLAS bf16: about 790 TFLOP/s |"
    echo "| fp32 GEMM, no TF32, fastest row | $fp32_best TFLOP/s ($fp32_shape) | | | (datasheet fp32 peak 67 TFLOP/s) |"
    echo "| GPT-2 fc + bias + GELU, bf16, $gelu_shape ($gelu_check): GELU epilogue vs GEMM then GELU kernel | $gelu_fused us vs $gelu_separate us | | | |"
    printf '%s\n' "${train_rows[@]}"
    echo
    echo "Attention alone (\`dtrain-bench-gemm --op attention\`, $att_check; forward / backward, FlashAttention's FLOP count; issue 32's target: at least 300 / 250 at S >= 2048, HS 128):"
    echo
    echo "| shape and path | dtrain bf16, TFLOP/s | dtrain fp32 kernels, TFLOP/s | FlashAttention-2 on an H100, TFLOP/s |"
    echo "|---|---:|---:|---:|"
    printf '%s\n' "${att_rows[@]}"
} >"$out/results.md"
tar -C "$work" -czf "$out/logs.tar.gz" logs 2>/dev/null || echo "$me: warning: could not pack the logs" >&2
echo
echo "---- $out/results.md (for bench/README.md) ----"
cat "$out/results.md"
[ "$failed" -eq 0 ] || { echo "$me: some checks FAILED (see above and $logs/)"; exit 1; }
