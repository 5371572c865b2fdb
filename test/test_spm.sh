#!/bin/sh
# The spm tokenizer (io/tok_spm.cc) against Debian's SentencePiece tools:
#  - spm_train makes four models of the bundled corpus: BPE and unigram with
#    SentencePiece's defaults (nmt_nfkc normalisation), a Llama-2-style BPE
#    (identity normaliser, byte fallback, digits split, whitespace kept) and
#    a BPE with non-default special ids (no BOS, EOS 0, unk 3);
#  - for the first three, tok_tool encode-lines equals spm_encode's ids on
#    every line of each book and of a Unicode stress text written here (CJK,
#    emoji and ZWJ sequences, combining marks, Arabic, Hebrew, fullwidth
#    forms, whitespace runs, CR LF, NUL, invalid UTF-8): 0 mismatching lines;
#  - tok_tool decode of those ids equals spm_decode's text on every line
#    (one decode call per file, EOS between the lines: a control id decodes
#    to its piece text, "</s>", which is then read as the line end), and on
#    each whole book encoded as one document;
#  - the Llama-style model round-trips every book and the valid UTF-8 of the
#    stress text byte for byte, NUL included; U+2581 (SentencePiece's space
#    mark) in the text decodes to a space;
#  - tok_tool info: vocabulary size, <unk>/<s>/</s> ids and doc_start equal
#    the model's own vocabulary listing (MODEL.vocab, one piece per id);
#  - a missing, non-model, truncated or empty model file, a directory, and an
#    id outside the vocabulary: exit 1 with one line naming the file or id.
# Automake protocol: exit 0 pass, 1 fail, 77 skip (no SentencePiece tools).
. "$top_srcdir/test/common.sh"

for t in spm_train spm_encode spm_decode; do
    if ! command -v "$t" >/dev/null 2>&1; then
        echo "SKIP: $t not found (Debian package sentencepiece)"
        exit 77
    fi
done
TOK=$top_builddir/test/tok_tool
[ -x "$TOK" ] || { fail "$TOK is not built (make check builds it)"; finish; }

D=$top_srcdir/examples/data
BOOKS="$D/carroll-alice.txt $D/shakespeare-hamlet.txt $D/shakespeare-macbeth.txt $D/austen-persuasion.txt"
INPUT=$D/carroll-alice.txt,$D/shakespeare-hamlet.txt,$D/shakespeare-macbeth.txt,$D/austen-persuasion.txt

# ---- the models (about a second each; input order fixed, no sampling) ----
train() { # NAME ARGS...
    name=$1
    shift
    if spm_train --input="$INPUT" --model_prefix="$TMP/$name" --shuffle_input_sentence=false \
        --input_sentence_size=0 --num_threads=2 --minloglevel=2 "$@" >"$TMP/train.log" 2>&1; then
        pass "spm_train $name: $(wc -l <"$TMP/$name.vocab") pieces"
    else
        fail "spm_train $name: $(tail -n 3 "$TMP/train.log")"
        finish
    fi
}
train bpe --model_type=bpe --vocab_size=2000
train unigram --model_type=unigram --vocab_size=2000
train llama --model_type=bpe --vocab_size=2000 --byte_fallback=true --normalization_rule_name=identity \
    --remove_extra_whitespaces=false --split_digits=true --allow_whitespace_only_pieces=true
train noBOS --model_type=bpe --vocab_size=500 --unk_id=3 --bos_id=-1 --eos_id=0 --pad_id=-1

# ---- the Unicode stress text ----
# Valid UTF-8 first (stress_ok.txt, NUL included), then the lines no model
# round-trips: U+2581 and invalid UTF-8 (each bad byte reads as U+FFFD,
# then as the model encodes U+FFFD). No line holds
# "</s>" (the decode check uses it as the line end); "<s>" and "<unk>" are
# here as text, to be encoded as text.
cat >"$TMP/stress_ok.txt" <<'EOF'
日本語のテキスト、漢字とかな。中文文本：你好，世界！한국어 문장입니다.
Family 👨‍👩‍👧‍👦, rainbow flag 🏳️‍🌈, thumbs 👍🏽👍🏿, flags 🇫🇷🇯🇵🇧🇷, keycap 1️⃣ and 🤷‍♀️.
Arabic: مرحبا بالعالم ١٢٣٤ — Hebrew: שָׁלוֹם עוֹלָם, mixed עברית and English.
Fullwidth ＡＢＣ１２３ ｶﾀｶﾅ, ligatures ﬁ ﬂ ﬀ, ½ ㎏ Ⅻ x² ℌ, Greek Ωμέγα, Cyrillic Привет.
Digits: 12345678901234567890 3.14159 1,000,000 0x7fff 2024-05-20.
    leading spaces, inner    runs	tabs		and trailing spaces    
