#!/usr/bin/env python3
"""Independent reader and writer of safetensors and llm.c model files, for
test_safetensors.sh. Written from the formats' specifications, not from
io/safetensors.c or io/llmc_model.c:

safetensors (github.com/huggingface/safetensors, "Format"): 8 bytes N
(unsigned little-endian), N bytes of JSON {name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data
region of raw little-endian row-major elements; offsets are relative to
the data region. A sharded model adds model.safetensors.index.json
{"metadata": {"total_size"}, "weight_map": {name: file}}.

llm.c (train_gpt2.py write_model): 256 int32 [20240326, version (3 fp32 /
5 bf16), maxT, V, L, NH, C, Vp, 0...], then wte[Vp,C] wpe[maxT,C] and the
per-layer tensors stacked over L, then lnfw[C] lnfb[C].

Subcommands (see test_safetensors.sh): gen, verify, write, compare, mutate,
llmc-gen, llmc-verify, llmc-write, llmc-mutate; same-tensors (see
test_init_from.sh: two model directories hold the same tensors, byte for
byte, whatever their sharding).
"""
import json
import os
import struct
import sys

import numpy as np

rng = np.random.default_rng(19)

ITEM = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
        "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1}
NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
      "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "u1", "F8_E4M3": "u1"}


def bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even, by integer arithmetic on
    the fp32 bits (NaN not expected here)."""
    u = np.asarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    low = u & 0xFFFF
    hi = u >> 16
    up = (low > 0x8000) | ((low == 0x8000) & ((hi & 1) == 1))
    return (hi + up.astype(np.uint64)).astype(np.uint16)


def bf16_to_f32(b):
    return (np.asarray(b, dtype=np.uint32) << 16).view("<f4")


def to_f32(raw, dtype):
    """Raw little-endian bytes of dtype -> float32 array."""
    if dtype == "BF16":
        return bf16_to_f32(np.frombuffer(raw, dtype="<u2"))
    return np.frombuffer(raw, dtype=NP[dtype]).astype(np.float32)


def die(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- reader

def read_header(path):
    """(header dict, data region bytes, N) of one safetensors file, checked
    against the specification."""
    b = open(path, "rb").read()
    if len(b) < 8:
        die(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack_from("<Q", b, 0)
    if 8 + n > len(b):
        die(f"{path}: header length {n} past the end")
    raw = b[8:8 + n]
    if raw[:1] != b"{":
        die(f"{path}: header does not start with '{{'")
    hdr = json.loads(raw.decode("utf-8"))
    data = b[8 + n:]
    spans = []
    for name, e in hdr.items():
        if name == "__metadata__":
            if not all(isinstance(v, str) for v in e.values()):
                die(f"{path}: metadata not str -> str")
            continue
        b0, e0 = e["data_offsets"]
        numel = int(np.prod(e["shape"], dtype=np.int64)) if e["shape"] else 1
        if e0 - b0 != numel * ITEM[e["dtype"]]:
            die(f"{path}: {name}: offsets do not match shape")
        spans.append((b0, e0, name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            die(f"{path}: {an} overlaps {bn}")
    if spans and spans[-1][1] > len(data):
        die(f"{path}: data past the end")
    return hdr, data, n, spans


def tensor(hdr, data, name):
    e = hdr[name]
    b0, e0 = e["data_offsets"]
    return to_f32(data[b0:e0], e["dtype"]).reshape(e["shape"]), e


# ---------------------------------------------------------------- writer test

def cmd_gen(src):
    """Tensors for dtrain's writer: shapes, dtypes and fp32 values with the
    rounding cases (bf16 and fp16 ties, fp16 subnormals and overflow)."""
    os.makedirs(src, exist_ok=True)
    man = [("wte", "F32", [37, 8]), ("h.0.attn.w", "BF16", [9, 16]),
           ("h.0.attn.b", "BF16", [16]), ("h.0.mlp.w", "F16", [5, 7]),
           ("ln_f.weight", "F32", [8]), ("ties.bf16", "BF16", [2, 32]),
           ("edge.f16", "F16", [40]), ("lm_head", "BF16", [11, 8])]
    out = []
    for i, (name, dt, shape) in enumerate(man):
        v = (rng.standard_normal(shape) * 3).astype(np.float32)
        if name == "ties.bf16":  # exact bf16 ties, both parities, both signs
            hi = rng.integers(0x3000, 0x4700, size=v.size).astype(np.uint32)
            u = (hi << 16) | 0x8000
            u[::3] |= 0x80000000
            u[1::4] += 1          # just above a tie
            u[2::5] -= 2          # just below a tie
            v = u.view("<f4").reshape(shape)
        if name == "edge.f16":
            v = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65504, 65519, 65520, 1e6,
                          -7e4, 2**-25, 3 * 2**-25, 2**-24 * 0.75, 2**-14 - 2**-26,
                          6e-8, -6e-8, 1e-10, 0.0, -0.0, np.inf, -np.inf] +
                         list(rng.standard_normal(22) * 10.0 ** rng.integers(-7, 5, 22)),
                         dtype=np.float32)
        v.astype("<f4").tofile(os.path.join(src, f"{i}.f32"))
        out.append({"name": name, "dtype": dt, "shape": shape})
    json.dump(out, open(os.path.join(src, "manifest.json"), "w"))


def expected_bits(v, dt):
    if dt == "F32":
        return v.astype("<f4").view("<u4")
    if dt == "BF16":
        return bf16_bits(v)
    return v.astype("<f2").view("<u2")  # numpy: round to nearest even


def check_shard_layout(path, hdr, n, spans, data_len):
    """What dtrain's writer promises beyond the spec: header padded with
    spaces to 8, tensors back to back from 0, nothing after them."""
    raw = open(path, "rb").read(8 + n)[8:]
    if n % 8 or raw.rstrip(b" ") != raw.rstrip(b" \t\r\n") or not raw.rstrip(b" ").endswith(b"}"):
        die(f"{path}: header of {n} bytes not padded with spaces to a multiple of 8")
    pos = 0
    for b0, e0, name in spans:
        if b0 != pos:
            die(f"{path}: {name} starts at {b0}, not {pos}")
        pos = e0
    if pos != data_len:
        die(f"{path}: {data_len - pos} bytes after the last tensor")
    if hdr.get("__metadata__", {}).get("format") != "pt":
        die(f"{path}: no __metadata__ format pt")


def cmd_verify(out, src, max_shard):
    man = json.load(open(os.path.join(src, "manifest.json")))
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    idx_path = os.path.join(out, "model.safetensors.index.json")
    if len(files) == 1:
        if files != ["model.safetensors"] or os.path.exists(idx_path):
            die(f"one shard must be model.safetensors without an index: {files}")
        where = {m["name"]: files[0] for m in man}
    else:
        want = [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
        if files != want:
            die(f"shard names {files}, wanted {want}")
        idx = json.load(open(idx_path))
        where = idx["weight_map"]
        total = sum(int(np.prod(m["shape"])) * ITEM[m["dtype"]] for m in man)
        if idx["metadata"]["total_size"] != total:
            die(f"index total_size {idx['metadata']['total_size']}, wanted {total}")
    if sorted(where) != sorted(m["name"] for m in man):
        die("weight_map names differ from the tensors written")
    shards = {}
    for f in files:
        p = os.path.join(out, f)
        hdr, data, n, spans = read_header(p)
        check_shard_layout(p, hdr, n, spans, len(data))
        if len(spans) > 1 and len(data) > max_shard:
            die(f"{f}: {len(data)} bytes of tensors past the {max_shard}-byte limit")
        shards[f] = (hdr, data)
    nel = 0
    for i, m in enumerate(man):
        hdr, data = shards[where[m["name"]]]
        e = hdr[m["name"]]
        if e["dtype"] != m["dtype"] or e["shape"] != m["shape"]:
            die(f"{m['name']}: {e['dtype']} {e['shape']}, wanted {m['dtype']} {m['shape']}")
        v = np.fromfile(os.path.join(src, f"{i}.f32"), dtype="<f4").reshape(m["shape"])
        b0, e0 = e["data_offsets"]
        got = np.frombuffer(data[b0:e0], dtype="<u4" if m["dtype"] == "F32" else "<u2")
        want = expected_bits(v, m["dtype"]).reshape(-1)
        bad = np.flatnonzero(got != want)
        if bad.size:
            k = bad[0]
            die(f"{m['name']}: {bad.size} of {v.size} elements differ, first [{k}] "
                f"{v.reshape(-1)[k]!r}: got {got[k]:#x}, wanted {want[k]:#x}")
        nel += v.size
    torch_check(shards, where, man)
    print(f"{len(files)} shard(s), {len(man)} tensors, {nel} elements bit-exact")


def torch_check(shards, where, man):
    """PyTorch's own bf16/fp16 storage reads the same values (when there)."""
    try:
        import torch
    except ImportError:
        return
    tdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    for m in man:
        hdr, data = shards[where[m["name"]]]
        b0, e0 = hdr[m["name"]]["data_offsets"]
        t = torch.frombuffer(bytearray(data[b0:e0]), dtype=tdt[m["dtype"]]).float().numpy()
        mine = to_f32(data[b0:e0], m["dtype"])
        if not np.array_equal(t, mine, equal_nan=True):
            die(f"{m['name']}: torch reads different values")


