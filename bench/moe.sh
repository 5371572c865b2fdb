#!/bin/sh
# A mixture of experts against the dense model with the same active
# parameters, at --ep 1, 2 and 4 on NP data-parallel ranks: median ms per
# step, tokens/s, and the experts' all-to-alls (the rank-max "a2a_ms" of
# --metrics, blocking time inside the step) as a share of the step. The
# runs are interleaved over ROUNDS rounds so that load from other
# processes falls on all of them alike.
#
#   bench/moe.sh [SHAPE [NP [STEPS [ROUNDS]]]]   (run from the build directory)
#
# SHAPE: tiny (default): tiny-moe (8 experts of width 256, top-2) against
# tiny (MLP width 512), micro batch 4 x seq 128; gpt2: a gpt2-124m-sized
# mixture, 8 experts of width 768, top-4 (active parameters as
# gpt2-124m's, 198M in all), against gpt2-124m, micro batch 1 x seq 256.
# One thread per rank.
#
# WARM=W (environment; default 0): first train each model W steps on the
# NP ranks (at --ep 1) and time the runs resumed from that checkpoint
# (a checkpoint resumes at any --ep), so the router has learned to
# balance its experts (tiny-moe's busiest expert falls from 2.3x the mean
# load at step 6 to about 1.4x by step 200): a run spends nearly all its
# steps there, and the all-to-all waits for the rank with the busiest
# experts. WARM=0 times the first steps of a fresh model.
set -eu
shape=${1:-tiny}
np=${2:-4}
steps=${3:-8}
rounds=${4:-3}
warm=${WARM:-0}
dtrain=${DTRAIN:-./src/dtrain}
data=${DATA:-data/gutenberg_train_*.bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case $shape in
tiny)
    dense="--model tiny"
    moe="--model tiny-moe"
    batch="--micro-batch 4 --seq-len 128"
    ;;
gpt2)
    dense="--model gpt2-124m --vocab-size 256"
    moe="--model gpt2-124m --vocab-size 256 --moe-experts 8 --moe-top-k 4 --moe-ffn 768"
    batch="--micro-batch 1 --seq-len 256"
    ;;
*)
    echo "usage: bench/moe.sh [tiny|gpt2 [NP [STEPS [ROUNDS]]]]" >&2
    exit 2
    ;;
esac

median_of() { # values on stdin, one a line
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
train() { # STEPS ARGS...: one run of NP ranks
    n=$1
    shift
    mpirun --oversubscribe --bind-to none --quiet -np "$np" "$dtrain" --data "$data" --val-every 0 --sample-tokens 0 \
        --steps "$n" --warmup 1 --threads 1 $batch "$@" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
}
# with WARM: each model's step-W checkpoint, trained once at --ep 1
if [ "$warm" -gt 0 ]; then
    train "$warm" $dense --ckpt-dir "$out/ckpt.dense" --ckpt-every "$warm"
    train "$warm" $moe --ckpt-dir "$out/ckpt.moe" --ckpt-every "$warm"
fi
from() { # dense|moe: the options that resume from its warm checkpoint
    [ "$warm" -gt 0 ] && echo "--resume $out/ckpt.$1/$(cat "$out/ckpt.$1/latest")"
    return 0
}
run() { # NAME ARGS...: one run's median ms/step and a2a ms/step (step 1 pays for first touch)
    name=$1
    shift
    train $((warm + steps)) --metrics "$out/m.json" "$@"
    sed -n 's/.*"ms": \([0-9.]*\).*/\1/p' "$out/m.json" | tail -n +2 | median_of >>"$out/ms.$name"
    sed -n 's/.*"a2a_ms": \([0-9.]*\).*/\1/p' "$out/m.json" | tail -n +2 | median_of >>"$out/a2a.$name"
    sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' "$out/m.json" | tail -n +2 | median_of >>"$out/tok.$name"
}

names="dense"
for ep in 1 2 4; do
    [ $((np % ep)) -eq 0 ] && names="$names ep$ep"
done
echo "mpirun -np $np dtrain $batch --threads 1: $dense against $moe --ep 1|2|4, $steps steps, $rounds rounds$([ "$warm" -gt 0 ] && echo ", from step $warm")"
for r in $(seq 1 "$rounds"); do
    for n in $names; do
        case $n in
        dense) run dense $dense $(from dense) ;;
        ep*) run "$n" $moe --ep "${n#ep}" $(from moe) ;;
        esac
    done
done
dense_tok=$(median_of <"$out/tok.dense")
printf '%-6s %10s %12s %10s %12s %14s\n' run ms/step tokens/s "vs dense" "a2a ms/step" "a2a share"
for n in $names; do
    ms=$(median_of <"$out/ms.$n")
    tok=$(median_of <"$out/tok.$n")
    a2a=$(median_of <"$out/a2a.$n")
    printf '%-6s %10.1f %12.0f %9.2fx %12.1f %13.1f%%\n' "$n" "$ms" "$tok" \
        "$(awk -v a="$tok" -v b="$dense_tok" 'BEGIN { print a / b }')" "$a2a" \
        "$(awk -v a="$a2a" -v b="$ms" 'BEGIN { print 100 * a / b }')"
done
