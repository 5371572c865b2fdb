#!/bin/sh
# dtrain --plan: (a) the planner's parameter count is dtrain's, and the
# published one for the presets of real models (Llama 2, Llama 3.1/3.2,
# Qwen2.5, Qwen3); (b) in fp32 and bf16 (dtrain's --dtype) its bytes per
# rank and category equal a real run's accounting allocator (--metrics
# "mem_peak", the maximum over ranks), at several layouts, for the tiny
# presets and for Llama 3.1-, Qwen2- and Qwen3-shaped models from
# --init-from; (c)
# llama-70b on 64 H100s at tp 8 pp 8 fits with ZeRO-1 and recomputation
# and does not without; (d) slurm/train_70b.sbatch's own arguments fit;
# (e) bad input is one line and exit 2; --search lists layouts that fit; a
# hardware file with the H100's numbers at 4 GPUs per node prices tp 8
# (now across 2 nodes) at the inter-node bandwidth: tp time 5-9x the
# in-node one;
# (f) --doc-mask --plan-doc-len N: attention FLOPs per token of documents of
# N tokens, against sum(L^2) / T computed here; (g) --ep's all-to-all
# bytes per step against the count written out here.
. "$top_srcdir/test/common.sh"

# plan_json OUT ARGS...: dtrain --plan ARGS, the plan's JSON in OUT and its
# text in OUT.txt
plan_json() {
    out=$1
    shift
    "$DTRAIN" --plan "$@" --metrics "$out" >"$out.txt" 2>&1 ||
        { fail "--plan $*: exit status $?: $(tail -n 2 "$out.txt")"; return 1; }
}

# jget FILE KEY[.KEY]: a value of the plan's or a run's last JSON line
jget() {
    /usr/bin/python3 -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for k in sys.argv[2].split("."):
    d = d[k]
print(d)' "$1" "$2"
}

# ---- (a) parameter counts ------------------------------------------------------------
# the planner sums its stages' tables (tied copies once); dtrain's banner
# prints model_params_total. Published counts: test_init.c.
banner_params() {
    sed -n 's/^model .* | \([0-9]*\) parameters$/\1/p' "$1"
}
for m in tiny gpt2-124m; do
    "$DTRAIN" $(tiny_args) --model "$m" --threads 1 --steps 1 --val-every 0 --sample-tokens 0 --micro-batch 1 \
        --seq-len 32 >"$TMP/run_$m.log" 2>&1 || fail "$m: one training step failed: $(tail -n 2 "$TMP/run_$m.log")"
    real=$(banner_params "$TMP/run_$m.log")
    for layout in "--tp 1 --pp 1" "--tp 2 --pp 2" "--tp 4 --pp 4 --dp 2"; do
        plan_json "$TMP/a.json" --model "$m" --micro-batch 1 --global-batch 8 --seq-len 32 $layout || continue
        got=$(jget "$TMP/a.json" params_total)
        if [ -n "$real" ] && [ "$got" = "$real" ]; then
            pass "$m $layout: planner counts $got parameters, as dtrain does"
        else
            fail "$m $layout: planner $got parameters, dtrain '$real'"
        fi
    done
done
[ "$(banner_params "$TMP/run_gpt2-124m.log")" = 124439808 ] &&
    pass "gpt2-124m: 124,439,808 parameters (124.4M: the head tied to wte, counted once)" ||
    fail "gpt2-124m: dtrain prints $(banner_params "$TMP/run_gpt2-124m.log") parameters, expected 124439808"
for layout in "--tp 1 --pp 1" "--tp 8 --pp 8"; do
    plan_json "$TMP/a.json" --model llama-70b --micro-batch 1 --global-batch 64 --seq-len 4096 $layout || continue
    got=$(jget "$TMP/a.json" params_total)
    [ "$got" = 68976648192 ] && pass "llama-70b $layout: $got parameters (Llama 2 70B)" ||
        fail "llama-70b $layout: $got parameters, expected 68976648192"
done

