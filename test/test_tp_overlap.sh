#!/bin/sh
# --tp-comm-overlap: in the backward, each column-parallel matmul's input
# gradient reduction (reduce-scatter under sequence parallelism, else
# all-reduce) is posted between its two GEMMs and waited for after the
# weight gradient's; under sequence parallelism the attention's gather
# runs beside the MLP projection's held-back weight-gradient GEMM. The
# sums are the blocking collectives', so at tp2 (where a sum of two does
# not depend on the algorithm's order) every run below is bit-identical to
# the same run without it:
#  - tiny-llama with sequence parallelism and selective recompute (fp32),
#  - GPT-2 without sequence parallelism (the all-reduce path),
#  - GPT-2 in bf16 with sequence parallelism and the bf16 wire (the
#    staging buffer; the DGELU GEMM split from its weight gradient),
#  - tp2 x pp2 x dp2 with ZeRO-1, sequence parallelism, bf16 and full
#    recomputation (the SwiGLU output, in a workspace its backward
#    overwrites, recomputed for the held-back GEMM),
#  - and under DTRAIN_DEFER_OPS=1 (the posting waits for the GEMM that
#    wrote what it sends).
# The trace shows the overlapped collectives as nonblocking, three per
# layer and microbatch; the planner's bytes equal the run's (its workspace
# counts the staging buffers); llama-70b at tp8 pp8 on 64 H100s plans at
# 40 % MFU or more with Llama 2's batch (4M tokens) and an interleaved
# schedule; --tp 1 and zb-h1 are refused.
. "$top_srcdir/test/common.sh"

OV=--tp-comm-overlap
# ov_pair NAME NP ARGS...: the run without and with --tp-comm-overlap
ov_pair() {
    name=$1
    np=$2
    shift 2
    layout_run "$TMP/$name.plain.json" "$np" --steps 6 --warmup 2 --val-every 3 "$@" &&
        layout_run "$TMP/$name.ov.json" "$np" --steps 6 --warmup 2 --val-every 3 "$@" $OV &&
        layout_twice "$TMP/$name.plain.json" "$TMP/$name.ov.json" "$name: $OV vs without"
}
ov_pair llama-sp 2 --model tiny-llama --tp 2 --sequence-parallel --recompute selective
ov_pair gpt-allreduce 2 --tp 2
ov_pair gpt-sp-bf16wire 2 --tp 2 --sequence-parallel --dtype bf16 --tp-comm-dtype bf16
ov_pair llama-tp2pp2dp2-zero1 8 --model tiny-llama --tp 2 --pp 2 --dp 2 --zero 1 --sequence-parallel --dtype bf16 \
    --recompute full

# deferred ops: the collective posted after the input-gradient GEMM reads
# its result (the MPI communicator's device_sync runs the queue first)
DTRAIN_DEFER_OPS=1
export DTRAIN_DEFER_OPS
layout_run "$TMP/defer.json" 2 --steps 6 --warmup 2 --val-every 3 --tp 2 --sequence-parallel --dtype bf16 \
    --tp-comm-dtype bf16 $OV
rc=$?
unset DTRAIN_DEFER_OPS
[ $rc -eq 0 ] && layout_twice "$TMP/gpt-sp-bf16wire.ov.json" "$TMP/defer.json" "$OV under deferred ops vs plain"

# the trace: per layer and microbatch the backward's two reduce-scatters
# and one all-gather are nonblocking (tiny: 4 layers, 4 microbatches a
# step, 2 steps), and no blocking reduce-scatter is left in the backward
# of a layer (the forward's are)
layout_run "$TMP/tr.json" 2 --steps 2 --warmup 1 --val-every 0 --tp 2 --sequence-parallel $OV --trace "$TMP/tr.trace" &&
    /usr/bin/python3 - "$TMP/tr.trace" >"$TMP/tr.count" <<'PYEOF' && pass "trace: $(cat "$TMP/tr.count")" || fail "trace: $(cat "$TMP/tr.count")"
