#!/bin/sh
# dreshard (src/dreshard.c):
#  - a tp2 x pp2 checkpoint resharded to tp4 on 1, 2 and 3 ranks: every
#    tensor bit-identical to the input's, the attributes carried over with
#    layout "tp 4 pp 1 dp 1 zero 0", the chunks and checksum records exactly those
#    dtrain itself writes at tp4, every checksum verifying (dreshard --info,
#    and h5py recomputing the parameters' CRC-32C);
#  - resharded back to tp2 x pp2: the checksum records equal the original's;
#  - dtrain --tp 4 --resume of the resharded file continues with losses and
#    a step-20 checkpoint bit-identical to --resume of the original;
#  - --params-only: params/* only, content params, read by h5py;
#  - --info: the attributes, tensor count and verdict;
#  - bad input: one line and exit 2 (exit 1 for a failed write), no output
#    left behind.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
: "${DRESHARD:=$top_builddir/src/dreshard}"
ARGS="$(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 --global-batch 8 --seq-len 64 \
      --val-every 20 --val-batches 4 --sample-tokens 0"
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }
dreshard() { # NP ARGS...
    np=$1
    shift
    "$MPIEXEC" --quiet -np "$np" "$DRESHARD" "$@"
}

"$MPIEXEC" --quiet -np 4 "$DTRAIN" $ARGS --tp 2 --pp 2 --ckpt-dir "$TMP/ck" --stop-at-step 10 >"$TMP/train.log" 2>&1 ||
    { fail "making the tp2 pp2 checkpoint: $(tail -n 3 "$TMP/train.log")"; finish; }
A="$TMP/ck/step_00000010.h5"

# ---- tp2 pp2 -> tp4 on 1, 2, 3 ranks ----
for np in 1 2 3; do
    if dreshard $np --in "$A" --out "$TMP/b$np.h5" --tp 4 >"$TMP/b$np.log" 2>&1 &&
        grep -q "on $np rank" "$TMP/b$np.log"; then
        pass "np $np: $(cat "$TMP/b$np.log")"
    else
        fail "np $np: $(cat "$TMP/b$np.log")"
    fi
done

# ---- the resharded file continues training exactly like the original ----
run4() { # OUT FILE
    "$MPIEXEC" --quiet -np 4 "$DTRAIN" $ARGS --tp 4 --resume "$2" --ckpt-dir "$1" --metrics "$1.json" >"$1.log" 2>&1 ||
        fail "dtrain --tp 4 --resume $2: $(tail -n 3 "$1.log")"
}
run4 "$TMP/ra" "$A"
run4 "$TMP/rb" "$TMP/b2.h5"
losses "$TMP/ra.json" >"$TMP/la"
losses "$TMP/rb.json" >"$TMP/lb"
if [ "$(wc -l <"$TMP/la")" -eq 10 ] && cmp -s "$TMP/la" "$TMP/lb"; then
    pass "dtrain --tp 4 --resume: 10 losses bit-identical from the resharded and the original file" \
        "(step 20 loss $(tail -n 1 "$TMP/lb" | cut -d' ' -f2))"
else
    fail "resumed losses differ: $(diff "$TMP/la" "$TMP/lb" | head -n 4)"
fi

# ---- tensors, attributes, chunks and records ----
dreshard 2 --in "$TMP/b3.h5" --out "$TMP/c.h5" --tp 2 --pp 2 >"$TMP/c.log" 2>&1 || fail "tp4 -> tp2 pp2: $(cat "$TMP/c.log")"
"$PY" - "$A" "$TMP/b1.h5" "$TMP/b2.h5" "$TMP/b3.h5" "$TMP/ra/step_00000020.h5" "$TMP/rb/step_00000020.h5" \
    "$TMP/c.h5" >"$TMP/py" 2>&1 <<'PYEOF'
import sys, h5py, numpy as np
a_path, bs, ra, rb, c_path = sys.argv[1], sys.argv[2:5], sys.argv[5], sys.argv[6], sys.argv[7]
tab = []
for i in range(256):
    r = i
    for _ in range(8):
        r = (r >> 1) ^ (0x82F63B78 if r & 1 else 0)
    tab.append(r)
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = (c >> 8) ^ tab[(c ^ x) & 0xFF]
    return c ^ 0xFFFFFFFF