# issue 39's presets plan at their published sizes (the totals of their
# safetensors files on the Hugging Face hub; tied heads counted once), at
# one rank and at tp 2 x pp 4 (Qwen2.5 0.5B's 2 KV heads allow no more
# tp); test_init.c checks the same counts on the parameter table
for mc in llama3.2-1b:1235814400 llama3.1-8b:8030261248 llama3.1-70b:70553706496 qwen2.5-0.5b:494032768 \
    qwen3-0.6b:596049920 qwen3-8b:8190735360; do
    m=${mc%%:*}
    want=${mc#*:}
    for layout in "--tp 1 --pp 1" "--tp 2 --pp 4"; do
        plan_json "$TMP/a.json" --model "$m" --micro-batch 1 --global-batch 8 --seq-len 4096 $layout || continue
        got=$(jget "$TMP/a.json" params_total)
        [ "$got" = "$want" ] && grep -q "^dtrain plan: model $m (llama):" "$TMP/a.json.txt" &&
            pass "$m $layout: $got parameters, the published count" ||
            fail "$m $layout: $got parameters, expected $want: $(head -n 1 "$TMP/a.json.txt")"
    done
done
plan_json "$TMP/a.json" --model llama3.1-8b --micro-batch 1 --global-batch 8 --seq-len 8192 --tp 8 &&
    grep -q "vocab=128256 rope_scaling=llama3(factor 8) | 8030261248 parameters" "$TMP/a.json.txt" &&
    plan_json "$TMP/b.json" --model qwen3-8b --micro-batch 1 --global-batch 8 --seq-len 8192 --tp 8 &&
    grep -q "ffn=12288 vocab=151936 head_dim=128 qk_norm | 8190735360 parameters" "$TMP/b.json.txt" &&
    pass "--plan names the presets' features: $(head -n 1 "$TMP/a.json.txt" | sed 's/.*: //'); $(head -n 1 "$TMP/b.json.txt" | sed 's/.*: //')" ||
    fail "--plan llama3.1-8b / qwen3-8b: $(head -n 1 "$TMP/a.json.txt"); $(head -n 1 "$TMP/b.json.txt")"

# ---- (b) fp32 and bf16 plans = the accounting allocator of a real run, byte for byte ------
# Every category is modelled exactly (dtrain's buffers and arenas: under
# --dtype bf16 the weights' bf16 copy and the bf16 matmul-only
# activations), so the tolerance is zero, activations included.
RUN="--threads 1 --steps 2 --val-every 0 --sample-tokens 0 --micro-batch 2 --global-batch 8 --seq-len 64"
mem_check() { # [--dtype bf16] NP ARGS... (the model: $mem_check_args, else tiny_args)
    dt=fp32
    [ "$1" = --dtype ] && { dt=$2; shift 2; }
    np=$1
    shift
    model=${mem_check_args:-$(tiny_args)}
    lbl=$(echo "$dt np $np" ${mem_check_label:-} "$@")
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $model $RUN "$@" --dtype $dt --metrics "$TMP/run.json" \
        >"$TMP/run.log" 2>&1 || { fail "$lbl: training failed: $(tail -n 2 "$TMP/run.log")"; return; }
    plan_json "$TMP/plan.json" $model $RUN "$@" --hw cpu --plan-dtype $dt --gpus "$np" || return
    diffs=""
    for k in parameters gradients optimizer activations communication workspace total; do
        a=$(jget "$TMP/run.json" "mem_peak.$k")
        b=$(jget "$TMP/plan.json" "mem_peak.$k")
        [ "$a" = "$b" ] || diffs="$diffs $k: run $a, plan $b;"
    done
    if [ -z "$diffs" ]; then
        pass "$lbl: planned bytes = measured peak in every category (total $(jget "$TMP/plan.json" mem_peak.total) B)"
    else
        fail "$lbl:$diffs"
    fi
}
mem_check 1
mem_check 1 --model tiny-llama
mem_check 4 --tp 2 --pp 2
mem_check 4 --tp 2 --sequence-parallel --zero 1
mem_check 4 --zero 1 --hybrid-shard 2
mem_check 4 --zero 2 --pp 2
mem_check 4 --model tiny-llama --tp 2 --zero 2
mem_check 4 --pp 4 --pp-schedule gpipe
mem_check 2 --pp 2 --pp-schedule interleaved --pp-virtual 2
mem_check 4 --pp 2 --pp-schedule interleaved --pp-virtual 2 --zero 2
mem_check 2 --pp 2 --pp-schedule zb-h1
mem_check --dtype bf16 4 --tp 2 --pp 2 --pp-schedule zb-h1
mem_check 4 --pp 2 --pp-schedule zb-h1 --zero 3 --recompute full
mem_check --dtype bf16 2 --pp 2 --pp-schedule zb-h1 --recompute selective
mem_check --dtype bf16 4 --tp 2 --sequence-parallel --pp 2 --pp-schedule zb-h1 --recompute selective
mem_check 4 --tp 2 --zero 3
mem_check 4 --pp 2 --zero 3 --recompute full
mem_check 2 --recompute selective
mem_check 4 --zero 2 --hybrid-shard 2
# --ep: each rank's experts, and the expert activations and all-to-all
# staging sized for every token of the EP group
mem_check 2 --model tiny-moe --ep 2
mem_check 4 --model tiny-moe --ep 2 --tp 2 --sequence-parallel
# ZeRO with --ep: the dense parts' pieces over dp 4, the experts' over the
# expert-DP group of 2 (mpi/zero.h's parts), and ZeRO-3's windows holding
# both parts padded
mem_check 4 --model tiny-moe --ep 2 --zero 1
mem_check 4 --model tiny-moe --ep 2 --zero 3
# bf16 experts: their rows' operands in a16/d16 (P N K rows at ep P)
mem_check --dtype bf16 4 --model tiny-moe --ep 2 --zero 3
mem_check 4 --model tiny-moe --tp 2 --etp 1 --ep 2 --zero 3
mem_check 4 --model tiny-moe --ep 2 --zero 3 --hybrid-shard 2
mem_check --dtype bf16 2 --model tiny-deepseek-moe --tp 2 --etp 1 --sequence-parallel
mem_check --dtype bf16 2 --model tiny-deepseek-moe --tp 2 --sequence-parallel
# bf16 reductions: ddp.c's and zero.c's bf16 staging, sized by the functions
# their allocations use
mem_check 4 --zero 1 --grad-reduce-dtype bf16
# --offload optimizer: the device keeps the moments of the elements not
# offloaded (none at fraction 1), the planner's count exactly
mem_check 1 --offload optimizer
mem_check --dtype bf16 4 --zero 2 --pp 2 --offload optimizer --offload-fraction 0.5
# ... all of it under bf16: the fp32 weights are the host's master copy, the
# device keeps their bf16 copy and the fp32 tensors other ops read
mem_check --dtype bf16 1 --offload optimizer
mem_check --dtype bf16 4 --model tiny-llama --tp 2 --pp 2 --zero 1 --offload optimizer
mem_check 4 --zero 2 --hybrid-shard 2 --grad-reduce-dtype bf16
mem_check 4 --zero 3 --grad-reduce-dtype bf16
mem_check --dtype bf16 1
mem_check --dtype bf16 1 --model tiny-llama --recompute selective
mem_check --dtype bf16 4 --tp 2 --pp 2
mem_check --dtype bf16 4 --tp 2 --sequence-parallel --zero 1
mem_check --dtype bf16 4 --model tiny-llama --zero 2 --pp 2
mem_check --dtype bf16 4 --tp 2 --zero 3
mem_check --dtype bf16 4 --pp 2 --zero 3 --recompute full
# issue 39's Llama-shaped models through --init-from (test/ref/hf_ref.py's
# small ones): Qwen2's q/k/v biases, Qwen3's q/k norms and head size of its
# own, a tied Llama head at pp 2 (both ends hold the embedding)
if /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
    for m in qwen2-tied qwen3 llama3; do
        /usr/bin/python3 "$top_srcdir/test/ref/hf_ref.py" write --arch "$m" --out "$TMP/hf_$m" --tokens "$TMP/hf_$m.tok" \
            --T 64 --batches 16 >/dev/null || { fail "hf_ref.py write --arch $m"; continue; }
        mem_check_label=$m
        mem_check_args="--init-from $TMP/hf_$m --data $TMP/hf_$m.tok --peak-gflops 100 --threads 2"
        mem_check 1
        mem_check 4 --tp 2 --pp 2
        mem_check 4 --tp 2 --zero 2
        mem_check --dtype bf16 4 --tp 2 --pp 2
        unset mem_check_label mem_check_args
    done
else
    echo "note: /usr/bin/python3 cannot import torch and numpy: the --init-from plans are not checked"
fi
# the worst rank of the plan is the first stage under 1F1B (most in flight)
plan_json "$TMP/w.json" $(tiny_args) $RUN --pp 4 --global-batch 16 --hw cpu --plan-dtype fp32 &&
    [ "$(jget "$TMP/w.json" worst_stage)" = 0 ] && [ "$(jget "$TMP/w.json" in_flight)" = 4 ] &&
    pass "pp 4, 1f1b: worst rank is stage 0 with 4 microbatches in flight" || fail "pp 4 worst stage: $(cat "$TMP/w.json")"

# ---- (c) llama-70b on 64 x H100 80 GB, tp 8 pp 8, micro batch 1, seq 4096 ----------------------
# Megatron-LM's bf16 layout (--plan-dtype megatron) against the published
# formulas; then dtrain's own --dtype bf16 (--plan-dtype bf16, what the job
# would allocate).
L70BASE="--config $top_srcdir/examples/llama-70b.conf --gpus 64 --hw h100-sxm --tp 8 --pp 8 --micro-batch 1 --seq-len 4096 --global-batch 128"
L70="$L70BASE --plan-dtype megatron"
for v in "--zero 1 --recompute selective" "--zero 1 --recompute full" "--zero 1 --recompute selective --sequence-parallel"; do
    plan_json "$TMP/c.json" $L70 $v || continue
    if [ "$(jget "$TMP/c.json" fits)" = 1 ] && grep -q "^FITS: margin" "$TMP/c.json.txt"; then
        pass "llama-70b 64 x h100-sxm $v: $(grep '^  total' "$TMP/c.json.txt" | sed 's/  */ /g'), $(grep '^FITS' "$TMP/c.json.txt")"
    else
        fail "llama-70b $v: $(grep -E '^(  total|FITS|DOES)' "$TMP/c.json.txt")"
    fi
done
for v in "--zero 0 --recompute none" "--zero 0 --recompute none --sequence-parallel"; do
    plan_json "$TMP/c.json" $L70 $v || continue
    if [ "$(jget "$TMP/c.json" fits)" = 0 ] && grep -q "^DOES NOT FIT: margin -" "$TMP/c.json.txt"; then
        pass "llama-70b 64 x h100-sxm $v: $(grep '^DOES NOT FIT' "$TMP/c.json.txt")"
    else
        fail "llama-70b $v: $(grep -E '^(  total|FITS|DOES)' "$TMP/c.json.txt")"
    fi
done
# the parts of the 70B plan that follow from the formulas alone: stage 0
# holds 10 blocks + the embedding, 8 microbatches in flight; 2 + 4 B per
# local parameter (dp 1: nothing to shard); Korthikanti's selective
# activations s*b*h*(10 + 24/t) per layer and microbatch
plan_json "$TMP/c.json" $L70 --zero 1 --recompute selective && {
    n=$(jget "$TMP/c.json" local_params)
    # 10 blocks' matrices / 8, their norm weights whole, and 32000 -> 32768
    # padded vocabulary rows / 8 of the embedding
    want=$(( 10 * 855638016 / 8 + 10 * 2 * 8192 + 32768 / 8 * 8192 ))
    [ "$n" = "$want" ] && pass "llama-70b stage 0: $n local parameters (10 blocks + embedding, split 8 ways)" ||
        fail "llama-70b stage 0: $n local parameters, expected $want"
    p=$(jget "$TMP/c.json" mem_worst.parameters)
    g=$(jget "$TMP/c.json" mem_worst.gradients)
    o=$(jget "$TMP/c.json" mem_worst.optimizer)
    [ "$p" = $((2 * n)) ] && [ "$g" = $((4 * n)) ] && [ "$o" = $((12 * n)) ] &&
        pass "llama-70b bf16: 2 + 4 + 12 B per parameter ($p, $g, $o)" || fail "llama-70b bf16 bytes $p $g $o for $n"
    a=$(jget "$TMP/c.json" mem_worst.activations)
    # 80 layer-microbatches x 4096*8192*(10 + 24/8) + one layer's attention scores (5as^2b/t) recomputed
    want=$(( 80 * 4096 * 8192 * 13 + 5 * 64 * 4096 * 4096 / 8 ))
    [ "$a" = "$want" ] && pass "llama-70b selective activations: $a B = 80 x sbh(10 + 24/t) + 5as^2b/t" ||
        fail "llama-70b selective activations: $a B, expected $want"
}
# dtrain's own bf16: fp32 master weights and their bf16 copy (6 B), fp32
# gradients (4 B) and AdamW moments (8 B) per local parameter; flash
# attention keeps no s x s scores, so even without recomputation it fits
# where Megatron's layout above does not
for v in "--zero 1 --recompute selective" "--zero 0 --recompute none" "--zero 1 --recompute full --sequence-parallel"; do
    plan_json "$TMP/c.json" $L70BASE --plan-dtype bf16 $v || continue
    [ "$(jget "$TMP/c.json" fits)" = 1 ] && grep -q "^precision: bf16: dtrain's --dtype bf16" "$TMP/c.json.txt" &&
        pass "llama-70b dtrain bf16 $v: $(grep '^  total' "$TMP/c.json.txt" | sed 's/  */ /g'), $(grep '^FITS' "$TMP/c.json.txt")" ||
        fail "llama-70b dtrain bf16 $v: $(grep -E '^(precision|  total|FITS|DOES)' "$TMP/c.json.txt")"
done
plan_json "$TMP/c.json" $L70BASE --plan-dtype bf16 --zero 1 --recompute selective && {
    n=$(jget "$TMP/c.json" local_params)
    p=$(jget "$TMP/c.json" mem_worst.parameters)
    g=$(jget "$TMP/c.json" mem_worst.gradients)
    o=$(jget "$TMP/c.json" mem_worst.optimizer)
    [ "$p" = $((6 * n)) ] && [ "$g" = $((4 * n)) ] && [ "$o" = $((8 * n)) ] &&
        pass "llama-70b dtrain bf16: 6 + 4 + 8 B per parameter ($p, $g, $o)" || fail "llama-70b dtrain bf16 bytes $p $g $o for $n"
}

# ---- (d) slurm/train_70b.sbatch's arguments ------------------------------------------------
SB="$top_srcdir/slurm/train_70b.sbatch"
# the job's model_args array (model, layout, batch, recompute), as srun gets
# it in the script's own allocation (8 nodes x 8 tasks: tp 8 x pp 8)
args=$(model_args_of "$SB" | sed "s|examples/|$top_srcdir/examples/|")
if [ -n "$args" ]; then
    plan_json "$TMP/d.json" $args --plan-dtype bf16 --hw h100-sxm --gpus 64 &&
        [ "$(jget "$TMP/d.json" fits)" = 1 ] && pass "slurm/train_70b.sbatch model_args ($(echo $args | sed "s|$top_srcdir/||")): FITS on 64 x h100-sxm" ||
        fail "slurm/train_70b.sbatch ($args): $(grep -E '^(FITS|DOES)' "$TMP/d.json.txt")"
else
    fail "slurm/train_70b.sbatch: no model_args array"
fi

# ---- FLOPs and the time model ------------------------------------------------------------------
# FLOPs per step = src/model/flops.c's per-token count x tokens: for tiny at seq
# 64, 6 x (4 x 12 x 128^2 + 256 x 128) + 12 x 4 x 128 x 64 = 5,308,416
plan_json "$TMP/f.json" $(tiny_args) $RUN --hw cpu --peak-gflops 100 && {
    f=$(jget "$TMP/f.json" flops_per_step)
    expect_close "tiny FLOPs per step = 5308416 x 512 tokens" 2717908992 "$f" 1e-6
}
plan_json "$TMP/f.json" $L70 --zero 1 --recompute selective && {
    b=$(jget "$TMP/f.json" bubble_fraction)
    expect_close "1F1B bubble (p-1)/(m+p-1) at p 8, m 128" "$(awk 'BEGIN { print 7 / 135 }')" "$b" 1e-6
    mfu=$(jget "$TMP/f.json" mfu)
    awk -v m="$mfu" 'BEGIN { exit !(m > 0.2 && m < 0.6) }' && pass "llama-70b predicted MFU $mfu (published anchors: 0.38-0.47)" ||
        fail "llama-70b predicted MFU $mfu outside 0.2-0.6"
    # dtrain's attention runs on the tensor cores at the profile's
    # att_bf16 (head size 128), but its TP all-reduces carry fp32
    # activations, so the same layout under its own bf16 predicts a lower
    # MFU than Megatron's; with att_bf16 removed from the profile (the fp32
    # kernels at the fp32 peak) lower still
    plan_json "$TMP/fd.json" $L70BASE --plan-dtype bf16 --zero 1 --recompute selective && {
        mfud=$(jget "$TMP/fd.json" mfu)
        sed -n 's/^\(precision: .*\)/\1/p' "$TMP/fd.json.txt" | grep -q "attention on the tensor cores" &&
            awk -v a="$mfud" -v b="$mfu" 'BEGIN { exit !(a > 0 && a < b) }' &&
            pass "llama-70b dtrain bf16 predicted MFU $mfud below Megatron's $mfu (tensor-core attention, fp32 TP wire)" ||
            fail "llama-70b dtrain bf16 MFU $mfud vs Megatron $mfu: $(grep '^precision' "$TMP/fd.json.txt")"
        printf 'name = h100-noatt\nmemory = 80GiB\nreserve = 4GiB\npeak_fp32 = 66.9e12\npeak_bf16 = 989.4e12\nefficiency = 0.5\nmem_bw = 3.35e12\nintra_node_bw = 360e9\ninter_node_bw = 40e9\nlatency = 15e-6\ngpus_per_node = 8\n' >"$TMP/noatt.hw"
        plan_json "$TMP/fn.json" $L70BASE --plan-dtype bf16 --zero 1 --recompute selective --hw "$TMP/noatt.hw" && {
            mfun=$(jget "$TMP/fn.json" mfu)
            awk -v a="$mfun" -v b="$mfud" 'BEGIN { exit !(a > 0 && a < b) }' &&
                pass "llama-70b without att_bf16 (fp32 attention kernels): MFU $mfun below $mfud" ||
                fail "llama-70b without att_bf16: MFU $mfun, with it $mfud"
        }
        # --tp-comm-dtype bf16: the activations' TP bytes halve (the
        # last stage's cross-entropy statistics stay fp32, so stage 0's
        # are exactly half), their time about halves, the MFU rises
        plan_json "$TMP/fb.json" $L70BASE --plan-dtype bf16 --zero 1 --recompute selective --tp-comm-dtype bf16 && {
            t32=$(jget "$TMP/fd.json" bytes_sent.tp)
            t16=$(jget "$TMP/fb.json" bytes_sent.tp)
            mfub=$(jget "$TMP/fb.json" mfu)
            grep -q "^precision: .*tensor-parallel activations on the wire in bf16 (--tp-comm-dtype bf16))$" \
                "$TMP/fb.json.txt" && [ "$((t32 / 2))" = "$t16" ] &&
                awk -v a="$mfub" -v b="$mfud" 'BEGIN { exit !(a > b) }' &&
                pass "llama-70b --tp-comm-dtype bf16: stage 0 sends $t16 B over TP (fp32 wire $t32), MFU $mfub (fp32 wire $mfud)" ||
                fail "llama-70b --tp-comm-dtype bf16: tp bytes $t16 vs $t32, MFU $mfub vs $mfud: $(grep '^precision' "$TMP/fb.json.txt")"
        }
    }
}
# ZeRO stages shrink the data-parallel rank's state: optimizer 1/dp at zero 1
plan_json "$TMP/z0.json" --model gpt2-124m --gpus 8 --micro-batch 1 --global-batch 8 --seq-len 64 --zero 0 &&
    plan_json "$TMP/z1.json" --model gpt2-124m --gpus 8 --micro-batch 1 --global-batch 8 --seq-len 64 --zero 1 &&
    plan_json "$TMP/z3.json" --model gpt2-124m --gpus 8 --micro-batch 1 --global-batch 8 --seq-len 64 --zero 3 && {
    awk -v a="$(jget "$TMP/z0.json" mem_worst.optimizer)" -v b="$(jget "$TMP/z1.json" mem_worst.optimizer)" \
        'BEGIN { r = b / a; exit !(r > 0.124 && r < 0.127) }' && pass "zero 1 at dp 8: optimizer state 1/8" ||
        fail "zero 1 optimizer $(jget "$TMP/z1.json" mem_worst.optimizer) vs $(jget "$TMP/z0.json" mem_worst.optimizer)"
    # ZeRO-3 keeps parameters as ZeRO-2/3 keep gradients: the shard, the
    # tensors outside the blocks whole and two block windows; in fp32
    # exactly the gradient bytes
    plan_json "$TMP/z3f.json" --model gpt2-124m --gpus 8 --micro-batch 1 --global-batch 8 --seq-len 64 --zero 3 \
        --plan-dtype fp32 && {
        p3=$(jget "$TMP/z3f.json" mem_worst.parameters)
        g3=$(jget "$TMP/z3f.json" mem_worst.gradients)
        p0=$(jget "$TMP/z0.json" mem_worst.parameters)
        [ "$p3" -eq "$g3" ] && [ "$p3" -lt "$p0" ] &&
            pass "zero 3 at dp 8: parameters $p3 B = shard + outside-block tensors + 2 block windows (the fp32 gradients' bytes; zero 0 bf16: $p0 B)" ||
            fail "zero 3 parameters $p3 vs gradients $g3, zero 0 $p0"
    }
}

# ---- --search ----------------------------------------------------------------------------------
"$DTRAIN" --plan --search --config "$top_srcdir/examples/llama-70b.conf" --gpus 64 --global-batch 128 >"$TMP/s.txt" 2>&1 &&
    n=$(sed -n 's/.* layouts planned, \([0-9]*\) fit in .*/\1/p' "$TMP/s.txt") && [ "${n:-0}" -gt 0 ] &&
    [ "$(awk '/tokens\/s/ { on = 1; next } on && NF == 17 { n++ } END { print n + 0 }' "$TMP/s.txt")" -ge 2 ] &&
    awk '/tokens\/s/ { on = 1; next } on && NF == 17 { print $11 }' "$TMP/s.txt" | sort -c -r -n 2>/dev/null &&
    pass "--search: $n layouts of llama-70b fit on 64 x h100-sxm, listed by predicted tokens/s: $(sed -n '3p' "$TMP/s.txt" | sed 's/  */ /g')" ||
    fail "--search: $(head -n 4 "$TMP/s.txt")"
# the best layout it lists, planned on its own, fits (read in this shell:
# a pass or fail inside a pipeline's subshell would not count)
read -r tp pp dp cp ep sched z sp rc mb rest <<EOF
$(sed -n '3p' "$TMP/s.txt")
EOF
spf=""
[ "$sp" = on ] && spf=--sequence-parallel
case $sched in
inter-v*) schf="--pp-schedule interleaved --pp-virtual ${sched#inter-v}" ;;
*) schf="--pp-schedule $sched" ;;
esac
plan_json "$TMP/s1.json" --config "$top_srcdir/examples/llama-70b.conf" --tp "$tp" --pp "$pp" --dp "$dp" --cp "$cp" --zero "$z" \
    $spf $schf --recompute "$rc" --micro-batch "$mb" --global-batch 128 &&
    [ "$(jget "$TMP/s1.json" fits)" = 1 ] &&
    pass "--search's best (tp $tp pp $pp dp $dp $sched zero $z) fits when planned alone" ||
    fail "--search's best (tp $tp pp $pp dp $dp $sched zero $z): $(grep -E '^(FITS|DOES)' "$TMP/s1.json.txt")"

