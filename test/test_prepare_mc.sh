#!/bin/sh
# dtrain-prepare --eval-mc end to end, against references written here:
#  - a Python reader of the eval format, from io/evalmc.h's header comment
#    and doc/data.md (struct.unpack; no dtrain code), checks every header
#    field and example: START marker, size, index, label, completions,
#    the longest-example field, no trailing bytes
#  - the ids, context = encode(context) and ending = encode(" " + ending),
#    are js-tiktoken's (gpt2, cl100k_base; ordinary encoding) and the UTF-8
#    bytes for the byte tokenizer (with and without the leading space)
#  - gpt2 and byte write version 1 (uint16), cl100k_base version 2 (uint32)
#  - 1 and 2 ranks write the same bytes
#  - bad input and bad usage: exit 2, one line on stderr naming the file
#    and line, and no output file
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
set -u
. "$top_srcdir/test/common.sh"

PY=${PYTHON_REF:-/usr/bin/python3}
PREP=$DTRAIN_PREPARE
DIR=${DTRAIN_TOKENIZERS:-$top_srcdir/tokenizers}
REF="$top_srcdir/test/tiktoken_ref.mjs"

# The examples: HellaSwag's "ctx" as well as "context", 2 to 5 endings,
# a label given as a string, unicode (accents, CJK, emoji, a combining
# mark), quotes and backslashes, a NUL from \u0000, a blank line and CR LF.
"$PY" - "$TMP/mc.jsonl" <<'EOF' || exit 1
import json, sys
ex = [
    {"context": "A man is sitting on a roof. He", "endings": ["is using wrap to wrap a pair of skis.",
     "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "label": 3},
    {"ctx": "Caf\u00e9 na\u00efve r\u00e9sum\u00e9: the chef", "endings": ["cooks.", "sleeps \u65e5\u672c\u8a9e."],
     "label": 0},
    {"context": "Emoji \U0001F44B\U0001F3FD and e\u0301 then", "endings": ["\U0001F600 smiles", "frowns",
     "\"quotes\" and \\ backslash"], "label": "2"},
    {"context": "Numbers 12345 and  spaces\ttabs", "endings": ["one", "two", "three", "four", "five"], "label": 4},
    {"context": "Which is a gas at room temperature?", "endings": ["Iron", "Oxygen", "Salt"], "label": 1},
    {"context": "To open a jar, you should", "endings": ["twist the lid counterclockwise.",
     "twist the lid clockwise."], "label": 0},
    {"context": "A NUL \u0000 inside and a newline\nhere", "endings": ["ok\u0000", "fine"], "label": 1},
    {"context": "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439, \u043c\u0438\u0440 and "
     "\u0645\u0631\u062d\u0628\u0627", "endings": ["\ud55c\uad6d\uc5b4", "\u0928\u092e\u0938\u094d\u0924\u0947",
     "\u05e9\u05dc\u05d5\u05dd", "\u00df\u1e9e"], "label": 2},
]
with open(sys.argv[1], "w", encoding="utf-8", newline="") as f:
    for i, e in enumerate(ex):
        f.write(json.dumps(e, ensure_ascii=i % 2 == 0) + ("\r\n" if i == 3 else "\n"))
        if i == 1:
            f.write("  \n")
EOF

# read.py FILE: the file's examples, read by the format alone, as JSON
# {"version", "examples": [{"index", "label", "ctx": [...], "endings": [[...]]}]}
cat >"$TMP/read.py" <<'EOF'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
assert len(data) >= 1024, "shorter than the header"
hdr = struct.unpack("<256i", data[:1024])
assert hdr[0] == 20240522, "magic %d" % hdr[0]
assert hdr[1] in (1, 2), "version %d" % hdr[1]
assert all(v == 0 for v in hdr[4:]), "header words 4..255 are not 0"
w, fmt, start = (2, "<H", 0xFFFF) if hdr[1] == 1 else (4, "<I", 0xFFFFFFFF)
body = data[1024:]
assert len(body) % w == 0, "body not whole words"
words = [v[0] for v in struct.iter_unpack(fmt, body)]
at, examples, longest = 0, [], 0
for e in range(hdr[2]):
    assert words[at] == start, "example %d: no start marker" % e
    size, index, label, nc = words[at + 1:at + 5]
    assert size % w == 0 and index == e and 2 <= nc <= 32 and label < nc, (e, size, index, label, nc)
    end, p = at + size // w, at + 5
    n = words[p]; ctx = words[p + 1:p + 1 + n]; p += 1 + n
    ends = []
    for c in range(nc):
        n = words[p]; assert n > 0, "empty ending"
        ends.append(words[p + 1:p + 1 + n]); p += 1 + n
    assert p == end, "example %d: fields do not fill its %d bytes" % (e, size)
    assert start not in ctx and all(start not in x for x in ends)
    longest = max(longest, size)
    examples.append({"index": index, "label": label, "ctx": ctx, "endings": ends})
    at = end
assert at == len(words), "bytes after the last example"
assert hdr[3] == longest, "longest field %d, examples' %d" % (hdr[3], longest)
print(json.dumps({"version": hdr[1], "examples": examples}))
EOF

# check.py FILE JSONL KIND SPACE VERSION TMP REFDIR REFPY: FILE's examples against the
# JSONL's, ids from REFDIR/t_N.ids (KIND js) or UTF-8 bytes (KIND byte).
# test/ref/mc_texts.py JSONL SPACE DIR writes the strings to encode,
# DIR/t_N.txt, and prints "IN OUT" pairs for test/tiktoken_ref.mjs.
cat >"$TMP/check.py" <<'EOF'
import json, subprocess, sys
sys.path.insert(0, sys.argv[6])
sys.path.insert(0, sys.argv[8])
from mc_texts import texts
path, jsonl, kind, space, version = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
refdir = sys.argv[7]
got = json.loads(subprocess.run([sys.executable, sys.argv[6] + "/read.py", path], check=True,
                                capture_output=True, text=True).stdout)
assert got["version"] == version, "version %d, expected %d" % (got["version"], version)
rows = [json.loads(l) for l in open(jsonl, encoding="utf-8") if l.strip()]
want_text = texts(jsonl, space)
def ref(i):
    if kind == "byte":
        return list(want_text[i].encode("utf-8"))
    return [int(x) for x in open("%s/t_%d.ids" % (refdir, i)).read().split()]
assert len(got["examples"]) == len(rows), "%d examples, expected %d" % (len(got["examples"]), len(rows))
k, bad, ids, largest = 0, 0, 0, 0
for e, (x, r) in enumerate(zip(got["examples"], rows)):
    if x["label"] != int(r["label"]) or len(x["endings"]) != len(r["endings"]):
        bad += 1
    for seq in [x["ctx"]] + x["endings"]:
        want = ref(k); k += 1
        bad += seq != want; ids += len(seq)
        largest = max([largest] + seq)
print("%d examples, %d sequences, %d ids (largest %d), %d mismatch(es)" % (len(rows), k, ids, largest, bad))
# version 2 must carry ids above 65,535 here, or uint32 is chosen but untested
sys.exit(bad != 0 or (version == 2 and largest <= 65535))
EOF

# prepared LABEL KIND SPACE VERSION OUT ARGS...: prepare, then check
prepared() {
    label=$1 kind=$2 space=$3 version=$4 out=$5
    shift 5
    if ! "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$out" --eval-mc-space "$space" "$@" >"$TMP/log" 2>&1; then
        fail "$label: dtrain-prepare failed: $(cat "$TMP/log")"
    elif ! grep -q "^$out: 8 examples (2 to 5 endings), .* version $version " "$TMP/log"; then
        fail "$label: summary line: $(cat "$TMP/log")"
    elif res=$("$PY" "$TMP/check.py" "$out" "$TMP/mc.jsonl" "$kind" "$space" "$version" "$TMP" "$TMP/ref.$label" "$top_srcdir/test/ref" 2>&1); then
        pass "$label: version $version, $res"
    else
        fail "$label: $res"
    fi
}

# js_ref LABEL ENCODING SPACE: js-tiktoken's ids of every string, in $TMP/ref.LABEL
js_ref() {
    mkdir -p "$TMP/ref.$1" && "$PY" "$top_srcdir/test/ref/mc_texts.py" "$TMP/mc.jsonl" "$3" "$TMP/ref.$1" >"$TMP/pairs" &&
        node "$REF" "$DIR/node" "$2" $(cat "$TMP/pairs") 2>/dev/null
}

# ---- (b) the byte tokenizer, with and without the leading space ----
prepared byte byte 1 1 "$TMP/byte.bin" --tokenizer byte
prepared byte-nospace byte 0 1 "$TMP/sub/byte0.bin" --tokenizer byte

# ---- 1 and 2 ranks: the same bytes ----
if $MPIEXEC --quiet -np 2 "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$TMP/byte2.bin" >"$TMP/log" 2>&1 &&
    cmp -s "$TMP/byte.bin" "$TMP/byte2.bin"; then
    pass "2 ranks write the same file as 1"
else
    fail "2 ranks: $(head -c 300 "$TMP/log")"
fi

# ---- (a) gpt2 and (c) cl100k_base against js-tiktoken ----
if [ ! -f "$DIR/gpt2/encoder.json" ]; then
    echo "SKIP part: no GPT-2 vocabulary in $DIR/gpt2 (scripts/fetch-tokenizers.sh)"
elif ! command -v node >/dev/null 2>&1 || [ ! -f "$DIR/node/node_modules/js-tiktoken/package.json" ]; then
    echo "SKIP part: no node or no js-tiktoken in $DIR/node (scripts/fetch-tokenizers.sh)"
else
    js_ref gpt2 gpt2 1 || fail "gpt2: js-tiktoken failed"
    prepared gpt2 js 1 1 "$TMP/gpt2.bin" --tokenizer "gpt2:$DIR/gpt2"
    if [ -f "$DIR/tiktoken/cl100k_base.tiktoken" ]; then
        js_ref cl100k cl100k_base 1 || fail "cl100k_base: js-tiktoken failed"
        prepared cl100k js 1 2 "$TMP/cl100k.bin" --tokenizer "tiktoken:$DIR/tiktoken/cl100k_base.tiktoken"
    else
        fail "no $DIR/tiktoken/cl100k_base.tiktoken: run scripts/fetch-tokenizers.sh"
    fi
fi

# ---- (d) bad input: exit 2, one line, no file ----
# bad NAME WANT LINE...: a JSONL of a good example then LINE..., rejected
good='{"context": "The sky is", "endings": ["blue", "green"], "label": 0}'
bad() {
    name=$1 want=$2
    shift 2
    printf '%s\n' "$good" "$@" >"$TMP/bad_$name.jsonl"
    expect_exit2 "$want" "$PREP" --eval-mc "$TMP/bad_$name.jsonl" --out "$TMP/bad_$name.bin"
    [ ! -e "$TMP/bad_$name.bin" ] && [ -z "$(ls "$TMP" | grep "bad_$name.bin.")" ] ||
        fail "$name: an output file was left: $(ls "$TMP" | grep "bad_$name")"
}
bad notjson "bad_notjson.jsonl:2: not JSON" '{"context": "x", "endings": ["a", "b"], "label": 0'
bad array "bad_array.jsonl:2: not a JSON object" '["x", ["a", "b"], 0]'
bad noctx 'bad_noctx.jsonl:2: no "context" (or "ctx") field' '{"endings": ["a", "b"], "label": 0}'
bad noendings 'bad_noendings.jsonl:2: no "endings" field' '{"context": "x", "label": 0}'
bad nolabel 'bad_nolabel.jsonl:2: no "label" field' '{"context": "x", "endings": ["a", "b"]}'
bad ctxnum '"context" is not a string' '{"context": 5, "endings": ["a", "b"], "label": 0}'
bad ctxempty '"context" is empty' '{"context": "", "endings": ["a", "b"], "label": 0}'
bad endobj '"endings" is not an array' '{"context": "x", "endings": "ab", "label": 0}'
bad labelfloat '"label" is not an integer' '{"context": "x", "endings": ["a", "b"], "label": 1.5}'
bad labelhigh "bad_labelhigh.jsonl:3: label 2 is out of range" "$good" '{"context": "x", "endings": ["a", "b"], "label": 2}'
bad labelneg "label -1 is out of range" '{"context": "x", "endings": ["a", "b"], "label": -1}'
bad oneending "bad_oneending.jsonl:2: 1 endings: an example has 2 to 32" '{"context": "x", "endings": ["a"], "label": 0}'
bad manyendings "33 endings: an example has 2 to 32" \
    "{\"context\": \"x\", \"endings\": [$(seq -s, 1 33 | sed 's/[0-9]*/"&"/g')], \"label\": 0}"
bad emptyending "ending 1 is empty" '{"context": "x", "endings": ["a", ""], "label": 0}'
bad numending "ending 0 is not a string" '{"context": "x", "endings": [7, "b"], "label": 0}'
bad trailing "bad_trailing.jsonl:2: not JSON" '{"context": "x", "endings": ["a", "b"], "label": 0} x'
bad control "bad_control.jsonl:2: not JSON" "$(printf '{"context": "a\033\rb", "endings": ["a", "b"], "label": 0}')"
grep -q "$(printf '\033')" "$TMP/err" && fail "control: the raw ESC byte reached the error line" || pass "control: no raw control byte in the line"
: >"$TMP/empty.jsonl"
expect_exit2 "holds no examples" "$PREP" --eval-mc "$TMP/empty.jsonl" --out "$TMP/empty.bin"
gzip -c "$TMP/mc.jsonl" >"$TMP/mc.jsonl.gz"
expect_exit2 "gzip-compressed: --eval-mc reads plain JSONL; decompress it first" \
    "$PREP" --eval-mc "$TMP/mc.jsonl.gz" --out "$TMP/gz.bin"
expect_exit2 "cannot open '$TMP/none.jsonl'" "$PREP" --eval-mc "$TMP/none.jsonl" --out "$TMP/none.bin"
# under 2 ranks: still one line, and no file
expect_exit2 "bad_labelhigh.jsonl:3: label 2" $MPIEXEC --quiet -np 2 "$PREP" --eval-mc "$TMP/bad_labelhigh.jsonl" \
    --out "$TMP/bad_np2.bin"
[ ! -e "$TMP/bad_np2.bin" ] || fail "2 ranks: an output file was left"
for f in empty gz none; do [ ! -e "$TMP/$f.bin" ] || fail "$f: an output file was left"; done

# version 1 numbers examples in uint16 below the start marker: 65,535 fit
"$PY" -c "
import json, sys
with open(sys.argv[1], 'w') as f:
    for i in range(65536):
        f.write(json.dumps({'context': 'c%d' % i, 'endings': ['a', 'b'], 'label': i % 2}) + '\\n')
" "$TMP/many.jsonl" && head -n 65535 "$TMP/many.jsonl" >"$TMP/most.jsonl" || exit 1
if "$PREP" --eval-mc "$TMP/most.jsonl" --out "$TMP/most.bin" >"$TMP/log" 2>&1 &&
    n=$("$PY" "$TMP/read.py" "$TMP/most.bin" | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["examples"]))') &&
    [ "$n" = 65535 ]; then
    pass "65,535 examples in version 1, read back"
else
    fail "65,535 examples: $(cat "$TMP/log") ${n:-}"
fi
expect_exit2 "many.jsonl:65536: more than 65535 examples: a version-1 file numbers them in 16 bits" \
    "$PREP" --eval-mc "$TMP/many.jsonl" --out "$TMP/many.bin"
[ ! -e "$TMP/many.bin" ] || fail "65,536 examples: an output file was left"

# an existing file is kept when the new one fails (published atomically)
cp "$TMP/byte.bin" "$TMP/keep.bin"
"$PREP" --eval-mc "$TMP/bad_labelhigh.jsonl" --out "$TMP/keep.bin" >/dev/null 2>&1
cmp -s "$TMP/byte.bin" "$TMP/keep.bin" && pass "a failed run leaves the old file as it was" ||
    fail "a failed run changed the old file"

# ---- bad usage ----
expect_exit2 "--eval-mc needs --out FILE" "$PREP" --eval-mc "$TMP/mc.jsonl"
expect_exit2 "--eval-mc reads only its own FILE" "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$TMP/u.bin" "$TMP/mc.jsonl"
expect_exit2 "--val-fraction shapes corpus token files: --eval-mc does not take it" \
    "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$TMP/u.bin" --val-fraction 0.2
expect_exit2 "--format shapes corpus token files" "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$TMP/u.bin" --format llmc
expect_exit2 "--eval-mc-space 2: out of range" "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$TMP/u.bin" --eval-mc-space 2
expect_exit2 "is a directory: name the eval file to write" "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$TMP"
expect_exit2 "unknown tokenizer" "$PREP" --eval-mc "$TMP/mc.jsonl" --out "$TMP/u.bin" --tokenizer nope
[ ! -e "$TMP/u.bin" ] || fail "bad usage left $TMP/u.bin"

finish
