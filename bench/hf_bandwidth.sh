#!/bin/sh
# Hugging Face export and import bandwidth against dd on the same disk, for
# the gpt2-124m shapes (124.4M parameters: a 498 MB fp32 model.safetensors)
# or MODEL, at 1, 2 and 4 ranks.
#
#   bench/hf_bandwidth.sh [REPS]          (from the build directory, after make)
#
# The parameter file: one dtrain step at lr 0 with --save-params (the
# initial weights; the values do not matter).
# Export: `dreshard --in P.h5 --to-hf DIR --dtype DTYPE` on NP ranks, its own
# "total X s" (from the first check to the renamed, fsynced directory:
# reading and verifying the input, the transforms, every shard written and
# fsynced, configs, the read-back check), the input in the page cache
# (a checkpoint just written is), against `dd if=/dev/zero of=FILE bs=16M
# count=N conv=fdatasync` of the same size, and against `dd if=P.h5
# of=FILE bs=16M conv=fdatasync` (a copy of the input: what any conversion
# that reads one file and writes another cannot beat).
# Import: `dtrain --init-from DIR` on NP ranks (1: one rank; 2: --tp 2;
# 4: --tp 2 --pp 2), --threads cores/NP (at least 1: the threads a rank
# has), page cache dropped first, its "init-from: ... in X s"
# (from a common start until every rank's slices are read and converted)
# against
# `dd if=model.safetensors of=/dev/null bs=16M` with the cache dropped
# (dd read: one 16 MiB buffer reused, in cache), and against
# `dd if=model.safetensors of=/dev/null bs=SIZE count=1 iflag=fullblock`
# (dd read whole: the whole file read into one fresh buffer of its size,
# as the import must keep what it reads, so its fresh memory is faulted in
# and zeroed as the import's is), the cache dropped before each.
# Both under `mpirun --bind-to none`: Open MPI binds each rank to one core
# when there are at most two ranks, which leaves the tools' own threads
# (the export's tile writer and tokenizer, the import's prefault) on the
# rank's one core while the other idles. Medians of REPS; GB = 1e9 bytes.
#
# Environment: DTRAIN, DRESHARD (./src/...), DATA
# (data/gutenberg-gpt2_train_*.bin), MPIEXEC (mpirun), DIR
# (bench/out/hf-bw: the disk measured), MODEL (gpt2-124m), ARCH (the
# preset's; llama: the same sizes without GPT-2's transposed Conv1D
# weights), DTYPE (the export's, fp32; bf16 or fp16: the import then
# converts), NPS ("1 2 4").
# Dropping the page cache needs root; without it a note says the reads
# came from the page cache.
set -eu
reps=${1:-3}
dtrain=${DTRAIN:-./src/dtrain}
dreshard=${DRESHARD:-./src/dreshard}
data=${DATA:-data/gutenberg-gpt2_train_*.bin}
mpiexec=${MPIEXEC:-mpirun}
dir=${DIR:-bench/out/hf-bw}
model=${MODEL:-gpt2-124m}
arch=${ARCH:+--arch $ARCH}
dtype=${DTYPE:-fp32}
nps=${NPS:-"1 2 4"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$dir"
log="$dir/log"
: >"$log"

. "$(dirname "$0")/io_common.sh" # drop, median, now, since, gbps, pct
layout() { case $1 in 1) echo "" ;; 2) echo "--tp 2" ;; *) echo "--tp 2 --pp 2 --global-batch 2" ;; esac; }

p="$dir/params.h5"
if [ ! -f "$p" ]; then
    # shellcheck disable=SC2086
    "$mpiexec" -np 1 "$dtrain" --model "$model" $arch --data "$data" --steps 1 --lr 0 --min-lr 0 --warmup 0 \
        --micro-batch 1 --seq-len 16 --val-every 0 --sample-tokens 0 --threads 2 --peak-gflops 100 \
        --save-params "$p" >>"$log" 2>&1
fi
echo "model $model${ARCH:+ (--arch $ARCH)}, $dtype; $(nproc) cores; disk: $(df -h "$dir" | awk 'NR == 2 { print $1 }'); $reps repetitions"
echo
echo "| ranks | export s | GB/s | % of dd write | dd write s | % of dd copy | dd copy s | import s | GB/s | % of dd read | dd read s | % of dd read whole | dd read whole s |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for np in $nps; do
    ex="" im="" ddw="" ddc="" ddr="" ddm=""
    th=$(($(nproc) / np))
    [ "$th" -ge 1 ] || th=1
    for r in $(seq "$reps"); do
        rm -rf "$dir/hf" "$dir/dd"
        sync
        t=$("$mpiexec" --bind-to none -np "$np" "$dreshard" --in "$p" --to-hf "$dir/hf" --dtype "$dtype" | tee -a "$log" |
            sed -n 's/.*total \([0-9.]*\) s$/\1/p')
        ex="$ex $t"
        bytes=$(cat "$dir"/hf/*.safetensors | wc -c)
        t0=$(now)
        dd if=/dev/zero of="$dir/dd" bs=16M count=$(((bytes + 16777215) / 16777216)) conv=fdatasync 2>/dev/null
        ddw="$ddw $(since "$t0")"
        rm -f "$dir/dd"
        sync
        t0=$(now)
        dd if="$p" of="$dir/dd" bs=16M conv=fdatasync 2>/dev/null
        ddc="$ddc $(since "$t0")"
        rm -f "$dir/dd"
        drop
        # shellcheck disable=SC2046
        t=$("$mpiexec" --bind-to none -np "$np" "$dtrain" --init-from "$dir/hf" --data "$data" $(layout "$np") --steps 1 --lr 0 \
            --min-lr 0 --warmup 0 --micro-batch 1 --seq-len 16 --val-every 0 --sample-tokens 0 --threads "$th" \
            --peak-gflops 100 | tee -a "$log" | sed -n 's/^init-from: .* in \([0-9.]*\) s;.*/\1/p')
        im="$im $t"
        drop
        t0=$(now)
        for f in "$dir"/hf/*.safetensors; do dd if="$f" of=/dev/null bs=16M 2>/dev/null; done
        ddr="$ddr $(since "$t0")"
        drop
        t0=$(now)
        for f in "$dir"/hf/*.safetensors; do
            dd if="$f" of=/dev/null bs="$(wc -c <"$f")" count=1 iflag=fullblock 2>/dev/null
        done
        ddm="$ddm $(since "$t0")"
    done
    e=$(echo "$ex" | tr ' ' '\n' | grep . | median)
    w=$(echo "$ddw" | tr ' ' '\n' | grep . | median)
    c=$(echo "$ddc" | tr ' ' '\n' | grep . | median)
    i=$(echo "$im" | tr ' ' '\n' | grep . | median)
    d=$(echo "$ddr" | tr ' ' '\n' | grep . | median)
    m=$(echo "$ddm" | tr ' ' '\n' | grep . | median)
    printf "| %d | %.2f | %s | %s | %.2f | %s | %.2f | %.2f | %s | %s | %.2f | %s | %.2f |\n" "$np" "$e" \
        "$(gbps "$bytes" "$e")" "$(pct "$w" "$e")" "$w" "$(pct "$c" "$e")" "$c" "$i" "$(gbps "$bytes" "$i")" \
        "$(pct "$d" "$i")" "$d" "$(pct "$m" "$i")" "$m"
done
rm -rf "$dir/dd"
echo
echo "model.safetensors: $bytes bytes. Runs' output: $log"
[ "$cold" = yes ] || echo "note: the page cache could not be dropped (not root): reads came from memory"