# ---------------------------------------------------------------- reader test

def write_file(path, tensors, metadata=None, order=None, pad=True):
    """tensors: list of (name, dtype, array of that dtype's numpy type);
    data in list order, header entries in `order` (names) if given."""
    hdr, blobs, pos = {}, [], 0
    if metadata is not None:
        hdr["__metadata__"] = metadata
    ents = {}
    for name, dt, a in tensors:
        raw = np.ascontiguousarray(a).astype(NP[dt] if dt != "BF16" else "<u2").tobytes()
        ents[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    for name in order or list(ents):
        hdr[name] = ents[name]
    js = json.dumps(hdr).encode()
    if pad:
        js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs))


def model_tensors():
    """name -> (dtype, stored array, its float32 values)."""
    t = {}
    for name, dt, shape in [("a.f32", "F32", [13, 21]), ("b.f16", "F16", [17, 6]),
                            ("c.bf16", "BF16", [9, 33]), ("d.f64", "F64", [7, 5]),
                            ("e.vec", "BF16", [40]), ("f.f32vec", "F32", [3]),
                            ("g.one", "F16", [1, 1])]:
        v = (rng.standard_normal(shape) * 2).astype(np.float32)
        if dt == "BF16":
            s = bf16_bits(v)
            t[name] = (dt, s, bf16_to_f32(s).reshape(shape))
        elif dt == "F16":
            s = v.astype("<f2")
            t[name] = (dt, s, s.astype(np.float32))
        elif dt == "F64":
            s = rng.standard_normal(shape)
            t[name] = (dt, s, s.astype(np.float32))
        else:
            t[name] = (dt, v, v)
    # every 16-bit pattern, NaNs and subnormals included (the SIMD
    # conversions' groups with and without a NaN), read bit for bit
    h = np.arange(65536, dtype=np.uint32)
    t["h.f16all"] = ("F16", h.astype("<u2").view("<f2").reshape(256, 256),
                     f16_bits_to_f32(h).reshape(256, 256))
    t["i.bf16all"] = ("BF16", h.astype("<u2").reshape(256, 256), (h << 16).view("<f4").reshape(256, 256))
    return t


