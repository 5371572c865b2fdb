#!/usr/bin/python3
"""Hugging Face mixture-of-experts model directories for dtrain --init-from,
and the loss a float64 PyTorch model written to transformers'
modeling_mixtral / modeling_qwen2_moe conventions computes on them. The
attention, norms and RoPE are test/ref/hf_ref.py's Llama (Mixtral is
Mistral's attention, Qwen2-MoE Qwen2's with q/k/v biases); the feed-forward
is written here from the Hugging Face models, not from dtrain's code:

  MixtralSparseMoeBlock: router_logits = x @ gate.weight^T;
    routing_weights = softmax(router_logits) over all experts, top-k of
    them, divided by their sum (always renormalised); each expert
    w2(silu(w1 x) * w3 x); the output sum_j weight_j expert_j(x).
  Qwen2MoeSparseMoeBlock: the same routing (renormalised only with
    norm_topk_prob), experts down_proj(silu(gate_proj x) * up_proj x),
    plus sigmoid(x @ shared_expert_gate.weight^T) * shared_expert(x).
    Layer l is a MoE layer when l is not in mlp_only_layers and
    (l + 1) % decoder_sparse_step == 0; the others are Qwen2MoeMLP of
    intermediate_size.

    hf_moe_ref.py write --arch mixtral|qwen2moe --out DIR [--tokens FILE]
                        [--mutate swap13|swapgateup|expertperm|normtopk]
                        [--seed S]

writes DIR/config.json, DIR/model.safetensors (the safetensors writer of
hf_ref.py, from the format's spec) of random weights, DIR/ref.json (the
loss of --batches x --B sequences of --T + 1 random tokens of FILE, as
hf_ref.py's, so `hf_ref.py check` reads it) and prints the loss.
--mutate writes the file as a converter with a bug would read it, ref.json
keeping the right model's loss: swap13 (Mixtral) stores each expert's w1
under w3's name and w3 under w1's, swapgateup (Qwen2-MoE) does the same with
gate_proj and up_proj, expertperm swaps experts 0 and 1 of every layer
(router rows unchanged), normtopk flips config.json's norm_topk_prob.

    hf_moe_ref.py exported DIR REFDIR TOKENS [--tol 1e-6]

reads an exported directory (dreshard --to-hf): its config.json gives the
model (architecture, experts, layers that are MoE), its tensors the
weights; the loss of TOKENS must equal REFDIR's reference within --tol.

    hf_moe_ref.py same-tensors A B

every tensor of A is in B with the same shape and values, and B has no
other (the import -> export round trip).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_ref  # noqa: E402  (the safetensors files and the Llama attention)

DT = torch.float64

# small shapes tp 2 divides, GQA, a vocabulary that is not a multiple of 128
SHAPES = {
    # every layer a MoE layer: 4 experts of width 48, top-2
    "mixtral": dict(vocab=300, C=64, NH=4, NKV=2, L=2, Fm=48, S=64, eps=1e-5, theta=1e6, E=4, K=2),
    # decoder_sparse_step 2: layers 1 and 3 MoE, 0 and 2 dense of width 96;
    # 4 experts of width 32, top-2 not renormalised, shared expert 48
    "qwen2moe": dict(vocab=300, C=64, NH=4, NKV=2, L=4, Fm=96, S=64, eps=1e-6, theta=1e6, E=4, K=2, Fe=32, Fs=48,
                     step=2, only=[], norm=False, bias=True),
}


def moe_layers(s, arch):
    """The MoE layers: every one of Mixtral's; Qwen2-MoE's by its rule."""
    if arch == "mixtral":
        return list(range(s["L"]))
    return [l for l in range(s["L"]) if l not in s["only"] and (l + 1) % s["step"] == 0]


def names(arch, l):
    """(router, expert name pattern with {x} and {p}, projections (gate, up, down))."""
    if arch == "mixtral":
        p = "model.layers.%d.block_sparse_moe." % l
        return p + "gate.weight", p + "experts.{x}.{p}.weight", ("w1", "w3", "w2")
    p = "model.layers.%d.mlp." % l
    return p + "gate.weight", p + "experts.{x}.{p}.weight", ("gate_proj", "up_proj", "down_proj")


def weights(arch, s, rng):
    """Random weights under Hugging Face's names: Llama's attention (Qwen2-MoE
    with q/k/v biases) and dense MLPs, and each MoE layer's router and experts
    (and Qwen2-MoE's shared expert and its gate)."""
    C, E = s["C"], s["E"]
    w = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)
    base = dict(s, Fm=s["Fm"])
    W = hf_ref.llama_weights(base, rng)
    for l in moe_layers(s, arch):
        for k in ("gate_proj", "up_proj", "down_proj"):
            del W["model.layers.%d.mlp.%s.weight" % (l, k)]
        router, pat, (g, u, d) = names(arch, l)
        Fe = s["Fm"] if arch == "mixtral" else s["Fe"]
        W[router] = w(E, C)
        for x in range(E):
            W[pat.format(x=x, p=g)] = w(Fe, C)
            W[pat.format(x=x, p=u)] = w(Fe, C)
            W[pat.format(x=x, p=d)] = w(C, Fe) / 2
        if arch == "qwen2moe":
            p = "model.layers.%d.mlp." % l
            W[p + "shared_expert.gate_proj.weight"] = w(s["Fs"], C)
            W[p + "shared_expert.up_proj.weight"] = w(s["Fs"], C)
            W[p + "shared_expert.down_proj.weight"] = w(C, s["Fs"]) / 2
            W[p + "shared_expert_gate.weight"] = w(1, C)
    return W


