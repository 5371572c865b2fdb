#!/bin/sh
# The tokenizer sidecar (PREFIX.tokenizer.json) and what dtrain does with it:
#   1. write/read round trip (byte, and gpt2 with its special token), the
#      same bytes on every write, nothing left behind;
#   2. tok_sidecar_find on every data-file name pattern;
#   3. malformed sidecars: one line naming the file and the field;
#   4. a sidecar whose vocabulary exceeds the model's: dtrain exits 2 with
#      one line, on 2 ranks; a missing vocabulary file and (gpt2) a sha256
#      mismatch: one line naming every place looked and the fix
#      (--tokenizer SPEC); a vocabulary is found by identity (name and
#      sha256) beside the sidecar, in $DTRAIN_TOKENIZERS/KIND, in the
#      build's directory, and a same-named file of another sha256 is
#      passed over;
#   5. the byte sample is the sampled ids as bytes (what dtrain printed
#      before tokenizers), prompt first;
#   6. (gpt2) data with a gpt2 sidecar: the sample is decoded text, also
#      when the data moved to where its recorded vocabulary path is gone.
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
. "${top_srcdir:-.}/test/common.sh"

SC="$top_builddir/test/sidecar_tool"
TOK="$top_builddir/test/tok_tool"
DIR=${DTRAIN_TOKENIZERS:-$top_srcdir/tokenizers}
PY=/usr/bin/python3
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x "$SC" ] || { echo "FAIL: $SC is not built (make check builds it)"; exit 1; }
FIRST=$(ls $DATA_TRAIN 2>/dev/null | head -n 1)
VAL=$(ls $DATA_VAL 2>/dev/null | head -n 1)
[ -n "$FIRST" ] && [ -n "$VAL" ] || { echo "FAIL: no byte shards $DATA_TRAIN (make builds them)"; exit 1; }
HAVE_GPT2=0
"$TOK" info "gpt2:$DIR/gpt2" >/dev/null 2>&1 && HAVE_GPT2=1
RUN="--threads 1 --peak-gflops 100 --steps 1 --micro-batch 2 --seq-len 32 --val-every 0"

# edit SRC DST KEY=JSON...: a copy of sidecar SRC with fields replaced
edit() {
    "$PY" - "$@" <<'EOF'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
d = json.load(open(src))
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    if v == "DELETE":
        del d[k]
    else:
        d[k] = json.loads(v)
open(dst, "w").write(json.dumps(d, indent=2) + "\n")
EOF
}

# expect_line WANT CMD...: CMD exits 2 with one stderr line containing WANT
expect_line() {
    want=$1
    shift
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -qF -- "$want" "$TMP/err"; then
        pass "exit 2: $(cat "$TMP/err")"
    else
        fail "$* -> exit $rc, wanted one line with '$want': $(head -c 600 "$TMP/err")"
    fi
}

# ---- 1. round trip ----
"$SC" write byte "$TMP/b.tokenizer.json" llmc 2 3 1000 1 99 && "$SC" read "$TMP/b.tokenizer.json" >"$TMP/b.read" ||
    fail "byte sidecar: write/read failed"
printf 'kind byte\nspec byte\nvocab_path \nvocab_sha256 \nvocab_size 256\ndoc_start -1\ndoc_end -1\ndata_format llmc\ntoken_bytes 2\ntrain 3 1000\nval 1 99\n' >"$TMP/b.want"
cmp -s "$TMP/b.read" "$TMP/b.want" && pass "byte sidecar: every field read back" ||
    fail "byte sidecar read back: $(diff "$TMP/b.want" "$TMP/b.read" | tr '\n' ' ')"