def f16_bits_to_f32(h):
    """IEEE binary16 bit patterns -> their exact binary32 values, from
    the formats' definitions (a NaN keeps its payload and quiet bit)."""
    sign, e, m = (h & 0x8000) << 16, (h >> 10) & 0x1F, h & 0x3FF
    normal = sign | ((e + 112) << 23) | (m << 13)
    special = sign | 0x7F800000 | (m << 13)
    sub = (m.astype(np.float32) * np.float32(2.0**-24)).view("<u4") | sign
    return np.where(e == 0, sub, np.where(e == 31, special, normal)).astype(np.uint32).view("<f4")


def cmd_write(d, mode):
    """A model directory by this writer, plus requests and expected blocks."""
    os.makedirs(d, exist_ok=True)
    t = model_tensors()
    names = list(t)
    other = [("z.i64", "I64", np.arange(6, dtype="<i8").reshape(2, 3)),
             ("z.f8", "F8_E4M3", np.arange(4, dtype="u1"))]
    if mode == "single":
        write_file(os.path.join(d, "model.safetensors"),
                   [(n, t[n][0], t[n][1]) for n in names] + other,
                   {"format": "pt"}, order=sorted(names + ["z.i64", "z.f8"], reverse=True))
    else:
        parts = [names[:3], names[3:5], names[5:]]
        wm = {}
        for k, part in enumerate(parts):
            fn = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
            extra = other if k == 2 else []
            write_file(os.path.join(d, fn), [(n, t[n][0], t[n][1]) for n in part] + extra,
                       {"format": "pt"} if k != 1 else None, pad=(k != 2))
            for n in part + [o[0] for o in extra]:
                wm[n] = fn
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm},
                  open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)
    reqs, exp = [], []
    for name in names:
        v = t[name][2]
        v2 = v.reshape(1, -1) if v.ndim == 1 else v
        for _ in range(12):
            tr = int(rng.integers(0, 2))
            m = v2.T if tr else v2
            r0 = int(rng.integers(0, m.shape[0]))
            nr = int(rng.integers(1, m.shape[0] - r0 + 1))
            c0 = int(rng.integers(0, m.shape[1]))
            nc = int(rng.integers(1, m.shape[1] - c0 + 1))
            reqs.append(f"{name} {r0} {nr} {c0} {nc} {tr}")
            exp.append(np.ascontiguousarray(m[r0:r0 + nr, c0:c0 + nc]).astype("<f4"))
        m = v2  # and the whole tensor both ways
        reqs.append(f"{name} 0 {m.shape[0]} 0 {m.shape[1]} 0")
        exp.append(m.astype("<f4"))
        reqs.append(f"{name} 0 {m.shape[1]} 0 {m.shape[0]} 1")
        exp.append(np.ascontiguousarray(m.T).astype("<f4"))
    open(os.path.join(d, "req.txt"), "w").write("\n".join(reqs) + "\n")
    np.concatenate([e.reshape(-1) for e in exp]).tofile(os.path.join(d, "expected.f32"))
    print(f"{len(reqs)} blocks")


