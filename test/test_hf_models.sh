#!/bin/sh
# Llama 3.1, Qwen2 and Qwen3 in and out (issue 39), against PyTorch:
# test/ref/hf_ref.py writes random weights under Hugging Face's names for
# Llama-shaped variants and computes their loss in float64 from
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
#   llama3-128k   llama3 tied, with Llama 3's 128,256-token vocabulary, and
#   qwen3-152k    qwen3 tied, with Qwen's 151,936: uint32 token files,
#                 vocabulary-parallel cross-entropy over the real sizes
# dtrain's validation loss at step 0 after --init-from must agree within
# 1e-5 relative at 1 rank and at tp2 x pp2, with bit-identical parameters;
# the same weights read without the scaling, the biases or the q/k norms
# must miss it (the check sees a wrong model). dreshard --to-hf (fp32)
# writes back the same tensors byte for byte and a config.json of the same
# keys (architecture, rope_scaling, head_dim), which the PyTorch model
# reads to the original's loss. 20 fine-tuning steps at tp2 x pp2 equal one
# rank's (the q/k norm and bias gradients across TP ranks). Data prepared
# with Llama 3.1's, DeepSeek-V3's and Qwen3's tokenizer.json (hf:) and
# trained on comes back out of dreshard --to-hf with the same
# tokenizer.json, byte for byte, and its tokenizer_config.json. Unsupported
# rope scalings, active sliding windows, o_proj and MLP biases, mismatched
# checkpoints and changed tokenizer files are one line, exit 2 on every
# rank, nothing written.
. "$top_srcdir/test/common.sh"
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
REF="$top_srcdir/test/ref/hf_ref.py"
: "${DRESHARD:=$top_builddir/src/dreshard}"
if ! "$PYTHON_REF" -c 'import torch, numpy' >/dev/null 2>&1; then
    echo "SKIP: $PYTHON_REF cannot import torch and numpy (Debian's python3-torch)"
    exit 77
fi




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

for m in llama3 llama-linear qwen2 qwen2-tied qwen3 llama3-128k qwen3-152k; do
    "$PYTHON_REF" "$REF" write --arch "$m" --out "$TMP/$m" --tokens "$TMP/$m.tok" >/dev/null ||
        { fail "hf_ref.py write --arch $m"; continue; }
    # (the large vocabularies' export once, from tp2 x pp2: 33 and 39 MB each)
    agree "$m 1 rank" "$m" 1 && cp "$TMP/last.h5" "$TMP/$m.1.h5" &&
        case $m in *k) ;; *) round_trip "$m 1 rank" "$m" 2 ;; esac
    agree "$m tp2 x pp2" "$m" 4 --tp 2 --pp 2 --global-batch 4 &&
        same_params "$m tp2 x pp2" "$TMP/$m.1.h5" "$TMP/last.h5" && round_trip "$m tp2 x pp2" "$m" 3
done