import collections, json, sys
c = collections.Counter()
for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e.get("ph") == "X" and e.get("cat") == "comm" and e["pid"] == 0 and e["name"].endswith(" tp"):
        c[e["name"]] += 1
want = 4 * 4 * 2
print("%d ireduce_scatter, %d iallgather (want %d and %d), %d reduce_scatter, %d allgather" % (
    c["ireduce_scatter tp"], c["iallgather tp"], 2 * want, want, c["reduce_scatter tp"], c["allgather tp"]))
sys.exit(0 if c["ireduce_scatter tp"] == 2 * want and c["iallgather tp"] == want else 1)
PYEOF

# the planner's bytes of every category equal the bf16-wire run's peaks
"$DTRAIN" --plan --plan-dtype bf16 --hw cpu --gpus 2 $(tiny_args) --tp 2 --sequence-parallel --dtype bf16 \
    --tp-comm-dtype bf16 $OV --micro-batch 2 --global-batch 8 --seq-len 64 --metrics "$TMP/plan.json" \
    >"$TMP/plan.txt" 2>&1 &&
    plan_equals_run "$TMP/plan.json" "$TMP/gpt-sp-bf16wire.ov.json" >"$TMP/plan.cmp" &&
    pass "--plan $OV tp2: planned/measured bytes equal: $(cat "$TMP/plan.cmp")" ||
    fail "--plan $OV tp2: planned/measured: $(cat "$TMP/plan.cmp" "$TMP/plan.txt" 2>/dev/null | tail -n 2)"

# llama-70b, 64 x H100, tp 8 pp 8, sequence parallelism, bf16 wire; Llama
# 2's batch: 1024 sequences of 4096 (4M tokens), 5 virtual stages
L70="--plan --config $top_srcdir/examples/llama-70b.conf --gpus 64 --hw h100-sxm --tp 8 --pp 8 --micro-batch 1
    --seq-len 4096 --global-batch 1024 --plan-dtype bf16 --dtype bf16 --zero 1 --recompute selective
    --sequence-parallel --tp-comm-dtype bf16 --pp-schedule interleaved --pp-virtual 5"
mfu() { sed -n 's/.*"mfu": \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
ttp() { sed -n 's/.*"tp_comm_s": \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
"$DTRAIN" $L70 --metrics "$TMP/p70.json" >"$TMP/p70.txt" 2>&1 &&
    "$DTRAIN" $L70 $OV --metrics "$TMP/p70ov.json" >"$TMP/p70ov.txt" 2>&1 &&
    a=$(mfu "$TMP/p70.json") && b=$(mfu "$TMP/p70ov.json") && ta=$(ttp "$TMP/p70.json") && tb=$(ttp "$TMP/p70ov.json") &&
    if awk -v a="$a" -v b="$b" -v ta="$ta" -v tb="$tb" 'BEGIN { exit !(b >= 0.40 && b > a && tb < ta) }'; then
        pass "llama-70b tp8 pp8 (interleaved v5, 4M tokens): MFU $a -> $b with $OV, exposed TP $ta -> $tb s"
    else
        fail "llama-70b tp8 pp8: MFU '$a' -> '$b', TP '$ta' -> '$tb' s: $(grep -E 'step  ' "$TMP/p70ov.txt")"
    fi

expect_exit2 "--tp-comm-overlap overlaps tensor-parallel collectives: it needs --tp above 1" \
    "$MPIEXEC" --quiet -np 1 "$DTRAIN" $(tiny_args) --steps 1 $OV --sample-tokens 0
expect_exit2 "--tp-comm-overlap runs the input gradients' reductions beside the weight-gradient GEMMs, which --pp-schedule zb-h1 moves to its own pass: drop one of them" \
    "$MPIEXEC" --quiet -np 4 "$DTRAIN" $(tiny_args) --steps 1 --tp 2 --pp 2 --pp-schedule zb-h1 $OV --sample-tokens 0
finish
