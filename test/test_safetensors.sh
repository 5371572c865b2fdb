#!/bin/sh
# safetensors and llm.c model files (io/safetensors.c, io/llmc_model.c)
# against the independent Python reader and writer test/st_ref.py (numpy,
# written from the formats' specifications; PyTorch's storage also reads
# the written tensors when python3-torch is there):
#   - dtrain's writer (fp32, bf16, fp16; one file, and shards of a tiny
#     size limit with the index) read back bit for bit, bf16 and fp16
#     rounding to nearest even included;
#   - files by the Python writer (one file and sharded, unpadded headers,
#     F64/I64/F8 tensors) read by dtrain's reader: blocks and transposed
#     blocks, element by element;
#   - each malformed header refused with one line naming file and tensor;
#   - the same for llm.c's model file (fp32 version 3, bf16 version 5).
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
. "${top_srcdir:-.}/test/common.sh"

PROG="$top_builddir/test/test_safetensors"
REF="$top_srcdir/test/st_ref.py"
[ -x "$PROG" ] || { echo "FAIL: $PROG not built (make check builds it)"; exit 1; }
PY=
for p in "${PYTHON_REF:-}" /usr/bin/python3 python3; do
    if [ -n "$p" ] && "$p" -c "import numpy" >/dev/null 2>&1; then
        PY=$p
        break
    fi
done
[ -n "$PY" ] || { echo "SKIP: no python3 with numpy for the independent reader"; exit 77; }

# run LABEL CMD...: pass with CMD's last line, or fail with its output.
run() {
    label=$1
    shift
    if "$@" >"$TMP/log" 2>&1; then
        pass "$label: $(tail -n 1 "$TMP/log")"
    else
        fail "$label: $(tail -n 5 "$TMP/log")"
    fi
}

# 1. in-process checks
run "unit" "$PROG" unit "$TMP"

# 2. dtrain writes, Python reads: one file (5 GB default limit) and shards
"$PY" "$REF" gen "$TMP/src"
for max in 0 300 1; do
    out="$TMP/out-$max"
    mkdir -p "$out"
    run "write, max shard $max" "$PROG" write "$out" "$TMP/src" "$max"
    lim=$max
    [ "$max" -eq 0 ] && lim=5000000000
    run "Python reads dtrain's files (max $max)" "$PY" "$REF" verify "$out" "$TMP/src" "$lim"
done
n=$(ls "$TMP/out-1" | grep -c 'safetensors$')
[ "$n" -eq 8 ] && pass "max 1 byte: one shard per tensor ($n)" || fail "max 1 byte: $n shards, wanted 8"
# and dtrain reads its own sharded output through the index
run "dtrain reads its sharded output" "$PROG" check "$TMP/out-300"

# 3. Python writes, dtrain reads blocks and transposed blocks
for mode in single sharded; do
    d="$TMP/py-$mode"
    "$PY" "$REF" write "$d" "$mode" >/dev/null
    if "$PROG" read "$d" "$d/req.txt" "$d/got.f32" >"$TMP/log" 2>&1; then
        run "dtrain reads Python's $mode model" "$PY" "$REF" compare "$d/got.f32" "$d/expected.f32"
    else
        fail "read $mode: $(cat "$TMP/log")"
    fi
done
# a single .safetensors file is a model too
run "a file as the model" "$PROG" check "$TMP/py-single/model.safetensors"

# 4. malformed files: exit 1, one line, naming the file (and the tensor)
reject() {
    f="$TMP/bad-$1.safetensors"
    "$PY" "$REF" mutate "$f" "$1" || { fail "cannot make mutation $1"; return; }
    "$PROG" check "$f" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && [ ! -s "$TMP/out" ] &&
        grep -qF -- "$f" "$TMP/err" && grep -qF -- "$2" "$TMP/err"; then
        pass "$1: $(cat "$TMP/err")"
    else
        fail "$1: exit $rc, wanted one line with '$2': $(cat "$TMP/out" "$TMP/err")"
    fi
}
reject short "shorter than the 8-byte header length"
reject past-end "runs past the end"
reject huge "exceeds the"
reject not-json "not valid JSON"
reject trailing "not valid JSON"
reject not-object "does not begin with '{'"
reject meta-object "__metadata__ is not a JSON object"
reject meta-value "__metadata__ 'n' is not a string"
reject entry "tensor 'b': entry is not a JSON object"
reject no-dtype "tensor 'b': needs \"dtype\""
reject dtype "tensor 'b': unknown dtype 'Q4_K'"
reject shape-neg "tensor 'b': shape[0] is not a non-negative integer"
reject shape-float "tensor 'a': shape[1] is not a non-negative integer"
reject dims "tensor 'b': 9 dimensions"
reject offsets-3 "tensor 'b': data_offsets is not [begin, end]"
reject size "tensor 'b': data_offsets [24, 30] hold a different number of bytes"
reject reversed "tensor 'b': data_offsets [32, 24] hold negative bytes"
reject past-data "tensor 'b': data_offsets end 36 is past the data region"
reject overflow "tensor 'b': its shape's size overflows"
reject overlap "tensor 'b' (bytes 16..24) overlaps tensor 'a'"
reject newline-name "tensor 'x?y': unknown dtype 'F99'"
reject duplicate "duplicate object key"
reject truncated "tensor 'b': data_offsets end 32 is past the data region's 30 bytes"

