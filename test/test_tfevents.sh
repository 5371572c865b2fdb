#!/bin/sh
# io/tfevents (test_tfevents.c): the writer's header and scalar records equal
# golden bytes worked out by hand from the format; a run of events read back
# by implementations that share nothing with the writer: protoc --decode_raw
# (no .proto needed) on every payload, protoc --decode with test/tbmin.proto,
# and /usr/bin/python3 walking the TFRecord framing, recomputing both masked
# CRC-32Cs of each record with python3-crc32c and parsing each payload with
# python3-protobuf classes generated from test/tbmin.proto; the trainer's
# step record (metrics_write_tfevents) with every tag it promises; the
# --metrics line (metrics_write_json) strict JSON, non-finite values null; missing
# parent directories made; write and create failures give one line naming
# the file.
. "$top_srcdir/test/common.sh"

PROG="$top_builddir/test/test_tfevents"
PY=/usr/bin/python3 # Debian's, with python3-protobuf and python3-crc32c

# expect_ok LABEL MODE DIR: exit 0, "0 failure(s)", nothing on stderr
expect_ok() {
    "$PROG" "$2" "$3" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 0 ] && ! grep -q '^FAIL' "$TMP/out" && tail -n 1 "$TMP/out" | grep -q '^0 failure(s)$' &&
        [ ! -s "$TMP/err" ]; then
        pass "$1: $(grep -c '^ok' "$TMP/out") checks"
    else
        fail "$1: exit $rc: $(grep -v '^ok' "$TMP/out" | tr '\n' ' ') stderr: $(head -c 1000 "$TMP/err")"
    fi
}

# expect_err LABEL WANT MODE DIR: exit 1, exactly one stderr line containing WANT
expect_err() {
    "$PROG" "$3" "$4" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && grep -q -- "$2" "$TMP/err" && ! grep -q '^FAIL' "$TMP/out"; then
        pass "$1: $(cat "$TMP/err")"
    else
        fail "$1: exit $rc, $lines stderr line(s), wanted '$2': $(head -c 1000 "$TMP/err") $(grep FAIL "$TMP/out")"
    fi
}

# decode_raw FILE: protoc --decode_raw of FILE in $TMP/raw; fails on any stderr
decode_raw() {
    protoc --decode_raw <"$1" >"$TMP/raw" 2>"$TMP/raw.err" && [ ! -s "$TMP/raw.err" ]
}

expect_ok "golden bytes" golden "$TMP/g"
if ! command -v protoc >/dev/null 2>&1; then
    fail "protoc not found: install Debian package protobuf-compiler (scripts/install-deps.sh)"
    finish
fi

# the golden file's two payloads (record = 12-byte head, data, 4-byte CRC)
gold="$TMP/g/a/b/c/events.out.tfevents.1700000000.host.4242.0"
tail -c +13 "$gold" | head -c 24 >"$TMP/gh.bin"
tail -c +53 "$gold" | head -c 32 >"$TMP/gs.bin"
if decode_raw "$TMP/gh.bin" && [ "$(cat "$TMP/raw")" = "$(printf '1: 0x41d954fc40000000\n3: "brain.Event:2"')" ]; then
    pass "decode_raw header: $(tr '\n' ' ' <"$TMP/raw")"
else
    fail "decode_raw header: $(cat "$TMP/raw" "$TMP/raw.err" | tr '\n' ' ')"
fi
want=$(printf '1: 0x41d954fc40200000\n2: 100\n5 {\n  1 {\n    1: "train/loss"\n    2: 0x40200000\n  }\n}')
if decode_raw "$TMP/gs.bin" && [ "$(cat "$TMP/raw")" = "$want" ]; then
    pass "decode_raw scalar: $(tr '\n' ' ' <"$TMP/raw" | tr -s ' ')"
else
    fail "decode_raw scalar: $(cat "$TMP/raw" "$TMP/raw.err" | tr '\n' ' ')"
fi
want=$(printf 'wall_time: 1700000000.5\nstep: 100\nsummary {\n  value {\n    tag: "train/loss"\n    simple_value: 2.5\n  }\n}')
if out=$(protoc -I "$top_srcdir/test" --decode=tbmin.Event "$top_srcdir/test/tbmin.proto" <"$TMP/gs.bin" 2>&1) &&
    [ "$out" = "$want" ]; then
    pass "decode with tbmin.proto: $(echo "$out" | tr '\n' ' ' | tr -s ' ')"
else
    fail "decode with tbmin.proto: $out"
