#!/bin/sh
# dtrain-serve (issue 38, after training): a completions server that
# lm-evaluation-harness's local-completions model scores.
#
# tiny is trained 40 steps (checkpoint, --save-params file, a greedy
# sample); dtrain also samples from the checkpoint at temperature 0.8,
# top-k 40, and greedily at tp2 x pp2. Then, with the client written from
# the harness's request format (test/serve_client.py, standard library):
#  - 1 rank, from the --save-params file: the log-likelihoods of 48
#    continuations (harness payloads, batches of 5) equal a float64 PyTorch
#    computation (test/ref/serve_ref.py) within 1e-5 relative, the greedy
#    flags equal the reference's where its best two tokens differ clearly;
#    the text generated at temperature 0, and at 0.8 / top-k 40 with the
#    run's seed, equals dtrain's own sample; malformed JSON, wrong types,
#    unknown fields, prompts beyond the context, another model, a body over
#    --max-body, wrong paths and methods, a dropped connection: each a 4xx
#    with a one-line JSON error, and the server keeps answering; 300
#    requests from 48 concurrent clients on loopback, every answer checked;
#    SIGTERM: exit 0.
#  - tp2 x pp2 (4 ranks), from the checkpoint: the same log-likelihoods
#    and greedy flags; greedy text equal to dtrain's at that layout;
#    SIGTERM to one rank stops all four, mpiexec exits 0.
#  - tiny-gpt2 (GPT-2 BPE), exported by dreshard --to-hf and served from
#    the Hugging Face directory (its tokenizer.json): a text prompt with
#    curly quotes and accents scores as its ids (dtrain's tokenizer,
#    test/tok_tool) and echoes as itself; the remote tokenizer endpoints
#    (/tokenizer_info, /tokenize, /detokenize) give dtrain's ids and read
#    "<|endoftext|>" as its id; log-likelihoods against the float64
#    reference of the --save-params file;
#  - tiny-llama at tp2: log-likelihoods and greedy flags against its
#    reference;
#  - bad command lines and models: exit 2, one line.
. "$top_srcdir/test/common.sh"
: "${DTRAIN_SERVE:=$top_builddir/src/dtrain-serve}" "${DRESHARD:=$top_builddir/src/dreshard}"
PY=/usr/bin/python3
CLIENT="$PY $top_srcdir/test/serve_client.py"

ARGS="$(tiny_args) --threads 1 --steps 40 --warmup 5 --micro-batch 4 --global-batch 8 --seq-len 64 --val-every 0 \
     --lr 3e-3 --prompt ALICE."
CKPT="$TMP/ck/step_00000040.h5"
# sample OUT LOG: the text of the run's sample (the lines after its header)
sample() {
    sed -n '/^sample (temperature/,$p' "$2" | sed 1d | head -c -1 >"$1"
}
"$MPIEXEC" --quiet -np 1 "$DTRAIN" $ARGS --ckpt-dir "$TMP/ck" --save-params "$TMP/p.h5" --sample-tokens 40 \
    --temperature 0 >"$TMP/train.log" 2>&1 || { fail "training: $(tail -n 3 "$TMP/train.log")"; finish; }
sample "$TMP/greedy.txt" "$TMP/train.log"
"$MPIEXEC" --quiet -np 1 "$DTRAIN" $ARGS --resume "$CKPT" --sample-tokens 40 --temperature 0.8 --top-k 40 \
    >"$TMP/sampled.log" 2>&1 || fail "sampling from the checkpoint: $(tail -n 3 "$TMP/sampled.log")"
sample "$TMP/sampled.txt" "$TMP/sampled.log"
"$MPIEXEC" --quiet -np 4 "$DTRAIN" $ARGS --resume "$CKPT" --tp 2 --pp 2 --sample-tokens 40 --temperature 0 \
    >"$TMP/greedy4.log" 2>&1 || fail "sampling at tp2 x pp2: $(tail -n 3 "$TMP/greedy4.log")"
sample "$TMP/greedy4.txt" "$TMP/greedy4.log"

# 24 sequences of 3 to 120 bytes of the validation text, and their reference
"$PY" - "$top_builddir/data/gutenberg_val_000000.bin" >"$TMP/seqs.json" <<'PYEOF'
import json, random, sys
import numpy as np
tok = np.fromfile(sys.argv[1], dtype="<u2", offset=1024).astype(int)
rng = random.Random(38)
seqs = []
for i in range(24):
    n = 3 + (i * 117) // 23
    at = rng.randrange(0, len(tok) - n)
    seqs.append([int(t) for t in tok[at:at + n]])
