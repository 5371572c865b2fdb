#!/usr/bin/python3
"""Float64 log-probabilities of token sequences under a dtrain checkpoint
or --save-params file, to check dtrain-serve's echo with logprobs.

The model is torch_ref.py's float64 forward of the file's float32
tensors, read as mc_ref.py reads them (h5py, not dtrain's reader); each
sequence is one row, its own length.

    /usr/bin/python3 test/ref/serve_ref.py --params FILE --seqs SEQS.json --out REF.json

SEQS.json: a list of token-id lists. REF.json: one record per sequence,
each a list over positions j (j = 0 is null: no token before it) of
[log p(s[j] | s[:j]), the most likely id there, its log p, the second
one's log p]. Exit 0, or 2 on unusable input.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mc_ref  # noqa: E402  (load_params: the file's model and tensors)
import torch_ref  # noqa: E402  (the float64 model)


def positions(cfg, P, seq):
    n = len(seq)
    tok = np.asarray(seq[:-1], dtype=np.int64)
    tgt = np.asarray(seq[1:], dtype=np.int64)
    _, logits = torch_ref.forward(dict(cfg, B=1, T=n - 1), P, tok, tgt)
    logp = F.log_softmax(logits, dim=-1)
    best = torch.topk(logp, 2, dim=-1)
    out = [None]
    for j in range(1, n):
        row = j - 1
        out.append([float(logp[row, seq[j]]), int(best.indices[row, 0]), float(best.values[row, 0]),
                    float(best.values[row, 1])])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", required=True)
    ap.add_argument("--seqs", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        cfg, P = mc_ref.load_params(a.params)
        with open(a.seqs) as f:
            seqs = json.load(f)
    except (OSError, KeyError, ValueError) as e:
        print("serve_ref: %s" % e, file=sys.stderr)
        return 2
    with torch.no_grad():
        ref = [positions(cfg, P, s) for s in seqs]
    with open(a.out, "w") as f:
        json.dump(ref, f)
    print("serve_ref: %d sequences, %d positions (float64, torch %s)"
          % (len(ref), sum(len(r) - 1 for r in ref), torch.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
