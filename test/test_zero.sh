#!/bin/sh
# ZeRO-1 (AdamW moments sharded over the data-parallel group) trains the
# identical model: the update is elementwise, so at dp2 (2 microbatches of
# gradient accumulation), dp4, dp4 with --hybrid-shard 2, tp2 x dp2 and
# pp2 x dp2 (GPT-2's tied embedding across stages) every loss, gradient
# norm and final parameter is bit-identical to --zero 0 at the same layout.
# ZeRO-2 (gradients reduce-scattered per block, per microbatch) agrees with
# --zero 0 within the layout tolerances at dp2, dp4, tp2 x dp2 (with and
# without sequence parallelism), pp2 x dp2 and tiny-llama, and is
# bit-identical run to run. ZeRO-3 (block parameters sharded, gathered
# per block with the next one prefetched) agrees with --zero 0 at dp2
# (gradient accumulation 2), dp4, tp2 x dp2 (with and without sequence
# parallelism), pp2 x dp2, dp4 with --hybrid-shard 2, full recompute and
# tiny-llama; ZeRO-2 with --hybrid-shard 2 too. Memory per rank from
# --metrics' mem_peak: the optimizer bytes fall to 1/dp exactly, and
# parameters + gradients + optimizer fall within the issue's bounds.
# --grad-reduce-dtype bf16 at dp2 (ZeRO 0 with 0.05 MiB buckets, 1, 2, 3)
# and dp4 with --hybrid-shard 2 (ZeRO 2) agrees with the fp32 reduction
# within the tolerances stated below, is bit-identical run to run, and at
# dp1 is bit-identical to fp32.
# Checkpoints written under ZeRO-1/2/3 resume bit-identically and load at
# another layout and stage; bad combinations are refused in one line.
# Validation with --val-batches not a multiple of dp under ZeRO-3 (every
# forward gathers parameters over dp, so the ranks must run as many) gives
# the --zero 0 losses.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
field() { # FILE KEY: KEY's value in the last metrics line
    tail -n 1 "$1" | sed -n "s/.*\"$2\": \([0-9]*\).*/\1/p"
}
same() { # A B LABEL: bit-identical losses, norms and final parameters
    strip_timing "$1" >"$TMP/a" && strip_timing "$2" >"$TMP/b"
    if cmp -s "$TMP/a" "$TMP/b" && out=$("$PY" "$top_srcdir/test/compare_params.py" "$1.h5" "$2.h5" 0 2>&1); then
        pass "$3: $(grep -c loss "$TMP/a") steps, losses, norms and final parameters bit-identical to --zero 0"
    else
        fail "$3: differs from --zero 0: $(diff "$TMP/a" "$TMP/b" | head -n 3) ${out:-}"
    fi
}

for layout in "2" "4" "4 --hybrid-shard 2" "4 --tp 2" "4 --pp 2" "2 --model tiny-llama"; do
    set -- $layout
    np=$1
    shift
    extra=$(echo "$*" | sed 's/--hybrid-shard [0-9]*//')
    tag=$(echo "$np $*" | tr -c 'a-z0-9\n' '_')
    layout_run "$TMP/z0.$tag.json" "$np" $extra || continue
    layout_run "$TMP/z1.$tag.json" "$np" --zero 1 "$@" || continue
    same "$TMP/z0.$tag.json" "$TMP/z1.$tag.json" "np $np $* --zero 1"
done

# ZeRO-2 reduce-scatters every microbatch's gradients in another order:
# equal to --zero 0 within the layout tests' tolerances
for layout in "2" "4" "4 --tp 2" "4 --tp 2 --sequence-parallel" "4 --pp 2" "2 --model tiny-llama"; do
    set -- $layout
    np=$1
    shift
    tag=$(echo "$np $*" | tr -c 'a-z0-9\n' '_')
    [ -f "$TMP/z0.$tag.json" ] || layout_run "$TMP/z0.$tag.json" "$np" "$@" || continue
    layout_run "$TMP/z2.$tag.json" "$np" --zero 2 "$@" &&
        layout_compare "$TMP/z0.$tag.json" "$TMP/z2.$tag.json" "np $np $* --zero 2 vs --zero 0"
