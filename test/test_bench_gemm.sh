#!/bin/sh
# dtrain-bench-gemm on the CPU: small shapes (one of them odd-sized) in
# both dtypes exit 0 with a row per shape and dtype, each with 0 wrong
# sampled elements and a positive, finite TFLOP/s (no speed threshold: the
# machine may be loaded), and so do the --op attention rows (forward and
# backward per dtype, head size and length); bad input exits 2 with one
# line. On a CUDA build
# the same shapes on the GPU where one is visible, else the one-line
# refusal of --device cuda.
. "$top_srcdir/test/common.sh"
BENCH=${DTRAIN_BENCH_GEMM:-$top_builddir/src/dtrain-bench-gemm}

# check_rows LABEL FILE WANT_ROWS DTYPES [OPS]: FILE holds WANT_ROWS data
# rows, each of a dtype in DTYPES (e.g. "bf16 fp32") and an op in OPS
# (default "gemm"), 0 wrong, TFLOP/s > 0 and finite
check_rows() {
    if awk -v want="$3" -v dtypes=" $4 " -v ops=" ${5:-gemm} " '
        /^#/ || NF == 0 { next }
        { rows++
          if (NF != 9 || index(dtypes, " " $1 " ") == 0 || index(ops, " " $2 " ") == 0) bad = bad " malformed:" $0
          t = $7; if (t !~ /^[0-9.e+-]+$/ || !(t + 0 > 0)) bad = bad " tflops:" $0
          if ($8 != "0") bad = bad " wrong:" $0 }
        END { if (rows != want) bad = bad " rows:" rows; if (bad != "") { print bad; exit 1 } }' "$2" >"$TMP/why"; then
        pass "$1: $3 rows, 0 wrong, TFLOP/s > 0"
    else
        fail "$1: $(cat "$TMP/why")"
    fi
}

# run_ok LABEL OUT ARGS...: exit 0 and the OK footer
run_ok() {
    label=$1
    out=$2
    shift 2
    "$BENCH" "$@" >"$out" 2>"$out.err"
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^# Wrong values : 0 OK" "$out" && [ ! -s "$out.err" ]; then
        pass "$label: exit 0, OK"
    else
        fail "$label: exit $rc $(tail -n 3 "$out") $(head -c 300 "$out.err")"
    fi
}

SMALL="--shapes 64x96x80,37x61x29 --iters 2 --warmup 1"
run_ok "cpu both" "$TMP/both" --device cpu --dtype both $SMALL --threads 2
check_rows "cpu both" "$TMP/both" 4 "bf16 fp32"
grep -q "^# dtrain-bench-gemm: cpu, 2 threads;" "$TMP/both" && pass "header names the device and threads" ||
    fail "header: $(head -n 1 "$TMP/both")"
for s in "bf16 64 96 80" "fp32 64 96 80" "bf16 37 61 29" "fp32 37 61 29"; do
    set -- $s
    awk -v d="$1" -v n="$2" -v i="$3" -v o="$4" '$1 == d && $3 == n && $4 == i && $5 == o { f = 1 } END { exit !f }' \
        "$TMP/both" && pass "row $s" || fail "no row $s"
done
run_ok "cpu bf16" "$TMP/bf16" --device cpu --dtype bf16 $SMALL --threads 1
check_rows "cpu bf16" "$TMP/bf16" 2 "bf16"
run_ok "cpu fp32 1x1x1" "$TMP/one" --device=cpu --dtype=fp32 --shapes=1x1x1 --iters=1 --warmup=0
check_rows "cpu fp32 1x1x1" "$TMP/one" 1 "fp32"
# GPT-2's fc with bias and GELU, fused and separate, besides the plain GEMM
run_ok "cpu --op all" "$TMP/all" --device cpu --op all $SMALL --threads 2
check_rows "cpu --op all" "$TMP/all" 12 "bf16 fp32" "gemm gemm+gelu gemm,gelu"
run_ok "cpu --op gelu" "$TMP/gelu" --device cpu --op=gelu --dtype fp32 $SMALL --threads 1
check_rows "cpu --op gelu" "$TMP/gelu" 4 "fp32" "gemm+gelu gemm,gelu"
grep -q "gelu rows: out within 1e-3" "$TMP/gelu" && pass "footer states the gelu rows' bound" ||
    fail "footer: $(tail -n 2 "$TMP/gelu")"

