#!/bin/sh
# dtrain-prepare end to end, against a reference written here in Python
# from doc/data.md (not from the C code):
#  - documents: one per text file, or the non-empty pieces between
#    --doc-separator occurrences, or one per JSONL line; gzip and zstd inputs
#  - the byte tokenizer's stream: each document, then "\n\n" when it does not
#    end with a newline; document d is validation iff floor((d+1)F) > floor(dF)
#  - llm.c shards: ceil(N/L) balanced shards, exact headers; stale shards go
#  - Megatron .bin/.idx: read back by test/megatron_reader.py (numpy, written
#    from the format) with the same documents
#  - the sidecar names the tokenizer; GPT-2 documents start with <|endoftext|>
#  - 1, 2 and 3 ranks write byte-identical files (several rounds, shards)
#  - bad usage and bad input: exit 2, exactly one line on stderr, on every
#    rank, and no output file appears
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
set -u
. "$top_srcdir/test/common.sh"

P=$TMP/out
PY=${PYTHON_REF:-/usr/bin/python3}
MPI="$MPIEXEC --quiet"
PREP=$DTRAIN_PREPARE

# Inputs: paragraphs with a "\n\n" separator (one piece starting with "\n"
# from a "\n\n\n"), every byte value with no final newline, JSONL with
# escapes, blank lines and CR LF, and compressed copies.
"$PY" - "$TMP" <<'EOF' || exit 1
import gzip, json, sys
d = sys.argv[1]
paras = [("Paragraph %d of the story, with some words.\n" % i) * (1 + i % 3) for i in range(40)]
text = "\n\n".join(p.rstrip("\n") for p in paras).replace("Paragraph 7", "\nParagraph 7", 1)
open(d + "/a.txt", "w").write(text + "\n")
open(d + "/b.txt", "wb").write(bytes(i % 256 for i in range(567)))
rows = [{"text": "doc %d \u00e9\u65e5 \"q\" \\ tab\t" % i * (1 + i % 4), "id": i} for i in range(30)]
with open(d + "/c.jsonl", "w", newline="") as f:
    for i, r in enumerate(rows):
        f.write(json.dumps(r) + ("\r\n" if i % 5 == 0 else "\n"))
        if i % 7 == 0:
            f.write("\n   \n")
with gzip.open(d + "/c.jsonl.gz", "wb") as f:
    f.write(open(d + "/c.jsonl", "rb").read())
EOF
zstd -q -19 -o "$TMP/a.txt.zst" "$TMP/a.txt" || exit 1

# ref.py PREFIX FORMAT F LIMIT SEP FILE...: the expected streams, checked
# against the files on disk. SEP is "" for one document per file.
cat >"$TMP/ref.py" <<'EOF'
import glob, gzip, json, os, struct, subprocess, sys
prefix, fmt, frac, limit, sep = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
inputs = sys.argv[6:]
sep = sep.encode().decode("unicode_escape").encode("latin-1")

def raw(path):
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
    return data

docs = []
for path in inputs:
    data = raw(path)
    if ".jsonl" in path:
        for line in data.split(b"\n"):
            if line.strip():
                docs.append(json.loads(line)["text"].encode("utf-8"))
    elif sep:
        docs += [p for p in data.split(sep) if p]
    else:
        docs.append(data)

splits = {"train": [], "val": []}
for d, doc in enumerate(docs):
    toks = doc if doc.endswith(b"\n") else doc + b"\n\n"
    val = int((d + 1) * frac) > int(d * frac)
    splits["val" if val else "train"].append(list(toks))