done
layout_run "$TMP/z2.again.json" 4 --zero 2 --pp 2 &&
    layout_twice "$TMP/z2.$(echo "4 --pp 2" | tr -c 'a-z0-9\n' '_').json" "$TMP/z2.again.json" "np 4 --pp 2 --zero 2"
tag=$(echo "4 " | tr -c 'a-z0-9\n' '_')
layout_run "$TMP/z2h.json" 4 --zero 2 --hybrid-shard 2 &&
    layout_compare "$TMP/z0.$tag.json" "$TMP/z2h.json" "np 4 --zero 2 --hybrid-shard 2 vs --zero 0"

# ZeRO-3 (FSDP full_shard): the gradients as in ZeRO-2, the block
# parameters gathered per block from the shards
for layout in "2" "4" "4 --tp 2" "4 --tp 2 --sequence-parallel" "4 --pp 2" "4 --hybrid-shard 2" \
    "2 --recompute full" "2 --model tiny-llama"; do
    set -- $layout
    np=$1
    shift
    ref=$(echo "$*" | sed 's/--hybrid-shard [0-9]*//; s/--recompute full//')
    tag=$(echo "$np $ref" | tr -c 'a-z0-9\n' '_')
    [ -f "$TMP/z0.$tag.json" ] || layout_run "$TMP/z0.$tag.json" "$np" $ref || continue
    layout_run "$TMP/z3.$(echo "$np $*" | tr -c 'a-z0-9\n' '_').json" "$np" --zero 3 "$@" &&
        layout_compare "$TMP/z0.$tag.json" "$TMP/z3.$(echo "$np $*" | tr -c 'a-z0-9\n' '_').json" \
            "np $np $* --zero 3 vs --zero 0"
done
# validation over 3 microbatches at dp 2 (and 5 at dp 4 with 2 stages):
# rank 1 has one microbatch fewer, and still joins every parameter gather
for layout in "2" "4 --pp 2 --val-batches 5"; do
    set -- $layout
    np=$1
    shift
    tag=val$np
    layout_run "$TMP/$tag.z0.json" "$np" --val-batches 3 "$@" &&
        layout_run "$TMP/$tag.z3.json" "$np" --val-batches 3 --zero 3 "$@" &&
        layout_compare "$TMP/$tag.z0.json" "$TMP/$tag.z3.json" "np $np $* --zero 3, val batches not a multiple of dp"
done
layout_run "$TMP/z3.again.json" 4 --fsdp full_shard --pp 2 &&
    layout_twice "$TMP/z3.$(echo "4 --pp 2" | tr -c 'a-z0-9\n' '_').json" "$TMP/z3.again.json" \
        "np 4 --pp 2 --zero 3 and --fsdp full_shard"

# --grad-reduce-dtype bf16: every data-parallel gradient reduction (DDP
# buckets under ZeRO 0 and 1, the reduce-scatter windows of ZeRO 2 and 3,
# HSDP's sum across shard groups) rounds to bf16 and sums in bf16. Against
# the fp32 run of the same layout above: every loss and the final
# validation loss within 1e-3 relative (measured at most 5.7e-5 over these
# 20 steps), gradient norms within 1e-1 (measured 1.2e-2 to 1.6e-2, all at
# step 19's loss spike, which amplifies the rounding about 100-fold as in
# layout_compare; 3.5e-4 elsewhere), final parameters within 1e-2
# (measured 1.5e-3 to 2.1e-3, the query biases), and never bit-identical
# (the rounding is in effect). ZeRO-1 reduces through the same DDP buckets,
# so it is bit-identical to bf16 --zero 0 as in fp32; bf16 runs are
# bit-identical run to run; at dp1 nothing is reduced, so bf16 is
# bit-identical to fp32.
bf16_compare() { # FP32 BF16 LABEL
    strip_timing "$1" >"$TMP/a" && strip_timing "$2" >"$TMP/b"
    if cmp -s "$TMP/a" "$TMP/b"; then
        fail "$3: bit-identical to the fp32 reduction: bf16 not in effect"
        return
    fi
    layout_compare "$1" "$2" "$3" 1e-3 1e-1 1e-2
}
B="--grad-reduce-dtype bf16"
if layout_run "$TMP/b0.json" 2 $B --bucket-mb 0.05; then
    grep -q "^data parallel: bucketed all-reduce of .* over 2 ranks, [0-9]* buckets, reduced in bf16$" "$TMP/b0.json.log" &&
        pass "banner: $(grep '^data parallel:' "$TMP/b0.json.log")" ||
        fail "banner: '$(grep '^data parallel:' "$TMP/b0.json.log")'"
    bf16_compare "$TMP/z0.2_.json" "$TMP/b0.json" "np 2 $B (bucketed, 0.05 MiB) vs fp32"
    layout_run "$TMP/b0.again.json" 2 $B --bucket-mb 0.05 &&
        layout_twice "$TMP/b0.json" "$TMP/b0.again.json" "np 2 $B"
    layout_run "$TMP/b1.json" 2 --zero 1 $B && same "$TMP/b0.json" "$TMP/b1.json" "np 2 --zero 1 $B"