# ---- the check fails when the model is wrong ----
# The same weights read as a model without what the architecture adds:
# plain RoPE for the scaled Llamas, a plain Llama without Qwen2's biases or
# Qwen3's q/k norms. ref.json keeps the right model's loss, which dtrain's
# must now miss by more than the 1e-5 the agreement above allows, at 1 rank
# and at tp2 x pp2.
for mk in llama3:noscaling llama-linear:noscaling qwen2:nobias qwen2-tied:nobias qwen3:noqknorm; do
    m=${mk%%:*}
    k=${mk#*:}
    "$PYTHON_REF" "$REF" write --arch "$m" --mutate "$k" --out "$TMP/$m.$k" --tokens "$TMP/$m.$k.tok" >/dev/null ||
        { fail "hf_ref.py write --arch $m --mutate $k"; continue; }
    for l in "1" "4 --tp 2 --pp 2 --global-batch 4"; do
        # shellcheck disable=SC2086
        if ! loss=$(init_val0 "$TMP/$m.$k" "$TMP/$m.$k.tok" $l); then
            fail "$m read as $k, np $l: dtrain failed"
        elif out=$("$PYTHON_REF" "$REF" check "$TMP/$m.$k" "$loss" --label "$m read as $k, np $l"); then
            fail "the check does not see a $m read as $k (np $l): $out"
        else
            pass "a $m read as $k (np $l) fails the check: $(echo "$out" | sed 's/^FAIL *//')"
        fi
    done
done

# ---- fine-tuning: 20 steps at tp2 x pp2 equal one rank's ----
FT_SEQ_LEN=32 # these models' fine-tuning sequence (finetune_run in common.sh)
for m in llama3 qwen2-tied qwen3; do
    finetune_run "$TMP/ft.$m.1.json" 1 "$TMP/$m" &&
        finetune_run "$TMP/ft.$m.tp2pp2.json" 4 "$TMP/$m" --tp 2 --pp 2 &&
        layout_compare "$TMP/ft.$m.1.json" "$TMP/ft.$m.tp2pp2.json" "fine-tune $m tp2 x pp2 vs 1 rank"
done

# ---- a checkpoint knows its model: the Qwen3 weights are not a plain Llama's ----
if [ -f "$TMP/qwen3.1.h5" ]; then
    "$MPIEXEC" --quiet -np 1 "$DRESHARD" --in "$TMP/qwen3.1.h5" --to-hf "$TMP/q3back" >/dev/null 2>&1 &&
        grep -q '"Qwen3ForCausalLM"' "$TMP/q3back/config.json" &&
        pass "the saved Qwen3 params know their model (head_dim, qk_norm attributes): exported as Qwen3ForCausalLM" ||
        fail "the saved Qwen3 params lost their model: $(head -c 300 "$TMP/q3back/config.json" 2>&1)"
fi

# ---- the tokenizer comes back: dreshard --to-hf writes the tokenizer.json
# the data was prepared with, byte for byte, its sha256 the one the data's
# sidecar and the checkpoint recorded, and the tokenizer_config.json that
# was beside it (or, when none was, one naming the tokens the data used);
# config.json's BOS/EOS are the document tokens
TOKD=${DTRAIN_TOKENIZERS:-$top_srcdir/tokenizers}/hf
PREP=${DTRAIN_PREPARE:-$top_builddir/src/dtrain-prepare}
# tok_export LABEL MODEL TOKDIR BOS EOS: the data prepared with hf:TOKDIR, one
# step of training from MODEL at 2 ranks, the export at 2 ranks
tok_export() {
    label=$1
    td=$3
    "$PREP" --out "$TMP/te_$label" --tokenizer "hf:$td" --val-fraction 0 "$TMP/te.txt" >"$TMP/te.log" 2>&1 ||
        { fail "$label: dtrain-prepare: $(tail -n 1 "$TMP/te.log")"; return; }
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" --init-from "$TMP/$2" --data "$TMP/te_${label}_train_*.bin" --steps 1 \
        --micro-batch 2 --global-batch 4 --seq-len 16 --val-every 0 --sample-tokens 0 --peak-gflops 100 --threads 1 \
        --save-params "$TMP/te_$label.h5" >"$TMP/te.log" 2>&1 ||
        { fail "$label: dtrain: $(tail -n 2 "$TMP/te.log")"; return; }
    "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "$TMP/te_$label.h5" --to-hf "$TMP/te_$label.hf" >"$TMP/te.log" 2>&1 ||
        { fail "$label: dreshard --to-hf: $(tail -n 1 "$TMP/te.log")"; return; }
    grep -q "^dreshard: tokenizer files of hf:$(cd "$td" && pwd -P)/tokenizer.json (tokenizer.json as read, sha256 verified)" \
        "$TMP/te.log" || fail "$label: dreshard's note: $(tail -n 1 "$TMP/te.log")"
    if out=$("$PYTHON_REF" - "$td" "$TMP/te_$label" "$4" "$5" <<'EOF' 2>&1
import hashlib, json, os, sys
import h5py
src, pre, bos, eos = sys.argv[1:5]
hf = pre + ".hf"
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
same = lambda a, b: open(a, "rb").read() == open(b, "rb").read()
err = []
recorded = json.load(open(pre + ".tokenizer.json"))["vocab_sha256"]
with h5py.File(pre + ".h5", "r") as f:
    attr = f.attrs["tokenizer_sha256"]
    attr = attr.decode() if isinstance(attr, bytes) else str(attr)
got = sha(os.path.join(hf, "tokenizer.json"))
if not same(os.path.join(src, "tokenizer.json"), os.path.join(hf, "tokenizer.json")):
    err.append("tokenizer.json differs from the source")
if not got == recorded == attr:
    err.append("sha256 %s, sidecar %s, checkpoint %s" % (got[:12], recorded[:12], attr[:12]))
src_cfg = os.path.join(src, "tokenizer_config.json")
cfg_path = os.path.join(hf, "tokenizer_config.json")
want = lambda i: None if i == "null" else int(i)
if os.path.exists(src_cfg):
    if not same(src_cfg, cfg_path):
        err.append("tokenizer_config.json differs from the source")
    if os.path.exists(os.path.join(hf, "special_tokens_map.json")):
        err.append("a special_tokens_map.json beside the source's own tokenizer_config.json")
    how = "tokenizer_config.json copied"
else:
    tok_cfg = json.load(open(cfg_path))
    vocab = json.load(open(os.path.join(src, "tokenizer.json")))["added_tokens"]
    name = {t["id"]: t["content"] for t in vocab}
    stm = json.load(open(os.path.join(hf, "special_tokens_map.json")))
    roles = {k: tok_cfg.get(k) for k in ("tokenizer_class", "bos_token", "eos_token")}
    if roles != {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name.get(want(bos)),
                 "eos_token": name.get(want(eos))} or stm.get("eos_token") != roles["eos_token"]:
        err.append("tokenizer_config.json written: %r" % roles)
    how = "tokenizer_config.json written (eos_token %s)" % tok_cfg.get("eos_token")
for f in ("config.json", "generation_config.json"):
    c = json.load(open(os.path.join(hf, f)))
    if c.get("bos_token_id") != want(bos) or c.get("eos_token_id") != want(eos):
        err.append("%s: bos_token_id %r, eos_token_id %r" % (f, c.get("bos_token_id"), c.get("eos_token_id")))
print("; ".join(err) if err else "tokenizer.json identical (%d bytes, sha256 %s... = the sidecar's = the checkpoint's), %s, "
      "bos_token_id %s, eos_token_id %s" % (os.path.getsize(os.path.join(hf, "tokenizer.json")), got[:12], how, bos, eos))
sys.exit(1 if err else 0)
EOF
    ); then
        pass "$label -> dreshard --to-hf: $out"
    else
        fail "$label -> dreshard --to-hf: $out"
    fi
}
if [ -f "$TOKD/llama3_1/tokenizer.json" ] && [ -f "$TOKD/qwen3/tokenizer.json" ] && [ -f "$TOKD/deepseek_v3/tokenizer.json" ] &&
    [ -d "$TMP/llama3-128k" ] && [ -d "$TMP/qwen3-152k" ]; then
    head -c 40000 "$top_srcdir/examples/data/carroll-alice.txt" >"$TMP/te.txt"
    # Qwen3's tokenizer.json alone: no tokenizer_config.json beside it
    mkdir -p "$TMP/qtok"
    cp "$TOKD/qwen3/tokenizer.json" "$TMP/qtok/"
    tok_export llama3_1 llama3-128k "$TOKD/llama3_1" 128000 128001
    tok_export deepseek_v3 qwen3-152k "$TOKD/deepseek_v3" 0 1
    tok_export qwen3-alone qwen3-152k "$TMP/qtok" null 151643
    # the file changed since: refused (its sha256 names both), nothing written
    printf '\n' >>"$TMP/qtok/tokenizer.json"
    expect_exit2 "whose vocabulary file had sha256 .*, but .*qtok/tokenizer.json now has" \
        "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "$TMP/te_qwen3-alone.h5" --to-hf "$TMP/te_changed"
    set -- "$TMP"/.te_changed*
    [ ! -e "$TMP/te_changed" ] && [ ! -e "$1" ] &&
        pass "a tokenizer.json changed since training: no export written" || fail "the refused export left files"
    # a tokenizer larger than the model's vocabulary
    expect_exit2 "has 151669 tokens, more than the model's vocabulary of 128256" \
        "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "$TMP/te_llama3_1.h5" --to-hf "$TMP/te_big" --tokenizer "hf:$TOKD/qwen3"
    set -- "$TMP"/.te_big*
    [ ! -e "$TMP/te_big" ] && [ ! -e "$1" ] || fail "the refused export left $TMP/te_big or $1"
else
    echo "note: no $TOKD/{llama3_1,qwen3,deepseek_v3}/tokenizer.json (scripts/fetch-tokenizers.sh): the tokenizer export is not checked"
fi

# ---- bad inputs: one line, exit 2 on every rank, nothing written ----
bad_model yarn llama3 'c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}' \
    "config.json: rope_scaling.rope_type: 'yarn': dtrain implements llama3 and linear scaling only"
bad_model dynamic llama3 'c["rope_scaling"] = {"type": "dynamic", "factor": 2.0}' \
    "config.json: rope_scaling.rope_type: 'dynamic': dtrain implements llama3 and linear scaling only"
bad_model longrope llama3 'c["rope_scaling"] = {"rope_type": "longrope", "long_factor": [1.0] * 16,
    "short_factor": [1.0] * 16, "original_max_position_embeddings": 32}' \
    "config.json: rope_scaling.rope_type: 'longrope': dtrain implements llama3 and linear scaling only"
