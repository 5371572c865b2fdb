#!/bin/sh
# The layering rule of doc/design.md, checked on every #include "..." of the
# sources: a layer includes only itself and the layers below it.
#
#   src/    driver, training loop, model, parameter table, CPU ops     (top)
#   cuda/   GPU backend + NCCL     |   io/   HDF5 store, token files, tokenizers
#   mpi/    grid, communicator, agreement, DDP, ZeRO, pipeline
#   base/   backend interface (ops), bf16 rounding, memory categories  (bottom)
#
# cuda/ and io/ are side by side: neither includes the other. test/, fuzz/
# and bench/ may include anything. An include of a file the layer may not
# see is printed as FILE:LINE: LAYER includes "HEADER" and fails the test.
. "$top_srcdir/test/common.sh"

allowed() {
    case $1 in
    base) echo "base" ;;
    mpi) echo "base mpi" ;;
    io) echo "base mpi io" ;;
    cuda) echo "base mpi cuda" ;;
    src) echo "base mpi io cuda src" ;;
    esac
}

for layer in base mpi io cuda src; do
    [ -d "$top_srcdir/$layer" ] || continue
    ok=$(allowed $layer)
    out=$(cd "$top_srcdir" && find "$layer" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' \) |
        sort | xargs grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' |
        awk -v layer="$layer" -v ok=" $ok " '{
            inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
            if (inc == "config.h") next                  # autoconf, the build directory
            n = index(inc, "/"); inc_layer = n ? substr(inc, 1, n - 1) : ""
            if (inc_layer == "" || index(ok, " " inc_layer " ") == 0) {
                split($0, w, ":"); printf "%s:%s: %s includes \"%s\"\n", w[1], w[2], layer, inc
            } }')
    if [ -n "$out" ]; then
        echo "$out"
        fail "$layer/ includes headers outside {$ok} (or without a layer prefix)"
    else
        pass "$layer/ includes only {$ok}"
    fi
done
finish
