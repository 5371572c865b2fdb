#!/bin/sh
# Checkpoints (src/ckpt/ckpt.c over io/h5store.c):
#  - exact resume: 20 steps straight vs 10 (--stop-at-step) + --resume auto
#    + 10 at tp2 x pp2: bit-identical losses, final parameters and every
#    tensor of the step-20 checkpoint (parameters and AdamW moments);
#  - another layout on load: the tp2 x pp2 checkpoint of step 10 continued
#    on 1 rank, dp2, pp2 and tp4 matches the uninterrupted run within 1e-5;
#  - --keep, --resume auto with no checkpoint yet, h5py reading every tensor
#    in its logical shape;
#  - faults, each one line from rank 0, a non-zero exit on every rank, and
#    the previous checkpoint still loadable: flipped byte, truncated file,
#    missing tensor, another model, unknown format version, an unusable
#    directory, a full disk (a 16 MiB tmpfs), and a job killed while writing.
# test_ckpt_async.sh runs all of it again with CKPT_ASYNC=--ckpt-async on
# every run that writes checkpoints, and then also checks the asynchronous
# checkpoints and the run resumed from them against synchronous ones.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
ARGS="$(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 --global-batch 8 --seq-len 64 \
      --val-every 20 --val-batches 4 --sample-tokens 0"
run() { # out np args...
    out=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $ARGS --metrics "$out" "$@" >"$out.log" 2>&1 ||
        { fail "np $np $*: exit status $? $(tail -n 3 "$out.log")"; return 1; }
}
ASYNC=${CKPT_ASYNC:-}
mode=${ASYNC:-sync}
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }

# ---- exact resume ----
run "$TMP/full.json" 4 --tp 2 --pp 2 --ckpt-dir "$TMP/full" $ASYNC --save-params "$TMP/full.h5"
run "$TMP/half1.json" 4 --tp 2 --pp 2 --ckpt-dir "$TMP/half" $ASYNC --stop-at-step 10
run "$TMP/half2.json" 4 --tp 2 --pp 2 --ckpt-dir "$TMP/half" $ASYNC --resume auto --save-params "$TMP/half.h5"
if grep -q "resume: $TMP/half/step_00000010.h5, step 10" "$TMP/half2.json.log" &&
    losses "$TMP/full.json" | tail -n 10 >"$TMP/a" && losses "$TMP/half2.json" >"$TMP/b" &&
    [ "$(wc -l <"$TMP/b")" -eq 10 ] && cmp -s "$TMP/a" "$TMP/b"; then
    pass "$mode: 10 + resume + 10 steps at tp2 pp2: the 10 resumed losses bit-identical to the uninterrupted run"
else
    fail "resumed losses differ: $(diff "$TMP/a" "$TMP/b" | head -n 4)"
fi
if out=$("$PY" "$top_srcdir/test/compare_params.py" "$TMP/full.h5" "$TMP/half.h5" 0); then
    pass "resumed final parameters bit-identical: $out"
else
    fail "resumed final parameters: $out"
fi
same_ckpt() { # A B: every tensor of checkpoints A and B bit-identical (in $TMP/same)
    "$PY" "$top_srcdir/test/same_ckpt.py" "$1" "$2" 200 >"$TMP/same" 2>&1
}
same_ckpt "$TMP/full/step_00000020.h5" "$TMP/half/step_00000020.h5"
if [ $? -eq 0 ]; then pass "$mode: step-20 checkpoints bit-identical: $(cat "$TMP/same")"; else fail "step-20 checkpoints: $(cat "$TMP/same")"; fi

# ---- asynchronous against synchronous: the same files, the same continuation ----
if [ -n "$ASYNC" ]; then
    run "$TMP/sync.json" 4 --tp 2 --pp 2 --ckpt-dir "$TMP/sync" --ckpt-every 10
    for s in 10 20; do
        if same_ckpt "$TMP/sync/step_000000$s.h5" "$TMP/half/step_000000$s.h5"; then
            pass "$ASYNC: step-$s checkpoint (the resumed run's at 20) bit-identical to the synchronous one: $(cat "$TMP/same")"
        else
            fail "$ASYNC: step-$s checkpoint against the synchronous one: $(cat "$TMP/same")"
        fi
    done
    if losses "$TMP/sync.json" | tail -n 10 >"$TMP/a" && cmp -s "$TMP/a" "$TMP/b" &&
        grep -q "^checkpoint: $TMP/half/step_00000010.h5 (step 10) written in the background" "$TMP/half1.json.log"; then
        pass "$ASYNC: the run resumed from the asynchronous step-10 checkpoint has the synchronous run's losses"
    else
        fail "$ASYNC: resumed losses against the synchronous run: $(diff "$TMP/a" "$TMP/b" | head -n 4)"
    fi