# sharded directories: the index against its shards
idx() {
    d="$TMP/idx-$1"
    rm -rf "$d" && cp -r "$TMP/py-sharded" "$d"
    "$PY" - "$d/model.safetensors.index.json" "$1" <<'EOF'
import json, sys
p, kind = sys.argv[1:3]
x = json.load(open(p))
wm = x["weight_map"]
if kind == "missing": wm["ghost"] = "model-00001-of-00003.safetensors"
elif kind == "unlisted": del wm["a.f32"]
elif kind == "wrong-shard": wm["a.f32"] = "model-00002-of-00003.safetensors"
elif kind == "path": wm["a.f32"] = "../model-00001-of-00003.safetensors"
elif kind == "no-file": wm["a.f32"] = "model-00009-of-00009.safetensors"
elif kind == "no-map": del x["weight_map"]
json.dump(x, open(p, "w"))
EOF
    "$PROG" check "$d" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -qF -- "$2" "$TMP/err"; then
        pass "index $1: $(cat "$TMP/err")"
    else
        fail "index $1: exit $rc, wanted one line with '$2': $(cat "$TMP/out" "$TMP/err")"
    fi
}
idx missing "tensor 'ghost': missing (the index says it is there)"
idx unlisted "tensor 'a.f32': not listed for this shard"
idx wrong-shard "tensor 'a.f32': missing"
idx path "tensor 'a.f32': shard is not a file name in the directory"
idx no-file "model-00009-of-00009.safetensors"
idx no-map "no \"weight_map\""
"$PROG" check "$TMP/src" >/dev/null 2>"$TMP/err"
grep -q "neither model.safetensors nor" "$TMP/err" && pass "not a model directory: $(cat "$TMP/err")" ||
    fail "not a model directory: $(cat "$TMP/err")"

# 5. llm.c: dtrain writes (fp32, bf16), Python reads; Python writes, dtrain reads
for v in 3 5; do
    "$PY" "$REF" llmc-gen "$TMP/lsrc$v" "$v"
    run "llm.c write v$v" "$PROG" llmc-write "$TMP/model$v.bin" "$TMP/lsrc$v"
    run "Python reads dtrain's llm.c v$v" "$PY" "$REF" llmc-verify "$TMP/model$v.bin" "$TMP/lsrc$v"
    [ -e "$TMP/model$v.bin.tmp" ] && fail "llm.c v$v: the .tmp was left behind"
    f="$TMP/py$v.bin"
    "$PY" "$REF" llmc-write "$f" "$v" >/dev/null
    if "$PROG" llmc-read "$f" "$f.req" "$f.got" >"$TMP/log" 2>&1; then
        run "dtrain reads Python's llm.c v$v" "$PY" "$REF" compare "$f.got" "$f.expected"
    else
        fail "llm.c read v$v: $(cat "$TMP/log")"
    fi
done
run "llm.c check" "$PROG" llmc-check "$TMP/py5.bin"
lreject() {
    f="$TMP/lbad-$1.bin"
    "$PY" "$REF" llmc-mutate "$TMP/py${3:-3}.bin" "$f" "$1"
    "$PROG" llmc-check "$f" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -qF -- "$f" "$TMP/err" &&
        grep -qF -- "$2" "$TMP/err"; then
        pass "llm.c $1: $(cat "$TMP/err")"
    else
        fail "llm.c $1: exit $rc, wanted one line with '$2': $(cat "$TMP/out" "$TMP/err")"
    fi
}
lreject magic "magic 20240520"
lreject version "version 4"
lreject short "needs exactly"
lreject long "needs exactly"
lreject header "not a regular file of at least 1024 bytes"
lreject heads "not a multiple of NH 3"
lreject vocab "V 65 exceeds the padded Vp 64"
lreject layers0 "must all be positive"
lreject overflow "overflows"
lreject bf16-as-f32 "needs exactly" 5

finish
