#!/bin/sh
# dtrain --init-from against PyTorch: test/ref/hf_ref.py writes random
# weights under Hugging Face's names (config.json + safetensors written from
# the format's spec, one file or shards with the index; f32, bf16, f16) for
# a small GPT-2 (Conv1D [in, out], fused c_attn, vocabulary 300: padded in
# memory) and a small Llama (rotate-half RoPE, GQA 4:2, untied head), and
# llm.c model files (fp32 version 3, bf16 version 5) of the same GPT-2, and
# computes the loss of a fixed batch with models written to Hugging Face's
# modelling conventions. dtrain's validation loss at step 0 after
# --init-from must agree within 1e-5 relative, at 1 rank, tp2, pp2 and
# tp2 x pp2 x dp2 with ZeRO-3, and its parameters must be bit-identical at
# every layout. A file as a converter that skips the Conv1D transpose or
# the RoPE permutation would read it must fail that check. Then: 20
# fine-tuning steps at tp2 x pp2 equal one rank's within the layout
# tolerances; --resume wins over --init-from; the resident memory an import
# adds stays within the rank's tensors plus one tensor, and a tp2 rank reads
# half of what one rank reads; bad inputs are one line and exit 2 on every
# rank.
# Export (dreshard --to-hf / --to-llmc): the weights each layout loaded,
# written back out on 1 to 4 ranks, equal the original directory in every
# tensor byte for byte (fp32, bf16, fp16; one file or shards) and the
# original llm.c files byte for byte; the PyTorch model reads the export
# (reader written from the spec, shapes from the exported config.json) and
# gets the original's loss; the data's GPT-2 tokenizer and a given
# SentencePiece model travel with the export; a refused or failed export
# (existing output, wrong architecture, damaged input, changed vocabulary
# file, full disk) is one line and leaves nothing behind.
. "$top_srcdir/test/common.sh"
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}
REF="$top_srcdir/test/ref/hf_ref.py"
if ! "$PYTHON_REF" -c 'import torch, numpy' >/dev/null 2>&1; then
    echo "SKIP: $PYTHON_REF cannot import torch and numpy (Debian's python3-torch)"
    exit 77
fi

# write NAME ARGS...: a model directory $TMP/NAME (and token file $TMP/NAME.tok)
write() {
    name=$1
    shift
    "$PYTHON_REF" "$REF" write --out "$TMP/$name" --tokens "$TMP/$name.tok" "$@" >/dev/null ||
        { fail "hf_ref.py write $name $*"; return 1; }
}


# agree LABEL DIR SOURCE TOKENS NP ARGS...: init_val0 within 1e-5 of DIR's reference
agree() {
    label=$1
    dir=$2
    shift 2
    if loss=$(init_val0 "$@") && out=$("$PYTHON_REF" "$REF" check "$dir" "$loss" --label "$label"); then
        pass "$(echo "$out" | sed "s/^ok *//")"
    else
        fail "$label: ${out:-dtrain failed}"
    fi
}

# same_params LABEL A.h5 B.h5: bit-identical logical tensors
same_params() {
    if out=$("$PYTHON_REF" "$top_srcdir/test/compare_params.py" "$2" "$3" 0 2>&1); then
        pass "$1: parameters bit-identical to 1 rank's ($out)"
    else
        fail "$1: parameters differ from 1 rank's: $out"
    fi
}

write g --arch gpt2 --llmc "$TMP/g3.bin" --llmc-version 3 || finish
write gb --arch gpt2 --dtype bf16 --shards 2 --llmc "$TMP/g5.bin" --llmc-version 5
write gh --arch gpt2 --dtype f16 --gpt2-plain-names --tied-head
write l --arch llama || finish
write lb --arch llama --dtype bf16 --shards 3
write lh --arch llama --dtype f16
write gt --arch gpt2 --mutate transpose
write lr --arch llama --mutate rope