fi

# ---- another layout on load ----
for layout in "1" "2 --dp 2" "2 --pp 2" "4 --tp 4"; do
    set -- $layout
    np=$1
    shift
    run "$TMP/re.json" "$np" "$@" --resume "$TMP/half/step_00000010.h5" || continue
    worst=$(losses "$TMP/full.json" | tail -n 10 | paste - "$(losses "$TMP/re.json" >"$TMP/re.l"; echo "$TMP/re.l")" |
        awk '{ d = $2 - $4; if (d < 0) d = -d; d /= $2; if (d > w) w = d; n++ } END { printf "%.2e %d", w, n }')
    set -- $worst
    if [ "$2" -eq 10 ] && awk -v w="$1" 'BEGIN { exit !(w < 1e-5) }'; then
        pass "tp2 pp2 checkpoint continued at np $np $layout: 10 losses within $1 of the uninterrupted run"
    else
        fail "tp2 pp2 checkpoint continued at $layout: worst $1 over $2 losses"
    fi
done

# ---- keep, auto with nothing yet, h5py ----
run "$TMP/keep.json" 2 --dp 2 --ckpt-dir "$TMP/keep" $ASYNC --ckpt-every 5 --keep 2 --resume auto
files=$(cd "$TMP/keep" && ls -A | tr '\n' ' ')
if [ "$files" = "latest step_00000015.h5 step_00000020.h5 " ] && [ "$(cat "$TMP/keep/latest")" = step_00000020.h5 ] &&
    grep -q "no checkpoint in $TMP/keep yet, starting from step 0" "$TMP/keep.json.log" &&
    [ -n "$(json_field "$TMP/keep.json" 6 ckpt_stall_ms)" ]; then
    pass "$mode: --resume auto on an empty directory starts at 0; --ckpt-every 5 --keep 2 leaves: $files;" \
        "step 6's record: ckpt_stall_ms $(json_field "$TMP/keep.json" 6 ckpt_stall_ms)"
else
    fail "--keep 2: directory holds '$files', latest $(cat "$TMP/keep/latest" 2>/dev/null)"
fi
"$PY" - "$TMP/keep/step_00000020.h5" >"$TMP/h5py" 2>&1 <<'PYEOF'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
a = dict(f.attrs)
assert a["content"] == "checkpoint" and a["format_version"] == 1 and a["step"] == 20, a
assert a["layout"] == "tp 1 pp 1 dp 2 zero 0" and a["d_model"] == 128 and a["tokens"] == 20 * 8 * 64, a
n = 0
for g in ("params", "optim/m", "optim/v"):
    for name in ("wte", "wpe", "h.0.attn.wq", "h.3.mlp.wproj", "lnf.w"):
        x = f[g + "/" + name][()]
        assert np.all(np.isfinite(x)), name
        n += 1
assert f["params/wte"].shape == (256, 128) and f["params/h.0.attn.wo"].shape == (128, 128)
assert np.all(f["optim/v/h.0.mlp.wfc"][()] >= 0)
print("h5py: attributes and %d tensors in logical shapes, moments finite, v >= 0" % n)
PYEOF
if [ $? -eq 0 ]; then pass "$(cat "$TMP/h5py")"; else fail "h5py: $(tail -n 3 "$TMP/h5py")"; fi

