#!/bin/sh
# Checkpoint write and read bandwidth for the gpt2-124m shapes (124.4M
# parameters + AdamW m and v = 1.49 GB) at 1, 2 and 4 ranks, against dd on
# the same disk.
#
#   bench/ckpt_bandwidth.sh [REPS]        (from the build directory, after make)
#
# Write: one dtrain run per layout, --steps REPS --ckpt-every 1 (micro
# batch 1, seq 16: the step is cheap, the checkpoint is the real one; all
# REPS files are kept, so no deletion is timed), timed by dtrain's own
# "checkpoint: FILE (step N) in X s" line: from the call into the
# checkpoint writer to the renamed, fsynced file and `latest` (the host
# copy of the tensors before it is not counted). Against
# `dd if=/dev/zero of=FILE bs=16M count=N conv=fdatasync`, N = the
# checkpoint's size in 16 MiB, REPS times, each to a new file, timed
# around dd.
# Read: REPS times each, page cache dropped before every run: `dtrain
# --resume FILE` (its "read and verified in X s" line: open, verify every
# checksum, read every rank's slices) against `dd if=FILE of=/dev/null
# bs=16M` of the same checkpoint file. Medians; GB = 1e9 bytes.
#
# Environment: DTRAIN (./src/dtrain), DATA (data/gutenberg_train_*.bin),
# MPIEXEC (mpirun), DIR (bench/out/ckpt-bw: the disk measured),
# LAYOUTS (default "1:|2:--tp 2|4:--tp 2 --pp 2 --global-batch 2": NP:dtrain
# layout options; pp needs 2 microbatches a step).
# Dropping the page cache needs root (echo 3 > /proc/sys/vm/drop_caches);
# without it a closing note says the reads came from the page cache.
set -eu
reps=${1:-3}
dtrain=${DTRAIN:-./src/dtrain}
data=${DATA:-data/gutenberg_train_*.bin}
mpiexec=${MPIEXEC:-mpirun}
dir=${DIR:-bench/out/ckpt-bw}
layouts=${LAYOUTS:-"1:|2:--tp 2|4:--tp 2 --pp 2 --global-batch 2"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
mkdir -p "$dir"
log="$dir/log"
: >"$log"

. "$(dirname "$0")/io_common.sh" # drop, median, now, since, gbps, pct
run_dtrain() { # LOG NP ARGS...
    out=$1
    np=$2
    shift 2
    "$mpiexec" --oversubscribe --bind-to none -np "$np" "$dtrain" --model gpt2-124m --data "$data" --threads 1 \
        --micro-batch 1 --seq-len 16 --warmup 0 --val-every 0 --sample-tokens 0 --peak-gflops 100 "$@" >"$out" 2>&1 ||
        { echo "dtrain -np $np $* failed:"; tail -n 5 "$out"; exit 1; }
    cat "$out" >>"$log"
}

printf '%-24s %11s | %8s %7s %6s | %8s %7s %6s\n' "ranks (layout)" "bytes" "write s" "GB/s" "of dd" "read s" "GB/s" \
    "of dd"
IFS='|'
set -- $layouts
unset IFS
for spec in "$@"; do
    np=${spec%%:*}
    opts=${spec#*:}
    ck="$dir/np$np"
    rm -rf "$ck" "$dir"/dd.*
    sync
    # shellcheck disable=SC2086 # opts holds several options
    run_dtrain "$dir/w.log" "$np" $opts --steps "$reps" --ckpt-every 1 --ckpt-dir "$ck"
    file="$ck/step_$(printf %08d "$reps").h5"
    bytes=$(stat -c %s "$file")
    w=$(sed -n "s|^checkpoint: $ck/step_[0-9]*\.h5 (step [0-9]*) in \([0-9.]*\) s\$|\1|p" "$dir/w.log" | median)

    # dd: the checkpoint's bytes rounded up to 16 MiB blocks, fdatasync
    count=$(((bytes + 16777215) / 16777216))
    ddbytes=$((count * 16777216))
    i=0
    while [ $i -lt "$reps" ]; do
        sync
        t0=$(now)
        dd if=/dev/zero of="$dir/dd.$i" bs=16M count=$count conv=fdatasync 2>/dev/null
        since "$t0"
        i=$((i + 1))
    done >"$dir/dd.w"
    dw=$(median <"$dir/dd.w")
    rm -f "$dir"/dd.[0-9]*

    # read: dtrain --resume and dd of the same file, page cache dropped
    : >"$dir/r.dtrain"
    : >"$dir/r.dd"
    i=0
    while [ $i -lt "$reps" ]; do
        drop
        # shellcheck disable=SC2086
        run_dtrain "$dir/r.log" "$np" $opts --steps "$reps" --resume "$file"
        sed -n 's/^resume: .* read and verified in \([0-9.]*\) s$/\1/p' "$dir/r.log" >>"$dir/r.dtrain"
        drop
        t0=$(now)
        dd if="$file" of=/dev/null bs=16M 2>/dev/null
        since "$t0" >>"$dir/r.dd"
        i=$((i + 1))
    done
    r=$(median <"$dir/r.dtrain")
    dr=$(median <"$dir/r.dd")
    printf '%-24s %11s | %8.2f %7s %6s | %8.2f %7s %6s\n' "$np${opts:+ ($opts)}" "$bytes" "$w" "$(gbps "$bytes" "$w")" \
        "$(pct "$(gbps "$bytes" "$w")" "$(gbps "$ddbytes" "$dw")")" "$r" "$(gbps "$bytes" "$r")" \
        "$(pct "$(gbps "$bytes" "$r")" "$(gbps "$bytes" "$dr")")"
    printf '%-24s %11s | %8.2f %7s %6s | %8.2f %7s\n' "  dd, same disk" "$ddbytes" "$dw" "$(gbps "$ddbytes" "$dw")" "" \
        "$dr" "$(gbps "$bytes" "$dr")"
    rm -rf "$ck"
done
if [ "$cold" = no ]; then
    echo "note: the page cache could not be dropped (needs root): the reads above were served from memory"
fi