# to_hf LABEL ORIG NP ARGS...: dreshard on NP ranks exports $TMP/last.h5 (the
# weights dtrain loaded, unchanged) to $TMP/rt; its tensors must equal the
# original directory's byte for byte (names, dtypes, shapes, data; read by
# st_ref.py, written from the safetensors spec), whatever the sharding
to_hf() {
    label=$1
    orig=$2
    np=$3
    shift 3
    if ! "$MPIEXEC" --quiet -np "$np" "$DRESHARD" --in "$TMP/last.h5" --to-hf "$TMP/rt" --force "$@" \
        >"$TMP/rt.log" 2>&1; then
        fail "$label: dreshard --to-hf on $np ranks: $(tail -n 1 "$TMP/rt.log")"
    elif out=$("$PYTHON_REF" "$top_srcdir/test/st_ref.py" same-tensors "$orig" "$TMP/rt" 2>&1); then
        pass "$label -> dreshard --to-hf ($np ranks $*): $out"
    else
        fail "$label -> dreshard --to-hf ($np ranks $*): $out"
    fi
}

# to_llmc LABEL ORIG NP ARGS...: the same for an llm.c file, the whole file
to_llmc() {
    label=$1
    orig=$2
    np=$3
    shift 3
    if ! "$MPIEXEC" --quiet -np "$np" "$DRESHARD" --in "$TMP/last.h5" --to-llmc "$TMP/rt.bin" --force "$@" \
        >"$TMP/rt.log" 2>&1; then
        fail "$label: dreshard --to-llmc on $np ranks: $(tail -n 1 "$TMP/rt.log")"
    elif cmp -s "$orig" "$TMP/rt.bin"; then
        pass "$label -> dreshard --to-llmc ($np ranks $*): the file is byte-identical ($(wc -c <"$orig") bytes)"
    else
        fail "$label -> dreshard --to-llmc ($np ranks $*): $(cmp "$orig" "$TMP/rt.bin")"
    fi
}

# exported LABEL DIR REF TOKENS: the PyTorch model's loss on an export
exported() {
    if out=$("$PYTHON_REF" "$REF" exported "$2" "$3" "$4" --label "$1" 2>&1); then
        pass "$(echo "$out" | sed "s/^ok *//")"
    else
        fail "$out"
    fi
}

# ---- numerics at every layout, and the round trip back out ----
for m in g l; do
    agree "$m 1 rank" "$TMP/$m" "$TMP/$m" "$TMP/$m.tok" 1 && cp "$TMP/last.h5" "$TMP/$m.1.h5" &&
        to_hf "$m 1 rank" "$TMP/$m" 1
    agree "$m tp2" "$TMP/$m" "$TMP/$m" "$TMP/$m.tok" 2 --tp 2 && same_params "$m tp2" "$TMP/$m.1.h5" "$TMP/last.h5" &&
        to_hf "$m tp2" "$TMP/$m" 2
    # the same file cut into 4 KiB tiles (DTRAIN_TEST_EXPORT_TILE_BYTES, a test-only knob): many tiles per
    # tensor, aligned to the tp2 chunks and to RoPE heads, fused outputs across tiles, dealt to 3 ranks
    cp "$TMP/last.h5" "$TMP/$m.tp2.h5"
    DTRAIN_TEST_EXPORT_TILE_BYTES=4096
    export DTRAIN_TEST_EXPORT_TILE_BYTES
    to_hf "$m tp2, 4 KiB tiles" "$TMP/$m" 3
    [ "$m" = g ] && to_llmc "llm.c v3 from g tp2, 4 KiB tiles" "$TMP/g3.bin" 3
    unset DTRAIN_TEST_EXPORT_TILE_BYTES
    agree "$m pp2" "$TMP/$m" "$TMP/$m" "$TMP/$m.tok" 2 --pp 2 --global-batch 4 &&
        same_params "$m pp2" "$TMP/$m.1.h5" "$TMP/last.h5" && to_hf "$m pp2" "$TMP/$m" 3
    agree "$m tp2 x pp2 x dp2 zero3" "$TMP/$m" "$TMP/$m" "$TMP/$m.tok" 8 --tp 2 --pp 2 --zero 3 --global-batch 8 &&
        same_params "$m tp2 x pp2 x dp2 zero3" "$TMP/$m.1.h5" "$TMP/last.h5" &&
        to_hf "$m tp2 x pp2 x dp2 zero3" "$TMP/$m" 4 --max-shard-size 40KB
    # the export read back by the PyTorch model of Hugging Face's conventions
    exported "$m exported" "$TMP/rt" "$TMP/$m" "$TMP/$m.tok"