bad_model nofactor llama3 'c["rope_scaling"] = {"rope_type": "llama3", "low_freq_factor": 1, "high_freq_factor": 4}' \
    "rope_scaling.factor: missing"
bad_model order llama3 'c["rope_scaling"] = {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
    "high_freq_factor": 1, "original_max_position_embeddings": 64}' "rope_scaling.high_freq_factor: must exceed low_freq_factor"
# sliding-window attention active within the context (max_position_embeddings 64)
bad_model window qwen2 'c["use_sliding_window"] = True' \
    "config.json: sliding_window: 32 with use_sliding_window true, shorter than max_position_embeddings (64): sliding-window attention"
bad_model window3 qwen3 'c.update(use_sliding_window=True, sliding_window=16)' \
    "config.json: sliding_window: 16 with use_sliding_window true, shorter than max_position_embeddings (64)"
bad_model mistral llama3 'c.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=48)' \
    "config.json: sliding_window: 48, shorter than max_position_embeddings (64): sliding-window attention"
# Qwen2 has no o_proj bias: one in the checkpoint is refused, never dropped
bad_model obias qwen2 'W["model.layers.1.self_attn.o_proj.bias"] = W["model.layers.1.self_attn.q_proj.bias"]' \
    "tensor model.layers.1.self_attn.o_proj.bias is not part of dtrain's llama model (an o_proj bias, which Qwen2 does not have"
bad_model mlpbias qwen2 'W["model.layers.0.mlp.down_proj.bias"] = W["model.layers.0.self_attn.q_proj.bias"]' \
    "tensor model.layers.0.mlp.down_proj.bias is not part of dtrain's llama model (an MLP bias"
bad_model llamabias qwen2 'c.update(architectures=["LlamaForCausalLM"], model_type="llama"); del c["sliding_window"]' \
    "self_attn.[qkv]_proj.bias is not part of dtrain's llama model (a q/k/v bias, which only Qwen2ForCausalLM has"
bad_model llamanorm qwen3 'c.update(architectures=["LlamaForCausalLM"], model_type="llama")' \
    "self_attn.[qk]_norm.weight is not part of dtrain's llama model (a per-head q/k norm, which only Qwen3ForCausalLM has"
bad_model nonorm qwen3 'del W["model.layers.1.self_attn.q_norm.weight"]' \
    "tensor model.layers.1.self_attn.q_norm.weight (dtrain's h.1.attn.qnorm) is missing"
finish
