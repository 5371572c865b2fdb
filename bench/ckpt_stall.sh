#!/bin/sh
# How long a checkpoint holds training up, synchronous and --ckpt-async,
# for gpt2-124m (124.4M parameters + AdamW m and v = 1.49 GB) at 1 and 2
# ranks (dp 2).
#
#   bench/ckpt_stall.sh [EVERY]           (from the build directory, after make)
#
# One dtrain run per rank count and mode: --steps 3*EVERY+3 --ckpt-every
# EVERY (micro batch 1, seq 16: cheap steps, the real checkpoint; EVERY
# (default 10) must leave the background write time to finish before the
# next checkpoint, or the wait for it is stall too). The stall of the
# checkpoint at step k is the "ckpt_stall_ms" of --metrics' record k+1:
# from the call into the checkpoint to the return to training (sync: the
# host copy and the whole write; async: the writer's start, any wait for
# the previous write, and the host copy where it is made at the boundary)
# plus, where the copy overlaps step k+1, step k+1's wait for it before
# its optimizer update. Per run: the mean of the checkpoints at 2*EVERY
# and 3*EVERY (not the first: a synchronous run allocates and faults in
# its host copies there; --ckpt-async made its own at start). "next +ms":
# how much longer step k+1 took than steps k+2 and k+3 (their mean), which
# run beside the same background write but after the copy: the cost of
# sharing the CPU with the copy (and the write's start), which a wait
# does not show (same checkpoints' mean; noisy where the machine is
# shared, and the write's own slowdown of the steps beside it shows in
# "while writing" rather than here); "polls": the
# other ckpt_stall_ms after the first checkpoint (the per-step all-reduce
# of the writer's progress while a write is in flight) per checkpoint;
# "write s": the synchronous "checkpoint: ... in X s" or the async
# "written in the background in X s" lines' median; "step ms while
# writing" against without, the median step time (the writer thread shares
# the CPU with training).
#
# Environment: DTRAIN (./src/dtrain), DATA (data/gutenberg_train_*.bin),
# MPIEXEC (mpirun), DIR (bench/out/ckpt-stall: the disk written), THREADS
# (1: BLAS threads per rank), RANKS ("1 2"), MODES ("sync async"; the
# ratio needs sync first).
set -eu
every=${1:-10}
dtrain=${DTRAIN:-./src/dtrain}
data=${DATA:-data/gutenberg_train_*.bin}
mpiexec=${MPIEXEC:-mpirun}
dir=${DIR:-bench/out/ckpt-stall}
threads=${THREADS:-1}
ranks=${RANKS:-1 2}
modes=${MODES:-sync async}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
mkdir -p "$dir"
. "$(dirname "$0")/io_common.sh" # median

steps=$((3 * every + 3))
# field FILE KEY: "step value" for every record holding KEY
field() { sed -n "s/^{\"step\": \([0-9]*\),.*\"$2\": \([0-9.]*\).*/\1 \2/p" "$1"; }
# next_extra EVERY: "step ms" lines in; the mean over the checkpoints k
# (multiples of EVERY) of ms(k+1) - median(ms(k+2), ms(k+3))
next_extra() {
    awk -v e="$1" '{ ms[$1] = $2; if ($1 > last) last = $1 } END {
        for (k = e; k < last; k += e) {
            if (!(k + 1 in ms) || !(k + 2 in ms) || !(k + 3 in ms)) continue
            s += ms[k + 1] - (ms[k + 2] + ms[k + 3]) / 2; n++
        }
        printf "%.1f", n ? s / n : 0 }'
}

printf '%-6s %-6s | %10s %10s %10s %8s | %12s %12s | %s\n' ranks mode "stall ms" "next +ms" \
    "polls ms" "write s" "step ms" "while writing" "async stall / sync stall"
for np in $ranks; do
    sync_stall=
    for mode in $modes; do
        ck="$dir/np$np-$mode"
        rm -rf "$ck"
        flag=
        [ "$mode" = async ] && flag=--ckpt-async
        "$mpiexec" --oversubscribe --bind-to none -np "$np" "$dtrain" --model gpt2-124m --data "$data" \
            --threads "$threads" --dp "$np" --micro-batch 1 --seq-len 16 --warmup 0 --val-every 0 --sample-tokens 0 \
            --peak-gflops 100 --steps "$steps" --ckpt-every "$every" --keep 1 --ckpt-dir "$ck" $flag \
            --metrics "$dir/np$np-$mode.json" >"$dir/np$np-$mode.log" 2>&1 ||
            { echo "dtrain -np $np $mode failed:"; tail -n 5 "$dir/np$np-$mode.log"; exit 1; }
        m="$dir/np$np-$mode.json"
        stall=$(field "$m" ckpt_stall_ms | awk -v e="$every" '$1 % e == 1 && $1 > e + 1 && $1 < 3 * e + 3 { print $2 }' | median)
        next=$(field "$m" ms | awk -v e="$every" '$1 > e + 1 { print }' | next_extra "$every")
        polls=$(field "$m" ckpt_stall_ms | awk -v e="$every" '$1 > e + 1 && $1 % e != 1 { s += $2 } END { printf "%.1f", s / 2 }')
        write=$(sed -n 's/^checkpoint: .* in \([0-9.]*\) s$/\1/p' "$dir/np$np-$mode.log" | median)
        # steps 2..EVERY run before any write; EVERY+1..EVERY+3 while the first is in flight (async only)
        plain=$(field "$m" ms | awk -v e="$every" '$1 >= 2 && $1 <= e { print $2 }' | median)
        busy=-
        [ "$mode" = async ] && busy=$(field "$m" ms | awk -v e="$every" '$1 > e && $1 <= e + 3 { print $2 }' | median | awk '{ printf "%.1f", $1 }')
        ratio=
        if [ "$mode" = sync ]; then
            sync_stall=$stall
        elif [ -n "$sync_stall" ]; then
            ratio=$(awk -v a="$stall" -v s="$sync_stall" 'BEGIN { printf "%.2f %%", 100 * a / s }')
        fi
        printf '%-6s %-6s | %10.1f %10.1f %10s %8.2f | %12.1f %12s | %s\n' "$np" "$mode" "$stall" "$next" \
            "$polls" "$write" "$plain" "$busy" "$ratio"
        rm -rf "$ck"
    done
done
