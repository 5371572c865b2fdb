#!/bin/sh
# The hf tokenizer kind (tokenizer.json, issue 39) against its reference:
#   1. 0 id mismatches against @lenml/tokenizers@3.7.2 (node; the
#      JavaScript tokenizer of the @lenml/tokenizer-NAME packages the files
#      come from) on every bundled book and on a Unicode stress text written
#      here (scripts, emoji ZWJ sequences, combining marks that NFC
#      composes, long digit runs, whitespace runs, contractions in every
#      case, and each tokenizer's added tokens inside text, whole and cut),
#      for Llama 3.1, Qwen3 and DeepSeek-V3;
#   2. dtrain-prepare's shards: each document is doc_start, the reference's
#      ids, doc_end (Llama 3: <|begin_of_text|> ... <|end_of_text|>; Qwen:
#      ... <|endoftext|>; DeepSeek-V3: <｜begin▁of▁sentence｜> ...), and the
#      sidecar records kind hf and the file's sha256;
#   3. decode(encode(x)) == x for random byte strings (invalid UTF-8, NUL),
#      and for the stress text (== NFC(x) for Qwen3, whose normalizer is NFC);
#   4. a sidecar finds its tokenizer.json by identity in
#      $DTRAIN_TOKENIZERS/hf/NAME/, the recorded one first while it is
#      there, and refuses one whose tokenizer_config.json now gives other
#      document tokens;
#   5. each tokenizer.json of another kind, or with a feature the kind does
#      not implement, or with merges naming unknown tokens: exit 2, one
#      line naming it (under mpirun -np 2 too, nothing written).
# Needs tokenizers/hf (scripts/fetch-tokenizers.sh) and node; else exit 77.
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
. "${top_srcdir:-.}/test/common.sh"