def datasets(f):
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return sorted(names)
a = h5py.File(a_path, "r")
names = datasets(a)
assert len(names) == 204, len(names)
# dtrain's own tp4 file (written by the run resumed at tp4): the reference
# for the chunk shapes and the checksum records' slices
tp4 = h5py.File(ra, "r")
nrec = 0
for path in bs:
    b = h5py.File(path, "r")
    assert datasets(b) == names, path
    for n in names:
        x, y = a[n][()], b[n][()]
        assert x.dtype == y.dtype == np.dtype("<f4") and x.shape == y.shape, n
        assert (x.view(np.uint32) == y.view(np.uint32)).all(), (path, n)
        assert b[n].chunks == tp4[n].chunks, (path, n, b[n].chunks, tp4[n].chunks)
        assert (b[n].attrs["crc32c"][:, :4] == tp4[n].attrs["crc32c"][:, :4]).all(), (path, n)
    aa, ba = dict(a.attrs), dict(b.attrs)
    assert ba.pop("layout") == "tp 4 pp 1 dp 1 zero 0" and aa.pop("layout") == "tp 2 pp 2 dp 1 zero 0", path
    assert aa.keys() == ba.keys() and all(aa[k] == ba[k] and type(aa[k]) == type(ba[k]) for k in aa), path
    nrec = sum(len(b[n].attrs["crc32c"]) for n in names)
# the fresh checksums of the parameters, recomputed here
b = h5py.File(bs[2], "r")
ncrc = 0
for n in names:
    if not n.startswith("params/"):
        continue
    g = b[n][()].reshape(b[n].shape[0], -1)
    for s0, s1, c0, c1, crc in b[n].attrs["crc32c"]:
        assert crc32c(np.ascontiguousarray(g[s0:s0 + c0, s1:s1 + c1]).tobytes()) == crc, (n, s0, s1)
        ncrc += 1
wte = (b["params/wte"].chunks, len(b["params/wte"].attrs["crc32c"]))
wfc = (b["params/h.0.mlp.wfc"].chunks, a["params/h.0.mlp.wfc"].chunks)
# back to tp2 pp2: the original's records, checksums included
c = h5py.File(c_path, "r")
for n in names:
    assert (c[n].attrs["crc32c"] == a[n].attrs["crc32c"]).all() and c[n].chunks == a[n].chunks, n
# the step-20 checkpoints of the two resumed runs
r1, r2 = h5py.File(ra, "r"), h5py.File(rb, "r")
for n in names:
    assert (r1[n][()].view(np.uint32) == r2[n][()].view(np.uint32)).all(), n
print("%d tensors bit-identical at np 1, 2, 3 with attributes carried over; chunks and %d records as dtrain's "
      "tp4 file (wte chunks %s, %d records; h.0.mlp.wfc %s, was %s); %d parameter CRCs recomputed; back at "
      "tp2 pp2 the records equal the original's; step-20 checkpoints of both resumed runs bit-identical"
      % (len(names), nrec, wte[0], wte[1], wfc[0], wfc[1], ncrc))
print(nrec)
PYEOF
if [ $? -eq 0 ]; then pass "$(head -n 1 "$TMP/py")"; else fail "h5py: $(tail -n 4 "$TMP/py")"; fi
nrec=$(tail -n 1 "$TMP/py")

# ---- --info ----
dreshard 2 --info "$TMP/b3.h5" >"$TMP/info" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -qx "  step = 10" "$TMP/info" && grep -qx "  layout = tp 4 pp 1 dp 1 zero 0" "$TMP/info" &&
    grep -qx "  content = checkpoint" "$TMP/info" && grep -qx "  format_version = 1" "$TMP/info" &&
    grep -qx "  tokens = 5120" "$TMP/info" && grep -qx "tensors: 204" "$TMP/info" &&
    grep -Eq '^  params/wte +\[256, 128\] +2 chunks$' "$TMP/info" &&
    grep -qx "checksums: verified: $nrec shards, 9.8 MiB" "$TMP/info"; then
    pass "--info: step 10, layout tp 4 pp 1 dp 1 zero 0, 204 tensors, $(tail -n 1 "$TMP/info")"
