#!/bin/sh
# --offload optimizer (issue 36): the moments and fp32 master weights of
# the first --offload-fraction of each rank's optimizer elements live in
# host memory and are updated by the host AdamW (src/optim/adamw_host.c),
# which does the ops table's arithmetic bit for bit. So offload on and off
# give bit-identical losses, gradient norms and final parameters at:
#  - 1 rank, fp32 and bf16 (the bf16 copy staged on the host);
#  - dp2 with ZeRO-1 and gradient accumulation, half the state offloaded;
#  - dp4 with ZeRO-3 and --hybrid-shard 2, half offloaded;
#  - tp2 x pp2 (GPT-2's tied embedding across stages), and with bf16 and
#    ZeRO-2;
#  - tiny-llama at dp2 with ZeRO-1 and bf16;
#  - with the whole state offloaded under bf16 (ZeRO 0-2), the fp32
#    weights themselves in host memory as the master copy, the device
#    holding their bf16 copy and the fp32 tensors other ops read: at 1
#    rank, tiny-llama at dp2 with ZeRO-1, tp2 x pp2 with ZeRO-2 (the tied
#    embedding), tiny-moe at ep2 (router and experts), and under the
#    deferred-ops table at 1 rank and dp2 with ZeRO-1; the device's
#    parameter bytes fall by the fp32 weights less those copies, and the
#    planner's host bytes are the run's;
#  - the deferred-ops table playing the device (DTRAIN_DEFER_OPS=1), so
#    the copies are queued ops as on a GPU, made at the last moment and
#    their sources checked unchanged from begin to end: at 1 rank, and at
#    dp2 with 2 microbatches a step under ZeRO-1 (per bucket) and ZeRO-3
#    (per unit).
# The gradient copies begin during the backward, as each bucket or unit
# is final (the --trace's "to_host grads" spans, test/offload_trace.py).
# A checkpoint written with offload resumes without it and the reverse
# (and one written with the bf16 run's host weights without them),
# bit-identically to the uninterrupted run; a rollback after non-finite
# steps (the master copy read back from the checkpoint) equals the same
# rollback without offload. The banner says what moved; bad combinations
# and a node whose memory cannot hold the state (and, under bf16, the
# fp32 weights) are refused in one line.
# (The device bytes equal the planner's: test_plan.sh's mem_check.)
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
same() { # REF OUT LABEL: bit-identical losses, norms and final parameters
    strip_timing "$1" >"$TMP/a" && strip_timing "$2" >"$TMP/b"
    if cmp -s "$TMP/a" "$TMP/b" && out=$("$PY" "$top_srcdir/test/compare_params.py" "$1.h5" "$2.h5" 0 2>&1); then
        pass "$3: $(grep -c loss "$TMP/a") records, losses, norms and final parameters bit-identical to no offload"
    else
        fail "$3: differs from no offload: $(diff "$TMP/a" "$TMP/b" | sed -n 2p | cut -c1-160) ${out:-}"
    fi
}

# ---- offload on vs off ----
n=0
for layout in "1" "1 --dtype bf16" "2 --zero 1 --offload-fraction 0.5" \
    "4 --zero 3 --hybrid-shard 2 --offload-fraction 0.5" "4 --tp 2 --pp 2" \
    "4 --tp 2 --pp 2 --dtype bf16 --zero 2 --offload-fraction 0.5" \
    "2 --model tiny-llama --zero 1 --dtype bf16" "4 --tp 2 --pp 2 --dtype bf16 --zero 2" \
    "2 --model tiny-moe --ep 2 --dtype bf16"; do
    set -- $layout
    np=$1
    shift
    ref=$(echo "$*" | sed 's/--offload-fraction [0-9.]*//')
    n=$((n + 1))
    layout_run "$TMP/off$n.ref.json" "$np" $ref || continue
    layout_run "$TMP/off$n.json" "$np" --offload optimizer "$@" || continue
    same "$TMP/off$n.ref.json" "$TMP/off$n.json" "np $np $* --offload optimizer"
done
grep -q "^offload: optimizer, [0-9]* of [0-9]* elements per rank (fraction 0.5) in plain host memory" \
    "$TMP/off3.json.log" && pass "the banner names the offloaded elements and the fraction" ||
    fail "banner: $(grep offload: "$TMP/off3.json.log")"

# the planner's host elements and bytes are the run's (rank 0 at dp2 ZeRO-1, half offloaded)
"$DTRAIN" --plan $(tiny_args) --micro-batch 2 --global-batch 8 --seq-len 64 --zero 1 --offload optimizer \
    --offload-fraction 0.5 --gpus 2 --hw cpu --metrics "$TMP/plan.json" >"$TMP/plan.txt" 2>&1 &&
    planned=$("$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['host_offload_elements'], \
d['host_offload_bytes'])" "$TMP/plan.json") &&
    ran=$(sed -n 's/^offload: optimizer, \([0-9]*\) of .*/\1/p' "$TMP/off3.json.log") &&
    [ "$planned" = "$ran $((ran * 16))" ] && pass "the planner's host elements and bytes are the run's: $planned" ||
    fail "planner host '$planned', run '$ran' elements"

