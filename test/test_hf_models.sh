#!/bin/sh
# Llama 3.1, Qwen2 and Qwen3 in and out (issue 39), against PyTorch:
# test/ref/hf_ref.py writes random weights under Hugging Face's names for
# four Llama-shaped variants and computes their loss in float64 from
# modeling_llama / modeling_qwen2 / modeling_qwen3's conventions:
#   llama3        rope_scaling llama3 (factor 8, low/high frequency factors
#                 1 and 4, original context 64: the 8 frequencies of a head
#                 fall in all three of its bands)
#   llama-linear  rope_scaling linear (factor 4, spelled "type")
#   qwen2         q/k/v projection biases (o none), a sliding_window that
#                 use_sliding_window false turns off
#   qwen2-tied    the same with tie_word_embeddings (no lm_head.weight:
#                 the head is embed_tokens, as in Qwen2.5 0.5B); at pp2 the
#                 last stage's copy of it sums its gradient with the first's
#   qwen3         per-head RMSNorm of q and k before RoPE, head_dim 32 at
#                 hidden_size 64 with 4 heads
# dtrain's validation loss at step 0 after --init-from must agree within
# 1e-5 relative at 1 rank and at tp2 x pp2, with bit-identical parameters;
# dreshard --to-hf writes back the same tensors byte for byte and a
# config.json of the same keys (architecture, rope_scaling, head_dim), which
# the PyTorch model reads to the original's loss. 20 fine-tuning steps at
# tp2 x pp2 equal one rank's (the q/k norm and bias gradients across TP
# ranks). Unsupported rope scalings and mismatched checkpoints are one line,
# exit 2.
. "$top_srcdir/test/common.sh"
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
REF="$top_srcdir/test/ref/hf_ref.py"
: "${DRESHARD:=$top_builddir/src/dreshard}"
if ! "$PYTHON_REF" -c 'import torch, numpy' >/dev/null 2>&1; then
    echo "SKIP: $PYTHON_REF cannot import torch and numpy (Debian's python3-torch)"
    exit 77
fi


# agree LABEL MODEL NP ARGS...: init_val0 of $TMP/MODEL within 1e-5 of its reference
agree() {
    label=$1
    m=$2
    shift 2
    if loss=$(init_val0 "$TMP/$m" "$TMP/$m.tok" "$@") &&
        out=$("$PYTHON_REF" "$REF" check "$TMP/$m" "$loss" --label "$label"); then
        pass "$(echo "$out" | sed "s/^ok *//")"
    else
        fail "$label: ${out:-dtrain failed}"
    fi
}

same_params() {
    if out=$("$PYTHON_REF" "$top_srcdir/test/compare_params.py" "$2" "$3" 0 2>&1); then
        pass "$1: parameters bit-identical to 1 rank's ($out)"
    else
        fail "$1: parameters differ from 1 rank's: $out"
    fi
}

# round_trip LABEL MODEL NP: dreshard --to-hf of $TMP/last.h5 on NP ranks:
# the original's tensors byte for byte, its config keys, its loss
round_trip() {
    label=$1
    m=$2
    if ! "$MPIEXEC" --quiet -np "$3" "$DRESHARD" --in "$TMP/last.h5" --to-hf "$TMP/rt" --force \
        >"$TMP/rt.log" 2>&1; then
        fail "$label: dreshard --to-hf on $3 ranks: $(tail -n 1 "$TMP/rt.log")"
        return
    fi
    if out=$("$PYTHON_REF" "$top_srcdir/test/st_ref.py" same-tensors "$TMP/$m" "$TMP/rt" 2>&1); then
        pass "$label -> dreshard --to-hf ($3 ranks): $out"
    else
        fail "$label -> dreshard --to-hf ($3 ranks): $out"
    fi
    if out=$("$PYTHON_REF" - "$TMP/$m/config.json" "$TMP/rt/config.json" <<'EOF' 2>&1
import json, math, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
keys = ["architectures", "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "num_hidden_layers", "vocab_size", "max_position_embeddings", "rope_theta",
        "rms_norm_eps", "rope_scaling", "tie_word_embeddings"]
keys += [k for k in ("head_dim", "attention_bias", "use_sliding_window") if k in a]
def same(x, y):
    if isinstance(x, dict) and isinstance(y, dict):  # rope_type or the older "type"
        x, y = ({("rope_type" if k == "type" else k): v for k, v in d.items()} for d in (x, y))
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, float) or isinstance(y, float):
        return isinstance(y, (int, float)) and math.isclose(x, y, rel_tol=1e-6)
    return x == y
bad = [k for k in keys if not same(a.get(k), b.get(k))]
print("differ: " + ", ".join("%s %r vs %r" % (k, a.get(k), b.get(k)) for k in bad) if bad else
      "%d config keys equal (%s)" % (len(keys), a["architectures"][0]))
sys.exit(1 if bad else 0)
EOF
    ); then
        pass "$label -> config.json: $out"
    else
        fail "$label -> config.json: $out"
    fi
    if out=$("$PYTHON_REF" "$REF" exported "$TMP/rt" "$TMP/$m" "$TMP/$m.tok" --label "$label exported" 2>&1); then
        pass "$(echo "$out" | sed "s/^ok *//")"
    else
        fail "$out"
    fi
}