# one process plans any layout; under mpirun every rank agrees and rank 0 prints
"$MPIEXEC" --quiet -np 2 "$DTRAIN" --plan --model tiny --tp 2 --hw cpu --peak-gflops 100 >"$TMP/np2.txt" 2>&1 &&
    [ "$(grep -c '^dtrain plan:' "$TMP/np2.txt")" = 1 ] && grep -q "tp 2 x pp 1 x dp 1 = 2 ranks" "$TMP/np2.txt" &&
    pass "--plan under mpirun -np 2: one plan printed, dp from the world size" || fail "--plan np 2: $(head -n 3 "$TMP/np2.txt")"

# ---- (e) bad input -----------------------------------------------------------------------------
expect_exit2 "--hw is an option of the planner: add --plan" "$DTRAIN" --hw h100-sxm
expect_exit2 "--search is an option of the planner" "$DTRAIN" --search --gpus 8
expect_exit2 "--plan-dtype is an option of the planner" "$DTRAIN" --plan-dtype bf16
expect_exit2 "--gpu-mem is an option of the planner" "$DTRAIN" --gpu-mem 80
expect_exit2 "--hw 'h200': not a built-in profile (h100-sxm|a100-80g|cpu)" "$DTRAIN" --plan --hw h200
expect_exit2 "--plan-dtype 'fp16': allowed values are fp32|bf16|megatron" "$DTRAIN" --plan --plan-dtype fp16
expect_exit2 "--recompute 'some': allowed values are none|selective|full" "$DTRAIN" --plan --recompute some
expect_exit2 "--gpus 60 is not a multiple of --tp 8 x --pp 8 = 64" "$DTRAIN" --plan --model llama-70b --tp 8 --pp 8 --gpus 60
expect_exit2 "--dp 2 disagrees with --gpus 64" "$DTRAIN" --plan --model llama-70b --tp 8 --pp 8 --gpus 64 --dp 2
expect_exit2 "--tp 3 must divide the attention heads (64)" "$DTRAIN" --plan --model llama-70b --tp 3
expect_exit2 "--pp 8 needs at least 8 microbatches per step" "$DTRAIN" --plan --model llama-70b --tp 8 --pp 8 --micro-batch 1
expect_exit2 "--search needs --gpus N" "$DTRAIN" --plan --search
expect_exit2 "--search needs --global-batch" "$DTRAIN" --plan --search --gpus 8
expect_exit2 "--seq-len 2048 exceeds the model's 1024 learned positions" "$DTRAIN" --plan --model gpt2-124m --seq-len 2048
printf 'memory = 80GiB\nintra_node_bw = 450GB\ninter_node_bw = 50GB\ngpus_per_node = 8\npeak_bf16 = 989e12\nwarp = 9\n' >"$TMP/hw.conf"
expect_exit2 "hw.conf:6: unknown key 'warp'" "$DTRAIN" --plan --hw "$TMP/hw.conf"
printf 'memory = 80 GiB\nintra_node_bw = fast\n' >"$TMP/hw2.conf"
expect_exit2 "hw2.conf:2: intra_node_bw 'fast': expected a non-negative number" "$DTRAIN" --plan --hw "$TMP/hw2.conf"
printf 'memory = 80GiB\n' >"$TMP/hw3.conf"
expect_exit2 "hw3.conf: the key 'intra_node_bw' is missing" "$DTRAIN" --plan --hw "$TMP/hw3.conf"
# a profile file: the same numbers as the built-in H100 give the same plan
printf '# H100 SXM as a file\nname = my-h100\nmemory = 80GiB\nreserve = 4GiB\npeak_fp32 = 66.9e12\npeak_bf16 = 989.4e12\nefficiency = 0.5\nmem_bw = 3.35TB\nintra_node_bw = 360GB\ninter_node_bw = 40GB\nlatency = 15e-6\ngpus_per_node = 8\n' >"$TMP/h100.conf"
plan_json "$TMP/h1.json" $L70 --zero 1 --recompute selective && plan_json "$TMP/h2.json" $(echo "$L70" | sed 's/--hw h100-sxm//') --hw "$TMP/h100.conf" --zero 1 --recompute selective &&
    [ "$(jget "$TMP/h1.json" step_s)" = "$(jget "$TMP/h2.json" step_s)" ] && [ "$(jget "$TMP/h1.json" mem_worst.total)" = "$(jget "$TMP/h2.json" mem_worst.total)" ] &&
    pass "--hw FILE with the h100-sxm numbers plans the same step time and memory" || fail "--hw FILE vs h100-sxm: $(jget "$TMP/h1.json" step_s) vs $(jget "$TMP/h2.json" step_s)"