done
agree "gpt2 bf16, 2 shards" "$TMP/gb" "$TMP/gb" "$TMP/gb.tok" 1 && to_hf "gpt2 bf16" "$TMP/gb" 2 --dtype bf16
agree "gpt2 bf16, 2 shards, tp2" "$TMP/gb" "$TMP/gb" "$TMP/gb.tok" 2 --tp 2 &&
    to_hf "gpt2 bf16 tp2" "$TMP/gb" 1 --dtype bf16 --max-shard-size 100KB
agree "gpt2 f16, names without 'transformer.', lm_head stored" "$TMP/gh" "$TMP/gh" "$TMP/gh.tok" 1
agree "llama bf16, 3 shards" "$TMP/lb" "$TMP/lb" "$TMP/lb.tok" 1 && to_hf "llama bf16" "$TMP/lb" 3 --dtype bf16
agree "llama bf16, 3 shards, tp2 x pp2" "$TMP/lb" "$TMP/lb" "$TMP/lb.tok" 4 --tp 2 --pp 2 --global-batch 4 &&
    to_hf "llama bf16 tp2 x pp2" "$TMP/lb" 2 --dtype bf16
agree "llama f16" "$TMP/lh" "$TMP/lh" "$TMP/lh.tok" 1 && to_hf "llama f16" "$TMP/lh" 2 --dtype fp16
exported "llama f16 exported" "$TMP/rt" "$TMP/lh" "$TMP/lh.tok"

# ---- llm.c files: the same loss as the Hugging Face directory, and back ----
hf=$(init_val0 "$TMP/g" "$TMP/g.tok" 1)
agree "llm.c fp32 (version 3)" "$TMP/g" "$TMP/g3.bin" "$TMP/g.tok" 1 && expect_close "llm.c v3 = HF f32" "$hf" "$loss" 1e-7
same_params "llm.c v3" "$TMP/g.1.h5" "$TMP/last.h5"
to_llmc "llm.c v3" "$TMP/g3.bin" 1
to_llmc "llm.c v3" "$TMP/g3.bin" 3
hf=$(init_val0 "$TMP/gb" "$TMP/gb.tok" 1)
agree "llm.c bf16 (version 5)" "$TMP/gb" "$TMP/g5.bin" "$TMP/gb.tok" 1 && expect_close "llm.c v5 = HF bf16" "$hf" "$loss" 1e-7
agree "llm.c bf16 (version 5), tp2 x pp2" "$TMP/gb" "$TMP/g5.bin" "$TMP/gb.tok" 4 --tp 2 --pp 2 --global-batch 4 &&
    to_llmc "llm.c v5 tp2 x pp2" "$TMP/g5.bin" 2 --dtype bf16

# ---- three loader threads (--threads 3): tensors taken in turn, the same weights ----
agree "gpt2 f32, 3 loader threads" "$TMP/g" "$TMP/g" "$TMP/g.tok" 1 --threads 3 &&
    same_params "gpt2 f32, 3 loader threads" "$TMP/g.1.h5" "$TMP/last.h5"
agree "llama bf16, 3 loader threads" "$TMP/lb" "$TMP/lb" "$TMP/lb.tok" 1 --threads 3
agree "llm.c bf16 (version 5), 3 loader threads" "$TMP/gb" "$TMP/g5.bin" "$TMP/gb.tok" 1 --threads 3

# ---- a converter's bugs would show: the mutated files must fail the check ----
for m in gt:transpose lr:rope; do
    d=${m%%:*}
    loss=$(init_val0 "$TMP/$d" "$TMP/$d.tok" 1)
    if out=$("$PYTHON_REF" "$REF" check "$TMP/$d" "$loss" --tol 1e-3 --label "skipped ${m#*:}"); then
        fail "a skipped ${m#*:} went unnoticed: $out"
    else
        pass "a skipped ${m#*:} is caught: $out"
    fi
done

# ---- fine-tuning: 20 steps at tp2 x pp2 equal one rank's ----
for m in g l; do
    finetune_run "$TMP/ft.$m.1.json" 1 "$TMP/$m" &&
        finetune_run "$TMP/ft.$m.tp2pp2.json" 4 "$TMP/$m" --tp 2 --pp 2 &&
        layout_compare "$TMP/ft.$m.1.json" "$TMP/ft.$m.tp2pp2.json" "fine-tune $m tp2 x pp2 vs 1 rank"
