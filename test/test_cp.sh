#!/bin/sh
# Context parallelism (--cp, issue 34): every sequence cut into 2cp chunks,
# rank r of the CP group holding chunks r and 2cp-1-r (zigzag), attention
# by the ring of mpi/cp_ring.c, gradients and ZeRO over DP x CP. tiny
# (GPT-2: learned positions, global ones per chunk) and tiny-llama (RoPE,
# GQA 4:2) train the same model as one process at cp2, cp4, cp2 x tp2 with
# sequence parallelism, cp2 x pp2 and cp2 x dp2 with ZeRO-3; and with
# --doc-mask on data whose documents (one line each, about 30 tokens)
# cross the chunk edges in nearly every row, at cp2 and cp4: every loss
# and the final validation loss within 1e-5 relative, gradient norms and
# final parameters within 1e-4 (layout_compare). The same layout twice is
# bit-identical, and so is the deferred-ops table at cp2 with documents.
# A checkpoint written at cp4 resumes at one rank (its 5 losses within
# 1e-5 of the uninterrupted run) and one written at one rank resumes at
# cp2. The activation arena falls as 1/cp: the measured peak at cp2 and
# cp4 equals the planner's byte for byte and is half and a quarter of one
# rank's (plus the rows' positions, 4 B each). Mixtures of experts at cp2
# with and without expert parallelism, TP, PP, DP and ZeRO-1 and 3 with
# --hybrid-shard (below); tiny-llama with --hybrid-shard 2 at cp2 x dp2. Bad
# --cp exits 2 with one line. test_ring_attn checks the ring's schedule and blocks against the
# whole-sequence attention; test_cp_ring.sh the ring over MPI; the CUDA
# ring ops run under emulation in test/emu/test_ring_emu. The CP group's
# load balance and the ring's overlap are bench/cp.sh's (timings).
. "$top_srcdir/test/common.sh"

