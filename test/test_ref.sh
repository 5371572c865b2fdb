#!/bin/sh
# The model against a PyTorch reference: test/ref_dump runs one forward,
# backward and AdamW step of the tiny GPT-2 and tiny Llama presets and dumps
# weights, batch, loss, logits, gradients and updated weights; then
# test/ref/torch_ref.py rebuilds each model in PyTorch (float64) from those
# weights and compares every number (see test/ref/README.md).
#
# Environment (set by make check): top_builddir, top_srcdir, PYTHON_REF.
# Exit: 0 pass, 1 fail, 77 skip (no PyTorch).

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
PYTHON_REF=${PYTHON_REF:-/usr/bin/python3}

dump=$top_builddir/test/ref_dump
ref=$top_srcdir/test/ref/torch_ref.py

if ! "$PYTHON_REF" -c 'import torch, numpy' >/dev/null 2>&1; then
    echo "SKIP: $PYTHON_REF cannot import torch and numpy (install Debian's python3-torch," \
         "or set PYTHON_REF to a python that has them)"
    exit 77
fi
if [ ! -x "$dump" ]; then
    echo "FAIL: $dump not built (make check builds it)"
    exit 1
fi
if [ ! -f "$ref" ]; then
    echo "FAIL: $ref not found"
    exit 1
fi

tmp=$(mktemp -d "$top_builddir/test/tmp.ref.XXXXXX") || {
    echo "FAIL: cannot create a temporary directory under $top_builddir/test"
    exit 1
}
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

status=0
# case: name model [extra ref_dump options]
run_case() {
    name=$1
    model=$2
    shift 2
    out=$tmp/$name
    echo "== $name"
    if ! mkdir "$out"; then
        status=1
        return
    fi
    if ! "$dump" --model "$model" "$@" "$out"; then
        echo "FAIL: $name: ref_dump failed"
        status=1
        return
    fi
    if ! "$PYTHON_REF" "$ref" "$out"; then
        echo "FAIL: $name: dtrain differs from the PyTorch reference"
        status=1
    fi
}

run_case tiny tiny
run_case tiny-llama tiny-llama
# every fifth target ignored (-1): loss and gradient must both be the mean
# over the counted targets
run_case tiny-llama-masked tiny-llama --masked

if [ "$status" -eq 0 ]; then
    echo "PASS: GPT-2 and Llama match PyTorch"
fi
exit $status