done

# ---- --resume wins over --init-from when it finds a checkpoint ----
finetune_run "$TMP/rs.a.json" 2 "$TMP/g" --tp 2 --ckpt-dir "$TMP/ck" --stop-at-step 10 &&
    finetune_run "$TMP/rs.b.json" 2 "$TMP/g" --tp 2 --ckpt-dir "$TMP/ck" --resume auto && {
    if grep -q "init-from: --resume found .*step_00000010" "$TMP/rs.b.json.log" &&
        ! grep -q '"step": [1-9],' "$TMP/rs.b.json" && grep -q '"step": 11,' "$TMP/rs.b.json"; then
        pass "--resume auto found the checkpoint of step 10 and continued from step 11, not from --init-from"
    else
        fail "--resume did not win over --init-from: $(grep -E 'resume|init-from' "$TMP/rs.b.json.log" | head -3)"
    fi
    expect_close "requeued fine-tune (stopped at 10, resumed) vs uninterrupted: final val loss" \
        "$(json_field "$TMP/ft.g.1.json" 20 val_loss)" "$(json_field "$TMP/rs.b.json" 20 val_loss)" 1e-5
}

# ---- a trained checkpoint (tp2, with AdamW state) out to Hugging Face and back in: bit for bit ----
if "$MPIEXEC" --quiet -np 3 "$DRESHARD" --in "$TMP/ck/step_00000010.h5" --to-hf "$TMP/ckhf" >"$TMP/ckhf.log" 2>&1 &&
    init_val0 "$TMP/ckhf" "$TMP/g.tok" 2 --pp 2 --global-batch 4 >/dev/null; then
    same_params "checkpoint (step 10, tp2) -> --to-hf on 3 ranks -> --init-from at pp2" "$TMP/ck/step_00000010.h5" \
        "$TMP/last.h5"
    # the run trained on byte shards: the checkpoint records it, the export carries its tokenizer.json
    "$top_builddir/test/tok_tool" hfjson byte >"$TMP/byte.tokenizer.json"
    if cmp -s "$TMP/ckhf/tokenizer.json" "$TMP/byte.tokenizer.json" &&
        grep -q '"tokenizer_class": "PreTrainedTokenizerFast"' "$TMP/ckhf/tokenizer_config.json"; then
        pass "the byte-vocabulary checkpoint's export carries the byte tokenizer.json test_tokenizer.sh checks"
    else
        fail "byte tokenizer files of the checkpoint's export: $(ls "$TMP/ckhf" | tr '\n' ' ')"
    fi
else
    fail "checkpoint -> --to-hf -> --init-from: $(tail -n 1 "$TMP/ckhf.log") $(tail -n 1 "$TMP/last.log")"
fi

# ---- memory: a GPT-2 with a 50257-row embedding (49 MiB in fp32), bf16 ----
"$PYTHON_REF" "$REF" write --arch gpt2 --big --dtype bf16 --out "$TMP/big" >/dev/null || fail "write big"
# mem NP ARGS...: "read grew local largest" (MiB, the maximum over the ranks)
mem() {
    np=$1
    shift
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" --init-from "$TMP/big" --data "$DATA_TRAIN" --val-data "$DATA_VAL" \
        --steps 1 --seq-len 16 --micro-batch 2 --val-every 0 --sample-tokens 0 --peak-gflops 100 --threads 1 "$@" \
        2>&1 | sed -n 's/.*at most: \([0-9.]*\) MiB read.*grew \([0-9.]*\) MiB for \([0-9.]*\) MiB.*largest \([0-9.]*\) MiB.*/\1 \2 \3 \4/p'
}
for lay in "1" "2 --tp 2" "2 --pp 2 --global-batch 4"; do
    # shellcheck disable=SC2086
    set -- $(mem $lay)
    [ "${lay%% *}" = 1 ] && read1=${1:-0}
    if [ $# -eq 4 ] && awk -v g="$2" -v l="$3" -v t="$4" 'BEGIN { exit !(g <= l + t + 2) }'; then
        pass "memory np $lay: resident growth $2 MiB <= local tensors $3 + largest tensor $4 + 2 MiB"
    else
        fail "memory np $lay: '$*' (read grew local largest, MiB)"
    fi
    case $lay in
    *tp*) if awk -v r="$1" -v r1="$read1" 'BEGIN { exit !(r <= 0.55 * r1) }'; then
              pass "tp2 rank read $1 MiB of the file, one rank $read1 MiB: each rank reads its slices only"
          else
              fail "tp2 rank read $1 MiB, one rank $read1 MiB"
          fi ;;
    esac