json.dump(seqs, sys.stdout)
PYEOF
"$PY" "$top_srcdir/test/ref/serve_ref.py" --params "$TMP/p.h5" --seqs "$TMP/seqs.json" --out "$TMP/ref.json" \
    >"$TMP/ref.log" 2>&1 || { fail "reference: $(tail -n 3 "$TMP/ref.log")"; finish; }

# start NAME NP ARGS...: dtrain-serve in the background (NP 1: no launcher,
# so $SPID is the server itself), its port taken from its banner
start() {
    name=$1
    np=$2
    shift 2
    if [ "$np" -eq 1 ]; then
        "$DTRAIN_SERVE" --port 0 --threads 1 "$@" >"$TMP/$name.log" 2>&1 &
    else
        "$MPIEXEC" --quiet -np "$np" "$DTRAIN_SERVE" --port 0 --threads 1 "$@" >"$TMP/$name.log" 2>&1 &
    fi
    SPID=$!
    PORT=""
    for _ in $(seq 1 600); do
        PORT=$(sed -n 's/^dtrain-serve: listening on http:[^ ]*:\([0-9]*\) .*/\1/p' "$TMP/$name.log")
        [ -n "$PORT" ] && break
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$PORT" ] || { fail "$name: the server did not start: $(tail -n 3 "$TMP/$name.log")"; return 1; }
}
# stop NAME PID: SIGTERM to PID (the server, or one rank of it), then the
# job's exit status and its closing line
stop() {
    kill -TERM "$2"
    for _ in $(seq 1 300); do
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$SPID" 2>/dev/null; then
        fail "$1: still running 30 s after SIGTERM"
        kill -KILL "$SPID"
        return
    fi
    wait "$SPID"
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^dtrain-serve: stopped: " "$TMP/$1.log"; then
        pass "$1: SIGTERM: exit 0, $(grep '^dtrain-serve: stopped: ' "$TMP/$1.log")"
    else
        fail "$1: SIGTERM: exit $rc, $(tail -n 2 "$TMP/$1.log")"
    fi
}
# client LABEL ARGS...: one client command, its lines prefixed
client() {
    label=$1
    shift
    out=$($CLIENT "$@" 2>&1)
    rc=$?
    echo "$out" | sed "s/^\(ok  \|FAIL\) /\1 $label: /"
    [ "$rc" -eq 0 ] || fails=$((fails + $(echo "$out" | grep -c '^FAIL') + 1))
}

if start one 1 --init-from "$TMP/p.h5" --seq-len 128 --max-body 65536; then
    client "1 rank" loglik --port "$PORT" --model p.h5 --seqs "$TMP/seqs.json" --ref "$TMP/ref.json"
    client "1 rank" gen --port "$PORT" --prompt ALICE. --max-tokens 40 --expect "$TMP/greedy.txt"
    client "1 rank" gen --port "$PORT" --prompt ALICE. --max-tokens 40 --temperature 0.8 --top-k 40 --seed 1337 \
        --expect "$TMP/sampled.txt"
    client "1 rank" bad --port "$PORT" --model p.h5 --vocab 256 --ctx 128 --max-body 65536
    client "1 rank" load --port "$PORT" --model p.h5 --seqs "$TMP/seqs.json" --ref "$TMP/ref.json" --requests 300 \
        --clients 48 --seconds 90
    stop one "$SPID"
fi

if start tp2pp2 4 --init-from "$CKPT" --tp 2 --pp 2 --seq-len 128 --model-name tiny; then
    client "tp2 x pp2" loglik --port "$PORT" --model tiny --seqs "$TMP/seqs.json" --ref "$TMP/ref.json" --batch 7
    client "tp2 x pp2" gen --port "$PORT" --prompt ALICE. --max-tokens 40 --expect "$TMP/greedy4.txt"
    stop tp2pp2 "$(pgrep -P "$SPID" | tail -n 1)"
fi

# ---- GPT-2 BPE from a Hugging Face directory; Llama at tp2 ----
# seqs SHARD N MAX: N sequences of 3 to MAX tokens of a validation shard
seqs() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, random, sys
import numpy as np
tok = np.fromfile(sys.argv[1], dtype="<u2", offset=1024).astype(int)
rng = random.Random(38)
n, most = int(sys.argv[2]), int(sys.argv[3])
out = []
for i in range(n):
    k = 3 + (i * (most - 3)) // (n - 1)
    at = rng.randrange(0, len(tok) - k)
    out.append([int(t) for t in tok[at:at + k]])
json.dump(out, sys.stdout)
PYEOF
}
SMALL="--threads 1 --warmup 1 --micro-batch 2 --global-batch 4 --seq-len 64 --val-every 0 --sample-tokens 0 \
    --peak-gflops 100"