Contractions: don't DON'T I'm you're we'll they've she'd It's O'Neill ’tis.

 
pneumonoultramicroscopicsilicovolcanoconiosispneumonoultramicroscopicsilicovolcanoconiosispneumonoultramicroscopicsilicovolcanoconiosispneumonoultramicroscopicsilicovolcanoconiosispneumonoultramicroscopicsilicovolcanoconiosispneumonoultramicroscopicsilicovolcanoconiosis
EOF
# Written with escapes, to be sure of the bytes: decomposed e + U+0301,
# i + U+0308, A + U+030A beside precomposed ones; NBSP, U+3000, U+200B, soft
# hyphen.
printf 'Combining: cafe\314\201 nai\314\210ve A\314\212ngstro\314\210m vs caf\303\251 \303\205ngstr\303\266m, zalgo a\314\220\315\204\314\210.\n' >>"$TMP/stress_ok.txt"
printf 'NBSP: a\302\240b, ideographic space:\343\200\200x, zero-width:\342\200\213y, soft hyphen: co\302\255op.\n' >>"$TMP/stress_ok.txt"
printf 'Markup as text: <s> <unk> <pad> <|endoftext|> [INST].\n' >>"$TMP/stress_ok.txt"
printf 'CR LF line\r\nlone\rCR inside\n\r\n' >>"$TMP/stress_ok.txt"
printf 'NUL\000inside and at the end\000\n\000\n' >>"$TMP/stress_ok.txt"
cp "$TMP/stress_ok.txt" "$TMP/stress.txt"
# U+2581 is SentencePiece's own space mark: it decodes to a space.
printf 'U+2581 as text: \342\226\201 alone, \342\226\201\342\226\201twice, a\342\226\201b.\n' >>"$TMP/stress.txt"
printf 'bad \377\376 bytes \303 then ok\n\360\237\230 cut emoji, overlong \300\257, surrogate \355\240\200\n' >>"$TMP/stress.txt"
printf '\200\201\202\n' >>"$TMP/stress.txt"

# mismatches A B: how many lines of A differ from B's line
mismatches() { diff -a "$1" "$2" | grep -c '^<'; }

# check_file MODEL FILE: encode-lines vs spm_encode, decode vs spm_decode;
# adds to the totals LINES, ENC_BAD, DEC_BAD.
check_file() {
    m=$TMP/$1.model
    f=$2
    n=$(wc -l <"$f")
    "$TOK" encode-lines "spm:$m" "$f" >"$TMP/our.ids" 2>"$TMP/err" ||
        { fail "$1 $(basename "$f"): tok_tool encode-lines: $(cat "$TMP/err")"; return; }
    spm_encode --model "$m" --output_format=id <"$f" >"$TMP/ref.ids" 2>"$TMP/err" ||
        { fail "$1 $(basename "$f"): spm_encode: $(cat "$TMP/err")"; return; }
    # Every line's ids, then EOS (2): one tok_tool run decodes the file.
    awk '{ print $0, 2 }' "$TMP/our.ids" >"$TMP/our.eos"
    "$TOK" decode "spm:$m" <"$TMP/our.eos" >"$TMP/our.raw" 2>"$TMP/err" ||
        { fail "$1 $(basename "$f"): tok_tool decode: $(cat "$TMP/err")"; return; }
    sed 's#</s>#\n#g' "$TMP/our.raw" >"$TMP/our.txt"
    spm_decode --model "$m" --input_format=id <"$TMP/ref.ids" >"$TMP/ref.txt" 2>"$TMP/err" ||
        { fail "$1 $(basename "$f"): spm_decode: $(cat "$TMP/err")"; return; }
    enc=$(mismatches "$TMP/our.ids" "$TMP/ref.ids")
    dec=$(mismatches "$TMP/our.txt" "$TMP/ref.txt")
    ids=$(wc -w <"$TMP/our.ids")
    counts="$(wc -l <"$TMP/our.ids") $(wc -l <"$TMP/ref.ids") $(wc -l <"$TMP/our.txt") $(wc -l <"$TMP/ref.txt")"
    msg="$1 $(basename "$f"): $n lines, $ids ids: $enc encode, $dec decode mismatching lines"
    if [ "$enc" -eq 0 ] && [ "$dec" -eq 0 ] && [ "$counts" = "$n $n $n $n" ]; then
        pass "$msg"
    else
        fail "$msg (line counts ours/spm_encode/decode/spm_decode: $counts, input $n)"
    fi
    LINES=$((LINES + n))
    ENC_BAD=$((ENC_BAD + enc))
    DEC_BAD=$((DEC_BAD + dec))
}