for m in llama3 llama-linear qwen2 qwen2-tied qwen3; do
    "$PYTHON_REF" "$REF" write --arch "$m" --out "$TMP/$m" --tokens "$TMP/$m.tok" >/dev/null ||
        { fail "hf_ref.py write --arch $m"; continue; }
    agree "$m 1 rank" "$m" 1 && cp "$TMP/last.h5" "$TMP/$m.1.h5" && round_trip "$m 1 rank" "$m" 2
    agree "$m tp2 x pp2" "$m" 4 --tp 2 --pp 2 --global-batch 4 &&
        same_params "$m tp2 x pp2" "$TMP/$m.1.h5" "$TMP/last.h5" && round_trip "$m tp2 x pp2" "$m" 3
done

# ---- fine-tuning: 20 steps at tp2 x pp2 equal one rank's ----
ft_run() {
    out=$1
    np=$2
    src=$3
    shift 3
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" --init-from "$src" --data "$DATA_TRAIN" --val-data "$DATA_VAL" \
        --peak-gflops 100 --threads 1 --steps 20 --warmup 5 --lr 3e-4 --min-lr 3e-5 --micro-batch 2 --global-batch 8 \
        --seq-len 32 --val-every 20 --val-batches 4 --sample-tokens 0 --check-replicas 5 --metrics "$out" \
        --save-params "$out.h5" "$@" >"$out.log" 2>&1 ||
        { fail "fine-tune np $np $*: exit status $? $(tail -n 3 "$out.log")"; return 1; }
}
for m in llama3 qwen2-tied qwen3; do
    ft_run "$TMP/ft.$m.1.json" 1 "$TMP/$m" &&
        ft_run "$TMP/ft.$m.tp2pp2.json" 4 "$TMP/$m" --tp 2 --pp 2 &&
        layout_compare "$TMP/ft.$m.1.json" "$TMP/ft.$m.tp2pp2.json" "fine-tune $m tp2 x pp2 vs 1 rank"
done

# ---- a checkpoint knows its model: the Qwen3 weights are not a plain Llama's ----
if [ -f "$TMP/qwen3.1.h5" ]; then
    "$MPIEXEC" --quiet -np 1 "$DRESHARD" --in "$TMP/qwen3.1.h5" --to-hf "$TMP/q3back" >/dev/null 2>&1 &&
        grep -q '"Qwen3ForCausalLM"' "$TMP/q3back/config.json" &&
        pass "the saved Qwen3 params know their model (head_dim, qk_norm attributes): exported as Qwen3ForCausalLM" ||
        fail "the saved Qwen3 params lost their model: $(head -c 300 "$TMP/q3back/config.json" 2>&1)"
fi

# ---- bad inputs: one line, exit 2 ----
bad_scaling() {
    mkdir -p "$TMP/bad_$1"
    cp "$TMP/llama3/model.safetensors" "$TMP/bad_$1/"
    "$PYTHON_REF" - "$TMP/llama3/config.json" "$TMP/bad_$1/config.json" "$2" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_scaling"] = json.loads(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
EOF
    expect_exit2 "$3" "$MPIEXEC" --quiet -np 2 "$DTRAIN" --init-from "$TMP/bad_$1" --data "$TMP/llama3.tok" \
        --val-every 0 --seq-len 16 --steps 1 --sample-tokens 0 --peak-gflops 100 --threads 1
}
bad_scaling yarn '{"rope_type": "yarn", "factor": 4.0}' \
    "rope_scaling.rope_type: 'yarn': dtrain implements llama3 and linear scaling only"
bad_scaling nofactor '{"rope_type": "llama3", "low_freq_factor": 1, "high_freq_factor": 4}' \
    "rope_scaling.factor: missing"
bad_scaling order '{"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
    "original_max_position_embeddings": 64}' "rope_scaling.high_freq_factor: must exceed low_freq_factor"
finish