# TP across nodes: the same H100 numbers with 4 GPUs per node put each tp-8
# group on two nodes, and the planner prices its all-reduces at the
# inter-node 40 GB/s instead of NVLink's 360 GB/s: the tp time grows by up to
# 9x (latency terms are the same), nothing else in the compute changes
sed 's/^gpus_per_node = 8$/gpus_per_node = 4/' "$TMP/h100.conf" >"$TMP/h100x4.conf"
plan_json "$TMP/x4.json" $(echo "$L70" | sed 's/--hw h100-sxm//') --hw "$TMP/h100x4.conf" --zero 1 --recompute selective &&
    grep -q "^  tp .* 8 ranks, inter-node:" "$TMP/x4.json.txt" &&
    awk -v a="$(jget "$TMP/h2.json" tp_comm_s)" -v b="$(jget "$TMP/x4.json" tp_comm_s)" 'BEGIN { exit !(b > 5 * a && b <= 9 * a) }' &&
    pass "--plan: tp 8 on 4 GPUs per node is priced inter-node: tp time $(jget "$TMP/x4.json" tp_comm_s) s vs $(jget "$TMP/h2.json" tp_comm_s) s inside a node" ||
    fail "--plan, TP across nodes: tp time $(jget "$TMP/x4.json" tp_comm_s) s vs $(jget "$TMP/h2.json" tp_comm_s) s inside a node; $(grep '^  tp ' "$TMP/x4.json.txt")"