done

# ---- export: the tokenizer's files ----
# A GPT-2 vocabulary model trained a step (lr 0) on the GPT-2 shards `make`
# writes: the parameter file records the data's tokenizer, and the export
# carries GPT-2's files byte for byte.
GPT2_DATA="$top_builddir/data/gutenberg-gpt2_train_*.bin"
"$MPIEXEC" --quiet -np 2 "$DTRAIN" --init-from "$TMP/big" --data "$GPT2_DATA" --val-every 0 --steps 1 --lr 0 --min-lr 0 --warmup 0 \
    --seq-len 16 --micro-batch 2 --sample-tokens 0 --peak-gflops 100 --threads 1 --save-params "$TMP/last.h5" \
    >"$TMP/big.log" 2>&1 || fail "dtrain --init-from big on GPT-2 shards: $(tail -n 2 "$TMP/big.log")"
to_hf "gpt2 vocabulary 50257, bf16" "$TMP/big" 2 --dtype bf16
tokdir=$(sed -n 's/.*"spec": "gpt2:\(.*\)",/\1/p' "$top_builddir/data/gutenberg-gpt2.tokenizer.json")
TOK="$top_builddir/test/tok_tool"
"$TOK" hfjson "gpt2:$tokdir" >"$TMP/gpt2.tokenizer.json" || fail "tok_tool hfjson gpt2"
if cmp -s "$TMP/rt/vocab.json" "$tokdir/encoder.json" && cmp -s "$TMP/rt/merges.txt" "$tokdir/vocab.bpe" &&
    cmp -s "$TMP/rt/tokenizer.json" "$TMP/gpt2.tokenizer.json" &&
    grep -q '"tokenizer_class": "GPT2Tokenizer"' "$TMP/rt/tokenizer_config.json" &&
    grep -q '"eos_token_id": 50256' "$TMP/rt/config.json" && grep -q '"eos_token_id": 50256' "$TMP/rt/generation_config.json"; then
    pass "the export carries the data's GPT-2 tokenizer (vocab.json = encoder.json, merges.txt = vocab.bpe, tokenizer.json = the file test_tokenizer.sh checks, eos 50256) without being told"
else
    fail "the GPT-2 tokenizer files of the export: $(ls "$TMP/rt" | tr '\n' ' ')"
fi
# a tiktoken rank file, r50k_base (GPT-2's ranks), becomes tokenizer.json
r50k="$(dirname "$tokdir")/tiktoken/r50k_base.tiktoken"
to_hf "gpt2 vocabulary, --tokenizer tiktoken:r50k_base" "$TMP/big" 1 --dtype bf16 --tokenizer "tiktoken:$r50k"
"$TOK" hfjson "tiktoken:$r50k" >"$TMP/r50k.tokenizer.json" || fail "tok_tool hfjson r50k_base"
if cmp -s "$TMP/rt/tokenizer.json" "$TMP/r50k.tokenizer.json" && [ ! -e "$TMP/rt/vocab.json" ] &&
    grep -q '"tokenizer_class": "PreTrainedTokenizerFast"' "$TMP/rt/tokenizer_config.json" &&
    grep -q '"eos_token": "<|endoftext|>"' "$TMP/rt/special_tokens_map.json"; then
    pass "--tokenizer tiktoken:r50k_base: tokenizer.json, the file test_tokenizer.sh checks; PreTrainedTokenizerFast"
else
    fail "the tiktoken tokenizer files of the export: $(ls "$TMP/rt" | tr '\n' ' ')"
