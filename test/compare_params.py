"""Final parameters of two runs, as written by dtrain --save-params.

usage: compare_params.py A.h5 B.h5 TOL    (TOL 0: bit-identical, every tensor)
Prints the worst tensor's relative difference, ||a-b|| / ||a|| (2-norms
over its elements), and exits 1 when it is not below TOL or the files do not hold the
same tensors with the same shapes. Run with Debian's /usr/bin/python3.

The key bias (attn.bk) is listed but not compared: its exact gradient is
zero (q.(k+b) shifts every score of a query by the same q.b, which the
softmax ignores), so what AdamW does to it is driven by rounding noise
(values ~1e-6, sign arbitrary) and differs between any two reduction
orders.
"""
import sys

import h5py
import numpy as np


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f["params"].visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def main():
    a, b, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
    if sorted(a) != sorted(b):
        print("different tensors: %s" % sorted(set(a) ^ set(b)))
        return 1
    worst, where, skipped = 0.0, "", 0
    for name in sorted(a):
        if a[name].shape != b[name].shape:
            print("%s: shape %s vs %s" % (name, a[name].shape, b[name].shape))
            return 1
        if name.endswith("attn.bk") and tol > 0:
            skipped += 1
            continue
        x = a[name].astype(np.float64)
        scale = float(np.linalg.norm(x))
        d = float(np.linalg.norm(x - b[name])) / (scale if scale > 0 else 1.0)
        if not d <= worst:  # NaN propagates
            worst, where = d, name
    print("%d tensors (%d zero-gradient key biases not compared), worst relative difference %.2e (%s)"
          % (len(a), skipped, worst, where or "-"))
    return 0 if worst < tol or (tol == 0 and worst == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