# --gpu-mem overrides the profile's memory
plan_json "$TMP/g.json" $L70 --zero 1 --recompute selective --gpu-mem 40 &&
    [ "$(jget "$TMP/g.json" fits)" = 0 ] && pass "--gpu-mem 40: the 70B layout that fits in 80 GiB does not in 40" || fail "--gpu-mem 40: fits=$(jget "$TMP/g.json" fits)"


# ---- (f) --doc-mask: the planner's mean document length ------------------------------------
# Attention FLOPs per token are 12 x L x h x T unmasked (src/model/flops.c); with
# each sequence of T cut into floor(T/N) documents of N and one of T mod N,
# T becomes sum(L^2) / T. Computed here from the plan's own L and C (h = C:
# heads x head size) and compared with its JSON, exactly (integers).
PD="--model gpt2-124m --micro-batch 2 --global-batch 16 --seq-len 1024 --gpus 8"
plan_json "$TMP/d0.json" $PD && plan_json "$TMP/dm.json" $PD --doc-mask &&
    grep -q "^document masking: one document per sequence assumed" "$TMP/dm.json.txt" &&
    [ "$(jget "$TMP/dm.json" flops_per_step)" = "$(jget "$TMP/d0.json" flops_per_step)" ] &&
    pass "--plan --doc-mask without --plan-doc-len: one document per sequence, said so, FLOPs as unmasked" ||
    fail "--plan --doc-mask alone: $(grep '^document' "$TMP/dm.json.txt")"
