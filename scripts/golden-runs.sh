#!/bin/sh
# golden-runs.sh BUILDDIR OUTDIR: run a fixed set of short trainings that
# covers every layout, ZeRO stage, recompute mode, bf16, a resume at another
# layout and dreshard, and write into OUTDIR, one file per run, the step
# records without timings (loss, validation loss, learning rate, gradient
# norm, printed with 9 significant digits: exact for fp32) and a SHA-256 of
# every saved parameter tensor. A refactor that claims to change no result
# records OUTDIR before its first change and after its last, on the same
# machine (BLAS kernels differ between CPUs), and `diff -r` finds nothing.
# Takes about 10 minutes on 2 cores.
set -u
B=$(cd "${1:?usage: golden-runs.sh BUILDDIR OUTDIR}" && pwd)
OUT=${2:?usage: golden-runs.sh BUILDDIR OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
MPI="mpiexec --oversubscribe --quiet"
D="$B/src/dtrain"
W=$(mktemp -d) || exit 1
trap 'rm -rf "$W"' EXIT
COMMON="--data $B/data/gutenberg_train_*.bin --val-data $B/data/gutenberg_val_*.bin --peak-gflops 100 --threads 1
 --steps 10 --warmup 3 --micro-batch 2 --global-batch 8 --seq-len 64 --val-every 5 --val-batches 2 --sample-tokens 0"

# digest NAME: the run's records and parameter hashes into OUT/NAME
digest() {
    sed 's/, "ms": .*//' "$W/$1.json" >"$OUT/$1"
    /usr/bin/python3 - "$W/$1.h5" >>"$OUT/$1" <<'PY' || echo "params: unreadable" >>"$OUT/$1"
import h5py, hashlib, sys
def walk(g, p=""):
    for k in sorted(g):
        o = g[k]
        if isinstance(o, h5py.Dataset):
            print("param", p + k, hashlib.sha256(o[()].tobytes()).hexdigest())
        else:
            walk(o, p + k + "/")
walk(h5py.File(sys.argv[1], "r"))
PY
}

# run NAME NP ARGS...
run() {
    name=$1 np=$2
    shift 2
    # shellcheck disable=SC2086
    if $MPI -np "$np" "$D" $COMMON --metrics "$W/$name.json" --save-params "$W/$name.h5" "$@" >"$W/$name.log" 2>&1; then
        digest "$name"
        echo "ran  $name"
    else
        echo "FAILED $name: $(tail -n 2 "$W/$name.log")" | tee "$OUT/$name"
    fi
}

for m in tiny tiny-llama; do
    run $m.1 1 --model $m
    run $m.dp2.naive 2 --model $m --ddp-mode naive
    run $m.dp2.flat 2 --model $m --ddp-mode flat
    run $m.dp2.bucketed 2 --model $m --ddp-mode bucketed --bucket-mb 0.05
    run $m.tp2 2 --model $m --tp 2
    run $m.tp2sp 2 --model $m --tp 2 --sequence-parallel
    run $m.pp2 2 --model $m --pp 2
    run $m.tp2pp2dp2sp 8 --model $m --tp 2 --pp 2 --sequence-parallel --bucket-mb 0.05
    for z in 1 2 3; do
        run $m.z$z.dp2 2 --model $m --zero $z
        run $m.z$z.pp2dp2 4 --model $m --zero $z --pp 2
    done
    run $m.z2.hsdp 4 --model $m --zero 2 --hybrid-shard 2
    run $m.z3.hsdp 4 --model $m --zero 3 --hybrid-shard 2
    run $m.z3.tp2dp2 4 --model $m --zero 3 --tp 2
    for r in selective full; do
        run $m.rc-$r.tp2 2 --model $m --recompute $r --tp 2
        run $m.rc-$r.z3 2 --model $m --recompute $r --zero 3
    done
    run $m.bf16.1 1 --model $m --dtype bf16
    run $m.bf16.dp2 2 --model $m --dtype bf16 --grad-reduce-dtype bf16
    run $m.bf16.z3 2 --model $m --dtype bf16 --zero 3
done
run tiny.pp2.gpipe 2 --model tiny --pp 2 --pp-schedule gpipe
run tiny.pp4 4 --model tiny --pp 4
run tiny.tp4 4 --model tiny --tp 4

# a checkpoint written at tp2 x dp2 with ZeRO-1, stopped at step 5, resumed at pp2 x dp2 with ZeRO-3
run tiny.resume.a 4 --model tiny --tp 2 --zero 1 --ckpt-dir "$W/ck" --ckpt-every 5 --stop-at-step 5
run tiny.resume.b 4 --model tiny --pp 2 --zero 3 --ckpt-dir "$W/ck" --resume auto
# dreshard of that checkpoint to tp2 x pp2 (every dataset hashed) and to a Hugging Face directory
ck=$(ls "$W/ck" | grep -m1 '\.h5$')
if $MPI -np 2 "$B/src/dreshard" --in "$W/ck/$ck" --out "$W/dreshard.h5" --tp 2 --pp 2 >"$W/dreshard.log" 2>&1 &&
    $MPI -np 2 "$B/src/dreshard" --in "$W/ck/$ck" --to-hf "$W/hf" >>"$W/dreshard.log" 2>&1; then
    : >"$W/dreshard.json"
    digest dreshard
    (cd "$W/hf" && sha256sum model.safetensors config.json) >>"$OUT/dreshard"
    echo "ran  dreshard"
else
    echo "FAILED dreshard: $(tail -n 2 "$W/dreshard.log")" | tee "$OUT/dreshard"
fi