fi

# a run of events: python reader (framing, CRCs, protobuf), decode_raw on each payload
mkdir -p "$TMP/run" "$TMP/pay" "$TMP/pb2"
"$PROG" write "$TMP/run" >"$TMP/out" 2>"$TMP/err"
rc=$?
events=$(head -n 1 "$TMP/out")
if [ "$rc" -ne 0 ] || [ -s "$TMP/err" ] || [ ! -f "$events" ]; then
    fail "write: exit $rc: $(cat "$TMP/out" "$TMP/err" | tr '\n' ' ')"
elif ! out=$(protoc -I "$top_srcdir/test" --python_out="$TMP/pb2" "$top_srcdir/test/tbmin.proto" 2>&1); then
    fail "protoc --python_out: $out"
elif ! $PY -c 'import crc32c, google.protobuf' 2>/dev/null; then
    fail "$PY cannot import crc32c and google.protobuf: install Debian packages python3-crc32c python3-protobuf (scripts/install-deps.sh)"
elif out=$($PY "$top_srcdir/test/tfevents_reader.py" "$events" "$TMP/run/expected.txt" "$TMP/pb2" "$TMP/pay" 2>&1); then
    pass "python3 reader: $out"
    n=0
    bad=""
    for p in "$TMP"/pay/*.bin; do
        n=$((n + 1))
        decode_raw "$p" || bad="$bad $(basename "$p"): $(cat "$TMP/raw.err")"
    done
    # the 200-byte tag (2-byte length varints) and step 2^40 decoded too
    decode_raw "$TMP/pay/015.bin" && grep -q '^    1: "long/xxx' "$TMP/raw" || bad="$bad 015.bin: no long tag"
    decode_raw "$TMP/pay/027.bin" && grep -qx '2: 1099511627776' "$TMP/raw" || bad="$bad 027.bin: no step 2^40"
    if [ -z "$bad" ] && [ "$n" -eq 28 ]; then
        pass "decode_raw: all $n payloads"
    else
        fail "decode_raw: $n payloads:$bad"
    fi
else
    fail "python3 reader: $out"
fi

# the trainer's step record (src/train/metrics.c): every promised tag, read by python
mkdir -p "$TMP/m" "$TMP/mpay"
"$PROG" metrics "$TMP/m" >"$TMP/out" 2>"$TMP/err"
rc=$?
events=$(head -n 1 "$TMP/out")
if [ "$rc" -eq 0 ] && [ ! -s "$TMP/err" ] && [ -f "$events" ] && ! grep -q '^FAIL' "$TMP/out" &&
    out=$($PY "$top_srcdir/test/tfevents_reader.py" "$events" "$TMP/m/expected.txt" "$TMP/pb2" "$TMP/mpay" 2>&1); then
    pass "step record as TensorBoard scalars: $out"
else
    fail "step record as TensorBoard scalars: exit $rc: $(cat "$TMP/out" "$TMP/err" | tr '\n' ' ') ${out:-}"
fi

# --metrics lines: strict JSON (no nan or inf literals), non-finite values null
mkdir -p "$TMP/j"
expect_ok "metrics_write_json" json "$TMP/j"
if out=$($PY -c '
import json, sys
def bad(c): raise ValueError("non-JSON constant " + c)
r = [json.loads(l, parse_constant=bad) for l in open(sys.argv[1])]
assert r[0]["loss"] == 3.25 and r[0]["grad_norm"] == 0.75 and "val_loss" not in r[0], r[0]
assert r[1]["loss"] is None and r[1]["grad_norm"] is None and r[1]["val_loss"] is None, r[1]
assert r[1]["lr"] == 3e-4 and r[1]["mfu"] == 0.4, r[1]
print("%d lines, step 8: loss %s, grad_norm %s, val_loss %s" % (len(r), r[1]["loss"], r[1]["grad_norm"], r[1]["val_loss"]))
' "$TMP/j/m.jsonl" 2>&1); then
    pass "--metrics JSON with non-finite values parses strictly: $out"
else
    fail "--metrics JSON: $out: $(cat "$TMP/j/m.jsonl")"
fi

# failures: one line naming the file
expect_err "write beyond a file size limit" "^cannot write '$TMP/fs/events.out.tfevents.1700000000.host.7.0': File too large" fsize "$TMP/fs"
: >"$TMP/plain"
expect_err "directory below a file" "^cannot create directory '$TMP/plain': a file of that name exists" open "$TMP/plain/sub"
finish