for N in 256 300; do
    plan_json "$TMP/d$N.json" $PD --doc-mask --plan-doc-len $N || continue
    LC=$(sed -n 's/^dtrain plan: .*: L=\([0-9]*\) C=\([0-9]*\) .*/\1 \2/p' "$TMP/d$N.json.txt")
    want=$(echo "$LC" | awk -v T=1024 -v N=$N '{ k = int(T / N); r = T - k * N; printf "%.0f", 12 * $1 * $2 * (k * N * N + r * r) / T }')
    got=$(jget "$TMP/d$N.json" attn_flops_per_token)
    # the step's FLOPs fall by the attention no longer computed, over 16 x 1024 tokens
    drop=$(echo "$LC" | awk -v T=1024 -v w="$want" '{ printf "%.0f", (12 * $1 * $2 * T - w) * 16 * T }')
    d=$(awk -v a="$(jget "$TMP/d0.json" flops_per_step)" -v b="$(jget "$TMP/d$N.json" flops_per_step)" 'BEGIN { printf "%.0f", a - b }')
    if [ -n "$want" ] && [ "$got" = "$want" ] && [ "$d" = "$drop" ] &&
        grep -q "^document masking: documents of mean length $N " "$TMP/d$N.json.txt" &&
        awk -v a="$(jget "$TMP/d0.json" compute_s)" -v b="$(jget "$TMP/d$N.json" compute_s)" 'BEGIN { exit !(b < a) }'; then
        pass "--plan-doc-len $N at T 1024: attention $got FLOPs per token = 12 L h sum(L^2)/T, step FLOPs $d lower, compute time lower"
    else
        fail "--plan-doc-len $N: attention $got FLOPs per token, expected $want; step FLOPs drop $d, expected $drop"
    fi
