#!/bin/sh
# Mixtral and Qwen2-MoE in and out (issue 33), against PyTorch:
# test/ref/hf_moe_ref.py writes random weights under Hugging Face's names
# and computes their loss in float64 from modeling_mixtral /
# modeling_qwen2_moe's conventions (softmax router, top-k, renormalised by
# Mixtral and not by a Qwen2-MoE with norm_topk_prob false, SwiGLU
# experts, Qwen's shared expert under its sigmoid gate, Qwen's
# decoder_sparse_step 2 making layers 1 and 3 MoE and 0 and 2 dense).
#   - dtrain's validation loss at step 0 after --init-from agrees within
#     1e-5 relative at 1 rank, ep2, ep2 x tp2 and tp2 x pp2, with
#     bit-identical parameters at each layout;
#   - dreshard --to-hf (fp32, 1 and 3 ranks) of the imported parameters
#     writes back the original tensors bit for bit (the round trip) and a
#     config.json the reference reads to the original's loss;
#   - a checkpoint trained 5 steps at ep2 x tp2 exports to a directory the
#     reference loads and matches dtrain's own validation loss of it, and
#     --init-from of that export gives the same loss back;
#   - the same weights stored as a converter with a bug would (w1 and w3
#     swapped, gate_proj and up_proj swapped, two experts swapped under
#     their router rows, norm_topk_prob flipped) miss the reference loss;
#   - an expert count that disagrees with config.json, a missing expert, a
#     layer pattern --moe-every/--moe-first-dense cannot express, router
#     jitter, and an export of a model no HF architecture holds are one
#     line and exit 2 on every rank, nothing written.
. "$top_srcdir/test/common.sh"
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
REF="$top_srcdir/test/ref/hf_moe_ref.py"
CHECK="$top_srcdir/test/ref/hf_ref.py"
: "${DRESHARD:=$top_builddir/src/dreshard}"
if ! "$PYTHON_REF" -c 'import torch, numpy' >/dev/null 2>&1; then
    echo "SKIP: $PYTHON_REF cannot import torch and numpy (Debian's python3-torch)"
    exit 77
fi



# export_check LABEL MODEL NP H5: dreshard --to-hf of H5 on NP ranks; the
# original's tensors bit for bit, its loss by the reference
export_check() {
    if ! "$MPIEXEC" --quiet -np "$3" "$DRESHARD" --in "$4" --to-hf "$TMP/rt" --force >"$TMP/rt.log" 2>&1; then
        fail "$1: dreshard --to-hf on $3 ranks: $(tail -n 1 "$TMP/rt.log")"
        return
    fi
    if out=$("$PYTHON_REF" "$REF" same-tensors "$TMP/$2" "$TMP/rt" 2>&1); then
        pass "$1 -> dreshard --to-hf ($3 ranks): $out"
    else
        fail "$1 -> dreshard --to-hf ($3 ranks): $out"
    fi
    if out=$("$PYTHON_REF" "$REF" exported "$TMP/rt" "$TMP/$2" "$TMP/$2.tok" --label "$1 exported" 2>&1); then
        pass "$(echo "$out" | sed "s/^ok *//")"
    else
        fail "$out"
    fi
}

for m in mixtral qwen2moe; do
    "$PYTHON_REF" "$REF" write --arch "$m" --out "$TMP/$m" --tokens "$TMP/$m.tok" >/dev/null ||
        { fail "hf_moe_ref.py write --arch $m"; continue; }
    agree "$m 1 rank" "$m" 1 || continue
    cp "$TMP/last.h5" "$TMP/$m.1.h5"
    export_check "$m 1 rank" "$m" 1 "$TMP/$m.1.h5"
    agree "$m ep2" "$m" 2 --ep 2 && same_params "$m ep2" "$TMP/$m.1.h5" "$TMP/last.h5"
    agree "$m ep2 x tp2" "$m" 4 --ep 2 --tp 2 && same_params "$m ep2 x tp2" "$TMP/$m.1.h5" "$TMP/last.h5" &&
        export_check "$m ep2 x tp2" "$m" 3 "$TMP/last.h5"
    agree "$m tp2 x pp2" "$m" 4 --tp 2 --pp 2 --global-batch 4 &&
        same_params "$m tp2 x pp2" "$TMP/$m.1.h5" "$TMP/last.h5"
done