def cmd_compare(a, b):
    x, y = np.fromfile(a, dtype="<u4"), np.fromfile(b, dtype="<u4")
    if x.size != y.size:
        die(f"{x.size} values, wanted {y.size}")
    bad = np.flatnonzero(x != y)
    if bad.size:
        die(f"{bad.size} of {x.size} values differ, first at {bad[0]}: "
            f"{x[bad[0]:bad[0] + 1].view('<f4')[0]} vs {y[bad[0]:bad[0] + 1].view('<f4')[0]}")
    print(f"{x.size} values bit-identical")


def cmd_mutate(path, kind):
    """One malformed file per validation rule."""
    good = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}
    data = bytes(range(32))
    h, raw, n_override = json.loads(json.dumps(good)), None, None
    if kind == "short": open(path, "wb").write(b"\x10\0\0"); return
    elif kind == "past-end": n_override = 10**6
    elif kind == "huge": n_override = 1 << 40
    elif kind == "not-json": raw = b"{\"a\": [1, 2,}"
    elif kind == "trailing": raw = json.dumps(good).encode() + b" x"
    elif kind == "not-object": raw = b"[1, 2, 3]"
    elif kind == "meta-object": h["__metadata__"] = [1]
    elif kind == "meta-value": h["__metadata__"] = {"format": "pt", "n": 3}
    elif kind == "entry": h["b"] = 7
    elif kind == "no-dtype": del h["b"]["dtype"]
    elif kind == "dtype": h["b"]["dtype"] = "Q4_K"
    elif kind == "shape-neg": h["b"]["shape"] = [-4]
    elif kind == "shape-float": h["a"]["shape"] = [2, 3.0]
    elif kind == "dims": h["b"]["shape"] = [1] * 8 + [4]
    elif kind == "offsets-3": h["b"]["data_offsets"] = [24, 28, 32]
    elif kind == "size": h["b"]["data_offsets"] = [24, 30]
    elif kind == "reversed": h["b"]["data_offsets"] = [32, 24]
    elif kind == "past-data": h["b"]["data_offsets"] = [28, 36]
    elif kind == "overflow": h["b"]["shape"] = [1 << 62, 1 << 62]; h["b"]["data_offsets"] = [24, 24]
    elif kind == "overlap": h["b"]["data_offsets"] = [16, 24]
    elif kind == "newline-name": h["x\ny"] = {"dtype": "F99", "shape": [], "data_offsets": [0, 0]}
    elif kind == "duplicate":
        js = json.dumps(good)
        raw = (js[:-1] + ', "a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}').encode()
    elif kind == "truncated": data = data[:30]
    else: die("unknown mutation " + kind)
    if raw is None:
        raw = json.dumps(h).encode()
    raw += b" " * (-len(raw) % 8)
    n = len(raw) if n_override is None else n_override
    open(path, "wb").write(struct.pack("<Q", n) + raw + data)