bad = []
for name, split_docs in splits.items():
    stream = [t for doc in split_docs for t in doc]
    if fmt == "megatron":
        got = subprocess.run([sys.executable, os.environ["READER"], "--json", "%s_%s" % (prefix, name)],
                             capture_output=True, text=True)
        if not split_docs:
            continue
        if got.returncode != 0:
            bad.append("megatron_reader %s_%s: %s" % (prefix, name, got.stderr.strip()))
            continue
        read = [json.loads(l) for l in got.stdout.splitlines()]
        if read != split_docs:
            bad.append("%s: the reader's %d documents differ from the %d expected" % (name, len(read), len(split_docs)))
        print("%s: %d documents, %d tokens" % (name, len(read), len(stream)))
        continue
    files = sorted(glob.glob("%s_%s_*.bin" % (prefix, name)))
    if not stream:
        if files:
            bad.append("%s: no tokens expected but found %s" % (name, files))
        continue
    n = (len(stream) + limit - 1) // limit
    names = ["%s_%s_%06d.bin" % (prefix, name, i) for i in range(n)]
    if files != names:
        bad.append("%s shards are %s, want %s" % (name, files, names))
        continue
    q, rem = divmod(len(stream), n)
    at = 0
    for i, f in enumerate(names):
        cnt = q + (i < rem)
        chunk = stream[at:at + cnt]
        at += cnt
        body = open(f, "rb").read()
        hdr = struct.unpack("<256i", body[:1024])
        if hdr[:3] != (20240520, 1, cnt) or any(hdr[3:]):
            bad.append("%s header %s, want 20240520 1 %d" % (f, hdr[:3], cnt))
        if list(struct.unpack("<%dH" % ((len(body) - 1024) // 2), body[1024:])) != chunk:
            bad.append("%s tokens differ from the reference" % f)
    print("%s: %d tokens in %d balanced shard(s) %s" % (name, len(stream), n, [q + (i < rem) for i in range(n)]))
for b in bad:
    print("FAIL: " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
export READER="$top_srcdir/test/megatron_reader.py"

# prep LABEL ARGS...: run dtrain-prepare, which must succeed quietly on stderr.
prep() {
    label=$1
    shift
    if "$@" >"$TMP/out.log" 2>"$TMP/err.log" && [ ! -s "$TMP/err.log" ]; then
        pass "$label"
    else
        fail "$label: exit $?, stderr: $(head -c 400 "$TMP/err.log")"
    fi
}
check() { # LABEL ref.py args
    label=$1
    shift
    if "$PY" "$TMP/ref.py" "$@" >"$TMP/ref.log" 2>&1; then
        pass "$label: $(tr '\n' ' ' <"$TMP/ref.log")"
    else
        fail "$label: $(cat "$TMP/ref.log")"
    fi
}

A=$TMP/a.txt B=$TMP/b.txt C=$TMP/c.jsonl

# 1. One document per file, defaults (F 0.1). Two documents: d=1 is not
#    validation (floor(0.2) = 0) so F=0.5 is needed for a val split.
prep "two files, F 0.5" $PREP --out "$P" --val-fraction 0.5 "$A" "$B"
check "two files, F 0.5" "$P" llmc 0.5 100000000 "" "$A" "$B"

# 2. Paragraph documents, small balanced shards, then back to one shard:
#    the stale shards of the first run are removed.
prep "paragraphs, 300-token shards" $PREP --out "$P" --doc-separator '\n\n' --val-fraction 0.25 --shard-tokens 300 "$A" "$B"
check "paragraphs, 300-token shards" "$P" llmc 0.25 300 '\n\n' "$A" "$B"
prep "paragraphs, one shard" $PREP --out "$P" --doc-separator '\n\n' --val-fraction 0.25 "$A" "$B"
grep -q "removed (stale" "$TMP/out.log" && pass "stale shards reported removed" || fail "no stale removal: $(cat "$TMP/out.log")"
check "paragraphs, one shard" "$P" llmc 0.25 100000000 '\n\n' "$A" "$B"

# 2b. One text file, no --doc-separator, the default F 0.1: its paragraphs
#     are the documents (a note says so), the same output as asking for it.
prep "one file, no separator" $PREP --out "$TMP/lone" "$A"
if grep -q "^dtrain-prepare: note: one text file and no --doc-separator: its paragraphs (text between blank lines) are the documents" "$TMP/out.log"; then
    pass "one text file: the note says it is split at its paragraphs"
else
    fail "one text file: no note: $(head -c 300 "$TMP/out.log")"
fi
check "one file, no separator" "$TMP/lone" llmc 0.1 100000000 '\n\n' "$A"
prep "one file, explicit separator" $PREP --out "$TMP/lone2" --doc-separator '\n\n' "$A"
cmp -s "$TMP/lone_train_000000.bin" "$TMP/lone2_train_000000.bin" && cmp -s "$TMP/lone_val_000000.bin" "$TMP/lone2_val_000000.bin" &&
    pass "one text file: the same files as --doc-separator '\\n\\n'" || fail "one text file: output differs from --doc-separator '\\n\\n'"

# 3. F = 0: no validation files, the old ones removed.
prep "F 0" $PREP --out "$P" --val-fraction 0 --doc-separator '\n\n' "$A"
[ -e "$P"_val_000000.bin ] && fail "F 0 left a val shard" || pass "F 0 removed the val shard"
check "F 0" "$P" llmc 0 100000000 '\n\n' "$A"

# 4. JSONL (plain, gzip) and zstd text; the Megatron format.
prep "jsonl + gz + zst" $PREP --out "$P" --input-format jsonl "$C" "$C.gz"
check "jsonl + gz" "$P" llmc 0.1 100000000 "" "$C" "$C.gz"
prep "zstd text" $PREP --out "$P" --doc-separator '\n\n' "$A.zst"
check "zstd text" "$P" llmc 0.1 100000000 '\n\n' "$A.zst"
prep "megatron" $PREP --out "$TMP/m" --format megatron --doc-separator '\n\n' --val-fraction 0.2 "$A" "$B"
check "megatron (numpy reader)" "$TMP/m" megatron 0.2 0 '\n\n' "$A" "$B"

# 5. The sidecar.
S="$P.tokenizer.json"
prep "sidecar run" $PREP --out "$P" --doc-separator '\n\n' "$A"
"$PY" - "$S" <<'EOF' && pass "byte sidecar: kind byte, vocabulary 256" || fail "byte sidecar: $(cat "$S")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["kind"] == "byte" and s["vocab_size"] == 256, s
EOF

# 6. 1, 2 and 3 ranks: the same bytes (rounds of 5 documents, 200-token
#    shards, both formats, JSONL too).
for fmt in llmc megatron; do
    for np in 1 2 3; do
        prep "$fmt np $np" $MPI -np $np $PREP --out "$TMP/np$np/$fmt" --format $fmt --round-docs 5 \
            --shard-tokens 200 --doc-separator '\n\n' --val-fraction 0.3 "$A" "$B"
        prep "jsonl np $np" $MPI -np $np $PREP --out "$TMP/np$np/j$fmt" --format $fmt --round-docs 3 "$C" "$C.gz"
    done
done
for np in 2 3; do
    if diff -r "$TMP/np1" "$TMP/np$np" >/dev/null; then
        pass "np $np output is byte-identical to np 1 ($(ls "$TMP/np1" | wc -l) files)"
    else
        fail "np $np output differs from np 1: $(diff -rq "$TMP/np1" "$TMP/np$np" | head -3)"
    fi
done
check "np 3 llmc" "$TMP/np3/llmc" llmc 0.3 200 '\n\n' "$A" "$B"

# 6b. The same with many documents: after the first round of 700, each
#     rank takes runs of neighbouring paragraphs and writes them together,
#     and a rank's writes fill the 1 MiB write buffer (1.3 MB of text).
"$PY" - "$TMP/many.txt" <<'EOF' || exit 1
import sys
paras = [("Paragraph %d: " % i) + "lorem ipsum dolor " * (5 + i % 40) for i in range(3000)]
open(sys.argv[1], "w").write("\n\n".join(paras))
EOF
for fmt in llmc megatron; do
    for np in 1 2 3; do
        prep "many $fmt np $np" $MPI -np $np $PREP --out "$TMP/many$np/$fmt" --format $fmt --round-docs 700 \
            --shard-tokens 500000 --doc-separator '\n\n' --val-fraction 0.1 "$TMP/many.txt"
    done
done
for np in 2 3; do
    if diff -r "$TMP/many1" "$TMP/many$np" >/dev/null; then
        pass "many documents: np $np output is byte-identical to np 1"
    else
        fail "many documents: np $np output differs from np 1: $(diff -rq "$TMP/many1" "$TMP/many$np" | head -3)"
    fi
done
check "many documents np 2 llmc" "$TMP/many2/llmc" llmc 0.1 500000 '\n\n' "$TMP/many.txt"

# 6c. Uncompressed inputs are mapped and their documents found by byte
#     ranges, one per rank; compressed ones are streamed whole by every
#     rank. Both give the same bytes, at 1, 2 and 3 ranks (text cut at
#     '\n\n', JSONL lines).
prep "streamed text" $PREP --out "$TMP/str/t" --round-docs 5 --doc-separator '\n\n' "$A.zst"
prep "streamed jsonl" $PREP --out "$TMP/str/j" --round-docs 3 "$C.gz"
for np in 1 2 3; do
    prep "mapped text np $np" $MPI -np $np $PREP --out "$TMP/map$np/t" --round-docs 5 --doc-separator '\n\n' "$A"
    prep "mapped jsonl np $np" $MPI -np $np $PREP --out "$TMP/map$np/j" --round-docs 3 --input-format jsonl "$C"
    if diff -r "$TMP/str" "$TMP/map$np" >/dev/null; then
        pass "mapped inputs at np $np: byte-identical to streamed ($(ls "$TMP/str" | wc -l) files)"
    else
        fail "mapped inputs at np $np differ from streamed: $(diff -rq "$TMP/str" "$TMP/map$np" | head -3)"
    fi
done

# 7. GPT-2 BPE (when the vocabulary is there): each document starts with
#    <|endoftext|> 50256 and the rest is the tokenizer's encoding of it.
if "$top_builddir/test/tok_tool" info gpt2 >/dev/null 2>&1; then
    prep "gpt2" $PREP --out "$TMP/g" --tokenizer gpt2 --val-fraction 0 --doc-separator '\n\n' "$A"
    "$PY" - "$TMP/g_train_000000.bin" "$TMP/g.tokenizer.json" <<'EOF' && pass "gpt2: 50256 starts every document; sidecar gpt2/50257" || fail "gpt2 shard or sidecar"
import json, struct, sys
body = open(sys.argv[1], "rb").read()
hdr = struct.unpack("<256i", body[:1024])
tok = struct.unpack("<%dH" % hdr[2], body[1024:])
assert hdr[0] == 20240520 and tok[0] == 50256 and tok.count(50256) == 40, (hdr[:3], tok[:3], tok.count(50256))
s = json.load(open(sys.argv[2]))
assert s["kind"] == "gpt2" and s["vocab_size"] == 50257 and s["doc_start"] == 50256, s
EOF
else
    echo "note: gpt2 tokenizer not available: GPT-2 checks skipped"
fi

# 8. Bad usage and bad input: exit 2, one line, no outputs.
Q=$TMP/q
expect_exit2 "unknown option '--bogus'" $PREP --bogus --out "$Q" "$A"
expect_exit2 "--out needs a value" $PREP "$A" --out
expect_exit2 "--out PREFIX is required" $PREP "$A"
expect_exit2 "no input FILE" $PREP --out "$Q"
expect_exit2 "--val-fraction '1.5'" $PREP --out "$Q" --val-fraction 1.5 "$A"
expect_exit2 "--shard-tokens '0'" $PREP --out "$Q" --shard-tokens 0 "$A"
expect_exit2 "--shard-tokens '2147483648'" $PREP --out "$Q" --shard-tokens 2147483648 "$A"
expect_exit2 "--format 'parquet'" $PREP --out "$Q" --format parquet "$A"
expect_exit2 "unknown tokenizer 'bpe'" $PREP --out "$Q" --tokenizer bpe "$A"
expect_exit2 "--doc-separator is for text inputs" $PREP --out "$Q" --doc-separator x "$C"
expect_exit2 "inputs are named" $PREP --out "$Q" "$A" "$C"
expect_exit2 "missing.txt" $PREP --out "$Q" "$A" "$TMP/missing.txt"
expect_exit2 "is a directory" $PREP --out "$Q" "$A" "$TMP"
expect_exit2 "validation split is empty" $PREP --out "$Q" --val-fraction 0.3 "$A" "$B"
printf '{"text": "ok"}\n{"text": "broken"\n' >"$TMP/bad.jsonl"
expect_exit2 "bad.jsonl:2" $MPI -np 2 $PREP --out "$Q" "$TMP/bad.jsonl"
printf '{"text": "ok"}\n{"body": "x"}\n' >"$TMP/nofield.jsonl"
expect_exit2 "nofield.jsonl:2" $MPI -np 3 $PREP --out "$Q" "$TMP/nofield.jsonl"
expect_exit2 "no \"body\" field" $PREP --out "$Q" --jsonl-field body "$C"
# A bad line one rank owns, with the rest of its round spread over many
# mapped windows (DTRAIN_PREPARE_WINDOW_BYTES, a test-only knob: 64 bytes
# per rank): the failing rank must read on to the round's end with the
# others, through the same window exchanges, or the ranks hang in
# different collectives (timeout: exit 124). Line 2 is rank 1's, line 3
# rank 2's at 3 ranks; the gzip copy is streamed, with no exchanges.
"$PY" - "$TMP" <<'EOF' || exit 1
import gzip, sys
for bad in (2, 3):
    rows = ['{"text": "document %d with a few words"}\n' % i for i in range(60)]
    rows[bad - 1] = '{"text": "broken"\n'
    open(sys.argv[1] + "/bad%d.jsonl" % bad, "w").write("".join(rows))
    with gzip.open(sys.argv[1] + "/bad%d.jsonl.gz" % bad, "wt") as f:
        f.write("".join(rows))
EOF
for np in 2 3; do
    expect_exit2 "bad2.jsonl:2: not valid JSON" env DTRAIN_PREPARE_WINDOW_BYTES=64 timeout 60 $MPI -np $np $PREP --out "$Q" "$TMP/bad2.jsonl"
done
expect_exit2 "bad3.jsonl:3: not valid JSON" env DTRAIN_PREPARE_WINDOW_BYTES=64 timeout 60 $MPI -np 3 $PREP --out "$Q" "$TMP/bad3.jsonl"
expect_exit2 "bad3.jsonl.gz:3: not valid JSON" timeout 60 $MPI -np 3 $PREP --out "$Q" "$TMP/bad3.jsonl.gz"
head -c 300 "$C.gz" >"$TMP/cut.jsonl.gz"
expect_exit2 "cut.jsonl.gz" $MPI -np 2 $PREP --out "$Q" "$TMP/cut.jsonl.gz"
if ls "$Q"* >/dev/null 2>&1; then fail "failed runs left files: $(ls "$Q"*)"; else pass "no files left by failed runs"; fi

# --help and --version go to stdout and succeed.
$PREP --help >"$TMP/h" 2>&1 && grep -q '^Usage: dtrain-prepare --out PREFIX' "$TMP/h" && pass "--help" || fail "--help: $(head -3 "$TMP/h")"
$PREP --version >"$TMP/h" 2>&1 && grep -q '^dtrain-prepare (dtrain) [0-9]' "$TMP/h" && pass "--version" || fail "--version"

finish