cp "$TMP/b.tokenizer.json" "$TMP/b.first"
"$SC" write byte "$TMP/b.tokenizer.json" llmc 2 3 1000 1 99
cmp -s "$TMP/b.first" "$TMP/b.tokenizer.json" && [ ! -e "$TMP/b.tokenizer.json.tmp" ] &&
    pass "a rewrite gives the same bytes and leaves no .tmp" || fail "a rewrite differs or left a .tmp"
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["format"]=="dtrain-tokenizer" and d["version"]==1 and d["special_tokens"]==[] and d["doc_start"] is None' \
    "$TMP/b.tokenizer.json" && pass "byte sidecar: the documented JSON layout" || fail "byte sidecar JSON layout"
if [ "$HAVE_GPT2" = 1 ]; then
    "$SC" write "gpt2:$DIR/gpt2" "$TMP/g.tokenizer.json" megatron 2 5 12345 1 678 &&
        "$SC" read "$TMP/g.tokenizer.json" >"$TMP/g.read" || fail "gpt2 sidecar: write/read failed"
    sha=$(sha256sum "$DIR/gpt2/encoder.json" | cut -c1-64)
    if grep -qx "kind gpt2" "$TMP/g.read" && grep -qx "vocab_size 50257" "$TMP/g.read" &&
        grep -qx "doc_start 50256" "$TMP/g.read" && grep -qx "vocab_sha256 $sha" "$TMP/g.read" &&
        grep -qx "data_format megatron" "$TMP/g.read" && grep -qx "train 5 12345" "$TMP/g.read" &&
        "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["special_tokens"]==[{"name":"<|endoftext|>","id":50256}]' "$TMP/g.tokenizer.json"; then
        pass "gpt2 sidecar: kind, vocabulary, sha256 of encoder.json, <|endoftext|> 50256, counts"
    else
        fail "gpt2 sidecar fields: $(tr '\n' ' ' <"$TMP/g.read")"
    fi
fi

# ---- 2. finding the sidecar of a data file ----
mkdir -p "$TMP/f"
cp "$TMP/b.tokenizer.json" "$TMP/f/c.tokenizer.json"
cp "$TMP/b.tokenizer.json" "$TMP/f/plain.tokenizer.json"
for n in c_train_000001.bin c_train_000000.bin c_val_000000.bin c_train.bin c_val.bin c_train.idx c_val.idx x_train_000000.bin plain.bin; do
    : >"$TMP/f/$n"
done
for n in c_train_000001.bin c_val_000000.bin c_train.bin c_val.bin c_train.idx c_val.idx 'c_train_*.bin'; do
    got=$("$SC" find "$TMP/f/$n")
    [ "$got" = "$TMP/f/c.tokenizer.json" ] && pass "find $n -> c.tokenizer.json" || fail "find $n -> '$got'"
done
got=$("$SC" find "$TMP/f/plain.bin") && [ "$got" = "$TMP/f/plain.tokenizer.json" ] &&
    pass "find plain.bin -> plain.tokenizer.json" || fail "find plain.bin -> '$got'"
for n in x_train_000000.bin 'x_*.bin' c_train_.bin nothing.txt 'none_*.bin'; do
    "$SC" find "$TMP/f/$n" >/dev/null
    rc=$?
    [ "$rc" -eq 1 ] && pass "find $n: none (1)" || fail "find $n: exit $rc, wanted 1"
done