TOK="$top_builddir/test/tok_tool"
RT="$top_builddir/test/tok_roundtrip"
SC="$top_builddir/test/sidecar_tool"
PREP=${DTRAIN_PREPARE:-$top_builddir/src/dtrain-prepare}
DIR=${DTRAIN_TOKENIZERS:-$top_srcdir/tokenizers}
REF="$top_srcdir/test/hf_json_ref.mjs"
BOOKS=$(ls "$top_srcdir"/examples/data/*.txt)
NAMES="llama3_1 qwen3 deepseek_v3"
PY=/usr/bin/python3
command -v "$PY" >/dev/null 2>&1 || PY=python3

for t in "$TOK" "$RT" "$SC"; do
    [ -x "$t" ] || { echo "FAIL: $t is not built (make check builds it)"; exit 1; }
done
for n in $NAMES; do
    if [ ! -f "$DIR/hf/$n/tokenizer.json" ]; then
        echo "SKIP: no $DIR/hf/$n/tokenizer.json: run scripts/fetch-tokenizers.sh"
        exit 77
    fi
done
if ! command -v node >/dev/null 2>&1 || [ ! -f "$DIR/node/node_modules/@lenml/tokenizers/package.json" ]; then
    echo "SKIP: no node or no @lenml/tokenizers in $DIR/node (scripts/fetch-tokenizers.sh)"
    exit 77
fi

# compare_ids LABEL REF OUT: every position of two id lists (one per line)
compare_ids() {
    if res=$("$PY" - "$2" "$3" <<'EOF'
import sys
a = open(sys.argv[1]).read().split()
b = open(sys.argv[2]).read().split()
bad = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"{len(a)} ids compared, {bad} mismatches" + (f" (first at {first})" if bad else ""))
sys.exit(bad != 0)
EOF
    ); then pass "$1: $res"; else fail "$1: $res"; fi
}

# ---- 1. against @lenml/tokenizers ----
# The stress text, with the added tokens of the three files inside words,
# beside each other and cut short (a prefix of one is text).
"$PY" - "$TMP/stress.txt" <<'EOF'
import random, sys
r = random.Random(39)
parts = [
    "日本語のテキストと漢字、中文字符，한국어 문장입니다。ひらがなカタカナ混じり文",
    "👋🏽 👨‍👩‍👧‍👦 🏳️‍🌈 👩🏿‍💻 ❤️‍🔥 🇫🇷🇯🇵 ✌🏻 🧑‍🤝‍🧑",
    "e\u0301 a\u0308 n\u0303o Z\u0336\u0335a\u0337l\u0338g\u0334o q\u0323\u0307 A\u030a \u1100\u1161\u11a8 Ω \u212b",
    "العربية نص قصير، مع أرقام ١٢٣٤٥ و عبرית: שָׁלוֹם עוֹלָם",
    "देवनागरी लिपि में हिन्दी पाठ। संस्कृतम् ไทย ภาษา",
    "Ελληνικά ΚΕΦΑΛΑΙΑ, кириллица ПРОПИСНЫЕ, ÀÉÎÕÜ àéîõü ǅǈǋ ß ẞ",
    "camelCaseWords HTTPServer iPhone McDonald'S O'NEIL'S x=1;y+=2 f(a,b)->c",
    "'s 's 'S 't 'T 're 'RE 'Re 'rE 've 'VE 'Ve 'm 'M 'll 'LL 'Ll 'lL 'd 'D it's IT'S we'LL they'Re I'M you'VE",
    "!!!??? ... --- ((([[[{{{}}}]]]))) @#$%^&*_+=~`|\\/<> «»„“”‘’ …—– ｜▁",
    "\u00a0nbsp\u00a0\u00a0x\u2000\u2001\u2002\u2003\u2009\u200a\u202f\u205f\u3000\u1680end\u2028\u2029"
    "\ufeffbom \u0085nel\u180emvs\u200bzw",
    "tabs\t\t\there\r\nCRLF\r\n\r\n  \r\n\t \n\n\n   \n \t\x0b\x0c vt ff",
    "<|endoftext|> <|begin_of_text|>x<|end_of_text|><|eot_id|> <|im_start|>user\nhi<|im_end|>",
    "<think>why</think> <|reserved_special_token_7|> <|fim_prefix|><|endofprompt|>",
    "<｜begin▁of▁sentence｜>a<｜end▁of▁sentence｜> <｜▁pad▁｜><｜tool▁sep｜>",
    "<|endoftext <|begin_of_tex <|im_end| <｜begin▁of <thin </think <| |> <|> <<|endoftext|>>",
    "https://example.com/path/to/file.html?q=1&x=2#frag /usr/bin/env",
]
for n in list(range(1, 41)) + [64, 100, 257]:
    parts.append(" " + "".join(r.choice("0123456789") for _ in range(n)) + " ")
    parts.append("x" + "١٢٣٤٥٦٧٨٩٠"[: n % 10 + 1] + "½²³")
for n in (1, 2, 3, 7, 16, 33, 130, 300):
    parts.append("a" + " " * n + "b" + "\t" * n + "c" + "\n" * n + "d" + "\r\n" * n + "e" + " \n" * n)
parts.append(" " + "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2000)) + " ")
parts.append("".join(r.choice("aeiou") for _ in range(300)).upper())
parts.append("".join(r.choice("一二三四五六七八九十百千万亿") for _ in range(500)))
text = ""
for _ in range(3):
    r.shuffle(parts)
    text += " ".join(parts) + "\n"
open(sys.argv[1], "w", encoding="utf-8", newline="").write(text)
EOF

for n in $NAMES; do
    tj="$DIR/hf/$n/tokenizer.json"
    args=""
    for f in $BOOKS "$TMP/stress.txt"; do
        args="$args $f $TMP/$n.$(basename "$f" .txt).ref"
    done
    # shellcheck disable=SC2086
    if ! node "$REF" "$DIR/node" "$tj" $args 2>"$TMP/js.err"; then
        fail "$n: @lenml/tokenizers failed: $(cat "$TMP/js.err")"
        continue
    fi
    echo "     ($(tail -n 1 "$TMP/js.err"))"
    for f in $BOOKS "$TMP/stress.txt"; do
        b=$(basename "$f" .txt)
        if "$TOK" encode "hf:$tj" "$f" >"$TMP/$n.$b.out" 2>"$TMP/err"; then
            compare_ids "$n $b" "$TMP/$n.$b.ref" "$TMP/$n.$b.out"
        else
            fail "$n $b: tok_tool: $(cat "$TMP/err")"
        fi
    done
    # decode(encode(x)) is x, or NFC(x) for Qwen (its normalizer)
    "$TOK" encode "hf:$tj" "$TMP/stress.txt" | "$TOK" decode "hf:$tj" >"$TMP/back.txt"
    if "$PY" - "$TMP/stress.txt" "$TMP/back.txt" "$n" <<'EOF'; then
import sys, unicodedata
text, back = (open(f, encoding="utf-8", newline="").read() for f in sys.argv[1:3])
sys.exit(back != (unicodedata.normalize("NFC", text) if sys.argv[3] == "qwen3" else text))
EOF
        pass "$n: decode(encode(stress)) == stress$([ "$n" = qwen3 ] && echo " in NFC")"
    else
        fail "$n: stress round trip"
    fi
done

# ---- 2. dtrain-prepare: documents framed by the tokenizer's own tokens ----
"$PY" - "$TMP/docs.jsonl" <<'EOF'
import json, sys
docs = ["The first document.\nIt has two lines.", "Zweites Dokument: Größe, Maße.",
        "第三个文件 with <|endoftext|> and <think> inside", "e\u0301 composed by NFC, 12345678 digits", "x"]
with open(sys.argv[1], "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
EOF
"$PY" - "$TMP/docs.jsonl" "$TMP/doc" <<'EOF'
import json, sys
for i, line in enumerate(open(sys.argv[1])):
    open(f"{sys.argv[2]}{i}.txt", "w", newline="").write(json.loads(line)["text"])
EOF
for n in $NAMES; do
    tj="$DIR/hf/$n/tokenizer.json"
    if ! $PREP --out "$TMP/p_$n" --tokenizer "hf:$tj" --val-fraction 0 "$TMP/docs.jsonl" >"$TMP/out" 2>&1; then
        fail "$n: dtrain-prepare: $(tail -n 2 "$TMP/out")"
        continue
    fi
    args=""
    for i in 0 1 2 3 4; do args="$args $TMP/doc$i.txt $TMP/doc$i.$n.ref"; done
    # shellcheck disable=SC2086
    node "$REF" "$DIR/node" "$tj" $args 2>/dev/null || { fail "$n: reference on the documents"; continue; }
    want_sha=$(sha256sum "$tj" | cut -d' ' -f1)
    if res=$("$PY" - "$TMP/p_${n}_train_000000.bin" "$TMP/p_$n.tokenizer.json" "$TMP/doc" "$n" "$want_sha" <<'EOF'
import json, struct, sys
shard, sidecar, doc, name, sha = sys.argv[1:6]
raw = open(shard, "rb").read()
head = struct.unpack("<256i", raw[:1024])
width = 4 if head[1] == 7 else 2
got = list(struct.unpack("<%d%s" % (head[2], "I" if width == 4 else "H"), raw[1024:1024 + head[2] * width]))
s = json.load(open(sidecar))
want_frame = {"llama3_1": (128000, 128001), "qwen3": (None, 151643), "deepseek_v3": (0, None)}[name]
assert (s["doc_start"], s["doc_end"]) == want_frame, ("doc tokens", s["doc_start"], s["doc_end"])
assert s["kind"] == "hf" and s["vocab_sha256"] == sha and s["spec"].startswith("hf:/"), s
want = []
for i in range(5):
    ids = [int(x) for x in open(f"{doc}{i}.{name}.ref").read().split()]
    want += ([s["doc_start"]] if s["doc_start"] is not None else []) + ids + ([s["doc_end"]] if s["doc_end"] is not None else [])
bad = sum(x != y for x, y in zip(got, want)) + abs(len(got) - len(want))
print(f"{len(got)} tokens in 5 documents, {bad} mismatches, doc_start {s['doc_start']}, doc_end {s['doc_end']}, "
      f"{len(s['special_tokens'])} special tokens in the sidecar")
sys.exit(bad != 0)
EOF
    ); then pass "$n: dtrain-prepare: $res"; else fail "$n: dtrain-prepare: $res"; fi
done

# ---- 3. round trips of random bytes ----
# (not Qwen3: NFC changes text with combining marks, and random bytes have no
# NFC to compare with; its round trip is the stress text's, modulo NFC)
for n in llama3_1 deepseek_v3; do
    "$RT" "hf:$DIR/hf/$n/tokenizer.json" 3000 39 >"$TMP/out" 2>&1 && pass "$(cat "$TMP/out")" || fail "$(cat "$TMP/out")"
done

# ---- 4. the sidecar finds the file by identity ----
mkdir -p "$TMP/tokcopy/hf/qwen3" "$TMP/elsewhere"
cp "$DIR/hf/qwen3/tokenizer.json" "$DIR/hf/qwen3/tokenizer_config.json" "$TMP/tokcopy/hf/qwen3/"
"$SC" write "hf:$DIR/hf/qwen3" "$TMP/q.tokenizer.json" llmc 4 1 1 1 1 2>"$TMP/err" || fail "sidecar_tool write: $(cat "$TMP/err")"
sed "s|$DIR/hf/qwen3/tokenizer.json|/gone/qwen3/tokenizer.json|g" "$TMP/q.tokenizer.json" >"$TMP/elsewhere/e.tokenizer.json"
got=$(DTRAIN_TOKENIZERS="$TMP/tokcopy" "$SC" open "$TMP/elsewhere/e.tokenizer.json" 2>&1)
[ "$got" = "hf:$TMP/tokcopy/hf/qwen3/tokenizer.json 151669" ] &&
    pass "a tokenizer.json is found in \$DTRAIN_TOKENIZERS/hf/NAME by its sha256" || fail "hf sidecar: '$got'"
# while the recorded file is there, it wins over a copy of the same sha256
# elsewhere (whose tokenizer_config.json may be another's)
mkdir -p "$TMP/rec"
cp "$DIR/hf/qwen3/tokenizer.json" "$TMP/rec/"
"$SC" write "hf:$TMP/rec" "$TMP/r.tokenizer.json" llmc 4 1 1 1 1 2>"$TMP/err" || fail "sidecar_tool write: $(cat "$TMP/err")"
got=$(DTRAIN_TOKENIZERS="$TMP/tokcopy" "$SC" open "$TMP/r.tokenizer.json" 2>&1)
[ "$got" = "hf:$(cd "$TMP/rec" && pwd -P)/tokenizer.json 151669" ] &&
    pass "the recorded tokenizer.json comes before \$DTRAIN_TOKENIZERS/hf/NAME's copy of it" || fail "hf sidecar order: '$got'"
# the document tokens come from tokenizer_config.json, which the sha256
# does not cover: one changed since (an EOS after each document) is refused
printf '{"add_eos_token": true, "eos_token": "<|im_end|>"}' >"$TMP/rec/tokenizer_config.json"
got=$(DTRAIN_TOKENIZERS="$TMP/tokcopy" "$SC" open "$TMP/r.tokenizer.json" 2>&1)
echo "$got" | grep -q "has vocabulary 151669 and document tokens -1, 151645, but the data records 151669 and -1, 151643" &&
    pass "a changed tokenizer_config.json: $got" || fail "a changed tokenizer_config.json: '$got'"

# ---- 5. refusals: one line, exit 2 ----
"$PY" - "$TMP" <<'EOF'
import copy, json, sys
d = sys.argv[1]
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, k = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + k); k += 1
vocab = {chr(c): i for i, c in enumerate(cs)}
# "bc" and "xyz" are tokens no merge makes; "bc" ranks before "ab"
for i, t in enumerate(["Ġt", "he", "Ġthe", "bc", "ab", "aa", "xyz", "xy"]):
    vocab[t] = 256 + i
base = {"version": "1.0", "added_tokens": [{"id": 264, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": ["Ġ t", "h e", "Ġt he", "a b", "a a", "x y"]}}
def put(name, edit):
    t = copy.deepcopy(base)
    edit(t)
    import os
    os.makedirs(f"{d}/bad/{name}", exist_ok=True)
    json.dump(t, open(f"{d}/bad/{name}/tokenizer.json", "w"))
put("ok", lambda t: None)
put("unigram", lambda t: t["model"].update(type="Unigram"))
put("wordpiece", lambda t: t["model"].update(type="WordPiece"))
put("metaspace", lambda t: t.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Metaspace", "replacement": "▁"}]}))
put("nfkc", lambda t: t.update(normalizer={"type": "NFKC"}))
put("merge", lambda t: t["model"].update(merges=["Ġ t", "h e", "Ġt hx"]))
put("mergeleft", lambda t: t["model"].update(merges=["Ġ t", ["h", "e"], ["zq", "e"]]))
put("mergejoined", lambda t: t["model"].update(merges=["Ġ t", "h e", "a e"]))
put("mergeform", lambda t: t["model"].update(merges=["Ġ t", "h e", "a b c"]))
put("collide", lambda t: t["added_tokens"][0].update(id=258))
put("sparse", lambda t: t["model"]["vocab"].update({"Ġthe": 100000}))
put("lstrip", lambda t: t["added_tokens"][0].update(lstrip=True))
put("removed", lambda t: t.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}))
put("badregex", lambda t: t.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(\\p{L}+"}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}))
put("nobyte", lambda t: t["model"]["vocab"].pop("Ā"))
put("fallback", lambda t: t["model"].update(byte_fallback=True))
open(f"{d}/bad/ok/tokenizer_config.json", "w").write('{"bos_token": "<|nope|>"}')
EOF
printf 'the the' >"$TMP/t.txt"
B="$TMP/bad"
expect_exit2 "model type 'Unigram' is not byte-level BPE" $PREP --out "$TMP/x" --tokenizer "hf:$B/unigram" "$TMP/t.txt"
expect_exit2 "model type 'WordPiece' is not byte-level BPE" $PREP --out "$TMP/x" --tokenizer "hf:$B/wordpiece" "$TMP/t.txt"
expect_exit2 "pre-tokenizer 'Metaspace' is not byte-level.*use spm:MODEL" $PREP --out "$TMP/x" --tokenizer "hf:$B/metaspace" "$TMP/t.txt"
expect_exit2 "normalizer 'NFKC' is not supported" $PREP --out "$TMP/x" --tokenizer "hf:$B/nfkc" "$TMP/t.txt"
# merges naming unknown tokens: the merge, the token, on every rank of an
# MPI run, and no shard or sidecar written
expect_exit2 'model.merges\[2\] "Ġt hx": "hx" is not a vocab token' $PREP --out "$TMP/x" --tokenizer "hf:$B/merge" "$TMP/t.txt"
expect_exit2 'model.merges\[2\] "zq e": "zq" is not a vocab token' $PREP --out "$TMP/x" --tokenizer "hf:$B/mergeleft" "$TMP/t.txt"
expect_exit2 'model.merges\[2\] "a e": the merged token "ae" is not in the vocab' $PREP --out "$TMP/x" \
    --tokenizer "hf:$B/mergejoined" "$TMP/t.txt"
expect_exit2 'model.merges\[2\] is not "a b" or \["a", "b"\]' $PREP --out "$TMP/x" --tokenizer "hf:$B/mergeform" "$TMP/t.txt"
mkdir -p "$TMP/mpi"
expect_exit2 'model.merges\[2\] "Ġt hx": "hx" is not a vocab token' "$MPIEXEC" --quiet -np 2 $PREP --out "$TMP/mpi/x" \
    --tokenizer "hf:$B/merge" "$TMP/t.txt"
left=$(ls -A "$TMP/mpi")
[ -z "$left" ] && pass "bad merges under mpirun -np 2: nothing written" || fail "bad merges under mpirun -np 2 left: $left"
expect_exit2 "added token '<|endoftext|>' sets lstrip" $PREP --out "$TMP/x" --tokenizer "hf:$B/lstrip" "$TMP/t.txt"
expect_exit2 "behavior Isolated and invert false (this one has a Regex, Removed)" $PREP --out "$TMP/x" --tokenizer "hf:$B/removed" "$TMP/t.txt"
expect_exit2 "Split pre-tokenizer pattern does not compile" $PREP --out "$TMP/x" --tokenizer "hf:$B/badregex" "$TMP/t.txt"
expect_exit2 "no vocab token for the byte 0x00" $PREP --out "$TMP/x" --tokenizer "hf:$B/nobyte" "$TMP/t.txt"
expect_exit2 "the BPE model sets 'byte_fallback'" $PREP --out "$TMP/x" --tokenizer "hf:$B/fallback" "$TMP/t.txt"
expect_exit2 "added token '<|endoftext|>' has id 258, which vocab token 'Ġthe' has" $PREP --out "$TMP/x" --tokenizer "hf:$B/collide" "$TMP/t.txt"
expect_exit2 "vocab id 100000 with 265 vocab and added tokens: ids must be 0..N-1" $PREP --out "$TMP/x" --tokenizer "hf:$B/sparse" "$TMP/t.txt"
expect_exit2 "bos_token '<|nope|>' is not an added token" $PREP --out "$TMP/x" --tokenizer "hf:$B/ok" "$TMP/t.txt"
expect_exit2 "tokenizer.json '$TMP/nowhere' not found" $PREP --out "$TMP/x" --tokenizer "hf:$TMP/nowhere" "$TMP/t.txt"
expect_exit2 "tokenizer 'hf' needs a tokenizer.json" $PREP --out "$TMP/x" --tokenizer "hf:" "$TMP/t.txt"
head -c 1000 "$DIR/hf/qwen3/tokenizer.json" >"$B/cut.json"
expect_exit2 "not valid JSON at line" $PREP --out "$TMP/x" --tokenizer "hf:$B/cut.json" "$TMP/t.txt"
# The merges list's rule where it differs from tiktoken's (which the three
# real files, derived from rank tables, never show): "xyz" is a token but no
# merge makes it (no whole-piece lookup without ignore_merges): xy z; " abc":
# Ġ ab c, though "bc" ranks before "ab" (only listed pairs merge); " aaa":
# Ġ aa a (leftmost on a tie); 'the' is t he, ' the' one token.
rm "$B/ok/tokenizer_config.json"
printf 'xyz abc aaa\nthe the' >"$TMP/m.txt"
got=$("$TOK" encode "hf:$B/ok" "$TMP/m.txt" | tr '\n' ' ')
want="263 89 220 260 66 220 261 64 198 83 257 258 "
[ "$got" = "$want" ] && pass "merges-list rule on a small tokenizer.json: 'xyz abc aaa\\nthe the' -> [$got]" ||
    fail "merges-list rule: 'xyz abc aaa\\nthe the' -> [$got], want [$want]"

finish