LC_MIN_VALUES=21
S="--steps 10 --val-every 10"
cp_layouts() { # MODEL ARGS...: one rank, then the CP layouts against it
    model=$1
    shift
    layout_run "$TMP/$model.1.json" 1 $S --model "$model" "$@" || return
    for L in "2 --cp 2" "4 --cp 4" "4 --cp 2 --tp 2 --sequence-parallel" "4 --cp 2 --pp 2" "4 --cp 2 --zero 3"; do
        np=${L%% *}
        lay=${L#* }
        name=$(echo "$lay" | tr -d ' -')
        layout_run "$TMP/$model.$name.json" "$np" $S --model "$model" "$@" $lay &&
            layout_compare "$TMP/$model.1.json" "$TMP/$model.$name.json" "$model $* $lay"
    done
}
cp_layouts tiny
cp_layouts tiny-llama
# --hybrid-shard counts ranks of dp x cp: shard groups of whole CP groups,
# replicated over dp (HSDP, torchtitan's dp_shard_cp)
layout_run "$TMP/hsdp.json" 4 $S --model tiny-llama --cp 2 --zero 2 --hybrid-shard 2 &&
    layout_compare "$TMP/tiny-llama.1.json" "$TMP/hsdp.json" "tiny-llama --cp 2 --zero 2 --hybrid-shard 2"

# ---- mixtures of experts: the routing statistics (the aux and z losses,
# the loads) summed over the CP ranks before the losses, so they are the
# whole sequences'; the EP groups cut from the DP axis, CP ranks included.
# tiny-moe (softmax top-2) at cp2, cp2 x ep2, and tp2 x cp2 x ep2 with
# sequence parallelism; tiny-deepseek-moe (sigmoid router, expert bias,
# shared expert) at cp2 x dp2 x ep2 with ZeRO-1 and at cp2 x pp2: as one
# process within layout_compare's bounds, and the step line's MoE
# statistics equal ----
moe_cp() { # MODEL LAYOUTS (np:args;...)
    model=$1
    layout_run "$TMP/moe.$model.1.json" 1 $S --model "$model" || return
    ifs=$IFS
    IFS=';'
    set -- $2
    IFS=$ifs
    for item in "$@"; do
        np=${item%%:*}
        lay=${item#*:}
        name=$(echo "$lay" | tr -d ' -')
        layout_run "$TMP/moe.$model.$name.json" "$np" $S --model "$model" $lay || continue
        layout_compare "$TMP/moe.$model.1.json" "$TMP/moe.$model.$name.json" "$model $lay"
        a=$(grep '^step   10/10' "$TMP/moe.$model.1.json.log" | grep -o 'moe aux [^|]*')
        b=$(grep '^step   10/10' "$TMP/moe.$model.$name.json.log" | grep -o 'moe aux [^|]*')
        [ -n "$a" ] && [ "$a" = "$b" ] && pass "$model $lay: step 10's MoE statistics as one process's: $b" ||
            fail "$model $lay: step 10's MoE statistics '$b', one process '$a'"
    done
}
moe_cp tiny-moe "2:--cp 2;2:--cp 2 --ep 2;4:--tp 2 --cp 2 --ep 2 --sequence-parallel"
moe_cp tiny-deepseek-moe "4:--cp 2 --ep 2 --zero 1;4:--cp 2 --pp 2;4:--cp 2 --ep 2 --zero 3 --hybrid-shard 2"

# ---- --doc-mask: documents cross the chunks' edges ----
P="$TMP/lines"
if "$DTRAIN_PREPARE" --out "$P" --format megatron --doc-separator '\n' --val-fraction 0.1 \
    "$top_srcdir/examples/data/carroll-alice.txt" "$top_srcdir/examples/data/shakespeare-hamlet.txt" \
    >"$TMP/prepare.log" 2>&1; then
    D="--data ${P}_train --val-data ${P}_val --data-format megatron --doc-mask"
    for model in tiny tiny-llama; do
        layout_run "$TMP/doc.$model.1.json" 1 $S --model $model $D || continue
        for cp in 2 4; do
            layout_run "$TMP/doc.$model.$cp.json" $cp $S --model $model $D --cp $cp &&
                layout_compare "$TMP/doc.$model.1.json" "$TMP/doc.$model.$cp.json" "$model --doc-mask --cp $cp"
        done
    done
else
    fail "dtrain-prepare: $(tail -n 2 "$TMP/prepare.log")"
fi

# ---- the deferred-ops table (DTRAIN_DEFER_OPS=1: the CPU ops queued as
# an asynchronous backend's are, so the ring's waits on the backend are
# exercised) gives the same bits ----
if [ -f "$TMP/doc.tiny-llama.2.json" ]; then
    DTRAIN_DEFER_OPS=1 layout_run "$TMP/defer.json" 2 $S --model tiny-llama $D --cp 2 &&
        layout_twice "$TMP/doc.tiny-llama.2.json" "$TMP/defer.json" "tiny-llama --doc-mask --cp 2 deferred ops vs direct:"
fi

# ---- determinism ----
layout_run "$TMP/again.json" 4 $S --model tiny-llama --cp 4 &&
    layout_twice "$TMP/tiny-llama.cp4.json" "$TMP/again.json" "tiny-llama --cp 4"

# ---- checkpoints: cp4 -> one rank, one rank -> cp2 ----
layout_run "$TMP/ck.json" 4 $S --model tiny-llama --cp 4 --ckpt-dir "$TMP/ck" --ckpt-every 5 &&
    layout_run "$TMP/re.json" 1 $S --model tiny-llama --resume "$TMP/ck/step_00000005.h5" &&
    resumed "tiny-llama --cp 4 checkpoint continued at one rank" "$TMP/ck.json" "$TMP/re.json"
layout_run "$TMP/ck1.json" 1 $S --model tiny --ckpt-dir "$TMP/ck1" --ckpt-every 5 &&
    layout_run "$TMP/re1.json" 2 $S --model tiny --cp 2 --resume "$TMP/ck1/step_00000005.h5" &&
    resumed "tiny one-rank checkpoint continued at --cp 2" "$TMP/ck1.json" "$TMP/re1.json"

# ---- activation memory: 1/cp, and the planner's bytes ----
# act_peak FILE: the activation category's peak of the last step
act_peak() {
    /usr/bin/python3 -c 'import json, sys
d = json.loads([l for l in open(sys.argv[1]) if "\"mem_peak\"" in l][-1])
print(d["mem_peak"]["activations"])' "$1"
}
a1=$(act_peak "$TMP/tiny-llama.1.json")
a2=$(act_peak "$TMP/tiny-llama.cp2.json")
a4=$(act_peak "$TMP/tiny-llama.cp4.json")
# a CP rank's arena is 1/cp of one rank's plus its rows' positions (the
# slot's int32 pos, B x T/cp: one rank without --doc-mask has none)
if [ -n "$a1" ] && [ "$((a1 / 2 + 4 * 2 * 64 / 2))" -eq "$a2" ] && [ "$((a1 / 4 + 4 * 2 * 64 / 4))" -eq "$a4" ]; then
    pass "activation arena per rank: $a1 B at one rank, $a2 at cp2, $a4 at cp4 (1/cp, plus 4 B x T/cp positions)"
else
    fail "activation arena per rank not 1/cp (plus the positions): $a1, $a2, $a4"
fi
for cp in 2 4; do
    "$DTRAIN" --plan --plan-dtype fp32 --hw cpu --gpus "$cp" --model tiny-llama --cp "$cp" --micro-batch 2 \
        --global-batch 8 --seq-len 64 --metrics "$TMP/plan$cp.json" >"$TMP/plan$cp.txt" 2>&1 ||
        { fail "--plan --cp $cp: $(tail -n 2 "$TMP/plan$cp.txt")"; continue; }
    want=$(/usr/bin/python3 -c 'import json, sys
print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["mem_worst"]["activations"])' "$TMP/plan$cp.json")
    got=$(act_peak "$TMP/tiny-llama.cp$cp.json")
    [ "$want" = "$got" ] && pass "--plan --cp $cp: activations $want B = the run's peak" ||
        fail "--plan --cp $cp: activations $want B, the run's peak $got"
done

# the planner with experts under CP: its bytes of every category equal
# the cp2 x ep2 run's peaks
if [ -f "$TMP/moe.tiny-moe.cp2ep2.json" ]; then
    "$DTRAIN" --plan --plan-dtype fp32 --hw cpu --gpus 2 --model tiny-moe --cp 2 --ep 2 --micro-batch 2 \
        --global-batch 8 --seq-len 64 --metrics "$TMP/planm.json" >"$TMP/planm.txt" 2>&1 &&
        plan_equals_run "$TMP/planm.json" "$TMP/moe.tiny-moe.cp2ep2.json" >"$TMP/planm.cmp" &&
        pass "--plan tiny-moe --cp 2 --ep 2: planned/measured bytes equal: $(cat "$TMP/planm.cmp")" ||
        fail "--plan tiny-moe --cp 2 --ep 2: planned/measured: $(cat "$TMP/planm.cmp" "$TMP/planm.txt" 2>/dev/null | tail -n 2)"
fi

# ---- bad input: one line, exit 2, on every rank ----
B="$DTRAIN $(tiny_args) --steps 1 --micro-batch 2"
expect_exit2 "--cp 2: --seq-len 66 must be a multiple of 2 x cp = 4" "$MPIEXEC" --quiet -np 2 $B --seq-len 66 --cp 2
expect_exit2 "world size 3 is not divisible by --tp 1 x --cp 2 x --pp 1 = 2" "$MPIEXEC" --quiet -np 3 $B \
    --seq-len 64 --cp 2
expect_exit2 "--cp 4 with --hybrid-shard 2: a shard group must hold whole CP groups" "$MPIEXEC" --quiet -np 4 $B \
    --seq-len 64 --cp 4 --zero 1 --hybrid-shard 2
expect_exit2 "--cp 2 with --moe-capacity-factor is not implemented" "$MPIEXEC" --quiet -np 2 $B --seq-len 64 --cp 2 \
    --model tiny-moe --moe-capacity-factor 1.5
expect_exit2 "--ep 4 must divide the data-parallel size 2 (world size / (tp x pp), the CP ranks included)" \
    "$MPIEXEC" --quiet -np 2 $B --seq-len 64 --cp 2 --model tiny-moe --ep 4
finish