fi
layout_run "$TMP/b2.json" 2 --zero 2 $B && bf16_compare "$TMP/z2.2_.json" "$TMP/b2.json" "np 2 --zero 2 $B vs fp32"
# the banner names what ZeRO-2 reduces and shards (no DDP bucket count)
grep -q "^data parallel: reduce-scatter of each block's gradients .* over 2 ranks, reduced in bf16$" "$TMP/b2.json.log" &&
    grep -q "^ZeRO-2: AdamW moments and gradients sharded over 2 ranks$" "$TMP/b2.json.log" &&
    pass "banner: $(grep '^ZeRO-2' "$TMP/b2.json.log")" ||
    fail "ZeRO-2 banner: '$(grep -E '^(data parallel|ZeRO)' "$TMP/b2.json.log")'"
if layout_run "$TMP/b3.json" 2 --zero 3 $B; then
    bf16_compare "$TMP/z3.2_.json" "$TMP/b3.json" "np 2 --zero 3 $B vs fp32"
    layout_run "$TMP/b3.again.json" 2 --zero 3 $B && layout_twice "$TMP/b3.json" "$TMP/b3.again.json" "np 2 --zero 3 $B"
fi
layout_run "$TMP/b2h.json" 4 --zero 2 --hybrid-shard 2 $B &&
    bf16_compare "$TMP/z2h.json" "$TMP/b2h.json" "np 4 --zero 2 --hybrid-shard 2 $B vs fp32"
if layout_run "$TMP/g1.fp32.json" 1 && layout_run "$TMP/g1.bf16.json" 1 $B; then
    strip_timing "$TMP/g1.fp32.json" >"$TMP/a" && strip_timing "$TMP/g1.bf16.json" >"$TMP/b"
    if cmp -s "$TMP/a" "$TMP/b" && "$PY" "$top_srcdir/test/compare_params.py" "$TMP/g1.fp32.json.h5" \
        "$TMP/g1.bf16.json.h5" 0 >/dev/null; then
        pass "np 1 $B: $(grep -c loss "$TMP/a") steps, losses and final parameters bit-identical to fp32"
    else
        fail "np 1 $B differs from fp32: $(diff "$TMP/a" "$TMP/b" | head -n 3)"
    fi
fi

# memory: optimizer bytes per rank at dp4 are a quarter (each unit's piece
# is ceil(len/4) floats, so at most 4 floats per unit above the quarter)
m0="$TMP/z0.$(echo "4 " | tr -c 'a-z0-9\n' _).json"
m1="$TMP/z1.$(echo "4 " | tr -c 'a-z0-9\n' _).json"
z0=$(field "$m0" optimizer)
z1=$(field "$m1" optimizer)
p0=$(field "$m0" parameters)
g0=$(field "$m0" gradients)
if [ -n "$z0" ] && [ -n "$z1" ] && awk -v a="$z0" -v b="$z1" -v p="$p0" -v g="$g0" \
    'BEGIN { q = a / 4; r = (p + g + b) / (p + g + a); exit !(b >= q && b <= q + 4 * 4 * 2 * 16 && r <= 0.70) }'; then
    pass "dp4 optimizer bytes per rank: --zero 0 $z0, --zero 1 $z1 (1/4 plus unit padding); parameters+gradients+optimizer $(awk -v a="$z0" -v b="$z1" -v p="$p0" -v g="$g0" 'BEGIN { printf "%.3f", (p + g + b) / (p + g + a) }')x of --zero 0 (<= 0.70)"
