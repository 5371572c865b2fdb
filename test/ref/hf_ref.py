#!/usr/bin/python3
"""Hugging Face and llm.c model files for dtrain --init-from, and the loss
a PyTorch model written to Hugging Face's modelling conventions computes
on them. Independent of dtrain's code and of the transformers and
safetensors packages: the files are written from the formats' specs.

    hf_ref.py write --arch gpt2|llama|llama3|llama-linear|qwen2|qwen2-tied|qwen3|llama3-128k|qwen3-152k
                    --out DIR
                    [--dtype f32|bf16|f16]
                    [--shards N] [--mutate transpose|rope|noscaling|noqknorm|nobias] [--llmc FILE
                    --llmc-version 3|5] [--tokens FILE] [--seed S]
                    [--B 2 --T 16 --batches 4] [--big]

writes DIR/config.json and DIR/model.safetensors (or N shards with
model.safetensors.index.json) holding random weights under Hugging Face's
names, with --llmc also llm.c's gpt2 model file of the same weights, and
with --tokens an llm.c token shard of --batches x --B sequences of --T + 1
random tokens. llama3 and llama-linear are Llama with rope_scaling
(Llama 3.1's and linear), qwen2 Qwen2 (q/k/v biases; qwen2-tied with
tie_word_embeddings and no lm_head.weight, as Qwen2.5 0.5B), qwen3 Qwen3
(q/k norms, a head_dim of its own); llama3-128k and qwen3-152k the same
with the real vocabularies (128,256 and 151,936 rows, tied; token files of
uint32 ids). DIR/ref.json gets the loss of each microbatch and their
mean ("loss"), which is how dtrain's val_loss averages, in float64 from
the weights as stored (bf16/fp16 rounded). Prints the mean.

--mutate writes the file as a converter with a bug would read it, while
ref.json keeps the correct model's loss: "transpose" stores each attention
c_proj.weight (square, so the shape still fits) untransposed, "rope"
stores q_proj/k_proj rows in dtrain's interleaved order instead of
rotate-half order, "noscaling" drops config.json's rope_scaling (plain
RoPE), "noqknorm" and "nobias" write a LlamaForCausalLM without Qwen3's
q/k norms or Qwen2's q/k/v biases. dtrain's loss on such a file must
differ from ref.json.

    hf_ref.py check DIR LOSS [--tol 1e-5]

prints and checks |LOSS - ref| / |ref| <= tol (exit 1 when not).

    hf_ref.py exported DIR REFDIR TOKENS [--tol 1e-6]

reads a model directory dtrain exported (dreshard --to-hf) with the reader
below, written from the safetensors spec: its config.json gives the shapes
(checked against REFDIR's), its tensors (any dtype; one file or shards
with the index) the weights, and the loss of TOKENS must equal REFDIR's
reference loss within --tol relative (exit 1 when not). lm_head.weight of
a GPT-2 is absent (tied), as transformers' save_pretrained leaves it out.

    hf_ref.py bad KIND --out DIR

writes a small GPT-2 or Llama directory with one defect (KIND: arch,
rope_scaling, missing, extra, shape, dtype, header).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DT = torch.float64

SHAPES = {
    # small shapes with GQA, a vocabulary that is not a multiple of 128
    # (dtrain pads it in memory) and dimensions tp 2 divides
    "gpt2": dict(vocab=300, C=64, NH=4, L=2, Fm=256, S=64, eps=1e-5),
    "llama": dict(vocab=300, C=64, NH=4, NKV=2, L=2, Fm=160, S=64, eps=1e-5, theta=50000.0),
}
# Llama-shaped variants: Llama 3.1's rope_scaling (an original context of
# 64 puts the head's 8 frequencies in all three of its bands: kept,
# blended, divided by factor), linear scaling, Qwen2 (q/k/v biases; a
# sliding_window that use_sliding_window false turns off), Qwen3 (per-head
# q/k norms, head_dim 32 while hidden_size / heads is 16)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}
VARIANTS = {
    "llama3": dict(scaling=LLAMA3_SCALING),
    "llama-linear": dict(scaling={"type": "linear", "factor": 4.0}),
    "qwen2": dict(bias=True),
    "qwen2-tied": dict(bias=True, tied=True),
    "qwen3": dict(qknorm=True, HS=32),
    # the real vocabularies, tied as in Llama 3.2 1B and Qwen3 0.6B: ids
    # past 65,535 (4-byte token files) through vocabulary-parallel
    # cross-entropy
    "llama3-128k": dict(scaling=LLAMA3_SCALING, tied=True, vocab=128256),
    "qwen3-152k": dict(qknorm=True, HS=32, tied=True, vocab=151936),
}
for _v, _x in VARIANTS.items():
    SHAPES[_v] = dict(SHAPES["llama"], **_x)
BIG = {"gpt2": dict(vocab=50257, C=256, NH=4, L=2, Fm=1024, S=64, eps=1e-5)}


# ---- safetensors, from the format's specification ---------------------------
# 8 bytes little-endian header length N, N bytes of JSON
# {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
# then the raw little-endian row-major data.

def bf16_bits(a32):
    """float32 -> bf16 bits, round to nearest even."""
    u = a32.astype("<f4").view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return r


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view("<f4")


def stored(a32, dtype):
    """(raw bytes, the float32 values the file holds)."""
    if dtype == "F32":
        a = a32.astype("<f4")
        return a.tobytes(), a
    if dtype == "F16":
        a = a32.astype("<f2")
        return a.tobytes(), a.astype("<f4")
    b = bf16_bits(a32)
    return b.tobytes(), bf16_to_f32(b)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, raw in tensors:
            f.write(raw)


def write_model_dir(out, tensors, shards):
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        return
    per = (len(tensors) + shards - 1) // shards
    weight_map, total = {}, 0
    for s in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = tensors[s * per:(s + 1) * per]
        write_safetensors(os.path.join(out, name), part)
        for t in part:
            weight_map[t[0]] = name
            total += len(t[3])
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---- random weights under Hugging Face's names --------------------------------

def gpt2_weights(s, rng):
    """HF GPT2LMHeadModel: Conv1D weights stored [in, out], fused c_attn."""
    C, Fm, V, S = s["C"], s["Fm"], s["vocab"], s["S"]
    w = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)
    vec = lambda n, base: (base + 0.1 * (2 * rng.random(n) - 1)).astype(np.float32)
    W = {"transformer.wte.weight": w(V, C), "transformer.wpe.weight": w(S, C)}
    for l in range(s["L"]):
        p = "transformer.h.%d." % l
        W[p + "ln_1.weight"], W[p + "ln_1.bias"] = vec(C, 1.0), vec(C, 0.0)
        W[p + "attn.c_attn.weight"], W[p + "attn.c_attn.bias"] = w(C, 3 * C), vec(3 * C, 0.0)
        W[p + "attn.c_proj.weight"], W[p + "attn.c_proj.bias"] = w(C, C) / 2, vec(C, 0.0)
        W[p + "ln_2.weight"], W[p + "ln_2.bias"] = vec(C, 1.0), vec(C, 0.0)
        W[p + "mlp.c_fc.weight"], W[p + "mlp.c_fc.bias"] = w(C, Fm), vec(Fm, 0.0)
        W[p + "mlp.c_proj.weight"], W[p + "mlp.c_proj.bias"] = w(Fm, C) / 2, vec(C, 0.0)
    W["transformer.ln_f.weight"], W["transformer.ln_f.bias"] = vec(C, 1.0), vec(C, 0.0)
    return W


def head_size(s):
    return s.get("HS") or s["C"] // s["NH"]


def llama_weights(s, rng):
    """HF LlamaForCausalLM: nn.Linear [out, in], q/k rows in rotate-half order;
    Qwen2 adds q/k/v biases, Qwen3 q_norm/k_norm weights [HS]."""
    C, Fm, V, HS = s["C"], s["Fm"], s["vocab"], head_size(s)
    w = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)
    vec = lambda n: (1.0 + 0.1 * (2 * rng.random(n) - 1)).astype(np.float32)
    W = {"model.embed_tokens.weight": w(V, C)}
    for l in range(s["L"]):
        p = "model.layers.%d." % l
        W[p + "input_layernorm.weight"] = vec(C)
        W[p + "self_attn.q_proj.weight"] = w(s["NH"] * HS, C)
        W[p + "self_attn.k_proj.weight"] = w(s["NKV"] * HS, C)
        W[p + "self_attn.v_proj.weight"] = w(s["NKV"] * HS, C)
        if s.get("bias"):
            for x, n in (("q", s["NH"]), ("k", s["NKV"]), ("v", s["NKV"])):
                W[p + "self_attn.%s_proj.bias" % x] = w(n * HS)
        if s.get("qknorm"):
            W[p + "self_attn.q_norm.weight"] = (0.5 + rng.random(HS)).astype(np.float32)
            W[p + "self_attn.k_norm.weight"] = (0.5 + rng.random(HS)).astype(np.float32)
        W[p + "self_attn.o_proj.weight"] = w(C, s["NH"] * HS) / 2
        W[p + "post_attention_layernorm.weight"] = vec(C)
        W[p + "mlp.gate_proj.weight"] = w(Fm, C)
        W[p + "mlp.up_proj.weight"] = w(Fm, C)
        W[p + "mlp.down_proj.weight"] = w(C, Fm) / 2
    W["model.norm.weight"] = vec(C)
    if not s.get("tied"):  # tie_word_embeddings: the head is embed_tokens, not stored
        W["lm_head.weight"] = w(V, C)
    return W


def gpt2_config(s):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": s["vocab"],
            "n_positions": s["S"], "n_embd": s["C"], "n_layer": s["L"], "n_head": s["NH"],
            "n_inner": s["Fm"], "activation_function": "gelu_new", "layer_norm_epsilon": s["eps"],
            "tie_word_embeddings": True, "torch_dtype": "float32"}


def llama_config(s):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": s["vocab"],
         "hidden_size": s["C"], "intermediate_size": s["Fm"], "num_hidden_layers": s["L"],
         "num_attention_heads": s["NH"], "num_key_value_heads": s["NKV"], "hidden_act": "silu",
         "max_position_embeddings": s["S"], "rms_norm_eps": s["eps"], "rope_theta": s["theta"],
         "rope_scaling": s.get("scaling"), "tie_word_embeddings": bool(s.get("tied")), "attention_bias": False,
         "torch_dtype": "float32"}
    if s.get("bias"):  # Qwen2Config: no attention_bias key, the biases are the architecture's
        del c["attention_bias"]
        c.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False,
                 sliding_window=s["S"] // 2, max_window_layers=1)
    if s.get("qknorm"):
        c.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=head_size(s),
                 use_sliding_window=False, sliding_window=None)
    return c


# ---- the models, to Hugging Face's modelling conventions (float64) -----------

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def causal_attention(q, k, v):
    T, HS = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def gpt2_forward(s, W, tok):
    """modeling_gpt2: Conv1D is x @ W + b (W [in, out]); pre-LN blocks; tied head."""
    B, T = tok.shape
    C, NH = s["C"], s["NH"]
    HS = C // NH
    g = lambda n: W["transformer." + n]
    conv1d = lambda x, n: x @ g(n + ".weight") + g(n + ".bias")
    ln = lambda x, n: F.layer_norm(x, (C,), g(n + ".weight"), g(n + ".bias"), s["eps"])
    h = g("wte.weight")[tok] + g("wpe.weight")[torch.arange(T)][None]
    for l in range(s["L"]):
        p = "h.%d." % l
        q, k, v = conv1d(ln(h, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        split = lambda x: x.view(B, T, NH, HS).transpose(1, 2)
        y = causal_attention(split(q), split(k), split(v)).transpose(1, 2).reshape(B, T, C)
        h = h + conv1d(y, p + "attn.c_proj")
        h = h + conv1d(gelu_new(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(h, "ln_f") @ g("wte.weight").T


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(s, HS):
    """modeling_rope_utils: _compute_default_rope_parameters, then
    _compute_linear_scaling_rope_parameters (inv_freq / factor) or
    _compute_llama3_parameters (low frequencies / factor, high ones kept,
    the band between blended), here in float64."""
    inv_freq = 1.0 / (s["theta"] ** (torch.arange(0, HS, 2, dtype=DT) / HS))
    sc = s.get("scaling")
    if not sc:
        return inv_freq
    kind = sc.get("rope_type", sc.get("type"))
    if kind == "linear":
        return inv_freq / sc["factor"]
    assert kind == "llama3"
    factor, low, high = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    old = sc["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def swiglu_mlp(W, p, x):
    """modeling_llama's LlamaMLP: down(silu(gate(x)) * up(x)), module prefix p."""
    return F.silu(x @ W[p + "gate_proj.weight"].T) * (x @ W[p + "up_proj.weight"].T) @ W[p + "down_proj.weight"].T


