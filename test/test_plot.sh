#!/bin/sh
# dtrain-plot (src/dtrain_plot.c): the --metrics files of two short runs of the
# tiny model (one rank, and two data-parallel ranks) drawn on one page:
# exit 0, nothing printed (gnuplot's warnings would be), an image of the
# asked size (the PNG's IHDR, the SVG's attributes), no temporary left;
# nan/inf values (what dtrain prints for a diverged run) read as missing;
# bad input exits 2 with one line; a gnuplot that warns or is missing
# exits 1 with one line and leaves no image.
. "$top_srcdir/test/common.sh"

PLOT="$top_builddir/src/dtrain-plot"
TMPDIR="$TMP/tmpdir" # dtrain-plot's own temporary directory goes here
export TMPDIR
mkdir -p "$TMPDIR"

run_tiny() {
    "$MPIEXEC" --quiet -np "$1" "$DTRAIN" $(tiny_args) --threads 1 --steps 12 --warmup 3 --micro-batch 2 \
        --global-batch 4 --seq-len 32 --val-every 4 --val-batches 2 --sample-tokens 0 --metrics "$2" \
        >"$2.log" 2>&1 || fail "np $1: exit status $? $(tail -n 3 "$2.log")"
}
run_tiny 1 "$TMP/np1.jsonl"
run_tiny 2 "$TMP/dp2.jsonl"

# png_size FILE: "WIDTHxHEIGHT" from the IHDR chunk (bytes 16..23, big-endian)
png_size() {
    od -An -tu1 -j16 -N8 "$1" | awk '{ printf "%dx%d", (($1 * 256 + $2) * 256 + $3) * 256 + $4, (($5 * 256 + $6) * 256 + $7) * 256 + $8 }'
}

# expect_image LABEL FILE SIZE ARGS...: exit 0, silent, FILE of SIZE, no temporary left
expect_image() {
    label=$1
    img=$2
    size=$3
    shift 3
    "$PLOT" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    case "$img" in
    *.svg) got=$(sed -n 's/^ *width="\([0-9]*\)" height="\([0-9]*\)".*/\1x\2/p' "$img" 2>/dev/null | head -n 1) ;;
    *) got=$(head -c 8 "$img" 2>/dev/null | od -An -tx1 | tr -d ' \n')"/$(png_size "$img" 2>/dev/null)" ;;
    esac
    case "$img" in *.svg) want=$size ;; *) want="89504e470d0a1a0a/$size" ;; esac
    left=$(ls -A "$TMPDIR" "$(dirname "$img")" | grep -e '\.tmp$' -e '^dtrain-plot\.' | tr '\n' ' ')
    if [ "$rc" -eq 0 ] && [ ! -s "$TMP/out" ] && [ ! -s "$TMP/err" ] && [ "$got" = "$want" ] && [ -z "$left" ]; then
        pass "$label: $size"
    else
        fail "$label: exit $rc, image '$got' (want '$want'), left: '$left', printed: $(head -c 600 "$TMP/out" "$TMP/err")"
    fi
}

expect_image "two runs, default size" "$TMP/curves.png" 1200x800 "$TMP/np1.jsonl" "$TMP/dp2.jsonl" -o "$TMP/curves.png"
expect_image "--size, --title, missing parent directories" "$TMP/a/b/c.png" 640x480 --title "tiny: np 1 vs dp 2 (it's)" \
    --size=640x480 "$TMP/np1.jsonl" -o "$TMP/a/b/c.png" "$TMP/dp2.jsonl"
expect_image "svg" "$TMP/curves.svg" 800x600 "$TMP/dp2.jsonl" --size 800x600 --output "$TMP/curves.svg"
# a diverged run as dtrain writes it (%.9g of non-finite values), one
# loss value left, a constant learning rate, no gradient norm at all
printf '{"step": 1, "loss": nan, "lr": 1e-3}\n{"step": 2, "loss": -inf, "lr": 1e-3, "grad_norm": -nan}\n{"step": 3, "loss": 2.5, "lr": 1e-3, "tag": "nan inf"}\n' >"$TMP/nan.jsonl"
expect_image "nan, inf, one point, a constant, an empty plot" "$TMP/nan.png" 1200x800 "$TMP/nan.jsonl" -o "$TMP/nan.png"

