#!/usr/bin/python3
"""Multiple-choice scores of a dtrain checkpoint or --save-params file in
PyTorch (float64), to check dtrain's --eval-mc example by example.

The eval file is read here from its specification (llm.c's
dev/data/data_common.py write_evalfile: a 256 x int32 header, magic
20240522, version 1 = uint16 words, 2 = uint32; per example START,
EXAMPLE_BYTES, EXAMPLE_INDEX, LABEL, NUM_COMPLETIONS, CTX_LEN + context,
then per completion LEN + tokens), not with dtrain's reader. Each
completion is scored as lm-evaluation-harness and llm.c do: the row is
(context + completion)[-(T+1):], the inputs its first tokens, the targets
the next ones, and the score the cross-entropy of the completion's own
tokens, summed and averaged per token. The model is torch_ref.py's
float64 forward of the file's float32 tensors.

    /usr/bin/python3 test/ref/mc_ref.py --params FILE --mc EVALFILE --seq-len T [--dump DUMP --step S]

Prints one line per example (example, label, sums); with --dump (dtrain's
--eval-mc-dump JSON lines) compares the records of step S of that file's
name: every sum and mean within 1e-5 relative, and the picks (lowest sum,
lowest mean) equal wherever the two best scores differ by more than that.
Exit 0 when all agree, 1 when not, 2 on unusable input.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (the float64 model)

TOL = 1e-5


def read_evalfile(path):
    """[(label, ctx, [completion, ...]), ...] from the format's spec."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n, longest = struct.unpack_from("<4i", data, 0)
    if magic != 20240522 or version not in (1, 2):
        raise ValueError("%s: magic %d version %d" % (path, magic, version))
    w = 2 if version == 1 else 4
    words = np.frombuffer(data, dtype="<u2" if w == 2 else "<u4", offset=1024).astype(np.int64)
    start = 0xFFFF if w == 2 else 0xFFFFFFFF
    out, at = [], 0
    for e in range(n):
        assert words[at] == start, "example %d: no start marker" % e
        nbytes, _index, label, ncomp = (int(x) for x in words[at + 1:at + 5])
        end = at + nbytes // w
        at += 5
        k = int(words[at])
        ctx = words[at + 1:at + 1 + k]
        at += 1 + k
        comps = []
        for _ in range(ncomp):
            k = int(words[at])
            comps.append(words[at + 1:at + 1 + k])
            at += 1 + k
        assert at == end, "example %d: its size field disagrees" % e
        out.append((label, ctx, comps))
    return out


def load_params(path):
    import h5py

    with h5py.File(path, "r") as f:
        attrs = dict(f.attrs)
        cfg = {k: attrs[k] for k in torch_ref.MODEL_ATTRS}
        cfg["arch"] = str(cfg["arch"])
        for k in torch_ref.MODEL_ATTRS[1:8]:
            cfg[k] = int(cfg[k])
        cfg["norm_eps"] = float(np.float32(cfg["norm_eps"]))
        cfg["rope_theta"] = float(np.float32(cfg["rope_theta"]))
        P = {}
        f["params"].visititems(lambda n, o: P.__setitem__(n, torch.from_numpy(o[()].astype(np.float64)))
                               if isinstance(o, h5py.Dataset) else None)
    return cfg, P


def score(cfg, P, ctx, comp, T):
    """(sum, mean) of the completion's token losses after its context."""
    full = np.concatenate([ctx, comp])[-(T + 1):]
    n_in = len(full) - 1
    tok = full[:-1]
    tgt = full[1:].copy()
    tgt[:n_in - len(comp)] = -1  # only the completion's tokens count
    c = dict(cfg, B=1, T=n_in)
    _, logits = torch_ref.forward(c, P, tok, tgt)
    t = torch.from_numpy(tgt.astype(np.int64))
    losses = F.cross_entropy(logits, t.clamp(min=0), reduction="none")
    s = float(losses[t >= 0].sum())
    return s, s / len(comp)


def argmin(xs):
    return min(range(len(xs)), key=lambda i: (xs[i], i))


def compare(ref, dump, name, step):
    got = {}
    with open(dump) as f:
        for line in f:
            r = json.loads(line)
            if r["file"] == name and r["step"] == step:
                got[r["example"]] = r
    bad = 0
    if len(got) != len(ref):
        print("FAIL %s step %d: %d examples in the dump, %d in the file" % (name, step, len(got), len(ref)))
        return 1
    worst = 0.0
    for e, (label, sums, means) in enumerate(ref):
        r = got[e]
        for key, mine in (("sum", sums), ("mean", means)):
            for a, b in zip(r[key], mine):
                worst = max(worst, abs(a - b) / abs(b))
        for key, mine in (("pred_sum", sums), ("pred_mean", means)):
            order = sorted(mine)
            clear = len(order) < 2 or (order[1] - order[0]) > TOL * abs(order[0])
            if clear and r[key] != argmin(mine):
                print("FAIL %s example %d: %s %d, torch %d" % (name, e, key, r[key], argmin(mine)))
                bad += 1
        if r["label"] != label:
            print("FAIL %s example %d: label %d, file %d" % (name, e, r["label"], label))
            bad += 1
    ok = worst <= TOL and bad == 0
    print("%-4s %s step %d: %d examples, worst |dtrain - torch| / |torch| %.3e (tol %.0e), picks %s"
          % ("ok" if ok else "FAIL", name, step, len(ref), worst, TOL, "equal" if bad == 0 else "differ"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", required=True)
    ap.add_argument("--mc", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--dump")
    ap.add_argument("--step", type=int)
    a = ap.parse_args()
    try:
        cfg, P = load_params(a.params)
        examples = read_evalfile(a.mc)
    except (OSError, KeyError, ValueError, AssertionError) as e:
        print("mc_ref: %s" % e, file=sys.stderr)
        return 2
    ref = []
    with torch.no_grad():
        for label, ctx, comps in examples:
            sm = [score(cfg, P, ctx, c, a.seq_len) for c in comps]
            ref.append((label, [s for s, _ in sm], [m for _, m in sm]))
    acc = sum(argmin(s) == l for l, s, _ in ref) / len(ref)
    acc_norm = sum(argmin(m) == l for l, _, m in ref) / len(ref)
    print("mc_ref: %s on %s: %d examples, acc %.6f, acc_norm %.6f (float64, torch %s)"
          % (a.params, a.mc, len(ref), acc, acc_norm, torch.__version__))
    if not a.dump:
        return 0
    name = os.path.splitext(os.path.basename(a.mc))[0]
    return compare(ref, a.dump, name, a.step)


if __name__ == "__main__":
    sys.exit(main())
