#!/bin/sh
# Bad input: each case must print exactly one line on stderr that names the
# option (or file) and what is allowed, and exit with status 2. Also: --help
# lists every option of the documented contract, --version, and the
# command line overriding a config file.
. "$top_srcdir/test/common.sh"

# expect_error WANT ARGS...: dtrain ARGS exits 2 with one stderr line containing WANT
expect_error() {
    want=$1
    shift
    expect_exit2 "$want" "$DTRAIN" "$@"
}

D="--data $DATA_TRAIN --val-data $DATA_VAL"
expect_error "unknown option '--bogus'" --bogus 3
expect_error "--steps 'abc': not an integer" --steps abc $D
expect_error "--steps 0: out of range" --steps 0 $D
expect_error "--lr '1e-3x': not a number" --lr 1e-3x $D
expect_error "--lr -1: out of range" --lr -1 $D
expect_error "--global-batch 10 must be a multiple of --micro-batch 4" --micro-batch 4 --global-batch 10 $D
expect_error "--model 'gpt5': unknown preset" --model gpt5 $D
expect_error "--min-lr 0.1 must not exceed --lr 0.01" --lr 0.01 --min-lr 0.1 $D
expect_error "--data-format 'u8': allowed values are llmc|raw-u16" --data-format u8 $D
expect_error "--arch 'bert'" --arch bert $D
expect_error "--steps needs a value" $D --steps
expect_error "--seq-len 512 exceeds the model's 256 learned positions" --seq-len 512 --val-every 0 --steps 1 $D
expect_error "--d-model 128 must be a positive multiple of --n-head 3" --n-head 3 $D
expect_error "--n-kv-head 3 must divide --n-head 4" --model tiny-llama --n-kv-head 3 $D
expect_error "no token files match" --data "$TMP/nothing_*.bin" --val-every 0
expect_error "--config $TMP/missing.conf: cannot open" --config "$TMP/missing.conf"
: >"$TMP/afile"
expect_error "--trace $TMP/afile/t.json: cannot create directory $TMP/afile: Not a directory" --trace "$TMP/afile/t.json" $D
expect_error "--sequence-parallel 'yes': a flag takes 0 or 1" --sequence-parallel=yes $D

expect_error "--device 'gpu': allowed values are auto|cpu|cuda" --device gpu $D
expect_error "--grad-reduce-dtype 'fp16': allowed values are fp32|bf16" --grad-reduce-dtype fp16 $D
expect_error "--comm 'gloo': allowed values are auto|mpi|nccl" --comm gloo $D

# --device cuda and --selftest: on a CPU-only build, one line naming the fix
# (exit 2 on every rank, so also under mpiexec -np 2); on a CUDA build
# without a usable GPU, exit 2 with the CUDA error string
if grep -q "^#define HAVE_CUDA 1" "$top_builddir/config.h"; then
    if ! "$top_builddir/test/gpu/test_ops_cuda" --probe >"$TMP/probe" 2>&1; then
        why=$(sed -n 's/^SKIP: no GPU visible: //p' "$TMP/probe")
        expect_error "--device cuda: no usable GPU: $why" --device cuda --steps 1 $D
        expect_exit2 "--device cuda: no usable GPU: $why" "$MPIEXEC" --quiet -np 2 "$DTRAIN" --device cuda \
            --steps 1 --threads 1 $D
        expect_error "--device cuda: no usable GPU: $why" --selftest
        "$DTRAIN" --steps 1 --micro-batch 2 --seq-len 32 --val-every 0 --sample-tokens 0 --peak-gflops 100 \
            --data "$DATA_TRAIN" >"$TMP/auto.out" 2>&1 &&
            grep -q "^backend: cpu (--device auto: no GPU usable: $why)" "$TMP/auto.out" &&
            pass "--device auto falls back to cpu and says why" ||
            fail "--device auto without a GPU: $(grep -i backend "$TMP/auto.out") $(tail -n 2 "$TMP/auto.out")"
        # --comm nccl where --device auto fell back to the CPU: every rank
        # fails before NCCL's bootstrap, none hangs in it
        expect_exit2 "--comm nccl: this rank runs on the CPU" "$MPIEXEC" --quiet -np 2 "$DTRAIN" --comm nccl \
            --steps 1 --threads 1 $D
    fi
    expect_error "--comm nccl runs between GPUs: use it with --device cuda (or auto), or --comm mpi" \
        --comm nccl --device cpu $D
else
    expect_error "--comm nccl: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda" \
        --comm nccl $D
    expect_error "--device cuda: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda" \
        --device cuda $D
    expect_exit2 "--device cuda: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda" \
        "$MPIEXEC" --quiet -np 2 "$DTRAIN" --device cuda $D
    expect_error "--selftest: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda" \
        --selftest
fi

printf 'steps = 5\nbogus-key = 1\n' >"$TMP/bad.conf"
expect_error "bad.conf:2: unknown option 'bogus-key'" --config "$TMP/bad.conf"
printf 'steps = 5\nlr 0.1\n' >"$TMP/bad2.conf"
expect_error "bad2.conf:2: expected \`key = value\`" --config "$TMP/bad2.conf"

# token files: bad magic, truncated body, tokens outside the vocabulary
head -c 4096 /dev/zero >"$TMP/zeros.bin"
expect_error "magic" --data "$TMP/zeros.bin" --val-every 0
f=$(ls $DATA_TRAIN | head -n 1)
head -c 3000 "$f" >"$TMP/trunc_train.bin"
expect_error "trunc_train.bin" --data "$TMP/trunc_train.bin" --val-every 0
expect_error "vocab" --vocab-size 100 --data "$f" --val-every 0

# --help lists the contract's options; --version
"$DTRAIN" --help >"$TMP/help" 2>&1 || fail "--help exit status"
for o in config model tp pp dp ddp-mode bucket-mb check-replicas steps micro-batch global-batch seq-len lr min-lr warmup weight-decay grad-clip \
         seed data val-data val-every metrics sample-tokens threads; do
    grep -q -- "--$o " "$TMP/help" || fail "--help does not list --$o"
done
pass "--help lists every contract option"
# the man page documents every option --help lists
missing=""
for o in $(sed -n 's/^  \(--[a-z0-9-]*\) .*/\1/p' "$TMP/help"); do
    m=$(printf '%s' "$o" | sed 's/-/\\\\-/g')
    grep -q -- "$m" "$top_srcdir/doc/dtrain.1" || missing="$missing $o"
done
[ -z "$missing" ] && pass "doc/dtrain.1 documents every option" || fail "doc/dtrain.1 lacks:$missing"
v=$("$DTRAIN" --version)
case "$v" in "dtrain "[0-9]*) pass "--version: $v" ;; *) fail "--version printed '$v'" ;; esac

# the command line overrides the config file
printf '# comment\nmodel = tiny\nsteps = 7\nval-every = 0 # inline comment\nsample-tokens = 0\n' >"$TMP/ok.conf"
"$DTRAIN" --config "$TMP/ok.conf" --steps 2 --data "$DATA_TRAIN" --peak-gflops 100 --micro-batch 2 --seq-len 32 >"$TMP/out" 2>&1
if grep -q "^step    2/2 " "$TMP/out" && ! grep -q "^step    3/" "$TMP/out"; then
    pass "--steps 2 on the command line overrides steps = 7 in the file"
else
    fail "config override: $(tail -n 3 "$TMP/out")"
fi
finish
