#!/bin/sh
# The layering rule of doc/design.md ("Layers, as the build enforces them"),
# checked on every #include "..." of the sources: a layer, and a room of
# src/, includes only itself and what the rule puts below it.
#
#   src/*.c   the programs' mains (dtrain.c, dreshard.c, dtrain_*.c)   (top)
#   src/plan/    the planner              > src/train/
#   src/serve/   dtrain-serve             > src/train/
#   src/train/   step loop, options, metrics, spikes, sampling
#                  > src/cli/ src/optim/ src/data/ src/ckpt/ src/convert/ src/backend/
#   src/optim/ src/data/ src/ckpt/ src/convert/   each > src/model/
#   src/model/ src/backend/ src/cli/ src/prepare/   (src/ rooms at the bottom)
#   cuda/   GPU backend + NCCL (only src/backend/ and the programs include it)
#   io/     HDF5 store, token files, tokenizers, model files
#   mpi/    grid, communicator, agreement, DDP, ZeRO, pipeline
#   base/   ops interface, bf16 rounding, memory accounting              (bottom)
#
# Also: src/ itself holds only the programs' mains (each file defines
# main); a header named *_internal.h or *_impl.h is included only from its
# own folder; every room of src/ is in the rule; and Makefile.am's include
# views (LAYER_VIEWS), which make the same rule a compile error, agree with
# this table. test/, fuzz/ and bench/ may include anything. A violation is
# printed as FILE:LINE: ROOM includes "HEADER" and fails the test.
#
# The checker first runs on a copy of the tree with a forbidden include
# planted in it and must fail there, so a checker that stopped seeing
# violations fails too.
. "$top_srcdir/test/common.sh"

BELOW_SRC="base mpi io"
allowed() {
    case $1 in
    base) echo "base" ;;
    mpi) echo "base mpi" ;;
    io) echo "base mpi io" ;;
    cuda) echo "base mpi cuda" ;;
    src/cli) echo "$BELOW_SRC src/cli" ;;
    src/model) echo "$BELOW_SRC src/model" ;;
    src/backend) echo "$BELOW_SRC cuda src/backend" ;;
    src/prepare) echo "$BELOW_SRC src/prepare" ;;
    src/optim) echo "$BELOW_SRC src/optim src/model" ;;
    src/data) echo "$BELOW_SRC src/data src/model" ;;
    src/ckpt) echo "$BELOW_SRC src/ckpt src/model" ;;
    src/convert) echo "$BELOW_SRC src/convert src/model" ;;
    src/train) echo "$BELOW_SRC src/train src/cli src/optim src/data src/ckpt src/convert src/backend src/model" ;;
    src/plan) echo "$BELOW_SRC src/plan src/train src/cli src/optim src/data src/ckpt src/convert src/backend src/model" ;;
    src/serve) echo "$BELOW_SRC src/serve src/train src/cli src/optim src/data src/ckpt src/convert src/backend src/model" ;;
    src) echo "$BELOW_SRC cuda src/plan src/serve src/train src/cli src/optim src/data src/ckpt src/convert src/backend src/model src/prepare" ;;
    *) echo "?" ;;
    esac
}
ROOMS="base mpi io cuda src/cli src/model src/backend src/prepare src/optim src/data src/ckpt src/convert src/train src/plan src/serve src"

