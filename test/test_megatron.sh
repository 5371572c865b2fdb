#!/bin/sh
# Megatron-LM indexed datasets (io/megatron.c): test_megatron writes random
# datasets of all eight dtypes (and one with several sequences per
# document), the independent numpy reader (test/megatron_reader.py) must
# read the same documents, and megatron_idx_open must reject each
# corruption of a good dataset with exactly one line naming the file.
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
. "${top_srcdir:-.}/test/common.sh"

PROG="$top_builddir/test/test_megatron"
READER="$top_srcdir/test/megatron_reader.py"
[ -x "$PROG" ] || { echo "FAIL: $PROG not built (make check builds it)"; exit 1; }

# The reader needs numpy: Debian's python3-numpy (scripts/install-deps.sh).
PY=
for p in "${PYTHON_REF:-}" /usr/bin/python3 python3; do
    if [ -n "$p" ] && "$p" -c "import numpy" >/dev/null 2>&1; then
        PY=$p
        break
    fi
done
[ -n "$PY" ] || { echo "SKIP: no python3 with numpy for the independent reader"; exit 77; }

# 1. write + in-process checks (read-back, parse on memory, writer errors)
if "$PROG" write "$TMP" >"$TMP/write.log" 2>&1; then
    pass "$(tail -n 1 "$TMP/write.log")"
else
    fail "test_megatron write: $(tail -n 20 "$TMP/write.log")"
fi

# 2. the numpy reader gets the same documents, token for token
for name in uint8 int8 int16 int32 int64 float32 float64 uint16 multi; do
    if ! "$PY" "$READER" --json "$TMP/$name" >"$TMP/$name.np" 2>"$TMP/err"; then
        fail "numpy reader on $name: $(cat "$TMP/err")"
        continue
    fi
    if "$PY" - "$TMP/$name.jsonl" "$TMP/$name.np" <<'EOF' >"$TMP/cmp" 2>&1; then
import json, sys
want = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
ntok = sum(len(d) for d in want)
if want != got:
    bad = sum(a != b for a, b in zip(want, got)) + abs(len(want) - len(got))
    print(f"{bad} of {len(want)} documents differ")
    sys.exit(1)
print(f"{len(want)} documents, {ntok} tokens")
EOF
        pass "numpy reader, $name: same $(cat "$TMP/cmp")"
    else
        fail "numpy reader, $name: $(cat "$TMP/cmp")"
    fi
done
# the summary form: one line per document, and PREFIX.idx names the dataset
if "$PY" "$READER" "$TMP/multi.idx" >"$TMP/sum" 2>"$TMP/err" &&
    [ "$(wc -l <"$TMP/sum")" -eq 61 ] && head -n 1 "$TMP/sum" | grep -q "60 documents"; then
    pass "numpy reader summary: $(head -n 1 "$TMP/sum")"
else
    fail "numpy reader summary: $(head -n 2 "$TMP/sum") $(cat "$TMP/err")"
fi