# ---------------------------------------------------------------- llm.c

LLMC_SHAPES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def llmc_shapes(c):
    """[layers, rows, cols] of each tensor in file order."""
    V, T, L, C = c["Vp"], c["maxT"], c["L"], c["C"]
    return [(1, V, C), (1, T, C), (L, 1, C), (L, 1, C), (L, 3 * C, C), (L, 1, 3 * C),
            (L, C, C), (L, 1, C), (L, 1, C), (L, 1, C), (L, 4 * C, C), (L, 1, 4 * C),
            (L, C, 4 * C), (L, 1, C), (1, 1, C), (1, 1, C)]


LLMC_CONF = {"maxT": 16, "V": 50, "Vp": 64, "L": 2, "NH": 2, "C": 8}


def llmc_values(c):
    vals = {}
    for name, s in zip(LLMC_SHAPES, llmc_shapes(c)):
        v = rng.standard_normal(s).astype(np.float32)
        if name == "wte":
            v[:, c["V"]:, :] = 0  # llm.c pads the vocabulary with zero rows
        vals[name] = v
    return vals


def cmd_llmc_gen(src, version):
    os.makedirs(src, exist_ok=True)
    c = dict(LLMC_CONF, version=int(version))
    json.dump(c, open(os.path.join(src, "llmc.json"), "w"))
    for name, v in llmc_values(c).items():
        v.tofile(os.path.join(src, name + ".f32"))


def llmc_read(path):
    b = open(path, "rb").read()
    h = struct.unpack_from("<256i", b, 0)
    if h[0] != 20240326 or h[1] not in (3, 5):
        die(f"{path}: magic/version {h[0]} {h[1]}")
    c = {"version": h[1], "maxT": h[2], "V": h[3], "L": h[4], "NH": h[5], "C": h[6], "Vp": h[7]}
    item = 4 if h[1] == 3 else 2
    pos, out = 1024, {}
    for name, s in zip(LLMC_SHAPES, llmc_shapes(c)):
        n = s[0] * s[1] * s[2] * item
        out[name] = np.frombuffer(b[pos:pos + n], dtype="<u4" if item == 4 else "<u2").reshape(s)
        pos += n
    if pos != len(b):
        die(f"{path}: {len(b)} bytes, layout needs {pos}")
    return c, out


def cmd_llmc_verify(path, src):
    want_c = json.load(open(os.path.join(src, "llmc.json")))
    c, t = llmc_read(path)
    if c != want_c:
        die(f"header {c}, wanted {want_c}")
    for name in LLMC_SHAPES:
        v = np.fromfile(os.path.join(src, name + ".f32"), dtype="<f4").reshape(t[name].shape)
        want = v.view("<u4") if c["version"] == 3 else bf16_bits(v)
        if not np.array_equal(t[name], want):
            die(f"{name}: {np.count_nonzero(t[name] != want)} elements differ")
    print(f"llm.c version {c['version']}: 16 tensors bit-exact")