# check_whole MODEL FILE: the file as one document, decoded by both.
check_whole() {
    m=$TMP/$1.model
    "$TOK" encode "spm:$m" "$2" >"$TMP/whole.ids" 2>"$TMP/err" ||
        { fail "$1 $(basename "$2") whole: $(cat "$TMP/err")"; return; }
    { "$TOK" decode "spm:$m" <"$TMP/whole.ids" && echo; } >"$TMP/our.txt" 2>"$TMP/err"
    tr '\n' ' ' <"$TMP/whole.ids" | spm_decode --model "$m" --input_format=id >"$TMP/ref.txt" 2>>"$TMP/err"
    if cmp -s "$TMP/our.txt" "$TMP/ref.txt"; then
        pass "$1 $(basename "$2") as one document: $(wc -l <"$TMP/whole.ids") ids decode as spm_decode's"
    else
        fail "$1 $(basename "$2") as one document: decode differs from spm_decode's:" \
            "$(cmp "$TMP/our.txt" "$TMP/ref.txt" 2>&1) $(cat "$TMP/err")"
    fi
}

# ---- ids and text against spm_encode / spm_decode ----
for model in bpe unigram llama; do
    LINES=0 ENC_BAD=0 DEC_BAD=0
    for f in $BOOKS "$TMP/stress.txt"; do
        check_file "$model" "$f"
    done
    echo "$model: $LINES lines compared, $ENC_BAD encode and $DEC_BAD decode mismatches"
    check_whole "$model" "$D/carroll-alice.txt"
    check_whole "$model" "$TMP/stress.txt"
done

# ---- byte-exact round trip where the model keeps every byte ----
for f in $BOOKS "$TMP/stress_ok.txt"; do
    if out=$("$TOK" roundtrip "spm:$TMP/llama.model" "$f" 2>&1); then
        pass "llama round trip $(basename "$f"): $out"
    else
        fail "llama round trip $(basename "$f"): $out"
    fi
done

# What no model keeps: U+2581 in the text comes back as a space.
printf 'a\342\226\201b' >"$TMP/mark.txt"
"$TOK" encode "spm:$TMP/llama.model" "$TMP/mark.txt" | "$TOK" decode "spm:$TMP/llama.model" >"$TMP/mark.out"
if [ "$(cat "$TMP/mark.out")" = "a b" ]; then
    pass "llama: U+2581 (SentencePiece's space mark) in the text decodes to a space, as documented"
else
    fail "llama: a<U+2581>b decodes to '$(cat "$TMP/mark.out")', not 'a b'"
fi

# ---- info: the ids the model itself lists (MODEL.vocab: piece TAB score, in id order) ----
piece_id() { awk -F '\t' -v p="$2" '$1 == p { print NR - 1; exit }' "$TMP/$1.vocab"; }
check_info() { # MODEL
    "$TOK" info "spm:$TMP/$1.model" >"$TMP/info" 2>&1 || { fail "$1 info: $(cat "$TMP/info")"; return; }
    want="vocab_size $(wc -l <"$TMP/$1.vocab")"
    bos=$(piece_id "$1" "<s>")
    want="$want|doc_start ${bos:--1}|doc_end -1"
    for p in "<unk>" "<s>" "</s>"; do
        id=$(piece_id "$1" "$p")
        [ -n "$id" ] && want="$want|special $p $id"
    done
    got=$(grep -E '^(vocab_size|doc_start|doc_end|special) ' "$TMP/info" | paste -sd '|')
    if [ "$got" = "$want" ] && grep -q "^spec spm:/" "$TMP/info" &&
        grep -q "^vocab_sha256 $(sha256sum <"$TMP/$1.model" | cut -c1-64)\$" "$TMP/info"; then
        pass "$1 info: $got, absolute spec, sha256"
    else
        fail "$1 info: got '$got', want '$want': $(cat "$TMP/info")"
    fi
}
for model in bpe unigram llama noBOS; do
    check_info "$model"