def llama_forward(s, W, tok, mlp=None):
    """modeling_llama: RMSNorm, rotate-half RoPE (cos/sin of cat(freqs, freqs)),
    repeat_kv for GQA, SwiGLU MLP, untied lm_head; modeling_qwen2: q/k/v
    projections with biases; modeling_qwen3: q_norm/k_norm, RMSNorms over
    each head's head_dim, on q and k before RoPE. mlp(W, l, x): layer l's
    feed-forward of its normed input x (default: the SwiGLU MLP;
    test/ref/hf_moe_ref.py's mixtures pass theirs)."""
    B, T = tok.shape
    C, NH, NKV = s["C"], s["NH"], s["NKV"]
    HS = head_size(s)
    g = lambda n: W["model." + n]
    lin = lambda x, n: x @ g(n + ".weight").T + (g(n + ".bias") if "model." + n + ".bias" in W else 0.0)
    rms = lambda x, n: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s["eps"]) * g(n + ".weight")
    inv_freq = rope_inv_freq(s, HS)
    freqs = torch.arange(T, dtype=DT)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    h = g("embed_tokens.weight")[tok]
    for l in range(s["L"]):
        p = "layers.%d." % l
        a = rms(h, p + "input_layernorm")
        q = lin(a, p + "self_attn.q_proj").view(B, T, NH, HS)
        k = lin(a, p + "self_attn.k_proj").view(B, T, NKV, HS)
        if s.get("qknorm"):
            q, k = rms(q, p + "self_attn.q_norm"), rms(k, p + "self_attn.k_norm")
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = lin(a, p + "self_attn.v_proj").view(B, T, NKV, HS).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = NH // NKV
        k = k[:, :, None].expand(B, NKV, rep, T, HS).reshape(B, NH, T, HS)
        v = v[:, :, None].expand(B, NKV, rep, T, HS).reshape(B, NH, T, HS)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, NH * HS)
        h = h + lin(y, p + "self_attn.o_proj")
        m = rms(h, p + "post_attention_layernorm")
        h = h + (mlp(W, l, m) if mlp else swiglu_mlp(W, "model." + p + "mlp.", m))
    head = W["model.embed_tokens.weight"] if s.get("tied") else W["lm_head.weight"]
    return rms(h, "norm") @ head.T


