#!/bin/sh
# io/h5store (test_h5store.c): tensors written at one np and split are read
# back at another, element by element; h5py reads every tensor bit-exactly
# and recomputes every stored CRC-32C; reading and verifying in one pass
# checks every checksum, also those no rank's reads cover; a flipped byte, a
# truncated file and failed writes give one clear line and leave no file
# behind.
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_h5store"
PY=/usr/bin/python3 # Debian's, with h5py (never a pyenv python3)

# run NP ARGS...: output in $TMP/out, $TMP/err; returns the exit status
run() {
    np=$1
    shift
    "$MPIEXEC" --oversubscribe --quiet -np "$np" "$PROG" "$@" >"$TMP/out" 2>"$TMP/err"
}

# expect_ok LABEL NP ARGS...: exit 0, summary "0 failure(s)", nothing on stderr
expect_ok() {
    label=$1
    shift
    run "$@"
    rc=$?
    if [ "$rc" -eq 0 ] && ! grep -q '^FAIL' "$TMP/out" && tail -n 1 "$TMP/out" | grep -q ' 0 failure(s)$' &&
        [ ! -s "$TMP/err" ]; then
        pass "$label: $(grep -v ' failure(s)$' "$TMP/out" | tr '\n' ' ')"
    else
        fail "$label: exit $rc: $(cat "$TMP/out") stderr: $(head -c 2000 "$TMP/err")"
    fi
}

# expect_err LABEL WANT NP ARGS...: exit 1 and exactly one stderr line containing WANT
expect_err() {
    label=$1
    want=$2
    shift 2
    run "$@"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && grep -q -- "$want" "$TMP/err"; then
        pass "$label: $(cat "$TMP/err")"
    else
        fail "$label: exit $rc, $lines stderr line(s), wanted '$want': $(head -c 2000 "$TMP/err") $(head -c 1000 "$TMP/out")"
    fi
}

expect_ok "crc32c" 1 crc

# write at np/split A, read at np/split B (every read checks each element)
expect_ok "write np 1 rows" 1 write "$TMP/w1.h5" rows
expect_ok "write np 2 uneven (rank 0 holds nothing)" 2 write "$TMP/w2.h5" uneven
expect_ok "write np 3 inter (2 shards per rank)" 3 write "$TMP/w3.h5" inter
expect_ok "write np 3 mixed (rows/cols, 1-D on one rank)" 3 write "$TMP/w4.h5" mixed
expect_ok "np 1 rows -> np 3 cols" 3 read "$TMP/w1.h5" cols
expect_ok "np 2 uneven -> np 3 inter" 3 read "$TMP/w2.h5" inter
expect_ok "np 3 inter -> np 2 rows" 2 read "$TMP/w3.h5" rows
expect_ok "np 3 mixed -> np 1 rows" 1 read "$TMP/w4.h5" rows
expect_ok "np 3 mixed -> np 2 uneven" 2 read "$TMP/w4.h5" uneven
expect_ok "np 1 rows -> np 2 mixed" 2 read "$TMP/w1.h5" mixed
expect_ok "2000 shards of one tensor at np 2" 2 many "$TMP/many.h5"
# a staging buffer of 7 floats: every shard moves in many blocks of rows,
# and rows of 17 and 24 floats are longer than the stage (one row a block)
export H5STORE_STAGE_FLOATS=7
expect_ok "7-float stage: write np 3 inter" 3 write "$TMP/s3.h5" inter
expect_ok "7-float stage: write np 2 mixed" 2 write "$TMP/s4.h5" mixed
expect_ok "7-float stage: np 3 inter -> np 2 cols" 2 read "$TMP/s3.h5" cols
expect_ok "7-float stage: np 2 mixed -> np 3 uneven" 3 read "$TMP/s4.h5" uneven
expect_ok "7-float stage: read_verify np 2 mixed -> np 3 rows" 3 readverify "$TMP/s4.h5" rows all
unset H5STORE_STAGE_FLOATS
# reading and verifying in one pass (what checkpoint loading uses)
expect_ok "read_verify np 3 inter -> np 2 rows" 2 readverify "$TMP/w3.h5" rows all
expect_ok "read_verify np 3 mixed -> np 3 inter, optim/m/big unread" 3 readverify "$TMP/w4.h5" inter nobig