# bf16 with everything offloaded: the fp32 weights are the host's master
# copy; the device's parameter bytes are the bf16 copy and the fp32
# tensors other ops read (off2: 1 rank; off1 the same without bf16)
mem_params() { sed -n 's/^memory per rank: parameters \([0-9.]* [KMG]*i*B\),.*/\1/p' "$1"; }
host_line=$(grep '^offload: the fp32 weights' "$TMP/off2.json.log")
dev_n=$(echo "$host_line" | sed -n 's/.* and the \([0-9]*\) fp32 elements .*/\1/p')
numel=$(sed -n 's/^offload: optimizer, [0-9]* of \([0-9]*\) elements.*/\1/p' "$TMP/off2.json.log")
if [ -n "$dev_n" ] && [ -n "$numel" ] && [ "$dev_n" -lt "$numel" ] &&
    ! grep -q '^offload: the fp32 weights' "$TMP/off2.ref.json.log" "$TMP/off1.json.log" "$TMP/off3.json.log"; then
    pass "bf16, fraction 1: $host_line (device parameters $(mem_params "$TMP/off2.json.log"), $(mem_params "$TMP/off2.ref.json.log") without offload)"
else
    fail "bf16 weights-on-host banner: '$host_line' (elements $numel)"
fi
"$DTRAIN" --plan $(tiny_args) --micro-batch 2 --global-batch 8 --seq-len 64 --offload optimizer --plan-dtype bf16 \
    --gpus 1 --hw cpu --metrics "$TMP/plan1.json" >"$TMP/plan1.txt" 2>&1 &&
    planned=$("$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['host_offload_bytes'])" \
        "$TMP/plan1.json") &&
    [ "$planned" = "$((numel * 18))" ] &&
    pass "the planner's host bytes under bf16 with host weights are the run's: $planned (18 B per parameter)" ||
    fail "planner host bytes '$planned', want $((numel * 18)) for $numel elements"

# the deferred-ops table plays the device: copies and updates are queued
export DTRAIN_DEFER_OPS=1
layout_run "$TMP/defer.ref.json" 1 --dtype bf16 &&
    layout_run "$TMP/defer.json" 1 --dtype bf16 --offload optimizer --offload-fraction 0.5 &&
    same "$TMP/defer.ref.json" "$TMP/defer.json" "DTRAIN_DEFER_OPS=1 bf16 --offload-fraction 0.5"
layout_run "$TMP/defer1.json" 1 --dtype bf16 --offload optimizer &&
    same "$TMP/defer.ref.json" "$TMP/defer1.json" "DTRAIN_DEFER_OPS=1 bf16, the fp32 weights on the host"
# (against off7's reference without the table: test_defer.sh shows the
# table bit-identical to plain ops)
layout_run "$TMP/deferz.json" 2 --model tiny-llama --zero 1 --dtype bf16 --offload optimizer &&
    same "$TMP/off7.ref.json" "$TMP/deferz.json" "DTRAIN_DEFER_OPS=1 np 2 tiny-llama ZeRO-1 bf16, the fp32 weights on the host"
# ... at dp2 with 2 microbatches a step: the copies begin per bucket as its
# all-reduce completes (ZeRO-1, 7 buckets) or per unit as its
# reduce-scatter is banked (ZeRO-3), during the last microbatch's
# backward, and are made only at to_host_end; the table ends the run if a
# copy's source changes after its begin (a copy begun before the
# reduction completed, or in a non-final microbatch)
for layout in "--zero 1 --bucket-mb 0.25" "--zero 3 --dtype bf16"; do
    n=$((n + 1))
    layout_run "$TMP/off$n.ref.json" 2 $layout &&
        layout_run "$TMP/off$n.json" 2 $layout --offload optimizer --offload-fraction 0.75 &&
        same "$TMP/off$n.ref.json" "$TMP/off$n.json" "DTRAIN_DEFER_OPS=1 np 2 $layout --offload-fraction 0.75"
done
unset DTRAIN_DEFER_OPS

# the copies are issued during the backward: on the trace, each step's
# first "to_host grads" span begins before its last backward span ends
# (ZeRO-3's units at dp2, banked as the windows turn over; the buckets of
# one rank, final once the backward has passed them, nothing being
# summed), and none before its last microbatch's backward (also ZeRO-1's
# buckets at dp2, final as the communicator completes their all-reduces:
# during the backward or in grads_finish)
for layout in "2 1 --zero 3" "1 1 --bucket-mb 0.25" "2 0 --zero 1 --bucket-mb 0.25"; do
    set -- $layout
    np=$1
    during=$2
    shift 2
    n=$((n + 1))
    layout_run "$TMP/off$n.json" "$np" "$@" --steps 4 --val-every 0 --offload optimizer --trace "$TMP/off$n.trace.json" &&
        if out=$("$PY" "$top_srcdir/test/offload_trace.py" "$TMP/off$n.trace.json" $((4 / np)) "$during" 2>&1); then
            pass "np $np $*: the gradient copies begin during the last microbatch's backward: $(echo "$out" | tr '\n' ' ')"
        else
            fail "np $np $*: $(echo "$out" | tr '\n' ' ')"
        fi
