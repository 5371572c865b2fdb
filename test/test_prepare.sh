#!/bin/sh
# dtrain-prepare end to end: the shards it writes hold exactly the bytes of
# the inputs, split per file at floor(n * F), in llm.c uint16 format, cut
# at --shard-tokens, with stale shards of earlier runs removed; bad usage
# exits 2 and a missing input exits 1, each with one line on stderr.
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
set -u

if [ -z "${DTRAIN_PREPARE:-}" ]; then
    echo "FAIL: DTRAIN_PREPARE is not set (make check sets it to src/dtrain-prepare)" >&2
    exit 1
fi
if [ ! -x "$DTRAIN_PREPARE" ]; then
    echo "FAIL: DTRAIN_PREPARE=$DTRAIN_PREPARE is not an executable" >&2
    exit 1
fi

# Any python3 will do (only the standard library is used); prefer
# Debian's, which the rest of the suite uses too.
PY=
for p in "${PYTHON_REF:-}" /usr/bin/python3 python3; do
    if [ -n "$p" ] && command -v "$p" >/dev/null 2>&1; then
        PY=$p
        break
    fi
done
if [ -z "$PY" ]; then
    echo "SKIP: no python3 to check the shard contents" >&2
    exit 77
fi

mkdir -p test || exit 1
tmp=$(mktemp -d test/tmp.prepare.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# Two inputs: a text that ends with a newline, and one holding every byte
# value 0..255 that does not (so it gets the "\n\n" separator).
"$PY" - "$tmp" <<'EOF' || fail "cannot create the input files"
import sys
d = sys.argv[1]
line = b"It is a truth universally acknowledged, that a single man.\n"
a = (line * 30)[:1233] + b"\n"
b = bytes(i % 256 for i in range(567))
assert len(a) == 1234 and a.endswith(b"\n")
assert len(b) == 567 and not b.endswith(b"\n")
open(d + "/a.txt", "wb").write(a)
open(d + "/b.txt", "wb").write(b)
EOF

# check.py PREFIX F SHARD_TOKENS FILE... : recompute the expected train/val
# token streams from the inputs and compare them with every shard on disk.
cat >"$tmp/check.py" <<'EOF'
import glob, os, struct, sys

prefix, frac, limit = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
inputs = sys.argv[4:]
want = {"train": b"", "val": b""}
for path in inputs:
    data = open(path, "rb").read()
    if not data.endswith(b"\n"):
        data += b"\n\n"
    n = len(data)
    n_val = int(n * frac)          # floor(n * F), as dtrain-prepare does
    n_val = min(n_val, n - 1)
    want["train"] += data[: n - n_val]
    want["val"] += data[n - n_val :]

bad = []
for split in ("train", "val"):
    stream = want[split]
    files = sorted(glob.glob("%s_%s_*.bin" % (prefix, split)))
    n_shards = (len(stream) + limit - 1) // limit
    names = ["%s_%s_%06d.bin" % (prefix, split, i) for i in range(n_shards)]
    if files != names:
        bad.append("%s shards are %s, want %s" % (split, files, names))
        continue
    for i, name in enumerate(names):
        chunk = stream[i * limit : (i + 1) * limit]
        raw = open(name, "rb").read()
        hdr = struct.unpack("<256i", raw[:1024])
        if hdr[0] != 20240520 or hdr[1] != 1 or hdr[2] != len(chunk):
            bad.append("%s header %d %d %d, want 20240520 1 %d"
                       % (name, hdr[0], hdr[1], hdr[2], len(chunk)))
        if any(hdr[3:]):
            bad.append("%s header words 3..255 are not zero" % name)
        if len(raw) != 1024 + 2 * len(chunk):
            bad.append("%s is %d bytes, want %d"
                       % (name, len(raw), 1024 + 2 * len(chunk)))
            continue
        tok = struct.unpack("<%dH" % len(chunk), raw[1024:])
        if list(tok) != list(chunk):
            first = next(j for j in range(len(chunk)) if tok[j] != chunk[j])
            bad.append("%s token %d is %d, want byte %d"
                       % (name, first, tok[first], chunk[first]))
    print("%s: %d tokens in %d shard(s)" % (split, len(stream), n_shards))
if bad:
    for b in bad:
        print("FAIL: " + b, file=sys.stderr)
    sys.exit(1)
EOF

A=$tmp/a.txt
B=$tmp/b.txt
P=$tmp/d

# 1. Defaults: F = 0.1, one shard per split.
#    a: 1234 bytes -> val 123, train 1111
#    b:  567 bytes + "\n\n" = 569 -> val 56, train 513
"$DTRAIN_PREPARE" --out "$P" "$A" "$B" >"$tmp/out" 2>"$tmp/err" ||
    fail "default run exited $?: $(cat "$tmp/err")"
[ -s "$tmp/err" ] && fail "default run wrote to stderr: $(cat "$tmp/err")"
printf '%s\n' "$P""_train_000000.bin: 1624 tokens" "$P""_val_000000.bin: 179 tokens" >"$tmp/want"
cmp -s "$tmp/out" "$tmp/want" || fail "default run printed:
$(cat "$tmp/out")
want:
$(cat "$tmp/want")"
"$PY" "$tmp/check.py" "$P" 0.1 100000000 "$A" "$B" || fail "default run shards"

# 2. Inputs reversed, F = 0.25, 500-token shards:
#    b: 569 -> val 142, train 427;  a: 1234 -> val 308, train 926
#    train 1353 = 500 + 500 + 353;  val 450
"$DTRAIN_PREPARE" --out "$P" --val-fraction 0.25 --shard-tokens 500 "$B" "$A" \
    >"$tmp/out" 2>"$tmp/err" || fail "sharded run exited $?: $(cat "$tmp/err")"
printf '%s\n' "$P""_train_000000.bin: 500 tokens" "$P""_train_000001.bin: 500 tokens" \
    "$P""_train_000002.bin: 353 tokens" "$P""_val_000000.bin: 450 tokens" >"$tmp/want"
cmp -s "$tmp/out" "$tmp/want" || fail "sharded run printed:
$(cat "$tmp/out")"
"$PY" "$tmp/check.py" "$P" 0.25 500 "$B" "$A" || fail "sharded run shards"

# 3. Back to one shard: the run must remove train shards 1 and 2, or a
#    reader's glob would mix them with the new data.
"$DTRAIN_PREPARE" --out "$P" --tokenizer byte "$A" "$B" >"$tmp/out" 2>"$tmp/err" ||
    fail "re-run exited $?: $(cat "$tmp/err")"
[ "$(grep -c 'removed' "$tmp/out")" -eq 2 ] || fail "re-run did not report 2 removed shards:
$(cat "$tmp/out")"
"$PY" "$tmp/check.py" "$P" 0.1 100000000 "$A" "$B" || fail "re-run shards"

# 4. F = 0: everything is training data and the old val shard goes.
"$DTRAIN_PREPARE" --out "$P" --val-fraction 0 "$A" "$B" >"$tmp/out" 2>"$tmp/err" ||
    fail "F=0 run exited $?: $(cat "$tmp/err")"
grep -q "_train_000000.bin: 1803 tokens" "$tmp/out" || fail "F=0 printed: $(cat "$tmp/out")"
[ -e "$P""_val_000000.bin" ] && fail "F=0 left a val shard"
"$PY" "$tmp/check.py" "$P" 0 100000000 "$A" "$B" || fail "F=0 shards"

# Usage errors: exit 2, exactly one line on stderr naming the problem.
# expect_fail CODE KEYWORD ARGS...
expect_fail() {
    code=$1
    key=$2
    shift 2
    "$DTRAIN_PREPARE" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" -eq "$code" ] || fail "'$*' exited $rc, want $code"
    lines=$(wc -l <"$tmp/err")
    [ "$lines" -eq 1 ] || fail "'$*' wrote $lines lines to stderr, want 1: $(cat "$tmp/err")"
    grep -q -e "$key" "$tmp/err" || fail "'$*' error lacks '$key': $(cat "$tmp/err")"
    [ -s "$tmp/out" ] && fail "'$*' wrote to stdout: $(cat "$tmp/out")"
    echo "exit $rc as expected: $(cat "$tmp/err")"
}
Q=$tmp/q
expect_fail 2 "unknown option '--bogus'" --bogus --out "$Q" "$A"
expect_fail 2 "unknown option '-x'" -x --out "$Q" "$A"
expect_fail 2 "'--out' needs a value" "$A" --out
expect_fail 2 "--out PREFIX is required" "$A"
expect_fail 2 "no input FILE" --out "$Q"
expect_fail 2 "--val-fraction '1.5'" --out "$Q" --val-fraction 1.5 "$A"
expect_fail 2 "--val-fraction 'abc'" --out "$Q" --val-fraction abc "$A"
expect_fail 2 "--val-fraction '-0.1'" --out "$Q" --val-fraction=-0.1 "$A"
expect_fail 2 "--shard-tokens '0'" --out "$Q" --shard-tokens 0 "$A"
expect_fail 2 "--shard-tokens '12x'" --out "$Q" --shard-tokens 12x "$A"
expect_fail 2 "--shard-tokens '2147483648'" --out "$Q" --shard-tokens 2147483648 "$A"
expect_fail 2 "GPT-2 BPE is not implemented" --out "$Q" --tokenizer gpt2 "$A"

# Input errors: exit 1, one line, nothing written even for the good file
# named before the bad one.
expect_fail 1 "$tmp/missing.txt" --out "$Q" "$A" "$tmp/missing.txt"
: >"$tmp/empty.txt"
expect_fail 1 "empty.txt' is empty" --out "$Q" "$A" "$tmp/empty.txt"
expect_fail 1 "is a directory" --out "$Q" "$A" "$tmp"
expect_fail 1 "validation split is empty" --out "$Q" --val-fraction 0.001 "$B"
ls "$Q"_* >/dev/null 2>&1 && fail "a failed run left files: $(ls "$Q"_*)"
expect_fail 1 "no/such/dir/x_train_000000.bin.tmp" --out "$tmp/no/such/dir/x" "$A"

# --help and --version go to stdout and succeed.
"$DTRAIN_PREPARE" --help >"$tmp/out" 2>&1 || fail "--help exited $?"
grep -q '^Usage: dtrain-prepare --out PREFIX' "$tmp/out" || fail "--help printed: $(cat "$tmp/out")"
"$DTRAIN_PREPARE" --version >"$tmp/out" 2>&1 || fail "--version exited $?"
grep -q '^dtrain-prepare (dtrain) [0-9][0-9.]*' "$tmp/out" || fail "--version printed: $(cat "$tmp/out")"

echo "test_prepare: all checks passed"
exit 0