# ---- faults: one line, non-zero exit, the good checkpoint untouched ----
good="$TMP/half/step_00000010.h5"
expect_fail_line() { # WANT ARGS...: exits non-zero with one stderr line containing WANT
    want=$1
    shift
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "$want" "$TMP/err"; then
        pass "exit $rc: $(cat "$TMP/err")"
    else
        fail "$* -> exit $rc, wanted one line with '$want': $(head -c 600 "$TMP/err")"
    fi
}
resume_from() { # FILE ARGS...
    f=$1
    shift
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS --dp 2 --resume "$f" "$@"
}
cp "$good" "$TMP/flip.h5"
"$PY" -c "
import h5py, sys
f = h5py.File('$TMP/flip.h5', 'r'); off = f['optim/m/h.2.mlp.wfc'].id.get_chunk_info(0).byte_offset; f.close()
b = open('$TMP/flip.h5', 'r+b'); b.seek(off + 1000); c = b.read(1); b.seek(off + 1000); b.write(bytes([c[0] ^ 0x10])); b.close()"
expect_fail_line "checksum mismatch in optim/m/h.2.mlp.wfc" resume_from "$TMP/flip.h5"
head -c 100000 "$good" >"$TMP/trunc.h5"
expect_fail_line "trunc.h5 is damaged or incomplete (a truncated copy?)" resume_from "$TMP/trunc.h5"
cp "$good" "$TMP/missing.h5"
"$PY" -c "import h5py; f = h5py.File('$TMP/missing.h5', 'r+'); del f['optim/v/h.1.ln2.w']; f.close()"
expect_fail_line "optim/v/h.1.ln2.w" resume_from "$TMP/missing.h5"
cp "$good" "$TMP/version.h5"
"$PY" -c "import h5py; f = h5py.File('$TMP/version.h5', 'r+'); f.attrs['format_version'] = 7; f.close()"
expect_fail_line "unknown checkpoint format version 7 (this dtrain reads version 1)" resume_from "$TMP/version.h5"
expect_fail_line "holds a model with d_ff 512, this run's model has d_ff 256" resume_from "$good" --d-ff 256
expect_fail_line "holds params only, no optimizer state" resume_from "$TMP/full.h5"
: >"$TMP/notadir"
expect_fail_line "--ckpt-dir $TMP/notadir/ck: cannot create" \
    "$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS --ckpt-dir "$TMP/notadir/ck" $ASYNC
if out=$(resume_from "$good" --steps 11 2>&1); then
    pass "after every fault the good checkpoint still loads and trains"
else
    fail "the good checkpoint no longer loads: $(echo "$out" | tail -n 2)"
fi

# a full disk: the step-5 checkpoint (10.4 MiB, 12.4 MiB reserved while
# writing) fits in 16 MiB, the step-10 one does not
mkdir -p "$TMP/small"
if mount -t tmpfs -o size=16m tmpfs "$TMP/small" 2>/dev/null; then
    expect_fail_line "No space left on device" \
        "$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS --dp 2 --ckpt-dir "$TMP/small" $ASYNC --ckpt-every 5
    left=$(cd "$TMP/small" && ls -A | tr '\n' ' ')
    if [ "$left" = "latest step_00000005.h5 " ] &&
        resume_from "$TMP/small/step_00000005.h5" --steps 6 >/dev/null 2>&1; then
        pass "disk full at step 10: only '$left' left, and step 5 still loads"
    else
        fail "disk full: directory holds '$left'"
    fi
    umount "$TMP/small"
else
    pass "full disk not tested: this machine cannot mount a tmpfs (needs root)"
fi

# a job killed while writing: a bigger model so that the write takes a
# while; kill it once a temporary checkpoint file exists
BIG="--model tiny --d-model 512 --d-ff 2048 --n-layer 8 --seq-len 32 --ckpt-every 1"
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS $BIG --dp 2 --ckpt-dir "$TMP/kill" $ASYNC >"$TMP/kill.log" 2>&1 &
pid=$!
i=0
while [ $i -lt 600 ] && ! ls -A "$TMP/kill" 2>/dev/null | grep -q '^\.step_0000000[2-9].h5.tmp$'; do
    sleep 0.05
    i=$((i + 1))
done
kill -9 $pid 2>/dev/null
pkill -9 -f "ckpt-dir $TMP/kill" 2>/dev/null
wait $pid 2>/dev/null
before=$(cat "$TMP/kill/latest" 2>/dev/null)
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $ARGS $BIG --dp 2 --ckpt-dir "$TMP/kill" $ASYNC --resume auto --steps 1 \
    >"$TMP/kill2.log" 2>&1
rc=$?
if [ -n "$before" ] && [ $rc -eq 0 ] && grep -q "resume: $TMP/kill/$before" "$TMP/kill2.log" &&
    ! ls -A "$TMP/kill" | grep -q '\.tmp$'; then
    pass "killed while writing (latest was $before): --resume auto loads it, the partial file is removed"
else
    fail "killed while writing: latest '$before', resume exit $rc: $(tail -n 2 "$TMP/kill2.log")"
fi
finish