# 3. corruptions. mutate.py SRC DST KIND copies the uint16 dataset SRC to
# DST (.idx and .bin) with one thing broken.
cat >"$TMP/mutate.py" <<'EOF'
import struct, sys
src, dst, kind = sys.argv[1:4]
idx = bytearray(open(src + ".idx", "rb").read())
bin_ = bytearray(open(src + ".bin", "rb").read())
n, m = struct.unpack_from("<QQ", idx, 18)
L, P, D = 34, 34 + 4 * n, 34 + 12 * n      # lengths, pointers, doc indices
def put(fmt, off, v): struct.pack_into(fmt, idx, off, v)
if kind == "truncated-idx": idx = idx[:-5]
elif kind == "empty-idx": idx = b""
elif kind == "header-only": idx = idx[:20]
elif kind == "cut-in-pointers": idx = idx[:34 + 12 * n - 1]  # N just too big
elif kind == "magic": idx[0:7] = b"MMIDIDY"
elif kind == "fairseq": idx[0:9] = b"TNTIDX\0\0\0"
elif kind == "version": put("<Q", 9, 2)
elif kind == "dtype": idx[17] = 9
elif kind == "dtype0": idx[17] = 0
elif kind == "dtype-int32": idx[17] = 4      # pointers no longer match
elif kind == "huge-n": put("<Q", 18, 1 << 62)
elif kind == "huge-m": put("<Q", 26, (1 << 64) - 1)
elif kind == "zero-m": put("<Q", 26, 0)
elif kind == "negative-length": put("<i", L + 4 * 3, -4)
elif kind == "pointer": put("<q", P + 8 * 5, struct.unpack_from("<q", idx, P + 8 * 5)[0] + 2)
elif kind == "pointer-negative": put("<q", P, -8)
elif kind == "doc-past-n": put("<q", D + 8 * (m // 2), n + 7)
elif kind == "doc-last": put("<q", D + 8 * (m - 1), n - 1)
elif kind == "doc-first": put("<q", D, 1)
elif kind == "doc-decreasing": put("<q", D + 8 * 4, 2)
elif kind == "trailing-idx": idx += b"\0\0\0"
elif kind == "bin-short": bin_ = bin_[:-1]
elif kind == "bin-long": bin_ += b"\0\0"
elif kind == "bin-empty": bin_ = b""
elif kind == "modes": idx += bytes(n)        # accepted: multimodal
elif kind == "no-bin": pass
else: sys.exit("unknown mutation " + kind)
open(dst + ".idx", "wb").write(idx)
if kind != "no-bin":
    open(dst + ".bin", "wb").write(bin_)
EOF

# reject KIND WANT: the mutated dataset fails with exactly one stderr line
# naming the file (.idx or .bin) and containing WANT.
reject() {
    d="$TMP/bad-$1"
    if ! "$PY" "$TMP/mutate.py" "$TMP/uint16" "$d" "$1"; then
        fail "cannot make mutation $1"
        return
    fi
    "$PROG" check "$d" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && [ ! -s "$TMP/out" ] &&
        grep -q -- "'$d\.\(idx\|bin\)'" "$TMP/err" && grep -q -- "$2" "$TMP/err"; then
        pass "$1: $(cat "$TMP/err")"
    else
        fail "$1: exit $rc, $lines line(s), wanted '$2': $(cat "$TMP/out" "$TMP/err")"
    fi
    # the numpy reader must refuse it too (it is a validator as well)
    if "$PY" "$READER" "$d" >/dev/null 2>&1; then
        fail "$1: the numpy reader accepted it"
    fi
}
reject truncated-idx "truncated"
reject empty-idx "shorter than the 34-byte header"
reject header-only "shorter than the 34-byte header"
reject cut-in-pointers "sequence count 96 needs 12 bytes each"
reject magic "bad magic"
reject fairseq "fairseq"
reject version "version 2"
reject dtype "unknown dtype code 9"
reject dtype0 "unknown dtype code 0"
reject dtype-int32 "points at byte"
reject huge-n "sequence count 4611686018427387904"
reject huge-m "document count 18446744073709551615"
reject zero-m "document count 0"
reject negative-length "negative length"
reject pointer "sequence 5 points at byte"
reject pointer-negative "sequence 0 points at byte -8"
reject doc-past-n "past the sequence count"
reject doc-last "must equal the sequence count"
reject doc-first "must be 0"
reject doc-decreasing "must not decrease"
reject trailing-idx "3 trailing bytes"
reject bin-short "is truncated"
reject bin-long "trailing bytes"
reject bin-empty "is truncated"

# a missing .bin: one line naming it
"$PY" "$TMP/mutate.py" "$TMP/uint16" "$TMP/nobin" no-bin
if "$PROG" check "$TMP/nobin" >/dev/null 2>"$TMP/err"; then
    fail "a missing .bin was accepted"
elif [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "'$TMP/nobin.bin'" "$TMP/err"; then
    pass "missing .bin: $(cat "$TMP/err")"
else
    fail "missing .bin: $(cat "$TMP/err")"
fi

# accepted: a multimodal modes array (N int8 after the document indices),
# and the dataset named by PREFIX, PREFIX.idx or PREFIX.bin
"$PY" "$TMP/mutate.py" "$TMP/uint16" "$TMP/mm" modes
if "$PROG" check "$TMP/mm" 2>"$TMP/err" | grep -q "multimodal modes"; then
    pass "multimodal modes array accepted and reported"
else
    fail "multimodal modes: $(cat "$TMP/err")"
fi
for arg in "$TMP/uint16" "$TMP/uint16.idx" "$TMP/uint16.bin"; do
    if "$PROG" check "$arg" >/dev/null 2>"$TMP/err"; then
        pass "opens $arg"
    else
        fail "cannot open $arg: $(cat "$TMP/err")"
    fi
done

finish
