#!/usr/bin/python3
"""An independent reader of Megatron-LM indexed datasets (PREFIX.bin +
PREFIX.idx, "MMIDIDX" version 1), written from the format description with
numpy, to check what dtrain writes. It shares no code with io/megatron.c.

.idx, little-endian, packed:
    9 bytes magic b"MMIDIDX\\x00\\x00", uint64 version (1), uint8 dtype code,
    uint64 N (sequences), uint64 M (documents + 1),
    int32 lengths[N], int64 pointers[N] (byte offsets into .bin),
    int64 document_indices[M], and for multimodal datasets int8 modes[N].
.bin: the sequences' tokens concatenated, no header.
Document d = sequences document_indices[d] .. document_indices[d+1]-1.

Library:
    ds = MegatronDataset(prefix)   # validates; raises ValueError
    ds.documents()                 # list of numpy arrays, one per document
CLI (run with Debian's /usr/bin/python3, which has python3-numpy):
    megatron_reader.py PREFIX          summary + sha256 of each document
    megatron_reader.py --json PREFIX   one JSON list of ids per document
Exit 0 when the dataset is valid, 1 with one line on stderr otherwise.
The sha256 is over the document's tokens as little-endian int64 (float64
for the float dtypes), so it does not depend on the dtype of the file.
"""
import hashlib
import json
import os
import struct
import sys

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")  # 34 bytes
DTYPES = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32,
    5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16,
}


def prefix_of(path):
    """PREFIX, PREFIX.idx and PREFIX.bin all name the same dataset."""
    for suffix in (".idx", ".bin"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


class MegatronDataset:
    def __init__(self, path):
        prefix = prefix_of(path)
        self.idx_path = prefix + ".idx"
        self.bin_path = prefix + ".bin"
        with open(self.idx_path, "rb") as f:
            idx = f.read()
        self._parse_idx(idx)
        self.tokens = np.fromfile(self.bin_path, dtype=np.uint8)
        self._check_bin()

    def _fail(self, what):
        raise ValueError(f"{self.idx_path}: {what}")

    def _parse_idx(self, idx):
        if len(idx) < HEADER.size:
            self._fail(f"{len(idx)} bytes, shorter than the header")
        magic, version, code, n, m = HEADER.unpack_from(idx, 0)
        if magic != MAGIC:
            self._fail(f"bad magic {magic!r}")
        if version != 1:
            self._fail(f"version {version}, expected 1")
        if code not in DTYPES:
            self._fail(f"unknown dtype code {code}")
        self.dtype = np.dtype(DTYPES[code]).newbyteorder("<")
        # Python integers do not overflow: compare the exact sizes.
        need = HEADER.size + 12 * n + 8 * m
        if m < 1 or len(idx) not in (need, need + n):
            self._fail(f"{len(idx)} bytes, but N={n} M={m} need {need}"
                       f" (or {need + n} with modes)")
        off = HEADER.size
        self.lengths = np.frombuffer(idx, "<i4", n, off)
        self.pointers = np.frombuffer(idx, "<i8", n, off + 4 * n)
        self.doc_idx = np.frombuffer(idx, "<i8", m, off + 12 * n)
        self.modes = (np.frombuffer(idx, "<i1", n, need)
                      if len(idx) == need + n and n > 0 else None)
        if (self.lengths < 0).any():
            self._fail("negative sequence length")
        nbytes = self.lengths.astype(np.int64) * self.dtype.itemsize
        expect = np.concatenate(([0], np.cumsum(nbytes)))
        if not np.array_equal(self.pointers, expect[:-1]):
            self._fail("pointers are not the running sum of the lengths")
        self.bin_bytes = int(expect[-1])
        d = self.doc_idx
        if d[0] != 0 or d[-1] != n or (np.diff(d) < 0).any():
            self._fail("document indices do not run from 0 up to N")

    def _check_bin(self):
        if self.tokens.size != self.bin_bytes:
            raise ValueError(f"{self.bin_path}: {self.tokens.size} bytes, "
                             f"the index describes {self.bin_bytes}")
        self.tokens = self.tokens.view(self.dtype)

    def sequence(self, i):
        start = int(self.pointers[i]) // self.dtype.itemsize
        return self.tokens[start:start + int(self.lengths[i])]

    def document(self, d):
        """Tokens of document d: its sequences, concatenated."""
        a, b = int(self.doc_idx[d]), int(self.doc_idx[d + 1])
        if a == b:
            return self.tokens[:0]
        start = int(self.pointers[a]) // self.dtype.itemsize
        end = (int(self.pointers[b - 1]) // self.dtype.itemsize
               + int(self.lengths[b - 1]))
        return self.tokens[start:end]

    def documents(self):
        return [self.document(d) for d in range(len(self.doc_idx) - 1)]


def doc_sha256(tokens):
    wide = np.float64 if tokens.dtype.kind == "f" else np.int64
    return hashlib.sha256(tokens.astype("<" + np.dtype(wide).str[1:])
                          .tobytes()).hexdigest()


def main(argv):
    as_json = len(argv) == 3 and argv[1] == "--json"
    if not (as_json or len(argv) == 2) or argv[-1].startswith("-"):
        print("usage: megatron_reader.py [--json] PREFIX", file=sys.stderr)
        return 2
    try:
        ds = MegatronDataset(argv[-1])
    except (OSError, ValueError) as e:
        print(f"megatron_reader: {e}", file=sys.stderr)
        return 1
    docs = ds.documents()
    out = sys.stdout
    if as_json:
        for doc in docs:
            out.write(json.dumps(doc.tolist()) + "\n")
        return 0
    out.write(f"{prefix_of(argv[-1])}: {len(ds.lengths)} sequences, "
              f"{len(docs)} documents, {ds.bin_bytes // ds.dtype.itemsize} "
              f"tokens of {ds.dtype.name}"
              f"{', multimodal modes' if ds.modes is not None else ''}\n")
    for d, doc in enumerate(docs):
        out.write(f"{d} {doc.size} {doc_sha256(doc)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