done
expect_exit2 "--plan-doc-len 2048 exceeds --seq-len 1024" "$DTRAIN" --plan $PD --doc-mask --plan-doc-len 2048
expect_exit2 "--plan-doc-len 256 is the mean document length of --doc-mask: add --doc-mask" "$DTRAIN" --plan $PD --plan-doc-len 256
expect_exit2 "--plan-doc-len is an option of the planner" "$DTRAIN" --doc-mask --plan-doc-len 256
expect_exit2 "--plan-doc-len -1: out of range" "$DTRAIN" --plan $PD --doc-mask --plan-doc-len -1

# ---- (g) --ep: the all-to-all bytes of one rank per step ----------------------------------
# tiny-moe (4 MoE layers, C 128, 8 experts, top-2) at ep2 on 4 ranks
# (dp 4, expert-DP 2), 2 x 64 tokens, one microbatch: per layer the
# tokens, outputs and both gradients of the (ep-1)/ep of the 256
# assignments that leave the rank (fp32 rows of 128) and the 4 experts'
# int32 counts
want=$(awk 'BEGIN { printf "%.0f", 4 * 1 * (4 * 0.5 * 128 * 2 * 128 * 4 + 0.5 * 8 * 4) }')
plan_json "$TMP/ep.json" --model tiny-moe --gpus 4 --ep 2 --micro-batch 2 --global-batch 8 --seq-len 64 --hw cpu &&
    plan_json "$TMP/ep1.json" --model tiny-moe --gpus 4 --micro-batch 2 --global-batch 8 --seq-len 64 --hw cpu &&
    if [ "$(jget "$TMP/ep.json" bytes_sent.ep)" = "$want" ] && [ "$(jget "$TMP/ep1.json" bytes_sent.ep)" = 0 ] &&
        grep -q "^  ep .* 2 ranks, .*: all-to-all of 4 MoE layers' tokens" "$TMP/ep.json.txt" &&
        grep -q "^  ep communication" "$TMP/ep.json.txt"; then
        pass "--plan --ep 2: $want all-to-all bytes per step (none without --ep), priced in the step"
    else
        fail "--plan --ep 2: all-to-all bytes $(jget "$TMP/ep.json" bytes_sent.ep), expected $want: $(grep '^  ep' "$TMP/ep.json.txt")"
    fi

