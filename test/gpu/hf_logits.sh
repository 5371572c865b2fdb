#!/bin/sh
# Hugging Face transformers reads what dtrain trained on the GPU (issue 19's
# GPU check; bench/gpu.sh step 5). For a small GPT-2 (Conv1D, tied head,
# vocabulary 300 padded in memory), a small Llama (GQA 4:2, rotate-half
# RoPE, untied head) and issue 39's variants of it (Llama 3.1's and linear
# rope_scaling, Qwen2's q/k/v biases untied and tied, Qwen3's q/k norms and
# head_dim; transformers 4.51 or later for Qwen3): test/ref/hf_ref.py writes random weights under Hugging
# Face's names; dtrain --device cuda starts from them (--init-from) and
# trains 10 steps (bf16, the GPU's default); dreshard --to-hf --dtype fp32
# exports the result; dtrain --init-from the export computes its validation
# loss at step 0 (fp32 on the GPU and on the CPU, and bf16 on the GPU); and
# test/gpu/hf_logits.py loads the export with transformers'
# AutoModelForCausalLM (float64) and must get the same loss within 1e-5
# relative (bf16: 2e-3), and the logits of hf_ref.py's own forward on the
# exported tensors. SKIP (77) without a GPU or without transformers.
. "$top_srcdir/test/common.sh"
PY=${HF_PYTHON:-${DTRAIN_PYTHON:-python3}}
: "${DRESHARD:=$top_builddir/src/dreshard}"
if ! "$top_builddir/test/gpu/test_ops_cuda" --probe >"$TMP/probe" 2>&1; then
    cat "$TMP/probe"
    exit 77
fi
if ! "$PY" -c 'import torch, transformers, numpy' >/dev/null 2>&1; then
    echo "SKIP: $PY cannot import torch, transformers and numpy"
    exit 77
fi

# run LOG ARGS...: one dtrain process, its log kept
run() {
    log=$1
    shift
    "$DTRAIN" --micro-batch 2 --seq-len 16 --val-batches 4 --sample-tokens 0 --peak-gflops 100 --threads 2 "$@" \
        >"$log" 2>&1 || { fail "dtrain $*: exit $?: $(tail -n 2 "$log")"; return 1; }
}

for arch in gpt2 llama llama3 llama-linear qwen2 qwen2-tied qwen3; do
    d=$TMP/$arch
    "$PY" "$top_srcdir/test/ref/hf_ref.py" write --arch "$arch" --out "$d" --tokens "$d.tok" >"$d.ref" 2>&1 ||
        { fail "$arch: hf_ref.py write: $(tail -n 1 "$d.ref")"; continue; }
    run "$d.train.log" --device cuda --init-from "$d" --data "$d.tok" --val-data "$d.tok" --steps 10 --lr 1e-3 \
        --warmup 0 --val-every 10 --metrics "$d.train.json" --save-params "$d.h5" || continue
    grep -q "^backend: cuda" "$d.train.log" || { fail "$arch: the training did not run on the CUDA backend"; continue; }
    "$DRESHARD" --in "$d.h5" --to-hf "$d.hf" --dtype fp32 >"$d.export.log" 2>&1 ||
        { fail "$arch: dreshard --to-hf: $(tail -n 1 "$d.export.log")"; continue; }
    # fp32 on both devices within 1e-5; --dtype bf16 on the GPU (the
    # default there) within 2e-3, bf16 operand rounding
    for cfg in cuda:fp32:1e-5 cpu:fp32:1e-5 cuda:bf16:2e-3; do
        dev=${cfg%%:*}
        dt=${cfg#*:}
        tol=${dt#*:}
        dt=${dt%%:*}
        run "$d.val.$dev.$dt.log" --device "$dev" --dtype "$dt" --init-from "$d.hf" --data "$d.tok" \
            --val-data "$d.tok" --steps 1 --lr 0 --min-lr 0 --warmup 0 --val-every 1 \
            --metrics "$d.val.$dev.$dt.json" || continue
        loss=$(json_field "$d.val.$dev.$dt.json" 0 val_loss)
        if out=$("$PY" "$top_srcdir/test/gpu/hf_logits.py" "$d.hf" "$d.tok" "$loss" --tol "$tol" \
            --label "$arch trained 10 steps on the GPU, exported; dtrain --device $dev --dtype $dt" 2>&1); then
            pass "$(echo "$out" | tail -n 1 | sed 's/^ok *//')"
        else
            fail "$(echo "$out" | grep -v 'Loading weights' | tail -n 3)"
        fi
    done
    echo "     $arch: the random start's loss $(cat "$d.ref"), after 10 GPU steps $(json_field "$d.val.cpu.fp32.json" 0 val_loss)"
done
finish