def losses(arch, s, W32, tokens, B, T, n):
    """The loss of each microbatch i (sequences i*B .. i*B+B-1, sequence k =
    tokens[k*T : k*T+T+1]) and its logits."""
    W = {k: torch.from_numpy(v.astype(np.float64)) for k, v in W32.items()}
    fwd = gpt2_forward if arch == "gpt2" else llama_forward
    out, logits = [], []
    with torch.no_grad():
        for i in range(n):
            seq = np.stack([tokens[k * T:k * T + T + 1] for k in range(i * B, i * B + B)]).astype(np.int64)
            x, y = torch.from_numpy(seq[:, :-1]), torch.from_numpy(seq[:, 1:])
            lg = fwd(s, W, x)
            out.append(float(F.cross_entropy(lg.reshape(B * T, -1), y.reshape(-1))))
            logits.append(lg)
    return out, logits


# ---- llm.c's files -------------------------------------------------------------

def write_llmc_model(path, s, W, version):
    """llm.c gpt2 .bin: 256 int32 header [20240326, version, maxT, V, L, NH, C, Vp],
    then wte[Vp,C] wpe ln1w ln1b qkvw[L,3C,C] qkvb attprojw attprojb ln2w ln2b
    fcw fcb fcprojw fcprojb lnfw lnfb, weights [out, in] (the transpose of
    HF's Conv1D), fp32 (3) or bf16 (5)."""
    C, V, L = s["C"], s["vocab"], s["L"]
    Vp = (V + 127) // 128 * 128
    g = lambda n: W["transformer." + n]
    wte = np.zeros((Vp, C), np.float32)
    wte[:V] = g("wte.weight")
    per = lambda n, tr=False: np.stack([g("h.%d.%s" % (l, n)).T if tr else g("h.%d.%s" % (l, n)) for l in range(L)])
    parts = [wte, g("wpe.weight"), per("ln_1.weight"), per("ln_1.bias"), per("attn.c_attn.weight", True),
             per("attn.c_attn.bias"), per("attn.c_proj.weight", True), per("attn.c_proj.bias"),
             per("ln_2.weight"), per("ln_2.bias"), per("mlp.c_fc.weight", True), per("mlp.c_fc.bias"),
             per("mlp.c_proj.weight", True), per("mlp.c_proj.bias"), g("ln_f.weight"), g("ln_f.bias")]
    header = np.zeros(256, "<i4")
    header[:8] = [20240326, version, s["S"], V, L, s["NH"], C, Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for a in parts:
            a = np.ascontiguousarray(a, dtype=np.float32)
            f.write(a.astype("<f4").tobytes() if version == 3 else bf16_bits(a).tobytes())


def write_tokens(path, tokens, vocab):
    """llm.c token shard: 256 int32 [20240520, 1, count], uint16 tokens; for
    a vocabulary over 65,536 [20240801, 7, count], uint32 tokens
    (doc/data.md)."""
    wide = vocab > 65536
    header = np.zeros(256, "<i4")
    header[:3] = [20240801, 7, len(tokens)] if wide else [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u4" if wide else "<u2").tobytes())


# ---- reading an exported directory, from the specs --------------------------------

ST_NP = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b0, b1 = e["data_offsets"]
        raw = data[8 + n + b0:8 + n + b1]
        if e["dtype"] == "BF16":
            a = bf16_to_f32(np.frombuffer(raw, "<u2"))
        else:
            a = np.frombuffer(raw, ST_NP[e["dtype"]]).astype(np.float32)
        out[name] = a.reshape(e["shape"])
    return out


def read_model_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(d, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    W = {}
    for shard in sorted(set(weight_map.values())):
        part = read_safetensors(os.path.join(d, shard))
        W.update(part)
    if set(W) != set(weight_map):
        raise SystemExit("%s: the index and the shards name different tensors" % d)
    return W


def shapes_of_config(cfg):
    if cfg["architectures"] == ["GPT2LMHeadModel"]:
        return "gpt2", dict(vocab=cfg["vocab_size"], C=cfg["n_embd"], NH=cfg["n_head"], L=cfg["n_layer"],
                            Fm=cfg["n_inner"], S=cfg["n_positions"], eps=cfg["layer_norm_epsilon"])
    s = dict(vocab=cfg["vocab_size"], C=cfg["hidden_size"], NH=cfg["num_attention_heads"],
             NKV=cfg["num_key_value_heads"], L=cfg["num_hidden_layers"], Fm=cfg["intermediate_size"],
             S=cfg["max_position_embeddings"], eps=cfg["rms_norm_eps"], theta=cfg["rope_theta"],
             HS=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
             bias=cfg["architectures"] == ["Qwen2ForCausalLM"], qknorm=cfg["architectures"] == ["Qwen3ForCausalLM"],
             tied=bool(cfg.get("tie_word_embeddings")))
    for k, v in (cfg.get("rope_scaling") or {}).items():  # the scaling's keys, type named either way
        s["rope_" + ("type" if k == "rope_type" else k)] = v
    return "llama", s


def scaling_of_shapes(s):
    """shapes_of_config's rope_* keys back as a rope_scaling dict (or None)."""
    sc = {k[5:]: v for k, v in s.items() if k.startswith("rope_")}
    if "type" in sc:
        sc["rope_type"] = sc.pop("type")
    return sc or None


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:1024], "<i4")
    return np.frombuffer(data[1024:], "<u4" if header[0] == 20240801 else "<u2")[:header[2]].astype(np.int64)


def cmd_exported(a):
    with open(os.path.join(a.dir, "config.json")) as f:
        arch, s = shapes_of_config(json.load(f))
    with open(os.path.join(a.refdir, "config.json")) as f:
        ref_arch, ref_s = shapes_of_config(json.load(f))
    for k in set(ref_s) | set(s):  # eps, theta and the scaling's factors pass through float32 in dtrain
        same = k in s and k in ref_s and (s[k] == ref_s[k] if isinstance(ref_s[k], (str, bool))
                                          else math.isclose(s[k], ref_s[k], rel_tol=1e-6))
        if arch != ref_arch or not same:
            print("FAIL %s: config.json %s %s = %r, the original's %s %r" % (a.dir, arch, k, s.get(k), ref_arch, ref_s[k]))
            return 1
    W = read_model_dir(a.dir)
    with open(os.path.join(a.refdir, "ref.json")) as f:
        ref = json.load(f)
    ref_s["scaling"] = scaling_of_shapes(ref_s)
    ls, _ = losses(arch, ref_s, W, read_tokens(a.tokens), ref["B"], ref["T"], ref["batches"])
    loss = sum(ls) / len(ls)
    rel = abs(loss - ref["loss"]) / abs(ref["loss"])
    ok = rel <= a.tol
    print("%s %s: %d tensors read from the spec, loss %.9g, the original's %.9g, |diff|/|ref| %.3e (tol %.0e)"
          % ("ok  " if ok else "FAIL", a.label or a.dir, len(W), loss, ref["loss"], rel, a.tol))
    return 0 if ok else 1


# ---- commands --------------------------------------------------------------------

def rope_to_interleaved(w, HS):
    """q/k rows in dtrain's interleaved order: row h*HS + 2i + j <- h*HS + j*HS/2 + i."""
    out = np.empty_like(w)
    for h in range(w.shape[0] // HS):
        for i in range(HS // 2):
            for j in range(2):
                out[h * HS + 2 * i + j] = w[h * HS + j * HS // 2 + i]
    return out


def cmd_write(a):
    s = dict((BIG if a.big else SHAPES)[a.arch])
    rng = np.random.default_rng(a.seed)
    W = gpt2_weights(s, rng) if a.arch == "gpt2" else llama_weights(s, rng)
    fam = "gpt2" if a.arch == "gpt2" else "llama"
    os.makedirs(a.out, exist_ok=True)
    dtype = {"f32": "F32", "bf16": "BF16", "f16": "F16"}[a.dtype]
    tensors, held = [], {}
    for name, val in W.items():
        raw, back = stored(val, dtype)
        held[name] = back.reshape(val.shape)
        file_val = held[name]
        if a.mutate == "transpose" and name.endswith("attn.c_proj.weight"):
            file_val = file_val.T.copy()
        if a.mutate == "rope" and (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
            file_val = rope_to_interleaved(file_val, head_size(s))
        if file_val is not held[name]:
            raw = stored(file_val, dtype)[0]
        if (a.mutate == "noqknorm" and (name.endswith("q_norm.weight") or name.endswith("k_norm.weight"))) or \
                (a.mutate == "nobias" and name.endswith("_proj.bias")):
            continue
        plain = a.gpt2_plain_names and name.startswith("transformer.")
        tensors.append((name[len("transformer."):] if plain else name, dtype, val.shape, raw))
    if a.tied_head and a.arch == "gpt2":
        tensors.append(("lm_head.weight", dtype, W["transformer.wte.weight"].shape,
                        stored(W["transformer.wte.weight"], dtype)[0]))
    write_model_dir(a.out, tensors, a.shards)
    cfg = gpt2_config(s) if fam == "gpt2" else llama_config(s)
    if a.mutate == "noscaling":
        cfg["rope_scaling"] = None
    if a.mutate in ("noqknorm", "nobias"):  # a plain Llama of the same shapes, head_dim kept
        for k in ("use_sliding_window", "sliding_window", "max_window_layers"):
            cfg.pop(k, None)
        cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if a.llmc:
        write_llmc_model(a.llmc, s, held, a.llmc_version)
    if not a.tokens:
        return 0
    rng_t = np.random.default_rng(a.seed + 1)
    tokens = rng_t.integers(0, s["vocab"], a.batches * a.B * a.T + 1)
    write_tokens(a.tokens, tokens, s["vocab"])
    if a.llmc and a.llmc_version == 5:  # the reference of what the llm.c file holds
        held = {k: bf16_to_f32(bf16_bits(v)).reshape(v.shape) for k, v in held.items()}
    ls, logits = losses(fam, s, held, tokens, a.B, a.T, a.batches)
    ref = {"arch": a.arch, "dtype": a.dtype, "losses": ls, "loss": sum(ls) / len(ls),
           "B": a.B, "T": a.T, "batches": a.batches, "torch": torch.__version__}
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    np.save(os.path.join(a.out, "ref_logits.npy"), torch.cat(logits).numpy())
    print("%.9g" % ref["loss"])
    return 0


def cmd_check(a):
    with open(os.path.join(a.dir, "ref.json")) as f:
        ref = json.load(f)["loss"]
    rel = abs(a.loss - ref) / abs(ref)
    ok = rel <= a.tol
    print("%s %s: dtrain %.9g, torch (HF conventions) %.9g, |diff|/|ref| %.3e (tol %.0e)"
          % ("ok  " if ok else "FAIL", a.label or a.dir, a.loss, ref, rel, a.tol))
    return 0 if ok else 1


def cmd_bad(a):
    """One defect per directory; the rest is a valid small model."""
    arch = "llama" if a.kind in ("rope_scaling", "tied_llama", "bias") else "gpt2"
    s = SHAPES[arch]
    rng = np.random.default_rng(7)
    W = gpt2_weights(s, rng) if arch == "gpt2" else llama_weights(s, rng)
    cfg = gpt2_config(s) if arch == "gpt2" else llama_config(s)
    dtype = "F32"
    if a.kind == "arch":
        cfg["architectures"] = ["FalconForCausalLM"]
    elif a.kind == "rope_scaling":  # dtrain has llama3 and linear, not dynamic NTK
        cfg["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    elif a.kind == "tied_llama":
        cfg["tie_word_embeddings"] = True
    elif a.kind == "bias":
        cfg["attention_bias"] = True
    elif a.kind == "missing":
        del W["transformer.h.1.mlp.c_fc.bias"]
    elif a.kind == "extra":
        W["transformer.h.1.attn.rotary.weight"] = np.zeros(4, np.float32)
    elif a.kind == "shape":
        W["transformer.h.0.attn.c_attn.weight"] = W["transformer.h.0.attn.c_attn.weight"].T.copy()
    elif a.kind == "dtype":
        dtype = "F64"
    os.makedirs(a.out, exist_ok=True)
    tensors = []
    for name, val in W.items():
        if dtype == "F64" and name.endswith("ln_f.bias"):
            tensors.append((name, "F64", val.shape, val.astype("<f8").tobytes()))
        else:
            tensors.append((name, "F32", val.shape, val.astype("<f4").tobytes()))
    write_model_dir(a.out, tensors, 1)
    if a.kind == "header":  # data_offsets past the end of the file
        path = os.path.join(a.out, "model.safetensors")
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        h = json.loads(data[8:8 + n])
        h["transformer.ln_f.bias"]["data_offsets"] = [o + 4096 for o in h["transformer.ln_f.bias"]["data_offsets"]]
        hb = json.dumps(h).encode()
        hb += b" " * (-len(hb) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + data[8 + n:])
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--arch", choices=["gpt2", "llama"] + list(VARIANTS), required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32")
    w.add_argument("--shards", type=int, default=1)
    w.add_argument("--mutate", choices=("transpose", "rope", "noscaling", "noqknorm", "nobias"))
    w.add_argument("--llmc")
    w.add_argument("--llmc-version", type=int, choices=(3, 5), default=3)
    w.add_argument("--tokens")
    w.add_argument("--seed", type=int, default=1234)
    w.add_argument("--B", type=int, default=2)
    w.add_argument("--T", type=int, default=16)
    w.add_argument("--batches", type=int, default=4)
    w.add_argument("--big", action="store_true", help="GPT-2 with a 50257-row embedding (memory test)")
    w.add_argument("--tied-head", action="store_true", help="GPT-2: also store lm_head.weight (= wte)")
    w.add_argument("--gpt2-plain-names", action="store_true", help="GPT-2 names without 'transformer.'")
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("loss", type=float)
    c.add_argument("--tol", type=float, default=1e-5)
    c.add_argument("--label")
    e = sub.add_parser("exported")
    e.add_argument("dir")
    e.add_argument("refdir")
    e.add_argument("tokens")
    e.add_argument("--tol", type=float, default=1e-6)
    e.add_argument("--label")
    b = sub.add_parser("bad")
    b.add_argument("kind", choices=("arch", "rope_scaling", "tied_llama", "bias", "missing", "extra", "shape",
                                    "dtype", "header"))
    b.add_argument("--out", required=True)
    a = ap.parse_args()
    return {"write": cmd_write, "check": cmd_check, "exported": cmd_exported, "bad": cmd_bad}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