done
# spm_train's defaults, as Llama 2's tokenizer.model has them too.
"$TOK" info "spm:$TMP/bpe.model" | grep -E '^(doc_start|special)' | paste -sd ' ' >"$TMP/defaults"
if [ "$(cat "$TMP/defaults")" = "doc_start 1 special <unk> 0 special <s> 1 special </s> 2" ]; then
    pass "bpe: unk 0, BOS 1 (doc_start), EOS 2: spm_train's defaults"
else
    fail "bpe: defaults: $(cat "$TMP/defaults")"
fi

# ---- dtrain-prepare: BOS + ids (+ EOS with --eos) per document ----
# llm.c shard: a 256 x int32 header, then uint16 tokens.
shard_ids() { od -A n -v -t u2 -j 1024 "$1" | tr -s ' ' '\n' | grep -v '^$' | paste -sd ' '; }
if [ -x "${DTRAIN_PREPARE:-}" ]; then
    printf 'It was the best of times.\n' >"$TMP/doc1.txt"
    printf 'Qu\303\251 tal, \344\270\226\347\225\214!\n' >"$TMP/doc2.txt"
    ref=
    for d in doc1 doc2; do
        ref="$ref 1 $(spm_encode --model "$TMP/bpe.model" --output_format=id <"$TMP/$d.txt") 2"
    done
    ref=${ref# }
    for eos in --eos ""; do
        want=$ref
        [ -z "$eos" ] && want=$(echo "$ref" | sed 's/ 2$//; s/ 2 1 / 1 /')
        rm -f "$TMP"/prep_*
        if "$DTRAIN_PREPARE" --out "$TMP/prep" --tokenizer "spm:$TMP/bpe.model" $eos --val-fraction 0 \
            "$TMP/doc1.txt" "$TMP/doc2.txt" >"$TMP/prep.log" 2>&1 &&
            [ "$(shard_ids "$TMP/prep_train_000000.bin")" = "$want" ]; then
            pass "dtrain-prepare spm ${eos:-(no --eos)}: $want"
        else
            fail "dtrain-prepare spm ${eos:-(no --eos)}: wanted '$want', got" \
                "'$(shard_ids "$TMP/prep_train_000000.bin" 2>&1)': $(cat "$TMP/prep.log")"
        fi
    done
    train noEOS --model_type=bpe --vocab_size=500 --eos_id=-1
    expect_exit2 "noEOS.model' defines no EOS" "$DTRAIN_PREPARE" --out "$TMP/noeos" \
        --tokenizer "spm:$TMP/noEOS.model" --eos "$TMP/doc1.txt"
else
    pass "dtrain-prepare not tested: DTRAIN_PREPARE is not set (make check sets it)"
fi

# ---- bad models and ids: exit 1, one line naming the culprit ----
expect_exit1() { # WANT CMD ARGS...
    want=$1
    shift
    "$@" >"$TMP/out" 2>"$TMP/err" <"${IN:-/dev/null}"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$TMP/err"; then
        pass "exit 1: $(cat "$TMP/err")"
    else
        fail "$* -> exit $rc, $lines stderr line(s), wanted '$want': $(head -c 600 "$TMP/err")"
    fi
}
head -c 1000 "$TMP/bpe.model" >"$TMP/truncated.model"
: >"$TMP/empty.model"
mkdir "$TMP/dir.model"
expect_exit1 "'$TMP/missing.model'" "$TOK" info "spm:$TMP/missing.model"
expect_exit1 "'$D/carroll-alice.txt'" "$TOK" info "spm:$D/carroll-alice.txt"
expect_exit1 "'$TMP/truncated.model'" "$TOK" info "spm:$TMP/truncated.model"
expect_exit1 "'$TMP/empty.model'" "$TOK" info "spm:$TMP/empty.model"
expect_exit1 "'$TMP/dir.model'" "$TOK" info "spm:$TMP/dir.model"
expect_exit1 "spm:MODEL" "$TOK" info "spm:"
echo 5 2000 >"$TMP/big.ids"
printf -- '-1\n' >"$TMP/neg.ids"
IN=$TMP/big.ids expect_exit1 "token id 2000 at 1" "$TOK" decode "spm:$TMP/bpe.model"
IN=$TMP/neg.ids expect_exit1 "token id -1 at 0" "$TOK" decode "spm:$TMP/bpe.model"

finish