else
    fail "dp4 optimizer bytes: --zero 0 '$z0', --zero 1 '$z1'"
fi

# memory at dp4 on a deeper model (32 blocks, so that the blocks outweigh
# the embeddings as in gpt2-124m): parameters + gradients + optimizer
# bytes per rank against --zero 0 (the issue's bounds: 0.70, 0.55, 0.30).
# ZeRO-2 keeps two blocks' gradient windows and ZeRO-3 two blocks' gathered
# parameters besides, all counted: 4 blocks above the quarter, which on 12
# blocks alone would be 0.33x; the 12-block figures are printed too.
sum3() { echo $(($(field "$1" parameters) + $(field "$1" gradients) + $(field "$1" optimizer))); }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b / a }'; }
for L in 32 12; do
    for z in 0 1 2 3; do
        "$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) --threads 1 --n-layer $L --steps 2 --micro-batch 2 \
            --seq-len 64 --val-every 0 --sample-tokens 0 --zero $z --metrics "$TMP/mem$L.$z.json" \
            >"$TMP/mem$L.$z.log" 2>&1 || fail "memory run --n-layer $L --zero $z: $(tail -n 2 "$TMP/mem$L.$z.log")"
    done
done
if b0=$(sum3 "$TMP/mem32.0.json") && b1=$(sum3 "$TMP/mem32.1.json") && b2=$(sum3 "$TMP/mem32.2.json") &&
    b3=$(sum3 "$TMP/mem32.3.json") && c0=$(sum3 "$TMP/mem12.0.json") && c3=$(sum3 "$TMP/mem12.3.json") &&
    c1=$(sum3 "$TMP/mem12.1.json") && c2=$(sum3 "$TMP/mem12.2.json") &&
    awk -v a="$b0" -v b="$b1" -v c="$b2" -v d="$b3" 'BEGIN { exit !(b / a <= 0.70 && c / a <= 0.55 && d / a <= 0.30) }'; then
    pass "32-block model at dp4, parameters+gradients+optimizer per rank: --zero 0 $b0 B, --zero 1 $(ratio "$b0" "$b1")x (<= 0.70), --zero 2 $(ratio "$b0" "$b2")x (<= 0.55), --zero 3 $(ratio "$b0" "$b3")x (<= 0.30); 12 blocks: $(ratio "$c0" "$c1")x, $(ratio "$c0" "$c2")x, $(ratio "$c0" "$c3")x"
else
    fail "memory: --zero 0/1/2/3 bytes '${b0:-}' '${b1:-}' '${b2:-}' '${b3:-}'"
fi

# checkpoints: exact resume under ZeRO-1, and the moments in logical form
ARGS="$(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 --global-batch 8 --seq-len 64 \
      --val-every 20 --val-batches 4 --sample-tokens 0"
ck() { # OUT NP ARGS...
    out=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $ARGS --metrics "$out" "$@" >"$out.log" 2>&1 ||
        { fail "np $np $*: exit status $? $(tail -n 2 "$out.log")"; return 1; }
}
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }
ck "$TMP/full.json" 4 --zero 1 --ckpt-dir "$TMP/full"
ck "$TMP/half1.json" 4 --zero 1 --ckpt-dir "$TMP/half" --stop-at-step 10
ck "$TMP/half2.json" 4 --zero 1 --ckpt-dir "$TMP/half" --resume auto
losses "$TMP/full.json" | tail -n 10 >"$TMP/a"
losses "$TMP/half2.json" >"$TMP/b"
if [ "$(wc -l <"$TMP/b")" -eq 10 ] && cmp -s "$TMP/a" "$TMP/b"; then
    pass "--zero 1 at dp4: 10 steps + resume + 10 steps bit-identical to 20 steps"
else
    fail "--zero 1 resume: $(diff "$TMP/a" "$TMP/b" | head -n 3)"
fi
ck "$TMP/full2.json" 2 --zero 2 --ckpt-dir "$TMP/full2"
ck "$TMP/half21.json" 2 --zero 2 --ckpt-dir "$TMP/half2" --stop-at-step 10
ck "$TMP/half22.json" 2 --zero 2 --ckpt-dir "$TMP/half2" --resume auto
losses "$TMP/full2.json" | tail -n 10 >"$TMP/a"
losses "$TMP/half22.json" >"$TMP/b"
if [ "$(wc -l <"$TMP/b")" -eq 10 ] && cmp -s "$TMP/a" "$TMP/b"; then
    pass "--zero 2 at dp2: 10 steps + resume + 10 steps bit-identical to 20 steps"
