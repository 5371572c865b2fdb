#!/usr/bin/env bash
# Tokenizer speed: dtrain-prepare's MB/s per core on the bundled corpus for
# GPT-2 BPE, cl100k_base, a SentencePiece model and the tokenizer.json files
# of Llama 3.1, Qwen3 and DeepSeek-V3 (hf:NAME), at 1 and 2 ranks, beside the
# references measured in the same run: js-tiktoken (node), spm_encode and
# @lenml/tokenizers (node). Run from a build directory after make (and
# scripts/fetch-tokenizers.sh):
#   bench/tokenize.sh [REPEAT]     (REPEAT copies of the corpus, default 128: large
#   enough that loading the vocabulary (a fraction of a second per rank) does
#   not dominate)
# Prints a markdown table for bench/README.md.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$PWD}
repeat=${1:-128}
prep=$build/src/dtrain-prepare
tok=${DTRAIN_TOKENIZERS:-$src/tokenizers}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -x "$prep" ] || { echo "bench/tokenize.sh: no $prep: run make first" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The corpus REPEAT times over, as paragraph documents (blank-line separated).
corpus=$work/corpus.txt
for _ in $(seq "$repeat"); do cat "$src"/examples/data/*.txt; done >"$corpus"
# The references are timed on 8 copies (js-tiktoken takes a minute there).
refcorpus=$work/ref.txt
for _ in $(seq 8); do cat "$src"/examples/data/*.txt; done >"$refcorpus"
mb=$(awk -v b="$(stat -c %s "$corpus")" 'BEGIN { printf "%.1f", b / 1e6 }')

# A SentencePiece BPE model of 8000 pieces trained on the corpus.
spm_train --input="$src/examples/data/austen-persuasion.txt,$src/examples/data/carroll-alice.txt" \
    --model_prefix="$work/spm" --vocab_size=8000 --model_type=bpe --minloglevel=2 >/dev/null 2>&1

# prep_rate NP SPEC: MB/s from dtrain-prepare's summary line.
prep_rate() {
    mpirun --quiet -np "$1" "$prep" --out "$work/o" --tokenizer "$2" --doc-separator '\n\n' "$corpus" |
        sed -n 's/.* s: \([0-9.]*\) MB\/s, .*/\1/p'
}

echo "corpus: examples/data/*.txt x $repeat = $mb MB, paragraph documents; $(nproc) cores; $(uname -m)"
echo
echo "| tokenizer | dtrain-prepare 1 rank MB/s | 2 ranks MB/s (per core) | 2-rank speed-up | reference (1 core) MB/s |"
echo "| --- | ---: | ---: | ---: | ---: |"
row() { # label spec reference
    local r1 r2
    r1=$(prep_rate 1 "$2")
    r2=$(prep_rate 2 "$2")
    awk -v l="$1" -v a="$r1" -v b="$r2" -v ref="$3" \
        'BEGIN { printf "| %s | %.2f | %.2f (%.2f) | %.2fx | %s |\n", l, a, b, b / 2, b / a, ref }'
}
js() { node "$src/bench/tiktoken_speed.mjs" "$tok/node/node_modules" "$1" "$refcorpus" | cut -d' ' -f1; }
spm_ref() {
    local t0 t1
    t0=$(date +%s.%N)
    spm_encode --model="$work/spm.model" --output_format=id <"$refcorpus" >/dev/null
    t1=$(date +%s.%N)
    awk -v b="$(stat -c %s "$refcorpus")" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.2f", b / 1e6 / (t1 - t0) }'
}
row "gpt2" gpt2 "$(js gpt2) (js-tiktoken)"
row "cl100k_base" "tiktoken:$tok/tiktoken/cl100k_base.tiktoken" "$(js cl100k_base) (js-tiktoken)"
row "spm (BPE, 8000)" "spm:$work/spm.model" "$(spm_ref) (spm_encode)"
# @lenml/tokenizers on one copy of the corpus (about 0.5 MB/s)
hf_ref() {
    node "$src/test/hf_json_ref.mjs" "$tok/node" "$tok/hf/$1/tokenizer.json" "$work/one.txt" "$work/one.ids" 2>&1 |
        sed -n 's/.*, \([0-9.]*\) MB\/s per core/\1/p'
}
cat "$src"/examples/data/*.txt >"$work/one.txt"
for name in llama3_1 qwen3 deepseek_v3; do
    if [ -f "$tok/hf/$name/tokenizer.json" ]; then
        row "hf:$name" "hf:$tok/hf/$name/tokenizer.json" "$(hf_ref "$name") (@lenml/tokenizers)"
    else
        echo "| hf:$name | no $tok/hf/$name/tokenizer.json: run scripts/fetch-tokenizers.sh | | | |"
    fi
done