# ---- 3. malformed sidecars ----
B="$TMP/b.tokenizer.json"
bad() { # bad WANT KEY=JSON...
    want=$1
    shift
    edit "$B" "$TMP/bad.tokenizer.json" "$@"
    expect_line "$want" "$SC" read "$TMP/bad.tokenizer.json"
}
bad "field 'vocab_size'" 'vocab_size="abc"'
bad "field 'kind': missing" kind=DELETE
bad "field 'kind': 'bpe' is not" 'kind="bpe"'
bad "field 'version': 2, but this dtrain reads version 1 (or use" version=2
bad "field 'vocab_size': kind byte has 256 tokens" vocab_size=300
bad "field 'doc_start': expected null or a token id in 0..255" doc_start=256
bad "field 'token_bytes'" token_bytes=3
bad "field 'train.tokens'" 'train={"documents": 1, "tokens": -5}'
bad "field 'special_tokens' [0]" 'special_tokens=[{"name": "x", "id": 999}]'
bad "field 'spec': 'gpt2:/x' is not a spec of kind byte" 'spec="gpt2:/x"'
bad "field 'vocab_sha256': expected 64 lower-case hex digits" 'kind="gpt2"' 'spec="gpt2:/x"' 'vocab_path="/x/encoder.json"' 'vocab_sha256="ABC"' vocab_size=50257
printf '{"format": "dtrain-tokenizer", "version": 1, "version": 1}' >"$TMP/dup.tokenizer.json"
expect_line "dup.tokenizer.json': not valid JSON" "$SC" read "$TMP/dup.tokenizer.json"
head -c 100 "$B" >"$TMP/cut.tokenizer.json"
expect_line "cut.tokenizer.json': not valid JSON: line" "$SC" read "$TMP/cut.tokenizer.json"
expect_line "cannot open tokenizer sidecar" "$SC" read "$TMP/missing.tokenizer.json"

# ---- 4. dtrain: the data's vocabulary against the model's ----
mkdir -p "$TMP/d"
cp "$FIRST" "$TMP/d/v_train_000000.bin"
cp "$VAL" "$TMP/d/v_val_000000.bin"
FAKE='kind="gpt2" spec="gpt2:/nonexistent/gpt2" vocab_path="/nonexistent/gpt2/encoder.json" vocab_size=50257 doc_start=50256'
SHA0='vocab_sha256="0000000000000000000000000000000000000000000000000000000000000000"'
# shellcheck disable=SC2086
edit "$B" "$TMP/d/v.tokenizer.json" $FAKE "$SHA0"
D="--data $TMP/d/v_train_*.bin --val-data $TMP/d/v_val_*.bin"
expect_exit2 "data $TMP/d/v_train_.*bin was made with tokenizer gpt2 (vocabulary 50257) but the model's vocabulary is 256: use --vocab-size >= 50257" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" --model tiny $RUN $D
grep -q "tiny-gpt2, gpt2-124m" "$TMP/err" && pass "the error names the presets that fit" || fail "no preset named: $(cat "$TMP/err")"
# the same for the validation data alone
mkdir -p "$TMP/v2"
cp "$FIRST" "$TMP/v2/w_train_000000.bin"
cp "$VAL" "$TMP/v2/u_val_000000.bin"
edit "$B" "$TMP/v2/u.tokenizer.json" $FAKE "$SHA0"
expect_exit2 "data $TMP/v2/u_val_\*.bin was made with tokenizer gpt2" "$DTRAIN" --model tiny $RUN \
    --data "$TMP/v2/w_train_*.bin" --val-data "$TMP/v2/u_val_*.bin" --val-every 1
# a model that covers it: the vocabulary file is missing, which matters only for a sample
expect_exit2 "data sidecar $TMP/d/v.tokenizer.json: no gpt2 vocabulary with the data's sha256 000000000000... at $TMP/d/encoder.json, .* or /nonexistent/gpt2/encoder.json.*: put the vocabulary that made the data in one of those places, or give --tokenizer SPEC" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" --model tiny $RUN --vocab-size 50257 $D --sample-tokens 4
"$DTRAIN" --model tiny $RUN --vocab-size 50257 $D --sample-tokens 0 >"$TMP/out" 2>&1 &&
    pass "no sample: the missing vocabulary is not needed" || fail "--sample-tokens 0: $(tail -n 2 "$TMP/out")"
"$DTRAIN" --model tiny $RUN --vocab-size 50257 $D --sample-tokens 4 --tokenizer none >"$TMP/out" 2>&1 &&
    grep -q "^sample token ids" "$TMP/out" && pass "--tokenizer none: ids printed" || fail "--tokenizer none: $(tail -n 2 "$TMP/out")"