fi
# SentencePiece: a 300-piece model of the corpus for the small Llama
if spm_train --input="$top_srcdir/examples/data/carroll-alice.txt" --model_prefix="$TMP/sp" --vocab_size=300 \
    --model_type=bpe --minloglevel=2 >/dev/null 2>&1; then
    cp "$TMP/l.1.h5" "$TMP/last.h5"
    to_hf "llama with --tokenizer spm" "$TMP/l" 2 --tokenizer "spm:$TMP/sp.model"
    if cmp -s "$TMP/rt/tokenizer.model" "$TMP/sp.model" && grep -q '"tokenizer_class": "LlamaTokenizer"' \
        "$TMP/rt/tokenizer_config.json" && grep -q '"bos_token": "<s>"' "$TMP/rt/special_tokens_map.json" &&
        grep -q '"bos_token_id": 1' "$TMP/rt/config.json" && grep -q '"eos_token_id": 2' "$TMP/rt/config.json"; then
        pass "--tokenizer spm:MODEL: tokenizer.model is the model, LlamaTokenizer, <s> = 1, </s> = 2"
    else
        fail "the spm tokenizer files of the export: $(cat "$TMP/rt/tokenizer_config.json")"
    fi
else
    fail "spm_train of a 300-piece model"
fi

# ---- export: bad input and failed writes ----
ex() { np=$1; shift; "$MPIEXEC" --quiet -np "$np" "$DRESHARD" "$@"; }
mkdir -p "$TMP/exists"
expect_exit2 "exists: remove it, choose another path, or pass --force" ex 2 --in "$TMP/g.1.h5" --to-hf "$TMP/exists"
expect_exit2 "llm.c model files hold GPT-2 models" ex 2 --in "$TMP/l.1.h5" --to-llmc "$TMP/l.bin"
expect_exit2 "--dtype fp16: llm.c model files are fp32" ex 1 --in "$TMP/g.1.h5" --to-llmc "$TMP/g.bin" --dtype fp16
expect_exit2 "has 50257 tokens, more than the model's vocabulary of 300" ex 2 --in "$TMP/g.1.h5" --to-hf "$TMP/x" \
    --tokenizer gpt2
expect_exit2 "leave out --out, --tp" ex 1 --in "$TMP/g.1.h5" --to-hf "$TMP/x" --tp 2
expect_exit2 "--max-shard-size '5XB'" ex 1 --in "$TMP/g.1.h5" --to-hf "$TMP/x" --max-shard-size 5XB
cp "$TMP/g.1.h5" "$TMP/flip.h5"
"$PYTHON_REF" - "$TMP/flip.h5" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    d = f["params/h.1.mlp.wfc"].id
    off = d.get_chunk_info(0).byte_offset if d.get_create_plist().get_layout() == h5py.h5d.CHUNKED else d.get_offset()
with open(sys.argv[1], "r+b") as b:
    b.seek(off + 100); c = b.read(1); b.seek(off + 100); b.write(bytes([c[0] ^ 0x10]))
PYEOF
expect_exit2 "checksum mismatch in params/h.1.mlp.wfc" ex 2 --in "$TMP/flip.h5" --to-hf "$TMP/x"
# a flip in the second tp2 chunk of a Llama weight, cut into 4 KiB tiles on 3 ranks: a rank other
# than 0 finds it mid-write; every rank exits 2 and nothing is left
cp "$TMP/l.tp2.h5" "$TMP/flip2.h5"
"$PYTHON_REF" - "$TMP/flip2.h5" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    off = f["params/h.1.attn.wq"].id.get_chunk_info(1).byte_offset
with open(sys.argv[1], "r+b") as b:
    b.seek(off + 8); c = b.read(1); b.seek(off + 8); b.write(bytes([c[0] ^ 0x01]))
PYEOF
DTRAIN_TEST_EXPORT_TILE_BYTES=4096
export DTRAIN_TEST_EXPORT_TILE_BYTES
expect_exit2 "checksum mismatch in params/h.1.attn.wq rows 32..63" ex 3 --in "$TMP/flip2.h5" --to-hf "$TMP/x"
unset DTRAIN_TEST_EXPORT_TILE_BYTES
# --force never replaces the input, a directory holding it, or a directory an export did not write
mkdir -p "$TMP/run/sub"
cp "$TMP/g.1.h5" "$TMP/run/g.h5"
expect_exit2 "holds the input" ex 2 --in "$TMP/run/g.h5" --to-hf "$TMP/run" --force
expect_exit2 "is the input" ex 1 --in "$TMP/run/g.h5" --to-llmc "$TMP/run/g.h5" --force
rm "$TMP/run/g.h5"
expect_exit2 "which is not a regular file: --force replaces only a model directory" ex 1 --in "$TMP/g.1.h5" \
    --to-hf "$TMP/run" --force