def config(arch, s):
    c = hf_ref.llama_config(s)
    for k in ("attention_bias", "use_sliding_window", "sliding_window", "max_window_layers"):
        c.pop(k, None)
    c.update(num_experts_per_tok=s["K"], router_aux_loss_coef=0.001, output_router_logits=False)
    if arch == "mixtral":
        c.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=s["E"],
                 router_jitter_noise=0.0, sliding_window=None)
    else:
        c.update(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=s["E"],
                 moe_intermediate_size=s["Fe"], shared_expert_intermediate_size=s["Fs"],
                 norm_topk_prob=s["norm"], decoder_sparse_step=s["step"], mlp_only_layers=s["only"],
                 use_sliding_window=False, sliding_window=32, max_window_layers=2)
    return c


def shapes_of_config(cfg):
    """(arch, shapes) of a Mixtral or Qwen2-MoE config.json."""
    arch = {"MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2moe"}[cfg["architectures"][0]]
    s = dict(vocab=cfg["vocab_size"], C=cfg["hidden_size"], NH=cfg["num_attention_heads"],
             NKV=cfg["num_key_value_heads"], L=cfg["num_hidden_layers"], Fm=cfg["intermediate_size"],
             S=cfg["max_position_embeddings"], eps=cfg["rms_norm_eps"], theta=cfg["rope_theta"],
             K=cfg["num_experts_per_tok"], tied=bool(cfg.get("tie_word_embeddings")))
    if arch == "mixtral":
        s.update(E=cfg["num_local_experts"])
    else:
        s.update(E=cfg["num_experts"], Fe=cfg["moe_intermediate_size"], Fs=cfg["shared_expert_intermediate_size"],
                 step=cfg.get("decoder_sparse_step", 1), only=cfg.get("mlp_only_layers") or [],
                 norm=bool(cfg.get("norm_topk_prob")), bias=True)
    return arch, s


def sparse_moe(arch, s, W, l, x):
    """The MoE block of layer l on x [B, T, C] (see the module docstring)."""
    B, T, C = x.shape
    router, pat, (g, u, d) = names(arch, l)
    h = x.reshape(-1, C)
    probs = torch.softmax(h @ W[router].T, dim=-1)
    top_w, top_i = torch.topk(probs, s["K"], dim=-1)
    if arch == "mixtral" or s["norm"]:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for x_ in range(s["E"]):
        tok, slot = torch.where(top_i == x_)
        if len(tok) == 0:
            continue
        y = F.silu(h[tok] @ W[pat.format(x=x_, p=g)].T) * (h[tok] @ W[pat.format(x=x_, p=u)].T)
        out.index_add_(0, tok, top_w[tok, slot, None] * (y @ W[pat.format(x=x_, p=d)].T))
    if arch == "qwen2moe":
        p = "model.layers.%d.mlp." % l
        shared = hf_ref.swiglu_mlp(W, p + "shared_expert.", h)
        out = out + torch.sigmoid(h @ W[p + "shared_expert_gate.weight"].T) * shared
    return out.reshape(B, T, C)


def forward(arch, s):
    moe = set(moe_layers(s, arch))

    def mlp(W, l, x):
        return sparse_moe(arch, s, W, l, x) if l in moe else hf_ref.swiglu_mlp(W, "model.layers.%d.mlp." % l, x)
    return lambda s_, W, tok: hf_ref.llama_forward(s_, W, tok, mlp)


def losses(arch, s, W32, tokens, B, T, n):
    W = {k: torch.from_numpy(v.astype(np.float64)) for k, v in W32.items()}
    fwd = forward(arch, s)
    out = []
    with torch.no_grad():
        for i in range(n):
            seq = np.stack([tokens[k * T:k * T + T + 1] for k in range(i * B, i * B + B)]).astype(np.int64)
            x, y = torch.from_numpy(seq[:, :-1]), torch.from_numpy(seq[:, 1:])
            lg = fwd(s, W, x)
            out.append(float(F.cross_entropy(lg.reshape(B * T, -1), y.reshape(-1))))
    return out


