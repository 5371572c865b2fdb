"""Two checkpoints hold bit-identical tensors.

usage: same_ckpt.py A.h5 B.h5 MIN    (Debian's /usr/bin/python3, h5py)
Prints "N datasets (groups), K differ[: the first three]" and exits 1
when a dataset of A differs from B's or A holds fewer than MIN datasets
(a checkpoint that lost its tensors must not pass as identical).
"""
import sys

import h5py
import numpy as np

a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
least = int(sys.argv[3])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
bad = [n for n in names if not np.array_equal(a[n][()], b[n][()])]
groups = sorted({n.split("/")[0] + ("/" + n.split("/")[1] if n.startswith("optim") else "") for n in names})
print("%d datasets (%s), %d differ%s" % (len(names), ", ".join(groups), len(bad),
                                         (": " + ", ".join(bad[:3])) if bad else ""))
sys.exit(1 if bad or len(names) < least else 0)