else
    fail "--info: exit $rc: $(head -n 12 "$TMP/info") ... $(tail -n 2 "$TMP/info")"
fi

# ---- --params-only ----
dreshard 3 --in "$TMP/b2.h5" --out "$TMP/p.h5" --params-only >"$TMP/p.log" 2>&1 || fail "--params-only: $(cat "$TMP/p.log")"
dreshard 1 --in "$TMP/p.h5" --out "$TMP/p2.h5" --tp 2 --pp 4 --dp 3 --zero 2 >"$TMP/p2.log" 2>&1 ||
    fail "params file -> tp2 pp4 dp3 zero2: $(cat "$TMP/p2.log")"
"$PY" - "$A" "$TMP/p.h5" "$TMP/p2.h5" >"$TMP/py" 2>&1 <<'PYEOF'
import sys, h5py, numpy as np
a, p, p2 = (h5py.File(x, "r") for x in sys.argv[1:4])
names = []
p.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert len(names) == 68 and all(n.startswith("params/") for n in names), names
for n in names:
    assert (p[n][()].view(np.uint32) == a[n][()].view(np.uint32)).all(), n
    assert p[n].chunks == p[n].shape and len(p[n].attrs["crc32c"]) == 1, n
    assert (p2[n][()].view(np.uint32) == a[n][()].view(np.uint32)).all(), n
at = dict(p.attrs)
assert at["content"] == "params" and at["layout"] == "tp 1 pp 1 dp 1 zero 0" and at["step"] == 10, at
assert dict(p2.attrs)["layout"] == "tp 2 pp 4 dp 3 zero 2" and dict(p2.attrs)["content"] == "params"
print("--params-only: %d params/* tensors bit-identical, one chunk each, content %s, layout %s; "
      "resharded again to %s" % (len(names), at["content"], at["layout"], dict(p2.attrs)["layout"]))
PYEOF
if [ $? -eq 0 ]; then pass "$(cat "$TMP/py")"; else fail "--params-only: $(tail -n 4 "$TMP/py")"; fi

# ---- bad input: one line, exit 2; nothing written ----
expect_exit2 "unknown option '--zero-stage'" dreshard 2 --in "$A" --out "$TMP/x.h5" --zero-stage 1
expect_exit2 "--zero '4': the ZeRO stage is 0, 1, 2 or 3" "$DRESHARD" --in "$A" --out "$TMP/x.h5" --zero 4
# every option of --help is in the man page
missing=""
for opt in $("$DRESHARD" --help | grep -o -- '--[a-z-]*' | sort -u); do
    grep -q -- "$(echo "$opt" | sed 's/-/\\\\-/g')" "$top_srcdir/doc/dreshard.1" || missing="$missing $opt"
done
if [ -z "$missing" ] && "$DRESHARD" --version | grep -q "^dreshard (dtrain) "; then
    pass "--help: every option documented in doc/dreshard.1; $("$DRESHARD" --version)"
else
    fail "options missing from doc/dreshard.1:$missing"
fi

# command-line errors need no collective: a singleton run (no launcher) is quicker
expect_exit2 "no --out FILE" "$DRESHARD" --in "$A"
expect_exit2 "--tp 0: out of range" "$DRESHARD" --in "$A" --out "$TMP/x.h5" --tp 0
expect_exit2 "--info FILE only prints a file" "$DRESHARD" --info "$A" --out "$TMP/x.h5"
expect_exit2 "--in $TMP/nope.h5: No such file or directory" dreshard 2 --in "$TMP/nope.h5" --out "$TMP/x.h5"
echo "not hdf5" >"$TMP/text.h5"
expect_exit2 "$TMP/text.h5 is not an HDF5 file" dreshard 2 --in "$TMP/text.h5" --out "$TMP/x.h5"
expect_exit2 "--tp 3 must divide the attention heads (4)" dreshard 2 --in "$A" --out "$TMP/x.h5" --tp 3
expect_exit2 "--pp 5 exceeds the model's 4 layers" dreshard 2 --in "$A" --out "$TMP/x.h5" --pp 5
expect_exit2 "--out $TMP/b1.h5 exists: remove it, choose another path, or pass --force" \
    dreshard 2 --in "$A" --out "$TMP/b1.h5"