expect_exit2 "--tokenizer gpt2:$TMP/nowhere:" "$DTRAIN" --model tiny $RUN --vocab-size 50257 $D --tokenizer "gpt2:$TMP/nowhere"
expect_exit2 "--tokenizer bogus: unknown tokenizer 'bogus'" "$DTRAIN" --model tiny $RUN --tokenizer bogus
if [ "$HAVE_GPT2" = 1 ]; then
    expect_exit2 "--tokenizer gpt2:$DIR/gpt2 has vocabulary 50257 but the model's vocabulary is 256: use --vocab-size >= 50257" \
        "$DTRAIN" --model tiny $RUN --data "$DATA_TRAIN" --tokenizer "gpt2:$DIR/gpt2"
    # a sidecar naming the real vocabulary with another sha256
    edit "$TMP/g.tokenizer.json" "$TMP/d/v.tokenizer.json" "$SHA0"
    expect_exit2 "no gpt2 vocabulary with the data's sha256 000000000000... at .*($DIR/gpt2/encoder.json is another vocabulary)" \
        "$MPIEXEC" --quiet -np 2 "$DTRAIN" --model tiny-gpt2 $RUN $D
    # the vocabulary moved with the data: found beside the sidecar
    mkdir -p "$TMP/moved"
    cp "$DIR/gpt2/encoder.json" "$DIR/gpt2/vocab.bpe" "$TMP/moved/"
    edit "$TMP/g.tokenizer.json" "$TMP/moved/m.tokenizer.json" 'spec="gpt2:/gone/gpt2"' 'vocab_path="/gone/gpt2/encoder.json"'
    got=$("$SC" open "$TMP/moved/m.tokenizer.json" 2>&1)
    [ "$got" = "gpt2:$TMP/moved 50257" ] && pass "a moved vocabulary is found beside the sidecar" || fail "moved: '$got'"
    # data made on another machine (its vocab_path is gone), no vocabulary
    # beside it: found by identity in $DTRAIN_TOKENIZERS/gpt2 (a bundle's
    # tokenizers/), then in the build's tokenizer directory
    mkdir -p "$TMP/tokcopy/gpt2" "$TMP/elsewhere" "$TMP/tampered"
    cp "$DIR/gpt2/encoder.json" "$DIR/gpt2/vocab.bpe" "$TMP/tokcopy/gpt2/"
    edit "$TMP/g.tokenizer.json" "$TMP/elsewhere/e.tokenizer.json" 'spec="gpt2:/gone/gpt2"' 'vocab_path="/gone/gpt2/encoder.json"'
    got=$(DTRAIN_TOKENIZERS="$TMP/tokcopy" "$SC" open "$TMP/elsewhere/e.tokenizer.json" 2>&1)
    [ "$got" = "gpt2:$TMP/tokcopy/gpt2 50257" ] && pass "a vocabulary is found in \$DTRAIN_TOKENIZERS/gpt2 by its sha256" ||
        fail "DTRAIN_TOKENIZERS: '$got'"
    if [ -n "${DTRAIN_TOKENIZERS:-}" ]; then # the harness sets it to the build's directory
        # the spec names the directory as the tokenizer resolved it (realpath):
        # a build configured with --with-tokenizers=BUILD/../tokenizers, as
        # .ci/run's tarball builds are, prints it without the '..'
        got=$(env -u DTRAIN_TOKENIZERS "$SC" open "$TMP/elsewhere/e.tokenizer.json" 2>&1)
        [ "$got" = "gpt2:$(cd "$DTRAIN_TOKENIZERS/gpt2" && pwd -P) 50257" ] && pass "without DTRAIN_TOKENIZERS: the build's tokenizer directory" ||
            fail "builtin directory: '$got'"
    fi
    # a file of the right name but another sha256 beside the sidecar is passed over
    sed 's/"!": 0/"!": 0 /' "$DIR/gpt2/encoder.json" >"$TMP/tampered/encoder.json"
    cp "$DIR/gpt2/vocab.bpe" "$TMP/tampered/"
    cp "$TMP/elsewhere/e.tokenizer.json" "$TMP/tampered/e.tokenizer.json"
    got=$(DTRAIN_TOKENIZERS="$TMP/tokcopy" "$SC" open "$TMP/tampered/e.tokenizer.json" 2>&1)
    if ! cmp -s "$DIR/gpt2/encoder.json" "$TMP/tampered/encoder.json" && [ "$got" = "gpt2:$TMP/tokcopy/gpt2 50257" ]; then
        pass "an encoder.json with another sha256 beside the sidecar is passed over"
    else
        fail "tampered vocabulary beside the sidecar: '$got'"
    fi
