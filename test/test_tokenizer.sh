#!/bin/sh
# The byte-level BPE tokenizers (gpt2, tiktoken) against their references:
#   1. the GPT-2 vectors of ../shared/notes/data-ecosystem.md section 2
#      (strings, and sha256 of the uint16 ids of each bundled book), frozen;
#   2. 0 id mismatches against js-tiktoken@1.0.21 (node, ordinary encoding)
#      on every bundled book and on a Unicode stress text written here, for
#      gpt2, cl100k_base and o200k_base (rank files of fetch-tokenizers.sh);
#   2b. the same three and the byte kind as Hugging Face tokenizer.json files (what dreshard
#      --to-hf exports), encoded and decoded by @huggingface/tokenizers@0.2.0
#      (Hugging Face's JavaScript implementation of the format): 0 differences;
#   3. decode(encode(x)) == x for thousands of random byte strings (invalid
#      UTF-8, NUL, CR LF heavy) and a 100,000-letter word;
#   4. each broken vocabulary or rank file: exit 1, one line naming the file.
# Needs tokenizers/ (scripts/fetch-tokenizers.sh); part 2 needs node.
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
. "${top_srcdir:-.}/test/common.sh"

TOK="$top_builddir/test/tok_tool"
RT="$top_builddir/test/tok_roundtrip"
DIR=${DTRAIN_TOKENIZERS:-$top_srcdir/tokenizers}
REF="$top_srcdir/test/tiktoken_ref.mjs"
BOOKS=$(ls "$top_srcdir"/examples/data/*.txt)
PY=/usr/bin/python3
command -v "$PY" >/dev/null 2>&1 || PY=python3

for t in "$TOK" "$RT"; do
    [ -x "$t" ] || { echo "FAIL: $t is not built (make check builds it)"; exit 1; }
done
if [ ! -f "$DIR/gpt2/encoder.json" ] || [ ! -f "$DIR/gpt2/vocab.bpe" ]; then
    echo "SKIP: no GPT-2 vocabulary in $DIR/gpt2: run scripts/fetch-tokenizers.sh"
    exit 77
fi
GPT2="gpt2:$DIR/gpt2"
CL100K="tiktoken:$DIR/tiktoken/cl100k_base.tiktoken"
O200K="tiktoken:$DIR/tiktoken/o200k_base.tiktoken"

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

# ---- 1. frozen GPT-2 vectors ----
# vector LABEL IDS PRINTF-TEXT
vector() {
    printf "$3" >"$TMP/vec.txt"
    got=$("$TOK" encode "$GPT2" "$TMP/vec.txt" | tr '\n' ' ' | sed 's/ $//')
    if [ "$got" = "$2" ]; then pass "vector $1: $(echo "$2" | wc -w) ids"; else fail "vector $1: got [$got], want [$2]"; fi
}
vector hello "15496 11 995 0" 'Hello, world!'
vector austen "1026 318 257 3872 26208 10810 11 326 257 2060 582 287 7797 286 257 922 15807 11 1276 307 287 765 286 257 3656 13" \
    'It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.'
vector spaces "220 3756 9029 628 197 8658 290 220 4274 220 9029 220 220 220 198" '  leading spaces\n\n\ttab and  double  spaces   \n'
vector contractions "40 1101 1654 484 1183 910 340 338 17031 2231 3134 393 720 18 13 1120 1377 2125 470 340 30" \
    "I'm sure they'll say it's 1234567 or \$3.50 -- isn't it?"
vector utf8 "2616 38776 40304 10545 245 98 17312 105 45739 252 12520 234 235 7377 243 39377 39377 138 115 26180 29945 43000 138 105" \
    'na\303\257ve caf\303\251 \346\227\245\346\234\254\350\252\236 \360\237\214\215 \316\225\316\273\316\273\316\267\316\275\316\271\316\272\316\254'
vector special-as-text "31373 27 91 437 1659 5239 91 29 6894" 'hello<|endoftext|>world'
vector some-text "1212 318 617 2420" 'This is some text'
vector indivisible "521 452 12843" 'indivisible'
vector emoji "31373 50169 233 995 12520 234 235" 'hello \360\237\221\213 world \360\237\214\215'
vector space "220" ' '
vector tab "197" '\t'
echo 50256 | "$TOK" decode "$GPT2" >"$TMP/eot.txt"
[ "$(cat "$TMP/eot.txt")" = "<|endoftext|>" ] && pass "decode 50256: <|endoftext|>" || fail "decode 50256: $(cat "$TMP/eot.txt")"

# Whole books: tokens and sha256 of the ids as uint16 LE (data-ecosystem.md).
while read -r book tokens sha; do
    [ -f "$top_srcdir/examples/data/$book" ] || continue
    got=$("$TOK" encode "$GPT2" "$top_srcdir/examples/data/$book" | "$PY" -c '
import hashlib, struct, sys
ids = [int(x) for x in sys.stdin.read().split()]
print(len(ids), hashlib.sha256(struct.pack("<%dH" % len(ids), *ids)).hexdigest())')
    if [ "$got" = "$tokens $sha" ]; then pass "vector $book: $tokens ids, sha256 $(echo "$sha" | cut -c1-16)..."; else fail "vector $book: got $got, want $tokens $sha"; fi
done <<'EOF'
carroll-alice.txt 39622 a04073973d25e02b05ff21b1f38d25d99b8c6dd055fb32382216810d6d4093cb
shakespeare-hamlet.txt 51666 6c86687c7362cb00606331e3819f8afecc4d0bfa9ab43c9d8f35c480c51a4058
shakespeare-macbeth.txt 32595 02ed99ccfb3c166b1ef447586d0c62614c110504e21e6d1d0cad29ccd6851835
austen-persuasion.txt 113151 c75a9ce42a53b566dd478070c99b87eb88e344ad6dd3f4e9234b59dfc915fad6
austen-emma.txt 223075 fbcad380cc7dcb0a04bc816485a7f478e241198e6ccc7fcedd1f34d116baeb13
EOF

# ---- 2. against js-tiktoken ----
# The stress text: scripts, emoji sequences, marks, digits, whitespace runs
# (the Unicode spaces where regex dialects differ included), contractions,
# punctuation and a 2,000-letter word (longer is quadratic in js-tiktoken;
# the 100,000-letter words of part 3 are round-tripped only).
"$PY" - "$TMP/stress.txt" <<'EOF'
import random, sys
r = random.Random(18)
parts = [
    "日本語のテキストと漢字、中文字符，한국어 문장입니다。",
    "👋🏽 👨‍👩‍👧‍👦 🏳️‍🌈 👩🏿‍💻 ❤️‍🔥 🇫🇷🇯🇵 ✌🏻 🧑‍🤝‍🧑",
    "e\u0301 a\u0308 n\u0303o Z\u0336\u0335a\u0337l\u0338g\u0334o q\u0323\u0307",
    "العربية نص قصير، مع أرقام ١٢٣٤٥ و عبرית: שָׁלוֹם עוֹלָם",
    "देवनागरी लिपि में हिन्दी पाठ। संस्कृतम्",
    "Ελληνικά ΚΕΦΑΛΑΙΑ, кириллица ПРОПИСНЫЕ, ÀÉÎÕÜ àéîõü ǅǈǋ ß ẞ",
    "camelCaseWords HTTPServer iPhone McDonald'S O'NEIL'S",
    "'s 's 'S 't 'T 're 'RE 'Re 'rE 've 'VE 'Ve 'm 'M 'll 'LL 'Ll 'lL 'd 'D it's IT'S we'LL they'Re I'M you'VE",
    "!!!??? ... --- ((([[[{{{}}}]]]))) @#$%^&*_+=~`|\\/<> «»„“”‘’ …—–",
    "\u00a0nbsp\u00a0\u00a0x\u2000\u2001\u2002\u2003\u2009\u200a\u202f\u205f\u3000\u1680end\u2028\u2029"
    "\ufeffbom \u0085nel\u180emvs\u200bzw",
    "tabs\t\t\there\r\nCRLF\r\n\r\n  \r\n\t \n\n\n   \n \t\x0b\x0c vt ff",
    "<|endoftext|> <|fim_prefix|> <|endofprompt|>",
    "https://example.com/path/to/file.html?q=1&x=2#frag /usr/bin/env",
]
for n in list(range(1, 41)) + [64, 100, 257]:
    parts.append(" " + "".join(r.choice("0123456789") for _ in range(n)) + " ")
    parts.append("x" + "١٢٣٤٥٦٧٨٩٠"[: n % 10 + 1])
for n in (1, 2, 3, 7, 16, 33, 130, 300):
    parts.append("a" + " " * n + "b" + "\t" * n + "c" + "\n" * n + "d" + "\r\n" * n + "e" + " \n" * n)
parts.append(" " + "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2000)) + " ")
parts.append("".join(r.choice("aeiou") for _ in range(300)).upper())
text = ""
for _ in range(3):
    r.shuffle(parts)
    text += " ".join(parts) + "\n"
open(sys.argv[1], "w", encoding="utf-8", newline="").write(text)
EOF

if ! command -v node >/dev/null 2>&1 || [ ! -f "$DIR/node/node_modules/js-tiktoken/package.json" ]; then
    echo "SKIP part: no node or no js-tiktoken in $DIR/node (scripts/fetch-tokenizers.sh): js-tiktoken comparisons not run"
else
    for enc in gpt2 cl100k_base o200k_base; do
        case $enc in
        gpt2) spec=$GPT2 ;;
        *) spec="tiktoken:$DIR/tiktoken/$enc.tiktoken" ;;
        esac
        if [ "$enc" != gpt2 ] && [ ! -f "$DIR/tiktoken/$enc.tiktoken" ]; then
            fail "$enc: no $DIR/tiktoken/$enc.tiktoken: run scripts/fetch-tokenizers.sh"
            continue
        fi
        args=""
        for f in $BOOKS "$TMP/stress.txt"; do
            b=$(basename "$f" .txt)
            args="$args $f $TMP/$enc.$b.ref"
        done
        # shellcheck disable=SC2086
        node "$REF" "$DIR/node" "$enc" $args 2>"$TMP/js.time" || { fail "$enc: js-tiktoken failed: $(cat "$TMP/js.time")"; continue; }
        echo "     ($(cat "$TMP/js.time"))"
        for f in $BOOKS "$TMP/stress.txt"; do
            b=$(basename "$f" .txt)
            "$TOK" encode "$spec" "$f" >"$TMP/$enc.$b.out" || { fail "$enc $b: tok_tool encode failed"; continue; }
            compare_ids "$enc vs js-tiktoken, $b" "$TMP/$enc.$b.ref" "$TMP/$enc.$b.out"
        done
    done
fi

# ---- 2b. the same vocabularies as Hugging Face's tokenizer.json ----
# tok_tool hfjson writes what dreshard --to-hf exports (io/tok_hf.h); Hugging
# Face's JavaScript implementation of the format must encode as js-tiktoken
# does and decode back (test/hf_tokenizer_ref.mjs says which two documented
# differences it takes out of the text first).
HFREF="$top_srcdir/test/hf_tokenizer_ref.mjs"
if ! command -v node >/dev/null 2>&1 || [ ! -f "$DIR/node/node_modules/@huggingface/tokenizers/package.json" ]; then
    echo "SKIP part: no node or no @huggingface/tokenizers in $DIR/node (scripts/fetch-tokenizers.sh): tokenizer.json not checked"
else
    for enc in bytes gpt2 cl100k_base o200k_base; do
        case $enc in
        bytes) spec=byte ;;
        gpt2) spec=$GPT2 ;;
        *) spec="tiktoken:$DIR/tiktoken/$enc.tiktoken" ;;
        esac
        if ! "$TOK" hfjson "$spec" >"$TMP/tokenizer.json" 2>"$TMP/err"; then
            fail "$enc: tok_tool hfjson: $(cat "$TMP/err")"
        elif out=$(node "$HFREF" "$DIR/node" "$TMP/tokenizer.json" "$enc" $BOOKS "$TMP/stress.txt" 2>&1); then
            pass "$enc as tokenizer.json, through @huggingface/tokenizers vs js-tiktoken, books and stress text: $out"
        else
            fail "$enc as tokenizer.json: $out"
        fi
    done
fi

# ---- 3. round trips ----
for spec in "$GPT2" "$CL100K" "$O200K"; do
    if out=$("$RT" "$spec" 3000 18 2>&1); then pass "round trip $out"; else fail "round trip $spec: $out"; fi
done
"$PY" -c 'import sys; sys.stdout.write("x" * 100000)' >"$TMP/word.txt"
"$PY" -c 'import random, sys; r = random.Random(5); sys.stdout.write("".join(r.choice("abcdefghij") for _ in range(100000)))' >"$TMP/word2.txt"
for f in word word2; do
    if out=$("$TOK" roundtrip "$GPT2" "$TMP/$f.txt" 2>&1); then pass "100,000-letter word ($f): $out"; else fail "100,000-letter word ($f): $out"; fi
done
"$TOK" roundtrip "$GPT2" "$TMP/stress.txt" >/dev/null 2>&1 && pass "stress text round trip" || fail "stress text round trip"

# ---- 4. broken vocabulary and rank files ----
# expect_bad WANT SPEC: tok_tool info SPEC exits 1 with one stderr line containing WANT
expect_bad() {
    "$TOK" info "$2" >/dev/null 2>"$TMP/err"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && grep -qF -- "$1" "$TMP/err"; then
        pass "bad file: $(cat "$TMP/err")"
    else
        fail "$2 -> exit $rc, $lines line(s), wanted '$1': $(head -c 400 "$TMP/err")"
    fi
}
bad=$TMP/bad
mkdir -p "$bad"
# gpt2: a copy of the directory with one file changed by python
gpt2_bad() { # NAME PYTHON-EXPR-ON-(enc,voc)
    mkdir -p "$bad/$1" && cp "$DIR/gpt2/encoder.json" "$DIR/gpt2/vocab.bpe" "$bad/$1/"
    "$PY" - "$bad/$1" "$2" <<'EOF'
import sys
d, expr = sys.argv[1], sys.argv[2]
enc = open(d + "/encoder.json", encoding="utf-8").read()
voc = open(d + "/vocab.bpe", encoding="utf-8").read()
enc, voc = eval(expr)
open(d + "/encoder.json", "w", encoding="utf-8", newline="").write(enc)
open(d + "/vocab.bpe", "w", encoding="utf-8", newline="").write(voc)
EOF
}
gpt2_bad truncated '(enc[:5000], voc)'
expect_bad "$bad/truncated/encoder.json:1:" "gpt2:$bad/truncated"
gpt2_bad missing-key '(enc.replace("\"Hello\": 15496, ", ""), voc)'
expect_bad "$bad/missing-key/encoder.json: 50256 entries" "gpt2:$bad/missing-key"
gpt2_bad swapped-ids '(enc.replace("\"Hello\": 15496", "\"Hello\": 99999"), voc)'
expect_bad "$bad/swapped-ids/encoder.json: key \"Hello\"" "gpt2:$bad/swapped-ids"
gpt2_bad not-alphabet '(enc.replace("\"Hello\": 15496", "\"Hel lo\": 15496"), voc)'
expect_bad "outside GPT-2's byte alphabet" "gpt2:$bad/not-alphabet"
gpt2_bad bad-line '(enc, voc.replace("\nĠ t\n", "\nĠt\n", 1))'
expect_bad "$bad/bad-line/vocab.bpe:2:" "gpt2:$bad/bad-line"
gpt2_bad merge-order '(enc, voc.replace("\nĠ t\nĠ a\n", "\nĠ a\nĠ t\n", 1))'
expect_bad "$bad/merge-order/vocab.bpe:2:" "gpt2:$bad/merge-order"
gpt2_bad dup-key '(enc.replace("{", "{\"!\": 0, ", 1), voc)'
expect_bad "$bad/dup-key/encoder.json:1:" "gpt2:$bad/dup-key"
expect_bad "$bad/nowhere" "gpt2:$bad/nowhere"
# tiktoken: r50k_base's file (the smallest) with one line changed
if [ -f "$DIR/tiktoken/r50k_base.tiktoken" ]; then
    rank_bad() { # NAME SED-SCRIPT
        sed "$2" "$DIR/tiktoken/r50k_base.tiktoken" >"$bad/$1.tiktoken"
    }
    rank_bad base64 '100s/^[^ ]*/a!b=/'
    expect_bad "$bad/base64.tiktoken:100: the token is not valid padded base64" "tiktoken:$bad/base64.tiktoken:r50k_base"
    rank_bad dup-token '101s/^[^ ]*/IQ==/'
    expect_bad "$bad/dup-token.tiktoken:101: the token of rank 100 already has rank 0" "tiktoken:$bad/dup-token.tiktoken:r50k_base"
    rank_bad dup-rank '200s/ .*/ 5/'
    expect_bad "$bad/dup-rank.tiktoken:200: rank 5 is given twice" "tiktoken:$bad/dup-rank.tiktoken:r50k_base"
    rank_bad sparse '300s/ .*/ 70000/'
    expect_bad "$bad/sparse.tiktoken:300: rank 70000 is not below" "tiktoken:$bad/sparse.tiktoken:r50k_base"
    rank_bad no-space '400s/ /\t/'
    expect_bad "$bad/no-space.tiktoken:400: a line is" "tiktoken:$bad/no-space.tiktoken:r50k_base"
    rank_bad no-byte '1s/^[^ ]*/IUlJ/'
    expect_bad "$bad/no-byte.tiktoken: no token for the byte 0x21" "tiktoken:$bad/no-byte.tiktoken:r50k_base"
    rank_bad short '1000,$d'
    expect_bad "$bad/short.tiktoken has 999 ranks but encoding r50k_base has 50256" "tiktoken:$bad/short.tiktoken:r50k_base"
    expect_bad "unknown tiktoken encoding 'gpt5': use one of r50k_base, cl100k_base, o200k_base, llama3" \
        "tiktoken:$DIR/tiktoken/r50k_base.tiktoken:gpt5"
    expect_bad "unknown tiktoken encoding 'short'" "tiktoken:$bad/short.tiktoken"
    expect_bad "$bad/nowhere.tiktoken" "tiktoken:$bad/nowhere.tiktoken:cl100k_base"
else
    fail "no $DIR/tiktoken/r50k_base.tiktoken: run scripts/fetch-tokenizers.sh"
fi

# ---- 5. the llama3 encoding's table ----
# No Llama 3 rank file is bundled: o200k_base's first 128,000 ranks stand in
# for one, to check the special tokens (Meta's list: 10 named, then
# reserved_special_token_5..250 up to 128255) and that the pattern works.
if [ -f "$DIR/tiktoken/o200k_base.tiktoken" ]; then
    head -n 128000 "$DIR/tiktoken/o200k_base.tiktoken" | sed 's/$/\r/' >"$bad/fake-llama3.tiktoken" # CR LF lines too
    "$TOK" info "tiktoken:$bad/fake-llama3.tiktoken:llama3" >"$TMP/llama3.info" 2>&1
    got=$(grep -E '^(vocab_size|doc_start)|^special (<\|begin_of_text\|>|<\|end_of_text\|>|<\|start_header_id\|>|<\|end_header_id\|>|<\|eot_id\|>|<\|reserved_special_token_4\|>|<\|reserved_special_token_5\|>|<\|reserved_special_token_250\|>) ' \
        "$TMP/llama3.info" | tr '\n' ' ')
    want="vocab_size 128256 doc_start 128000 special <|begin_of_text|> 128000 special <|end_of_text|> 128001 special <|start_header_id|> 128006 special <|end_header_id|> 128007 special <|reserved_special_token_4|> 128008 special <|eot_id|> 128009 special <|reserved_special_token_5|> 128010 special <|reserved_special_token_250|> 128255 "
    n=$(grep -c '^special ' "$TMP/llama3.info")
    if [ "$got" = "$want" ] && [ "$n" -eq 256 ]; then pass "llama3: vocabulary 128256, $n special tokens, BOS 128000"; else fail "llama3: $n specials, got [$got]"; fi
    if out=$("$RT" "tiktoken:$bad/fake-llama3.tiktoken:llama3" 500 7 2>&1); then pass "llama3 round trip: ${out#*: }"; else fail "llama3 round trip: $out"; fi
fi

finish