else
    fail "--zero 2 resume: $(diff "$TMP/a" "$TMP/b" | head -n 3)"
fi
ck "$TMP/full3.json" 4 --zero 3 --tp 2 --ckpt-dir "$TMP/full3"
ck "$TMP/half31.json" 4 --zero 3 --tp 2 --ckpt-dir "$TMP/half3" --stop-at-step 10
ck "$TMP/half32.json" 4 --zero 3 --tp 2 --ckpt-dir "$TMP/half3" --resume auto
losses "$TMP/full3.json" | tail -n 10 >"$TMP/a"
losses "$TMP/half32.json" >"$TMP/b"
if [ "$(wc -l <"$TMP/b")" -eq 10 ] && cmp -s "$TMP/a" "$TMP/b"; then
    pass "--zero 3 at tp2 x dp2: 10 steps + resume + 10 steps bit-identical to 20 steps"
else
    fail "--zero 3 resume: $(diff "$TMP/a" "$TMP/b" | head -n 3)"
fi
# the step-10 checkpoint of a --zero 0 dp4 run holds the same moments
ck "$TMP/plain.json" 4 --ckpt-dir "$TMP/plain" --stop-at-step 10
if out=$("$PY" - "$TMP/plain/step_00000010.h5" "$TMP/half/step_00000010.h5" 2>&1 <<'PYEOF'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
bad = [n for n in names if not np.array_equal(a[n][()], b[n][()])]
print("%d datasets, %d differ %s" % (len(names), len(bad), bad[:3]))
sys.exit(1 if bad or len(names) < 40 else 0)
PYEOF
); then
    pass "--zero 1 checkpoint equals the --zero 0 one: $out"
else
    fail "--zero 1 checkpoint: $out"
fi
for layout in "1" "2 --zero 1" "4 --tp 2 --zero 1" "4 --zero 3" "2 --zero 2"; do
    set -- $layout
    np=$1
    shift
    ck "$TMP/re.json" "$np" "$@" --resume "$TMP/half/step_00000010.h5" || continue
    worst=$(losses "$TMP/full.json" | tail -n 10 | paste - "$(losses "$TMP/re.json" >"$TMP/re.l"; echo "$TMP/re.l")" |
        awk '{ d = $2 - $4; if (d < 0) d = -d; d /= $2; if (d > w) w = d; n++ } END { printf "%.2e %d", w, n }')
    set -- $worst
    if [ "$2" -eq 10 ] && awk -v w="$1" 'BEGIN { exit !(w < 1e-5) }'; then
        pass "--zero 1 dp4 checkpoint continued at np $layout: 10 losses within $1"
    else
        fail "--zero 1 checkpoint continued at $layout: worst $1 over $2 losses"
    fi
done

for layout in "1" "2 --zero 3 --pp 2"; do
    set -- $layout
    np=$1
    shift
    ck "$TMP/re3.json" "$np" "$@" --resume "$TMP/half3/step_00000010.h5" || continue
    losses "$TMP/re3.json" >"$TMP/re3.l"
    worst=$(losses "$TMP/full3.json" | tail -n 10 | paste - "$TMP/re3.l" |
        awk '{ d = $2 - $4; if (d < 0) d = -d; d /= $2; if (d > w) w = d; n++ } END { printf "%.2e %d", w, n }')
    set -- $worst
    if [ "$2" -eq 10 ] && awk -v w="$1" 'BEGIN { exit !(w < 1e-5) }'; then
        pass "--zero 3 tp2 x dp2 checkpoint continued at np $layout: 10 losses within $1"
    else
        fail "--zero 3 checkpoint continued at $layout: worst $1 over $2 losses"
    fi
done

expect_exit2 "--hybrid-shard 3: must divide the data-parallel size 4" \
    "$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) --zero 1 --hybrid-shard 3
expect_exit2 "it needs --zero 1 or higher" "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --hybrid-shard 2
expect_exit2 "--fsdp no_shard and --zero 1 both set the sharding stage" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --zero 1 --fsdp no_shard
finish