# ---- a trained checkpoint goes out and back: 5 steps at ep2 x tp2, its
# export read by the reference to dtrain's own validation loss of it,
# and --init-from of the export to the same loss ----
for m in mixtral qwen2moe; do
    [ -f "$TMP/$m.1.h5" ] || continue
    "$MPIEXEC" --quiet -np 4 "$DTRAIN" --init-from "$TMP/$m" --data "$TMP/$m.tok" --val-data "$TMP/$m.tok" \
        --steps 5 --lr 1e-3 --warmup 1 --micro-batch 2 --global-batch 4 --seq-len 16 --val-every 5 --val-batches 4 \
        --sample-tokens 0 --peak-gflops 100 --threads 1 --ep 2 --tp 2 --metrics "$TMP/tr.json" \
        --save-params "$TMP/$m.tr.h5" >"$TMP/tr.log" 2>&1 || { fail "$m: 5 steps at ep2 x tp2: $(tail -n 2 "$TMP/tr.log")"; continue; }
    trained=$(json_field "$TMP/tr.json" 5 val_loss)
    "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "$TMP/$m.tr.h5" --to-hf "$TMP/$m.tr" >"$TMP/rt.log" 2>&1 ||
        { fail "$m trained: dreshard --to-hf: $(tail -n 1 "$TMP/rt.log")"; continue; }
    mkdir -p "$TMP/$m.trref"
    cp "$TMP/$m.tr/config.json" "$TMP/$m.trref/"
    printf '{"loss": %s, "B": 2, "T": 16, "batches": 4}\n' "$trained" >"$TMP/$m.trref/ref.json"
    if out=$("$PYTHON_REF" "$REF" exported "$TMP/$m.tr" "$TMP/$m.trref" "$TMP/$m.tok" --tol 1e-5 \
        --label "$m trained 5 steps at ep2 x tp2, exported" 2>&1); then
        pass "$(echo "$out" | sed "s/^ok *//") (dtrain's val_loss)"
    else
        fail "$out"
    fi
    cp "$TMP/$m.trref/ref.json" "$TMP/$m.tr/ref.json"
    cp "$TMP/$m.tok" "$TMP/$m.tr.tok"
    agree "$m trained, exported, imported again" "$m.tr" 1
done

# ---- the check fails when the model is read wrong ----
for mk in mixtral:swap13 mixtral:expertperm qwen2moe:swapgateup qwen2moe:expertperm qwen2moe:normtopk; do
    m=${mk%%:*}
    k=${mk#*:}
    "$PYTHON_REF" "$REF" write --arch "$m" --mutate "$k" --out "$TMP/$m.$k" --tokens "$TMP/$m.$k.tok" >/dev/null ||
        { fail "hf_moe_ref.py write --arch $m --mutate $k"; continue; }
    if ! loss=$(init_val0 "$TMP/$m.$k" "$TMP/$m.$k.tok" 2 --ep 2); then
        fail "$m read as $k: dtrain failed"
    elif out=$("$PYTHON_REF" "$CHECK" check "$TMP/$m.$k" "$loss" --label "$m read as $k"); then
        fail "the check does not see a $m read as $k: $out"
    else
        pass "a $m read as $k (ep2) fails the check: $(echo "$out" | sed 's/^FAIL *//')"
    fi
done

# ---- bad inputs: one line, exit 2 on every rank, nothing written ----
# the file has 4 experts per layer, the config says 3 (or 8)
bad_model fewer mixtral 'c["num_local_experts"] = 3' \
    "tensor model.layers.0.block_sparse_moe.gate.weight routes to 4 experts, config.json's model has 3"
bad_model more qwen2moe 'c["num_experts"] = 8' \
    "tensor model.layers.1.mlp.gate.weight routes to 4 experts, config.json's model has 8"
bad_model noexpert mixtral 'del W["model.layers.1.block_sparse_moe.experts.3.w2.weight"]' \
    "tensor model.layers.1.block_sparse_moe.experts.3.w2.weight (dtrain's h.1.moe.wproj) is missing"
bad_model extraexpert qwen2moe 'W["model.layers.1.mlp.experts.4.up_proj.weight"] = W["model.layers.1.mlp.experts.3.up_proj.weight"]' \
    "tensor model.layers.1.mlp.experts.4.up_proj.weight is not part of dtrain's llama model"
bad_model pattern qwen2moe 'c.update(decoder_sparse_step=1, mlp_only_layers=[2])' \
    "config.json: mlp_only_layers: with decoder_sparse_step, its MoE layers are not every N-th layer from a first one"
bad_model jitter mixtral 'c["router_jitter_noise"] = 0.01' \
    "config.json: router_jitter_noise: nonzero: dtrain's router adds no noise to its logits"
bad_model nogate qwen2moe 'del W["model.layers.3.mlp.shared_expert_gate.weight"]' \
    "tensor model.layers.3.mlp.shared_expert_gate.weight (dtrain's h.3.moe.shared_gate) is missing"

# ---- exports of mixtures no Hugging Face architecture holds: refused ----
for mk in "tiny-deepseek-moe:its sigmoid router (DeepSeek-V3's)" "tiny-moe:Hugging Face has no GPT-2 mixture of experts"; do
    m=${mk%%:*}
    "$MPIEXEC" --quiet -np 1 "$DTRAIN" $(tiny_args) --model "$m" --steps 1 --val-every 0 --sample-tokens 0 \
        --save-params "$TMP/$m.h5" >"$TMP/ds.log" 2>&1 || { fail "$m: $(tail -n 1 "$TMP/ds.log")"; continue; }
    expect_exit2 "this mixture of experts has no Hugging Face architecture dtrain maps: ${mk#*:}" \
        "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "$TMP/$m.h5" --to-hf "$TMP/$m.hf"
    set -- "$TMP"/.$m.hf*
    [ ! -e "$TMP/$m.hf" ] && [ ! -e "$1" ] || fail "the refused export of $m left files"
done
finish