if [ -d "$TMP/run/sub" ]; then pass "the refused --force left the directory as it was"; else fail "--force emptied $TMP/run"; fi
# a vocabulary file changed since training: the recorded sha256 no longer matches
cp "$TMP/last.h5" "$TMP/sha.h5"
"$PYTHON_REF" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); f.attrs['tokenizer'] = 'gpt2'; \
f.attrs['tokenizer_sha256'] = '0' * 64; f.close()" "$TMP/sha.h5"
expect_exit2 "vocabulary file had sha256 000000000000" ex 2 --in "$TMP/sha.h5" --to-hf "$TMP/x"
if [ -e "$TMP/x" ] || [ -e "$TMP/.x.tmp" ]; then fail "a refused export left $TMP/x or its temporary"; fi
# a full disk: exit 1, one line, no directory and no temporary left; also cut into 4 KiB tiles, so
# that the tile writer fails with tiles queued behind the one it writes
mkdir -p "$TMP/small"
if mount -t tmpfs -o size=64k tmpfs "$TMP/small" 2>/dev/null; then
    for tiles in "" 4096; do
        DTRAIN_TEST_EXPORT_TILE_BYTES=$tiles ex 2 --in "$TMP/g.1.h5" --to-hf "$TMP/small/out" >"$TMP/out" 2>"$TMP/err"
        rc=$?
        left=$(ls -A "$TMP/small")
        if [ "$rc" -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && [ -z "$left" ]; then
            pass "disk full${tiles:+ ($tiles-byte tiles)}: exit 1, '$(cat "$TMP/err")', nothing left behind"
        else
            fail "disk full${tiles:+ ($tiles-byte tiles)}: exit $rc, left '$left': $(head -c 400 "$TMP/err")"
        fi
    done
    umount "$TMP/small"
else
    echo "note: cannot mount a tmpfs here: the full-disk export case is not run"
fi

# ---- bad inputs: one line, exit 2, every rank ----
bad() {
    "$PYTHON_REF" "$REF" bad "$1" --out "$TMP/bad_$1" || fail "hf_ref.py bad $1"
    expect_exit2 "$2" "$MPIEXEC" --quiet -np 2 "$DTRAIN" --init-from "$TMP/bad_$1" --data "$TMP/g.tok" \
        --val-every 0 --seq-len 16 --steps 1 --sample-tokens 0 --peak-gflops 100 --threads 1
}
bad arch "architectures: 'FalconForCausalLM'"
bad rope_scaling "config.json: rope_scaling.rope_type: 'dynamic': dtrain implements llama3 and linear scaling only"
bad tied_llama "tensor lm_head.weight differs from model.embed_tokens.weight"
bad bias "config.json: attention_bias: true"
bad missing "tensor transformer.h.1.mlp.c_fc.bias (dtrain's h.1.mlp.bfc) is missing"
bad extra "tensor transformer.h.1.attn.rotary.weight is not part of dtrain's gpt2 model"
bad shape "tensor transformer.h.0.attn.c_attn.weight has shape \[192, 64\], the config's model needs \[64, 192\]"
bad dtype "tensor transformer.ln_f.bias has dtype F64"
bad header "model.safetensors': tensor 'transformer.ln_f.bias'"
run2() { "$MPIEXEC" --quiet -np 2 "$DTRAIN" --init-from "$TMP/g" --data "$TMP/g.tok" --val-every 0 --seq-len 16 \
    --steps 1 --sample-tokens 0 --threads 1 "$@"; }
expect_exit2 "--model tiny conflicts with --init-from" run2 --model tiny
expect_exit2 "--n-layer 3 conflicts with --init-from" run2 --n-layer 3
expect_exit2 "--arch llama conflicts with --init-from" run2 --arch llama
expect_exit2 "neither a Hugging Face model directory" run2 --init-from "$TMP/g.tok"
finish