# h5py: every tensor bit-exact, the attributes, every checksum recomputed
if $PY -c 'import h5py, numpy' 2>/dev/null; then
    for f in w1 w2 w3 w4 s3 s4; do
        if out=$($PY - "$TMP/$f.h5" <<'EOF' 2>&1
import sys, h5py, numpy as np
T = {"params/wte": (37, 24), "params/h.0.attn.wq": (24, 24), "params/h.0.ln.b": (24,),
     "params/lnf.g": (13,), "optim/m/big": (301, 17), "scalar": (1,), "optim/v/h.0.mlp.w": (64, 7)}
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
f = h5py.File(sys.argv[1], "r")
names = []
f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert sorted(names) == sorted(T), names
nrec = 0
for name, shape in T.items():
    d = f[name]
    assert d.dtype == np.dtype("<f4") and d.shape == shape, (name, d.dtype, d.shape)
    h = sum((k + 1) * b for k, b in enumerate(name.encode())) % 997
    want = (h + np.arange(int(np.prod(shape)), dtype=np.float64) / 7.0).astype(np.float32).reshape(shape)
    got = d[...]
    assert (got.view(np.uint32) == want.view(np.uint32)).all(), name
    rec = d.attrs["crc32c"]
    assert rec.dtype == np.int64 and rec.ndim == 2 and rec.shape[1] == 5, rec
    g2 = got.reshape(shape[0], -1)
    assert sum(r[2] * r[3] for r in rec) == got.size, name
    for s0, s1, c0, c1, crc in rec:
        assert crc32c(np.ascontiguousarray(g2[s0:s0 + c0, s1:s1 + c1]).tobytes()) == crc, (name, s0, s1)
    nrec += len(rec)
a = f.attrs
assert a["h5store_version"] == 1 and a["step"] == 1234567890123 and a["lr"] == 3e-4, dict(a)
assert a["model"] == 'tiny-\u00fc {"n_layer": 1, "d": 24}', a["model"]
print("%d tensors bit-exact, %d checksums recomputed, layout=%s" % (len(T), nrec, a["layout"]))
EOF
        ); then
            pass "h5py $f.h5: $out"
        else
            fail "h5py $f.h5: $out"
        fi
    done
else
    echo "skip h5py checks: $PY has no h5py/numpy"
fi

# one flipped byte of raw data: verify and a read at the writer's layout
# name the tensor and the shard's rows
cp "$TMP/w3.h5" "$TMP/bad.h5"
if where=$($PY - "$TMP/bad.h5" <<'EOF' 2>&1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
d = f["optim/m/big"]
off = d.id.get_offset() + 4 * (200 * 17 + 5) + 1   # row 200, col 5
for s0, s1, c0, c1, crc in d.attrs["crc32c"]:
    if s0 <= 200 < s0 + c0:
        print("%d %d" % (off, s0), end=" ")
        print("rows %d..%d" % (s0, s0 + c0 - 1))
f.close()
EOF
); then
    off=${where%% *}
    rows=${where#* * }
    $PY -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek($off); b = f.read(1); f.seek($off); f.write(bytes([b[0] ^ 0x10]))" "$TMP/bad.h5"
    expect_err "flipped byte, verify np 3" "checksum mismatch in optim/m/big $rows (stored" 3 verify "$TMP/bad.h5"
    expect_err "flipped byte, verify np 2" "checksum mismatch in optim/m/big $rows (stored" 2 verify "$TMP/bad.h5"
    expect_err "flipped byte, read at the writer's layout" "checksum mismatch in optim/m/big $rows" 3 read "$TMP/bad.h5" inter
    expect_err "flipped byte, read_verify reading it" "checksum mismatch in optim/m/big $rows" 2 readverify \
        "$TMP/bad.h5" rows all
    expect_err "flipped byte, read_verify with no rank reading it" "checksum mismatch in optim/m/big $rows (stored" 3 \
        readverify "$TMP/bad.h5" cols nobig
    expect_ok "unflipped file still verifies" 3 verify "$TMP/w3.h5"
else
    fail "cannot locate optim/m/big in the file: $where"
fi

# broken files: one line, every rank the same exit status
size=$(wc -c <"$TMP/w1.h5")
head -c $((size / 2)) "$TMP/w1.h5" >"$TMP/trunc.h5"
expect_err "truncated file" "$TMP/trunc.h5 is damaged or incomplete (a truncated copy?): HDF5 cannot open it; use another copy" 2 open "$TMP/trunc.h5"
head -c 4096 /dev/urandom >"$TMP/garbage.h5"
expect_err "not HDF5" "$TMP/garbage.h5 is not an HDF5 file (4096 bytes, no HDF5 signature)" 2 open "$TMP/garbage.h5"
expect_err "missing file" "$TMP/missing.h5: No such file or directory" 2 open "$TMP/missing.h5"
mkdir -p "$TMP/adir"
expect_err "a directory" "$TMP/adir is a directory, not a checkpoint or parameter file" 2 open "$TMP/adir"

# failed writes leave nothing under the final name and no temp file
for np in 1 3; do
    mkdir "$TMP/fail$np"
    expect_ok "failed writes np $np" "$np" fail "$TMP/fail$np"
    left=$(ls -A "$TMP/fail$np" | tr '\n' ' ')
    if [ "$left" = "keep.h5 " ]; then
        pass "np $np: only the good file remains"
    else
        fail "np $np: directory holds: $left"
    fi
done
finish
