#!/usr/bin/python3
"""Hugging Face transformers on a model dtrain exported (dreshard --to-hf).

    hf_logits.py DIR TOKENS DTRAIN_LOSS [--B 2 --T 16 --batches 4] [--tol 1e-5] [--label L]

loads DIR with transformers' AutoModelForCausalLM.from_pretrained (float64,
on the CPU: the reference, not the thing measured), computes the loss of
the validation microbatches dtrain's val_loss averages (microbatch i holds
sequences i*B .. i*B+B-1, sequence k = TOKENS[k*T : k*T+T+1], as
doc/format.md specifies), and checks

  - |DTRAIN_LOSS - transformers' loss| / transformers' loss <= --tol;
  - transformers' logits against test/ref/hf_ref.py's own forward (written
    to Hugging Face's conventions without transformers) on the weights that
    hf_ref.py's safetensors reader reads in DIR: max |difference| under
    1e-4. Both run in float64, but transformers 5.17's Llama builds its RoPE
    frequencies and cos/sin tables in float32 (8.7e-6 on the H200 run of
    2026-11-26; GPT-2, without RoPE, 1.3e-14).

Prints one line, "ok ..." or "FAIL ...", and exits 0 or 1.
"""

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # one line out, not a progress bar
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
for cand in (os.path.join(here, "..", "ref"), os.path.join(here, "..", "..", "test", "ref")):
    if os.path.exists(os.path.join(cand, "hf_ref.py")):
        sys.path.insert(0, cand)
        break
import hf_ref  # noqa: E402

from transformers import AutoModelForCausalLM  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("tokens")
    p.add_argument("loss", type=float)
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--T", type=int, default=16)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--label")
    a = p.parse_args()

    import json
    with open(os.path.join(a.dir, "config.json")) as f:
        arch, s = hf_ref.shapes_of_config(json.load(f))
    s["scaling"] = hf_ref.scaling_of_shapes(s)  # Llama 3.1's or linear rope_scaling, as hf_ref's forward takes it
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float64).eval()
    tokens = hf_ref.read_tokens(a.tokens)
    W = hf_ref.read_model_dir(a.dir)
    if arch == "gpt2" and "lm_head.weight" not in W:
        W["lm_head.weight"] = W["transformer.wte.weight"]
    ref_losses, ref_logits = hf_ref.losses(arch, s, W, tokens, a.B, a.T, a.batches)
    hf_losses, worst = [], 0.0
    with torch.no_grad():
        for i in range(a.batches):
            seq = np.stack([tokens[k * a.T:k * a.T + a.T + 1] for k in range(i * a.B, i * a.B + a.B)])
            x = torch.from_numpy(seq[:, :-1].astype(np.int64))
            y = torch.from_numpy(seq[:, 1:].astype(np.int64))
            lg = model(input_ids=x).logits
            hf_losses.append(float(F.cross_entropy(lg.reshape(a.B * a.T, -1), y.reshape(-1))))
            worst = max(worst, float((lg - ref_logits[i]).abs().max()))
    hf_loss = sum(hf_losses) / len(hf_losses)
    rel = abs(a.loss - hf_loss) / abs(hf_loss)
    ok = rel <= a.tol and worst < 1e-4
    print("%s %s: transformers %s (%s) loss %.9g, dtrain %.9g, |diff|/|ref| %.3e (tol %.0e); "
          "max |logit diff| transformers vs hf_ref.py %.2e"
          % ("ok  " if ok else "FAIL", a.label or a.dir, __import__("transformers").__version__,
             type(model).__name__, hf_loss, a.loss, rel, a.tol, worst))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