# --op attention: the causal attention ops forward and backward, every
# sampled row within its bound against the double-precision attention
# check_att_rows LABEL FILE WANT_ROWS: rows of 10 fields (dtype, attn-fwd or
# attn-bwd, B, S, NH, HS, time, TFLOP/s, 0 wrong, err/bound), TFLOP/s > 0
check_att_rows() {
    if awk -v want="$3" '
        /^#/ || NF == 0 { next }
        { rows++
          if (NF != 10 || ($1 != "bf16" && $1 != "fp32") || ($2 != "attn-fwd" && $2 != "attn-bwd") || $5 * $6 != 2048) bad = bad " malformed:" $0
          t = $8; if (t !~ /^[0-9.e+-]+$/ || !(t + 0 > 0)) bad = bad " tflops:" $0
          if ($9 != "0") bad = bad " wrong:" $0 }
        END { if (rows != want) bad = bad " rows:" rows; if (bad != "") { print bad; exit 1 } }' "$2" >"$TMP/why"; then
        pass "$1: $3 rows, 0 wrong, TFLOP/s > 0"
    else
        fail "$1: $(cat "$TMP/why")"
    fi
}
ATT="--op attention --seqs 64,100 --head-dims 64,32 --tokens 128 --iters 1 --warmup 0"
run_ok "cpu attention" "$TMP/att" --device cpu $ATT --threads 2
check_att_rows "cpu attention" "$TMP/att" 16
# B = max(1, 128 / S): 2 sequences of 64, 1 of 100; NH = 2048 / HS
for s in "bf16 attn-fwd 2 64 32 64" "fp32 attn-bwd 1 100 64 32"; do
    set -- $s
    awk -v d="$1" -v o="$2" -v b="$3" -v t="$4" -v h="$5" -v hs="$6" \
        '$1 == d && $2 == o && $3 == b && $4 == t && $5 == h && $6 == hs { f = 1 } END { exit !f }' "$TMP/att" &&
        pass "row $s" || fail "no row $s"
done
grep -q "^# --dtype bf16, head size 64: fp32 on the CPU" "$TMP/att" && pass "attention rows name the path" ||
    fail "no path line: $(grep '^# --dtype' "$TMP/att" | head -n 1)"

"$BENCH" --help >"$TMP/help" 2>&1 && pass "--help exits 0" || fail "--help: exit $?"
for opt in --device --dtype --op --shapes --seqs --head-dims --tokens --iters --warmup --threads --help --version; do
    grep -q -- "$opt" "$TMP/help" || fail "--help does not list $opt"
done
"$BENCH" --version | grep -q "^dtrain-bench-gemm " && pass "--version" || fail "--version"

expect_exit2 "unknown option '--bogus'" "$BENCH" --bogus
expect_exit2 "--shapes '64x96': each shape is NxICxOC" "$BENCH" --device cpu --shapes 64x96
expect_exit2 "--shapes '0x1x1': each shape is NxICxOC" "$BENCH" --device cpu --shapes 8x8x8,0x1x1
expect_exit2 "--shapes '8x8x8y': each shape is NxICxOC" "$BENCH" --device cpu --shapes 8x8x8y
expect_exit2 "--shapes '2000000x1x1': each shape is NxICxOC, three integers from 1 to 1048576" \
    "$BENCH" --device cpu --shapes 2000000x1x1
expect_exit2 "--dtype 'fp16': allowed values are bf16|fp32|both" "$BENCH" --dtype fp16
expect_exit2 "--device 'gpu': allowed values are auto|cpu|cuda" "$BENCH" --device gpu
expect_exit2 "--op 'relu': allowed values are gemm|gelu|all|attention" "$BENCH" --op relu
expect_exit2 "--shapes gives GEMM shapes, but --op attention times attention" "$BENCH" --op attention --shapes 8x8x8
expect_exit2 "--seqs sets the attention rows, which only --op attention times" "$BENCH" --device cpu --seqs 64
expect_exit2 "--tokens sets the attention rows, which only --op attention times" "$BENCH" --op gelu --tokens 64
expect_exit2 "--head-dims 96: a head size must divide the hidden size 2048" "$BENCH" --op attention --head-dims 64,96
expect_exit2 "--seqs '64,0': a list of at most 16 integers from 1 to 1048576 joined by commas" \
    "$BENCH" --op attention --seqs 64,0
expect_exit2 "--iters 0: out of range (1 to 1000000000)" "$BENCH" --iters 0
expect_exit2 "--warmup 'x': not an integer" "$BENCH" --warmup x
expect_exit2 "--threads needs a value" "$BENCH" --threads

if grep -q "^#define HAVE_CUDA 1" "$top_builddir/config.h"; then
    if "$top_builddir/test/gpu/test_ops_cuda" --probe >"$TMP/probe" 2>&1; then
        run_ok "cuda both" "$TMP/cuda" --device cuda --dtype both $SMALL
        check_rows "cuda both" "$TMP/cuda" 4 "bf16 fp32"
        run_ok "cuda attention" "$TMP/cuda_att" --device cuda $ATT
        check_att_rows "cuda attention" "$TMP/cuda_att" 16
        grep -q "^# --dtype bf16, head size 64: tensor cores" "$TMP/cuda_att" &&
            pass "cuda attention: bf16 at head size 64 on the tensor cores" ||
            fail "cuda attention: $(grep '^# --dtype bf16, head size 64' "$TMP/cuda_att")"
        run_ok "cuda --op all" "$TMP/cuda_all" --device cuda --op all $SMALL
        check_rows "cuda --op all" "$TMP/cuda_all" 12 "bf16 fp32" "gemm gemm+gelu gemm,gelu"
        expect_exit2 "--threads sets the CPU backend's threads, but the GEMMs run on cuda" \
            "$BENCH" --device cuda --threads 2 $SMALL
    else
        why=$(sed -n 's/^SKIP: no GPU visible: //p' "$TMP/probe")
        expect_exit2 "--device cuda: no usable GPU: $why (--device cpu times the CPU instead)" \
            "$BENCH" --device cuda $SMALL
    fi
else
    expect_exit2 "--device cuda: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda" \
        "$BENCH" --device cuda $SMALL
fi
finish