fi
# a moved tiktoken rank file keeps its encoding
CL="$DIR/tiktoken/cl100k_base.tiktoken"
if [ -f "$CL" ] && "$SC" write "tiktoken:$CL" "$TMP/t.tokenizer.json" llmc 4 1 1 1 1; then
    mkdir -p "$TMP/tmoved"
    cp "$CL" "$TMP/tmoved/"
    edit "$TMP/t.tokenizer.json" "$TMP/tmoved/t.tokenizer.json" 'spec="tiktoken:/gone/cl100k_base.tiktoken:cl100k_base"' \
        'vocab_path="/gone/cl100k_base.tiktoken"'
    got=$("$SC" open "$TMP/tmoved/t.tokenizer.json" 2>&1)
    [ "$got" = "tiktoken:$TMP/tmoved/cl100k_base.tiktoken:cl100k_base 100277" ] &&
        pass "a moved tiktoken rank file is found beside the sidecar, encoding kept" || fail "tiktoken moved: '$got'"
fi

# ---- 5. the byte sample: the sampled ids as bytes, prompt first ----
S="--model tiny --data $DATA_TRAIN --threads 1 --peak-gflops 100 --steps 3 --micro-batch 2 --seq-len 64 --val-every 0 --sample-tokens 80"
# sample_text LOG: everything after the sample header, less the final newline
sample_text() { sed -n '/^sample/,$p' "$1" | tail -n +2 | head -c -1; }
"$DTRAIN" $S --prompt "" --tokenizer byte >"$TMP/byte.log" 2>&1 &&
    "$DTRAIN" $S --prompt "" --tokenizer none >"$TMP/ids.log" 2>&1 || fail "sample runs failed: $(tail -n 2 "$TMP/byte.log")"
sample_text "$TMP/byte.log" >"$TMP/byte.txt"
sed -n '/^sample token ids/{n;p}' "$TMP/ids.log" |
    "$PY" -c 'import sys; sys.stdout.buffer.write(bytes(int(t) for t in sys.stdin.read().split()))' >"$TMP/ids.txt"
if [ -s "$TMP/ids.txt" ] && [ "$(wc -c <"$TMP/ids.txt")" -eq 81 ] && cmp -s "$TMP/byte.txt" "$TMP/ids.txt"; then
    pass "byte sample == the sampled ids as bytes (81 bytes, token 0 first)"
else
    fail "byte sample differs from its ids: $(cmp "$TMP/byte.txt" "$TMP/ids.txt" 2>&1)"
fi
"$DTRAIN" $S >"$TMP/def.log" 2>&1 || fail "default sample run: $(tail -n 2 "$TMP/def.log")"
sample_text "$TMP/def.log" >"$TMP/def.txt"
if grep -q "^tokenizer: byte (from the data's sidecar" "$TMP/def.log" && [ "$(head -c 6 "$TMP/def.txt")" = "ALICE." ] &&
    [ "$(wc -c <"$TMP/def.txt")" -eq 86 ]; then
    pass "default byte run: the data's byte sidecar, sample = ALICE. + 80 bytes"
else
    fail "default byte run: $(grep '^tokenizer' "$TMP/def.log"), $(wc -c <"$TMP/def.txt") bytes"
fi