done

# ---- checkpoints: written with offload, resumed without, and the reverse ----
RUN="$(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 --global-batch 8 --seq-len 64 --val-every 0 \
     --sample-tokens 0 --zero 1"
run() { # OUT NP ARGS...
    out=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $RUN --metrics "$out" "$@" >"$out.log" 2>&1 ||
        { fail "np $np $*: exit status $? $(tail -n 3 "$out.log")"; return 1; }
}
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*"grad_norm": \([^,]*\).*/\1 \2 \3/p' "$1"; }
run "$TMP/full.json" 2 --save-params "$TMP/full.h5"
run "$TMP/full16.json" 2 --save-params "$TMP/full16.h5" --dtype bf16
# bf16-on-off: written with the fp32 weights on the host (bf16, fraction 1)
for dir in on-off off-on bf16-on-off; do
    first=""
    second=""
    dt=""
    full=full
    case $dir in
    on-off) first="--offload optimizer" ;;
    off-on) second="--offload optimizer --offload-fraction 0.5" ;;
    bf16-on-off) first="--offload optimizer" dt="--dtype bf16" full=full16 ;;
    esac
    run "$TMP/$dir.1.json" 2 --ckpt-dir "$TMP/$dir" --stop-at-step 10 $dt $first &&
        run "$TMP/$dir.2.json" 2 --ckpt-dir "$TMP/$dir" --resume auto --save-params "$TMP/$dir.h5" $dt $second || continue
    losses "$TMP/$full.json" | awk '$1 > 10' >"$TMP/a"
    losses "$TMP/$dir.2.json" >"$TMP/b"
    if [ "$(wc -l <"$TMP/b")" -eq 10 ] && cmp -s "$TMP/a" "$TMP/b" &&
        out=$("$PY" "$top_srcdir/test/compare_params.py" "$TMP/$full.h5" "$TMP/$dir.h5" 0); then
        pass "checkpoint at step 10, offload $dir: the 10 resumed losses, norms and final parameters bit-identical ($out)"
    else
        fail "checkpoint offload $dir: $(diff "$TMP/a" "$TMP/b" | sed -n 2p) ${out:-}"
    fi
done

# ---- a rollback reads the master copy back ----
R="--spike-max 2 --ckpt-every 5 --zero 0"
export DTRAIN_TEST_INJECT_NAN=8,9
run "$TMP/rb.json" 2 $R --ckpt-dir "$TMP/rb" --save-params "$TMP/rb.json.h5" &&
    run "$TMP/rbo.json" 2 $R --ckpt-dir "$TMP/rbo" --save-params "$TMP/rbo.json.h5" --offload optimizer &&
    if grep -q "^spike: 2 steps skipped in a row" "$TMP/rbo.json.log"; then
        same "$TMP/rb.json" "$TMP/rbo.json" "rollback to step 5 after non-finite steps 8-9, offload"
    else
        fail "no rollback in the offload run: $(grep spike "$TMP/rbo.json.log" | head -n 2)"
    fi
# ... and under bf16 with the fp32 weights on the host (rewritten in place)
run "$TMP/rb16.json" 2 $R --dtype bf16 --ckpt-dir "$TMP/rb16" --save-params "$TMP/rb16.json.h5" &&
    run "$TMP/rbo16.json" 2 $R --dtype bf16 --ckpt-dir "$TMP/rbo16" --save-params "$TMP/rbo16.json.h5" \
        --offload optimizer &&
    if grep -q "^spike: 2 steps skipped in a row" "$TMP/rbo16.json.log"; then
        same "$TMP/rb16.json" "$TMP/rbo16.json" "rollback to step 5 after non-finite steps 8-9, bf16, host weights"
    else
        fail "no rollback in the bf16 offload run: $(grep spike "$TMP/rbo16.json.log" | head -n 2)"
    fi
unset DTRAIN_TEST_INJECT_NAN

# ---- refused in one line ----
expect_exit2 "offload-fraction 0.5 applies to --offload optimizer" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN --offload-fraction 0.5
expect_exit2 "offload-fraction 0 offloads nothing" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN --offload optimizer --offload-fraction 0
# about 150 GiB of optimizer state on one rank: refused before anything is allocated
expect_exit2 "offload optimizer: rank 0 needs [0-9.]* GiB of host memory for its optimizer state, but its node has" \
    "$MPIEXEC" --quiet -np 1 "$DTRAIN" --model gpt2-350m --n-layer 200 --d-model 2048 --n-head 16 --n-kv-head 16 \
    --d-ff 8192 --steps 2 --offload optimizer
expect_exit2 "offload optimizer: rank 0 needs [0-9.]* GiB of host memory for its optimizer state and its fp32 weights .*lower --offload-fraction below 1" \
    "$MPIEXEC" --quiet -np 1 "$DTRAIN" --model gpt2-350m --n-layer 200 --d-model 2048 --n-head 16 --n-kv-head 16 \
    --d-ff 8192 --steps 2 --offload optimizer --dtype bf16
finish