ln -s "$A" "$TMP/alias.h5"
expect_exit2 "is the input file" dreshard 2 --in "$A" --out "$TMP/alias.h5" --force
: >"$TMP/afile"
expect_exit2 "--out $TMP/afile/x.h5: Not a directory" dreshard 2 --in "$A" --out "$TMP/afile/x.h5"
cp "$A" "$TMP/flip.h5"
"$PY" -c "
import h5py
f = h5py.File('$TMP/flip.h5', 'r'); off = f['optim/m/h.2.mlp.wfc'].id.get_chunk_info(0).byte_offset; f.close()
b = open('$TMP/flip.h5', 'r+b'); b.seek(off + 1000); c = b.read(1); b.seek(off + 1000); b.write(bytes([c[0] ^ 0x10])); b.close()"
expect_exit2 "checksum mismatch in optim/m/h.2.mlp.wfc rows 0..255" dreshard 3 --in "$TMP/flip.h5" --out "$TMP/x.h5" --tp 4
expect_exit2 "checksum mismatch in optim/m/h.2.mlp.wfc" dreshard 2 --info "$TMP/flip.h5"
cp "$A" "$TMP/version.h5"
"$PY" -c "import h5py; f = h5py.File('$TMP/version.h5', 'r+'); f.attrs['format_version'] = 7; f.close()"
expect_exit2 "unknown checkpoint format version 7" dreshard 2 --in "$TMP/version.h5" --out "$TMP/x.h5"
cp "$A" "$TMP/extra.h5"
"$PY" -c "import h5py, numpy; f = h5py.File('$TMP/extra.h5', 'r+'); f['params/extra'] = numpy.zeros(3, 'f4'); f.close()"
expect_exit2 "tensor params/extra is not part of the model's checkpoint file" \
    dreshard 2 --in "$TMP/extra.h5" --out "$TMP/x.h5"
cp "$A" "$TMP/missing.h5"
"$PY" -c "import h5py; f = h5py.File('$TMP/missing.h5', 'r+'); del f['optim/v/h.1.ln2.w']; f.close()"
expect_exit2 "tensor optim/v/h.1.ln2.w: not in $TMP/missing.h5" dreshard 2 --in "$TMP/missing.h5" --out "$TMP/x.h5"
if [ ! -e "$TMP/x.h5" ] && ! ls -A "$TMP" | grep -q '\.tmp$'; then
    pass "no output and no temporary file after any refused command"
else
    fail "a refused command left $(ls -A "$TMP" | grep 'x.h5\|\.tmp$')"
fi

# --force replaces an existing output only once the new file is complete
if dreshard 2 --in "$TMP/p.h5" --out "$TMP/b1.h5" --force >/dev/null 2>&1 &&
    "$PY" -c "import h5py, sys; sys.exit(h5py.File('$TMP/b1.h5', 'r').attrs['content'] != 'params')"; then
    pass "--force replaced an existing output"
else
    fail "--force did not replace $TMP/b1.h5"
fi

# a failed write is exit 1 (the machine's fault, not the input's), leaving nothing
mkdir -p "$TMP/small"
if mount -t tmpfs -o size=4m tmpfs "$TMP/small" 2>/dev/null; then
    dreshard 2 --in "$A" --out "$TMP/small/x.h5" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    left=$(ls -A "$TMP/small")
    umount "$TMP/small"
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "No space left on device" "$TMP/err" &&
        [ -z "$left" ]; then
        pass "exit 1: $(cat "$TMP/err")"
    else
        fail "full disk: exit $rc, left '$left': $(cat "$TMP/err")"
    fi
else
    pass "full disk not tested: this machine cannot mount a tmpfs (needs root)"
fi
finish
