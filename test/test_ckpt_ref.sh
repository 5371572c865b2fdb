#!/bin/sh
# Interop of checkpoints with the PyTorch reference: dtrain trains tiny and
# tiny-llama 8 steps, validating and checkpointing at steps 4 and 8, on one
# rank, at tp2 x pp2 and at pp2 x dp2 with ZeRO-1 (4 ranks each); then
# test/ref/torch_ref.py --val-loss reads each checkpoint (and the
# --save-params file) with h5py, rebuilds the model in float64 from the
# file's logical tensors alone and computes the validation loss on the
# batches dtrain's validation reads. It must equal dtrain's own val_loss
# of that step (--metrics) within 1e-5 relative, whatever layout wrote the
# file. A negative case checks that the comparison notices other batches.
#
# Exit: 0 pass, 1 fail, 77 skip (no PyTorch or h5py).
. "$top_srcdir/test/common.sh"

PY=${PYTHON_REF:-/usr/bin/python3}
REF="$top_srcdir/test/ref/torch_ref.py"
if ! "$PY" -c 'import torch, numpy, h5py' >/dev/null 2>&1; then
    echo "SKIP: $PY cannot import torch, numpy and h5py (Debian's python3-torch and python3-h5py)"
    exit 77
fi

B=2
T=64
NB=4
ARGS="$(tiny_args) --threads 1 --steps 8 --warmup 2 --micro-batch $B --global-batch 8 --seq-len $T \
      --val-every 4 --val-batches $NB --sample-tokens 0 --ckpt-every 4"

# torch_val "FILE..." "EXPECT..." [extra torch_ref options]: torch's check of
# each FILE against dtrain's val_loss EXPECT; one python for all (its start
# costs seconds); every "ok"/"FAIL" line into pass/fail
torch_val() {
    files=$1
    wants=$2
    shift 2
    "$PY" "$REF" --val-loss $files --val-data "$DATA_VAL" --micro-batch $B --seq-len $T --val-batches $NB \
        --expect $wants "$@" >"$TMP/torch.out" 2>&1
}

for model in tiny tiny-llama; do
    for layout in "1" "4 --tp 2 --pp 2" "4 --pp 2 --dp 2 --zero 1"; do
        set -- $layout
        np=$1
        shift
        name="$model np $np${*:+ $*}"
        out="$TMP/$model.$np$(echo "$*" | tr -d ' -')"
        if ! "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $ARGS --model $model "$@" --ckpt-dir "$out.ck" \
            --metrics "$out.json" --save-params "$out.params.h5" >"$out.log" 2>&1; then
            fail "$name: exit status $? $(tail -n 3 "$out.log")"
            continue
        fi
        # checkpoints of steps 4 and 8, and the step-8 --save-params file
        v4=$(json_field "$out.json" 4 val_loss)
        v8=$(json_field "$out.json" 8 val_loss)
        if [ -z "$v4" ] || [ -z "$v8" ]; then
            fail "$name: no val_loss at steps 4 and 8 in --metrics"
            continue
        fi
        torch_val "$out.ck/step_00000004.h5 $out.ck/step_00000008.h5 $out.params.h5" "$v4 $v8 $v8"
        rc=$?
        n=$(grep -c '^ok ' "$TMP/torch.out")
        if [ $rc -eq 0 ] && [ "$n" -eq 3 ]; then
            sed -n "s|^ok   \(.*\)|$name: \1|p" "$TMP/torch.out" | while read -r line; do pass "$line"; done
        else
            fail "$name: torch_ref exit $rc, $n of 3 ok: $(grep -v '^ok ' "$TMP/torch.out" | tail -n 3)"
        fi
        if [ "$model $np $*" = "tiny 4 --tp 2 --pp 2" ]; then
            if grep -q "step_00000008.h5: checkpoint (gpt2) step 8, written at tp 2 pp 2 dp 1 zero 0" "$TMP/torch.out"
            then
                pass "the tp2 x pp2 checkpoint records its layout; torch used none of it to read the logical tensors"
            else
                fail "the tp2 x pp2 checkpoint does not record 'tp 2 pp 2 dp 1 zero 0': $(head -n 2 "$TMP/torch.out")"
            fi
        fi
    done
    # the check is sensitive: a fifth validation microbatch (other samples)
    # moves the mean far beyond 1e-5
    if torch_val "$TMP/$model.1.ck/step_00000008.h5" "$(json_field "$TMP/$model.1.json" 8 val_loss)" \
        --val-batches $((NB + 1)); then
        fail "$model: torch on 5 microbatches agrees with dtrain's 4: the comparison cannot tell batches apart"
    elif grep -q '^FAIL .*val loss' "$TMP/torch.out"; then
        pass "$model: torch on 5 microbatches differs from dtrain's 4: $(sed -n 's/^FAIL *//p' "$TMP/torch.out")"
    else
        fail "$model: torch on 5 microbatches: $(tail -n 2 "$TMP/torch.out")"
    fi
done
finish