def cmd_write(a):
    s = dict(SHAPES[a.arch])
    rng = np.random.default_rng(a.seed)
    W = weights(a.arch, s, rng)
    cfg = config(a.arch, s)
    stored = dict(W)
    if a.mutate in ("swap13", "swapgateup"):
        for l in moe_layers(s, a.arch):
            _, pat, (g, u, _) = names(a.arch, l)
            for x in range(s["E"]):
                kg, ku = pat.format(x=x, p=g), pat.format(x=x, p=u)
                stored[kg], stored[ku] = W[ku], W[kg]
    elif a.mutate == "expertperm":
        for l in moe_layers(s, a.arch):
            _, pat, projs = names(a.arch, l)
            for p in projs:
                k0, k1 = pat.format(x=0, p=p), pat.format(x=1, p=p)
                stored[k0], stored[k1] = W[k1], W[k0]
    elif a.mutate == "normtopk":
        cfg["norm_topk_prob"] = not s["norm"]
    os.makedirs(a.out, exist_ok=True)
    hf_ref.write_model_dir(a.out, [(k, "F32", v.shape, v.astype("<f4").tobytes()) for k, v in stored.items()], 1)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if not a.tokens:
        return 0
    tokens = np.random.default_rng(a.seed + 1).integers(0, s["vocab"], a.batches * a.B * a.T + 1)
    hf_ref.write_tokens(a.tokens, tokens, s["vocab"])
    ls = losses(a.arch, s, W, tokens, a.B, a.T, a.batches)
    ref = {"arch": a.arch, "losses": ls, "loss": sum(ls) / len(ls), "B": a.B, "T": a.T, "batches": a.batches,
           "torch": torch.__version__}
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("%.9g" % ref["loss"])
    return 0


def cmd_exported(a):
    with open(os.path.join(a.dir, "config.json")) as f:
        arch, s = shapes_of_config(json.load(f))
    with open(os.path.join(a.refdir, "config.json")) as f:
        ref_arch, ref_s = shapes_of_config(json.load(f))
    if arch != ref_arch or moe_layers(s, arch) != moe_layers(ref_s, ref_arch):
        print("FAIL %s: %s with MoE layers %s, the original %s with %s"
              % (a.dir, arch, moe_layers(s, arch), ref_arch, moe_layers(ref_s, ref_arch)))
        return 1
    W = hf_ref.read_model_dir(a.dir)
    with open(os.path.join(a.refdir, "ref.json")) as f:
        ref = json.load(f)
    ls = losses(arch, s, W, hf_ref.read_tokens(a.tokens), ref["B"], ref["T"], ref["batches"])
    loss = sum(ls) / len(ls)
    rel = abs(loss - ref["loss"]) / abs(ref["loss"])
    ok = rel <= a.tol
    print("%s %s: %s, MoE layers %s, %d tensors read from the spec, loss %.9g, the original's %.9g, "
          "|diff|/|ref| %.3e (tol %.0e)" % ("ok  " if ok else "FAIL", a.label or a.dir, arch, moe_layers(s, arch),
                                            len(W), loss, ref["loss"], rel, a.tol))
    return 0 if ok else 1


def cmd_same_tensors(a):
    A, B = hf_ref.read_model_dir(a.a), hf_ref.read_model_dir(a.b)
    bad = sorted(set(A) ^ set(B))
    bad += [k for k in sorted(set(A) & set(B)) if A[k].shape != B[k].shape or not np.array_equal(A[k], B[k])]
    if bad:
        print("FAIL %d tensors differ or are missing, first %s" % (len(bad), bad[:3]))
        return 1
    n = sum(v.size for v in A.values())
    print("%d tensors (%d values) equal bit for bit" % (len(A), n))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--arch", choices=list(SHAPES), required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--tokens")
    w.add_argument("--mutate", choices=("swap13", "swapgateup", "expertperm", "normtopk"))
    w.add_argument("--seed", type=int, default=1234)
    w.add_argument("--B", type=int, default=2)
    w.add_argument("--T", type=int, default=16)
    w.add_argument("--batches", type=int, default=4)
    e = sub.add_parser("exported")
    e.add_argument("dir")
    e.add_argument("refdir")
    e.add_argument("tokens")
    e.add_argument("--tol", type=float, default=1e-6)
    e.add_argument("--label")
    t = sub.add_parser("same-tensors")
    t.add_argument("a")
    t.add_argument("b")
    a = ap.parse_args()
    return {"write": cmd_write, "exported": cmd_exported, "same-tensors": cmd_same_tensors}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