def cmd_llmc_write(path, version):
    """An llm.c file by this writer, plus requests (id layer r0 nr c0 nc)."""
    c = dict(LLMC_CONF, version=int(version))
    vals = llmc_values(c)
    h = [20240326, c["version"], c["maxT"], c["V"], c["L"], c["NH"], c["C"], c["Vp"]] + [0] * 248
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *h))
        for name in LLMC_SHAPES:
            v = vals[name]
            if c["version"] == 5:
                s = bf16_bits(v)
                vals[name] = bf16_to_f32(s).reshape(v.shape)
                f.write(s.astype("<u2").tobytes())
            else:
                f.write(v.astype("<f4").tobytes())
    reqs, exp = [], []
    for i, (name, s) in enumerate(zip(LLMC_SHAPES, llmc_shapes(c))):
        for _ in range(4):
            layer = int(rng.integers(0, s[0]))
            r0 = int(rng.integers(0, s[1]))
            nr = int(rng.integers(1, s[1] - r0 + 1))
            c0 = int(rng.integers(0, s[2]))
            nc = int(rng.integers(1, s[2] - c0 + 1))
            reqs.append(f"{i} {layer} {r0} {nr} {c0} {nc}")
            exp.append(vals[name][layer, r0:r0 + nr, c0:c0 + nc].reshape(-1))
    open(path + ".req", "w").write("\n".join(reqs) + "\n")
    np.concatenate(exp).astype("<f4").tofile(path + ".expected")
    print(f"{len(reqs)} blocks")


def dir_tensors(d):
    """name -> (dtype, shape, raw bytes) of a model directory (one file or
    shards with model.safetensors.index.json, which must name exactly the
    tensors the shards hold)."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        wm = json.load(open(index))["weight_map"]
        files = sorted(set(wm.values()))
    else:
        wm, files = None, ["model.safetensors"]
    out = {}
    for fname in files:
        hdr, data, _, _ = read_header(os.path.join(d, fname))
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            if name in out or (wm is not None and wm.get(name) != fname):
                die(f"{d}: tensor {name} in {fname} is not where the index says or is there twice")
            b0, e0 = e["data_offsets"]
            out[name] = (e["dtype"], tuple(e["shape"]), data[b0:e0])
    if wm is not None and set(wm) != set(out):
        die(f"{d}: the index names {len(wm)} tensors, the shards hold {len(out)}")
    return out


def cmd_same_tensors(a, b):
    x, y = dir_tensors(a), dir_tensors(b)
    if set(x) != set(y):
        die(f"tensor names differ: only in {a}: {sorted(set(x) - set(y))[:3]}, only in {b}: {sorted(set(y) - set(x))[:3]}")
    nbytes = 0
    for name in sorted(x):
        if x[name][:2] != y[name][:2]:
            die(f"{name}: {x[name][0]} {list(x[name][1])} vs {y[name][0]} {list(y[name][1])}")
        if x[name][2] != y[name][2]:
            i = next(k for k in range(len(x[name][2])) if x[name][2][k] != y[name][2][k])
            die(f"{name}: bytes differ from byte {i} of {len(x[name][2])}")
        nbytes += len(x[name][2])
    print(f"{len(x)} tensors, {nbytes} bytes identical")


def cmd_llmc_mutate(src, dst, kind):
    b = bytearray(open(src, "rb").read())
    def put(i, v): struct.pack_into("<i", b, 4 * i, v)
    if kind == "magic": put(0, 20240520)
    elif kind == "version": put(1, 4)
    elif kind == "short": b = b[:-1]
    elif kind == "long": b += b"\0\0"
    elif kind == "header": b = b[:1000]
    elif kind == "heads": put(5, 3)
    elif kind == "vocab": put(3, 65)
    elif kind == "layers0": put(4, 0)
    elif kind == "overflow": put(4, 2**31 - 1); put(6, 2**31 - 2); put(5, 1)
    elif kind == "bf16-as-f32": put(1, 3)
    else: die("unknown mutation " + kind)
    open(dst, "wb").write(b)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"gen": lambda: cmd_gen(*args),
     "verify": lambda: cmd_verify(args[0], args[1], int(args[2])),
     "write": lambda: cmd_write(*args),
     "compare": lambda: cmd_compare(*args),
     "mutate": lambda: cmd_mutate(*args),
     "llmc-gen": lambda: cmd_llmc_gen(*args),
     "llmc-verify": lambda: cmd_llmc_verify(*args),
     "llmc-write": lambda: cmd_llmc_write(*args),
     "llmc-mutate": lambda: cmd_llmc_mutate(*args),
     "same-tensors": lambda: cmd_same_tensors(*args)}[cmd]()