# check ROOT: prints each violation under ROOT, one line each; returns 1 if any.
check() {
    root=$1
    bad=0
    # every room of src/ is in the rule
    for d in "$root"/src/*/; do
        [ -d "$d" ] || continue
        r=src/$(basename "$d")
        if [ "$(allowed "$r")" = "?" ]; then
            echo "$r/: a room of src/ that the layer rule does not name (add it to test/test_layers.sh and LAYER_VIEWS)"
            bad=1
        fi
    done
    # src/ holds only the programs' mains
    for f in "$root"/src/*; do
        [ -f "$f" ] || continue
        case $f in
        *.c) grep -q '^int main(' "$f" || { echo "src/$(basename "$f"): in src/ but defines no main (a program's code goes in a room)"; bad=1; } ;;
        *.h | *.cc | *.cu | *.cuh) echo "src/$(basename "$f"): only programs' mains live in src/ itself"; bad=1 ;;
        esac
    done
    for room in $ROOMS; do
        [ -d "$root/$room" ] || continue
        if [ "$room" = src ]; then depth="-maxdepth 1"; else depth=""; fi
        # shellcheck disable=SC2086
        out=$(cd "$root" && find "$room" $depth -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' \) |
            sort | xargs -r grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' |
            awk -v room="$room" -v ok=" $(allowed "$room") " '{
                split($0, w, ":"); file = w[1]
                inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
                if (inc == "config.h") next                  # autoconf, the build directory
                n = split(inc, p, "/")
                inc_room = n >= 3 && p[1] == "src" ? p[1] "/" p[2] : (n >= 2 ? p[1] : "")
                if (inc_room == "" || index(ok, " " inc_room " ") == 0) {
                    printf "%s:%s: %s includes \"%s\"\n", file, w[2], room, inc; next
                }
                if (inc ~ /_(internal|impl)\.h$/) {
                    home = inc; sub(/\/[^\/]*$/, "", home)
                    fhome = file; sub(/\/[^\/]*$/, "", fhome)
                    if (home != fhome)
                        printf "%s:%s: includes \"%s\", internal to %s/\n", file, w[2], inc, home
                } }')
        if [ -n "$out" ]; then
            echo "$out"
            bad=1
        fi
    done
    return $bad
}

# The rule's table against Makefile.am's views: "src-NAME base mpi io ...",
# one quoted view each, $(SRC_VIEW) standing for the layers below src/.
views=$(sed -n '/^LAYER_VIEWS *=/,/[^\\]$/p' "$top_srcdir/Makefile.am" | tr -d '\\\n\t' |
    sed 's/\$(SRC_VIEW)/'"$BELOW_SRC"'/g' | grep -o '"[^"]*"' | tr -d '"')
mismatch=""
for room in $ROOMS; do
    [ "$room" = src ] && continue
    name=$(echo "$room" | tr / -)
    got=$(echo "$views" | awk -v n="$name" '$1 == n { for (i = 2; i <= NF; i++) print $i }' | sort | tr '\n' ' ')
    want=$(allowed "$room" | tr ' ' '\n' | sort | tr '\n' ' ')
    [ "$want" = "$got" ] || mismatch="$mismatch
  $room: test table {$want} Makefile.am view {$got}"
done
if [ -n "$mismatch" ]; then
    echo "Makefile.am's LAYER_VIEWS and this test's table disagree:$mismatch"
    fail "the include views and the layer rule agree"
else
    pass "the include views (Makefile.am LAYER_VIEWS) equal the layer rule's table"
fi

# The checker must see a planted violation: a model file including the trainer.
tmp=$TMP/tree
mkdir -p "$tmp" || exit 99
(cd "$top_srcdir" && tar cf - base mpi io cuda src 2>/dev/null) | (cd "$tmp" && tar xf -)
echo '#include "src/train/train.h"' >>"$tmp/src/model/model.c"
planted=$(check "$tmp")
if [ $? -ne 0 ] && echo "$planted" | grep -q 'src/model/model.c:[0-9]*: src/model includes "src/train/train.h"'; then
    pass "the checker reports a planted upward include (src/model -> src/train)"
else
    fail "the checker missed a planted upward include: $planted"
fi

out=$(check "$top_srcdir")
if [ $? -ne 0 ]; then
    echo "$out"
    fail "every include follows the layer rule"
else
    pass "every include of base/ mpi/ io/ cuda/ src/ follows the layer rule ($(echo $ROOMS | wc -w) rooms)"
fi
finish