# --etp 1 at tp2 x dp2 x ep2: each TP rank routes half the 128 tokens, so
# the all-to-all carries half as much per rank
want=$(awk 'BEGIN { printf "%.0f", 4 * 1 * (4 * 0.5 * 64 * 2 * 128 * 4 + 0.5 * 8 * 4) }')
plan_json "$TMP/etp.json" --model tiny-moe --gpus 4 --tp 2 --etp 1 --ep 2 --micro-batch 2 --global-batch 4 \
    --seq-len 64 --hw cpu &&
    if [ "$(jget "$TMP/etp.json" bytes_sent.ep)" = "$want" ] && [ "$(jget "$TMP/etp.json" etp)" = 1 ] &&
        grep -q "ep 2 x expert-dp 2 (etp 1" "$TMP/etp.json.txt"; then
        pass "--plan --etp 1 --ep 2 at tp2: $want all-to-all bytes per step (each TP rank's share of the tokens)"
    else
        fail "--plan --etp 1: all-to-all bytes $(jget "$TMP/etp.json" bytes_sent.ep), expected $want: $(grep '^layout\|^  ep' "$TMP/etp.json.txt")"
    fi

# ---- (h) a mixture's active parameters and FLOPs ------------------------------------------
# tiny-moe is tiny (4 layers, C 128, MLP 512) with each MLP replaced by 8
# GPT-2 experts of width 256, top-2: a token meets the router (C x 8) and
# two experts whose fc and proj widths add up to tiny's MLP, plus one more
# proj bias (C). So its active parameters are tiny's + 4 (8 C + C), and
# its FLOPs per token tiny's + 6 x 4 x 8 C (the router's matmul; biases
# are not matmul parameters).
plan_json "$TMP/moe.json" --model tiny-moe --micro-batch 2 --global-batch 8 --seq-len 64 --hw cpu &&
    plan_json "$TMP/dense.json" --model tiny --micro-batch 2 --global-batch 8 --seq-len 64 --hw cpu &&
    {
        act=$(jget "$TMP/moe.json" params_active)
        want_act=$(($(jget "$TMP/dense.json" params_total) + 4 * (8 * 128 + 128)))
        df=$(awk -v a="$(jget "$TMP/moe.json" flops_per_step)" -v b="$(jget "$TMP/dense.json" flops_per_step)" 'BEGIN { printf "%.0f", a - b }')
        want_df=$((6 * 4 * 8 * 128 * 8 * 64))
        if [ "$act" = "$want_act" ] && [ "$df" = "$want_df" ] &&
            grep -q "^moe: 4 of 4 layers, 8 experts of width 256, top-2: $(jget "$TMP/moe.json" params_total) parameters, $act active" "$TMP/moe.json.txt"; then
            pass "--plan tiny-moe: $act active parameters (tiny's + the routers and a bias), step FLOPs tiny's + $df (the routers)"
        else
            fail "--plan tiny-moe: active $act (want $want_act), FLOPs over tiny's $df (want $want_df): $(grep '^moe:' "$TMP/moe.json.txt")"
        fi
    }
# --search ranges over --ep for a mixture: ep divides dp and the experts
"$DTRAIN" --plan --search --model tiny-moe --gpus 4 --global-batch 16 --seq-len 64 --hw cpu >"$TMP/se.txt" 2>&1 &&
    eps=$(awk 'NR > 2 && $1 ~ /^[0-9]+$/ { print $5 }' "$TMP/se.txt" | sort -u | tr '\n' ' ') &&
    if echo "$eps" | grep -Eq '(^| )(2|4) '; then
        pass "--search over tiny-moe on 4 ranks lists ep $eps"
    else
        fail "--search over tiny-moe: ep values '$eps': $(head -n 3 "$TMP/se.txt")"
    fi

finish