# bad input: exit 2, one line naming the problem and the fix
: >"$TMP/empty.jsonl"
printf '\n\n' >"$TMP/blank.jsonl"
printf '{"step": 1, "loss": 2}\n{"step": 2, "loss": \n' >"$TMP/cut.jsonl"
printf '[1, 2]\n' >"$TMP/array.jsonl"
printf '{"loss": 2}\n' >"$TMP/nostep.jsonl"
printf '{"step": 1, "loss": "low"}\n' >"$TMP/text.jsonl"
expect_exit2 "cannot open '$TMP/missing.jsonl': No such file or directory: give the file dtrain --metrics wrote" \
    "$PLOT" "$TMP/np1.jsonl" "$TMP/missing.jsonl" -o "$TMP/x.png"
expect_exit2 "'$TMP/empty.jsonl' has no records: give a --metrics file" "$PLOT" "$TMP/empty.jsonl" -o "$TMP/x.png"
expect_exit2 "'$TMP/blank.jsonl' has no records" "$PLOT" "$TMP/blank.jsonl" -o "$TMP/x.png"
expect_exit2 "$TMP/cut.jsonl:2: not JSON: .*reads the files dtrain --metrics writes" "$PLOT" "$TMP/cut.jsonl" -o "$TMP/x.png"
expect_exit2 "$TMP/array.jsonl:1: not a JSON object" "$PLOT" "$TMP/array.jsonl" -o "$TMP/x.png"
expect_exit2 "$TMP/nostep.jsonl:1: no non-negative integer \"step\"" "$PLOT" "$TMP/nostep.jsonl" -o "$TMP/x.png"
expect_exit2 "$TMP/text.jsonl:1: \"loss\" is not a number" "$PLOT" "$TMP/text.jsonl" -o "$TMP/x.png"
expect_exit2 "no metrics file given: dtrain-plot METRICS.jsonl... -o curves.png" "$PLOT" -o "$TMP/x.png"
expect_exit2 "no output image given (-o FILE)" "$PLOT" "$TMP/np1.jsonl"
expect_exit2 "-o '$TMP/x.pdf': the image's name ends in .png or .svg" "$PLOT" "$TMP/np1.jsonl" -o "$TMP/x.pdf"
expect_exit2 "--size '12x8': give WIDTHxHEIGHT in pixels" "$PLOT" "$TMP/np1.jsonl" -o "$TMP/x.png" --size 12x8
expect_exit2 "--size '1200': give WIDTHxHEIGHT" "$PLOT" "$TMP/np1.jsonl" -o "$TMP/x.png" --size 1200
expect_exit2 "unknown option '--logy': allowed are" "$PLOT" "$TMP/np1.jsonl" -o "$TMP/x.png" --logy
expect_exit2 "option '-o' needs a value" "$PLOT" "$TMP/np1.jsonl" -o
if [ -e "$TMP/x.png" ] || [ -e "$TMP/x.png.tmp" ] || [ -n "$(ls -A "$TMPDIR")" ]; then
    fail "bad input left files: $(ls "$TMP" "$TMPDIR" | tr '\n' ' ')"
else
    pass "bad input left no image and no temporary"
fi

# gnuplot's complaints are failures: one that warns, and none at all
mkdir -p "$TMP/fakebin"
printf '#!/bin/sh\necho "warning: something odd" >&2\nexec %s "$@"\n' "$(command -v gnuplot)" >"$TMP/fakebin/gnuplot"
chmod +x "$TMP/fakebin/gnuplot"
for case in warns missing; do
    if [ "$case" = warns ]; then
        p="$TMP/fakebin:$PATH" want="gnuplot printed a warning: warning: something odd: no image written"
    else
        p=/nonexistent want="cannot run gnuplot: No such file or directory: install gnuplot-nox"
    fi
    PATH=$p "$PLOT" "$TMP/np1.jsonl" -o "$TMP/g.png" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "$want" "$TMP/err" && [ ! -e "$TMP/g.png" ] &&
        [ ! -e "$TMP/g.png.tmp" ]; then
        pass "gnuplot $case: exit 1, $(cat "$TMP/err")"
    else
        fail "gnuplot $case: exit $rc, wanted '$want': $(head -c 600 "$TMP/err"); $(ls "$TMP" | grep g.png)"
    fi
done
finish