# ---- 6. a gpt2 sidecar: the sample is text ----
if [ "$HAVE_GPT2" = 1 ] && [ -n "${DTRAIN_PREPARE:-}" ] && [ -x "$DTRAIN_PREPARE" ]; then
    "$DTRAIN_PREPARE" --out "$TMP/g2" --tokenizer gpt2 --doc-separator '\n\n' --val-fraction 0.1 "$top_srcdir/examples/data/carroll-alice.txt" \
        >/dev/null 2>"$TMP/prep.err" || fail "dtrain-prepare --tokenizer gpt2: $(cat "$TMP/prep.err")"
    G="--model tiny-gpt2 --n-layer 1 --d-model 32 --n-head 2 --d-ff 64 --data $TMP/g2_train_*.bin --threads 1"
    G="$G --peak-gflops 100 --steps 2 --micro-batch 2 --seq-len 32 --val-every 0 --sample-tokens 40"
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $G >"$TMP/g.log" 2>&1 || fail "gpt2 run: $(tail -n 2 "$TMP/g.log")"
    sample_text "$TMP/g.log" >"$TMP/g.txt"
    n=$(wc -c <"$TMP/g.txt")
    # every GPT-2 token is at least one byte of text (<|endoftext|> 13)
    if grep -q "^tokenizer: gpt2:.* (from the data's sidecar $TMP/g2.tokenizer.json)" "$TMP/g.log" &&
        [ "$(head -c 6 "$TMP/g.txt")" = "ALICE." ] && [ "$n" -ge 46 ] && [ "$n" -le 1000 ] &&
        ! grep -q '\[token ' "$TMP/g.txt" && ! grep -q "^sample token ids" "$TMP/g.log"; then
        pass "gpt2 sidecar: the sample is decoded text, ALICE. first ($n bytes for 40 tokens)"
    else
        fail "gpt2 sample: $(grep '^tokenizer' "$TMP/g.log"); $n bytes: $(head -c 200 "$TMP/g.txt")"
    fi
    # the same data moved to a machine where the vocabulary's old path is
    # gone (a bundle): trained and decoded with $DTRAIN_TOKENIZERS's copy
    mkdir -p "$TMP/reloc"
    cp "$TMP"/g2_*.bin "$TMP/reloc/"
    edit "$TMP/g2.tokenizer.json" "$TMP/reloc/g2.tokenizer.json" 'spec="gpt2:/build/dir/tokenizers/gpt2"' \
        'vocab_path="/build/dir/tokenizers/gpt2/encoder.json"'
    DTRAIN_TOKENIZERS="$TMP/tokcopy" "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(echo "$G" | sed "s|$TMP/g2_|$TMP/reloc/g2_|") \
        >"$TMP/reloc.log" 2>&1 || fail "relocated gpt2 data: $(tail -n 2 "$TMP/reloc.log")"
    sample_text "$TMP/reloc.log" >"$TMP/reloc.txt"
    if grep -q "^tokenizer: gpt2:$TMP/tokcopy/gpt2 (from the data's sidecar $TMP/reloc/g2.tokenizer.json)" "$TMP/reloc.log" &&
        cmp -s "$TMP/g.txt" "$TMP/reloc.txt"; then
        pass "relocated data (vocab_path gone) trains on 2 ranks and decodes the same sample"
    else
        fail "relocated data: $(grep '^tokenizer' "$TMP/reloc.log"): $(head -c 200 "$TMP/reloc.txt")"
    fi
    # the prompt is the tokenizer's encoding after <|endoftext|>: decoding
    # those ids gives the prompt back, and they are GPT-2's ids
    printf 'ALICE. Hello, world' >"$TMP/prompt.txt"
    ids=$("$TOK" encode "gpt2:$DIR/gpt2" "$TMP/prompt.txt" | tr '\n' ' ')
    [ "$ids" = "1847 8476 13 18435 11 995 " ] && pass "prompt ids: $ids" || fail "prompt 'ALICE. Hello, world' -> '$ids'"
else
    echo "skip: gpt2 parts (no GPT-2 vocabulary in $DIR/gpt2 or no dtrain-prepare)"
fi
finish
