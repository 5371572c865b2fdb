#!/usr/bin/python3
"""An independent writer of Megatron-LM indexed datasets (PREFIX.bin +
PREFIX.idx, "MMIDIDX" version 1), following megatron/core/datasets/
indexed_dataset.py (_IndexWriter): it shares no code with io/megatron.c.
Test data for dtrain's reader (test/test_blend.sh).

.idx, little-endian, packed: b"MMIDIDX\\x00\\x00", <Q version 1, <B dtype
code, <Q sequence count N, <Q document count M, <i4 lengths[N],
<i8 pointers[N] (byte offsets into .bin), <i8 document_indices[M]
(0, ..., N), and with --modes an int8 modes[N] (multimodal).

    megatron_writer.py [options] PREFIX
      --from SHARD          tokens of an llm.c shard (1024-byte header, then
                            uint16 or uint32 tokens by the magic)
      --tokens 1,2,3        or these tokens
      --first N             only the first N tokens
      --skip N              without the first N tokens
      --dtype NAME          uint8 int8 int16 int32 int64 float32 float64 uint16
      --split-at ID         a document starts at each token ID (GPT-2's
                            <|endoftext|>); default: documents of --doc-len
      --doc-len N           document length without --split-at (default 100)
      --sentences K         each document as K sequences (Megatron's
                            sentence splitting): the documents stay the same
      --modes               append a modes array (a multimodal index)
"""
import argparse
import struct

import numpy as np

CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def read_shard(path):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack_from("<iii", raw, 0)
    dt = {20240520: "<u2", 20240801: "<u4"}[magic]
    return np.frombuffer(raw, dt, n, 1024).astype(np.int64)


def documents(tok, split_at, doc_len):
    if split_at is None:
        return [tok[i:i + doc_len] for i in range(0, len(tok), doc_len)]
    starts = [0] + [i for i in np.flatnonzero(tok == split_at).tolist() if i > 0] + [len(tok)]
    return [tok[a:b] for a, b in zip(starts, starts[1:]) if b > a]


def write(prefix, docs, dtype, sentences, modes):
    dt = np.dtype(dtype).newbyteorder("<")
    seqs, doc_idx = [], [0]
    for d in docs:
        cuts = np.array_split(np.arange(len(d)), min(sentences, len(d)))
        seqs += [d[c[0]:c[-1] + 1] for c in cuts if len(c)]
        doc_idx.append(len(seqs))
    lengths = np.array([len(s) for s in seqs], "<i4")
    pointers = np.zeros(len(seqs), "<i8")
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * dt.itemsize)
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(np.asarray(s).astype(dt).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(seqs)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.array(doc_idx, "<i8").tobytes())
        if modes:
            f.write(np.zeros(len(seqs), np.int8).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--from", dest="src")
    ap.add_argument("--tokens")
    ap.add_argument("--first", type=int)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--dtype", default="uint16", choices=sorted(CODES))
    ap.add_argument("--split-at", type=int)
    ap.add_argument("--doc-len", type=int, default=100)
    ap.add_argument("--sentences", type=int, default=1)
    ap.add_argument("--modes", action="store_true")
    a = ap.parse_args()
    tok = read_shard(a.src) if a.src else np.array([int(x) for x in a.tokens.split(",")], np.int64)
    if a.first:
        tok = tok[:a.first]
    tok = tok[a.skip:]
    write(a.prefix, documents(tok, a.split_at, a.doc_len), a.dtype, a.sentences, a.modes)


if __name__ == "__main__":
    main()