if "$MPIEXEC" --quiet -np 1 "$DTRAIN" --model tiny-gpt2 --data "$top_builddir/data/gutenberg-gpt2_train_*.bin" \
    --steps 2 $SMALL --save-params "$TMP/g.h5" >"$TMP/g.log" 2>&1 &&
    "$MPIEXEC" --quiet -np 1 "$DRESHARD" --in "$TMP/g.h5" --to-hf "$TMP/ghf" >>"$TMP/g.log" 2>&1; then
    seqs "$top_builddir/data/gutenberg-gpt2_val_000000.bin" 8 60 >"$TMP/gseqs.json"
    "$PY" "$top_srcdir/test/ref/serve_ref.py" --params "$TMP/g.h5" --seqs "$TMP/gseqs.json" --out "$TMP/gref.json" \
        >"$TMP/gref.log" 2>&1 || fail "tiny-gpt2 reference: $(tail -n 3 "$TMP/gref.log")"
    printf 'Alice said \342\200\234yes\342\200\235 to the na\303\257ve Caf\303\251 \342\200\224 twice.' >"$TMP/text.txt"
    "$top_builddir/test/tok_tool" encode gpt2 "$TMP/text.txt" >"$TMP/text.ids" || fail "tok_tool encode gpt2"
    if start gpt2 1 --init-from "$TMP/ghf" --seq-len 64; then
        grep -q "^tokenizer: hf:.*ghf/tokenizer.json (the model's)" "$TMP/gpt2.log" &&
            pass "tiny-gpt2 from a Hugging Face directory: $(grep '^tokenizer:' "$TMP/gpt2.log")" ||
            fail "tiny-gpt2's tokenizer: $(grep '^tokenizer' "$TMP/gpt2.log")"
        client "tiny-gpt2 hf" text --port "$PORT" --text "$TMP/text.txt" --ids "$TMP/text.ids"
        client "tiny-gpt2 hf" remote --port "$PORT" --text "$TMP/text.txt" --ids "$TMP/text.ids" \
            --eos "<|endoftext|>" --eos-id 50256
        client "tiny-gpt2 hf" loglik --port "$PORT" --model ghf --seqs "$TMP/gseqs.json" --ref "$TMP/gref.json"
        stop gpt2 "$SPID"
    fi
else
    fail "tiny-gpt2 and its export: $(tail -n 3 "$TMP/g.log")"
fi
if "$MPIEXEC" --quiet -np 1 "$DTRAIN" --model tiny-llama --steps 5 $SMALL --save-params "$TMP/l.h5" \
    >"$TMP/l.log" 2>&1; then
    "$PY" "$top_srcdir/test/ref/serve_ref.py" --params "$TMP/l.h5" --seqs "$TMP/seqs.json" --out "$TMP/lref.json" \
        >"$TMP/lref.log" 2>&1 || fail "tiny-llama reference: $(tail -n 3 "$TMP/lref.log")"
    if start llama 2 --init-from "$TMP/l.h5" --tp 2 --seq-len 128; then
        client "tiny-llama tp2" loglik --port "$PORT" --model l.h5 --seqs "$TMP/seqs.json" --ref "$TMP/lref.json"
        stop llama "$(pgrep -P "$SPID" | head -n 1)"
    fi
else
    fail "tiny-llama: $(tail -n 3 "$TMP/l.log")"
fi

# ---- refused in one line ----
expect_exit2 "init-from PATH is required" "$DTRAIN_SERVE"
expect_exit2 "$TMP/none.h5: No such file or directory" "$DTRAIN_SERVE" --init-from "$TMP/none.h5"
expect_exit2 "3 ranks for --tp 2 x --pp 1" "$MPIEXEC" --quiet -np 3 "$DTRAIN_SERVE" --init-from "$TMP/p.h5" --tp 2
expect_exit2 "tp 3 must divide the attention heads" "$MPIEXEC" --quiet -np 3 "$DTRAIN_SERVE" --init-from "$TMP/p.h5" \
    --tp 3
expect_exit2 "seq-len 9999 exceeds the model's 256 positions" "$DTRAIN_SERVE" --init-from "$TMP/p.h5" --seq-len 9999
expect_exit2 "port 70000: out of range" "$DTRAIN_SERVE" --init-from "$TMP/p.h5" --port 70000
expect_exit2 "tokenizer gpt2 has 50257 tokens, more than the model's vocabulary of 256" \
    "$DTRAIN_SERVE" --init-from "$TMP/p.h5" --tokenizer gpt2
finish
