#!/bin/sh
# What a new user meets (issue 40): mistakes that used to print library
# internals, blame the wrong program or lose work, each now one line naming
# the problem and the fix, the same exit status on every rank, or the
# behaviour a user expects:
#  - --resume DIR (the checkpoint directory instead of auto), dreshard --in
#    and --info DIR: one line with the fix, no MPI-IO lines;
#  - a checkpoint that is missing, not HDF5, or truncated: one line saying so;
#  - --resume auto whose newest checkpoint is damaged: the newest older one
#    that loads, said loudly, and the run ends as an uninterrupted one from
#    there would;
#  - --keep or --stop-at-step without --ckpt-dir: refused (the latter would
#    throw the job's steps away), as --ckpt-every already was;
#  - --val-data matching nothing names --val-data;
#  - dtrain-plot -o into a directory it cannot write names the path and the
#    reason (not gnuplot);
#  - a full disk under --metrics (a file size limit: EFBIG) leaves whole
#    lines only, and dtrain-plot skips a torn last line with a note.
. "$top_srcdir/test/common.sh"

PLOT="$top_builddir/src/dtrain-plot"
RUN="$(tiny_args) --threads 1 --steps 4 --warmup 1 --micro-batch 2 --global-batch 4 --seq-len 32 --val-every 0 \
    --sample-tokens 0"
# one_line WANT NP CMD...: CMD on NP ranks exits 2 with exactly one stderr
# line (MPI's own epilogue aside) containing WANT, and nothing of MPI-IO's
one_line() {
    want=$1 np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    ours=$(grep -c "error:" "$TMP/err")
    if [ "$rc" -eq 2 ] && [ "$ours" -eq 1 ] && grep -qF -- "$want" "$TMP/err" && ! grep -q "mca_\|MPI_ERR\|H5F__" "$TMP/err" "$TMP/out"; then
        pass "np $np exit 2: $(grep 'error:' "$TMP/err")"
    else
        fail "np $np $*: exit $rc, $ours error line(s), wanted '$want': $(head -c 700 "$TMP/err")"
    fi
}

# ---- a checkpoint directory with steps 2 and 4 ----
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN --ckpt-dir "$TMP/ck" --ckpt-every 2 >"$TMP/ck.log" 2>&1 &&
    [ -f "$TMP/ck/step_00000002.h5" ] && [ -f "$TMP/ck/step_00000004.h5" ] ||
    { fail "writing the checkpoints: $(tail -n 3 "$TMP/ck.log")"; finish; }

# ---- --resume DIR and dreshard DIR ----
one_line "--resume $TMP/ck is a directory: to continue from the newest checkpoint in it, use --resume auto --ckpt-dir $TMP/ck" \
    2 "$DTRAIN" $RUN --steps 6 --resume "$TMP/ck"
one_line "$TMP/ck is a directory, not a checkpoint or parameter file" 2 "$DRESHARD" --info "$TMP/ck"
one_line "--in $TMP/ck is a directory: name a checkpoint or parameter file ($TMP/ck/step_NNNNNNNN.h5)" 2 \
    "$DRESHARD" --in "$TMP/ck" --out "$TMP/r.h5"

# ---- missing, not HDF5, truncated ----
one_line "--resume $TMP/ck/nope.h5: No such file or directory: name a checkpoint file that exists (DIR/step_NNNNNNNN.h5), or use --resume auto --ckpt-dir DIR" \
    2 "$DTRAIN" $RUN --steps 6 --resume "$TMP/ck/nope.h5"
one_line "$TMP/ck/nope.h5: No such file or directory" 2 "$DRESHARD" --info "$TMP/ck/nope.h5"
printf 'not a checkpoint\n' >"$TMP/text.h5"
one_line "$TMP/text.h5 is not an HDF5 file (17 bytes, no HDF5 signature)" 2 "$DTRAIN" $RUN --steps 6 --resume "$TMP/text.h5"
head -c 4096 "$TMP/ck/step_00000004.h5" >"$TMP/short.h5"
one_line "$TMP/short.h5 is damaged or incomplete (a truncated copy?): HDF5 cannot open it; use another copy" 2 \
    "$DTRAIN" $RUN --steps 6 --resume "$TMP/short.h5"
one_line "$TMP/short.h5 is damaged or incomplete" 2 "$DRESHARD" --info "$TMP/short.h5"

# ---- --resume auto past a damaged newest checkpoint ----
cp -r "$TMP/ck" "$TMP/ck2"
size=$(wc -c <"$TMP/ck2/step_00000004.h5")
head -c $((size / 2)) "$TMP/ck/step_00000004.h5" >"$TMP/ck2/step_00000004.h5"
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN --steps 6 --ckpt-dir "$TMP/ck2" --resume auto --metrics "$TMP/fb.json" \
    >"$TMP/fb.log" 2>"$TMP/fb.err"
rc=$?
"$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN --steps 6 --ckpt-dir "$TMP/ck3" --resume "$TMP/ck/step_00000002.h5" \
    --metrics "$TMP/ref.json" >"$TMP/ref.log" 2>&1 || fail "reference resume from step 2: $(tail -n 2 "$TMP/ref.log")"
# the records less their timings: step, loss, lr, gradient norm
untimed() { sed 's/, "ms".*//' "$1"; }
if [ "$rc" -eq 0 ] && grep -q "^dtrain: warning: --resume auto: continuing from $TMP/ck2/step_00000002.h5, not from the newest checkpoint $TMP/ck2/step_00000004.h5, which does not load: .*damaged or incomplete" "$TMP/fb.err" &&
    grep -q "^resume: $TMP/ck2/step_00000002.h5, step 2" "$TMP/fb.log" &&
    [ "$(grep -c '"loss"' "$TMP/fb.json")" -eq 4 ] && [ "$(untimed "$TMP/fb.json")" = "$(untimed "$TMP/ref.json")" ]; then
    pass "--resume auto, newest damaged: continued from step 2, said loudly; steps 3-6 equal a resume from step 2"
else
    fail "--resume auto past a damaged newest: exit $rc: $(cat "$TMP/fb.err" | head -c 600)"
fi
# nothing older that loads: the first failure stands
mkdir -p "$TMP/ck4" && head -c 4096 "$TMP/ck/step_00000002.h5" >"$TMP/ck4/step_00000002.h5" && echo step_00000002.h5 >"$TMP/ck4/latest"
one_line "$TMP/ck4/step_00000002.h5 is damaged or incomplete" 2 "$DTRAIN" $RUN --steps 6 --ckpt-dir "$TMP/ck4" --resume auto

# ---- options that need --ckpt-dir ----
one_line "--keep 2 keeps the newest checkpoints of --ckpt-dir: give --ckpt-dir DIR" 2 "$DTRAIN" $RUN --keep 2
one_line "--stop-at-step 2 ends this job early for a later one to continue from its checkpoint: give --ckpt-dir DIR" \
    2 "$DTRAIN" $RUN --stop-at-step 2

# ---- --val-data matching nothing ----
one_line "--val-data: no token files match '$TMP/none_*.bin'" 2 "$DTRAIN" $RUN --val-every 2 --val-data "$TMP/none_*.bin"

# ---- dtrain-plot -o where it cannot write ----
"$DTRAIN" $RUN --metrics "$TMP/m.json" >/dev/null 2>&1 || fail "metrics run"
if [ -w /sys ] && ! (: >/sys/dtrain-probe) 2>/dev/null; then
    "$PLOT" "$TMP/m.json" -o /sys/curves.png >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
        grep -q "^dtrain-plot: error: -o /sys/curves.png: cannot write /sys/curves.png.tmp: .*: choose a directory you can write$" "$TMP/err" &&
        ! grep -q gnuplot "$TMP/err"; then
        pass "dtrain-plot -o /sys/curves.png: exit 2: $(cat "$TMP/err")"
    else
        fail "dtrain-plot -o unwritable: exit $rc: $(cat "$TMP/err")"
    fi
else
    echo "skip: no unwritable directory here (/sys is writable)"
fi

# ---- a full disk under --metrics: whole lines only ----
# a 2 KiB file size limit on dtrain alone (not on MPI's daemon, whose
# shared-memory files are larger); SIGXFSZ ignored so that writes fail with
# EFBIG as on a full disk
"$MPIEXEC" --quiet -np 1 sh -c "trap '' XFSZ && ulimit -f 4 && exec $DTRAIN $RUN --steps 12 --metrics $TMP/full.json" \
    >"$TMP/full.log" 2>"$TMP/full.err"
rc=$?
size=$(wc -c <"$TMP/full.json")
lines=$(wc -l <"$TMP/full.json")
if [ "$rc" -eq 0 ] && [ "$lines" -ge 1 ] && [ "$lines" -lt 12 ] && [ "$(tail -c 1 "$TMP/full.json" | od -An -c | tr -d ' ')" = '\n' ] &&
    "$PYTHON_REF" -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$TMP/full.json" &&
    grep -q "^dtrain: warning: --metrics $TMP/full.json: write failed: File too large" "$TMP/full.err"; then
    pass "--metrics on a full file system: $lines whole records ($size bytes), a warning, the run finished"
else
    fail "--metrics full: exit $rc, $lines lines, $size bytes, last byte '$(tail -c 1 "$TMP/full.json" | od -An -c)': $(cat "$TMP/full.err")"
fi
# dtrain-plot meets a torn last line (an older dtrain's, or a copy cut short)
{ cat "$TMP/m.json"; printf '{"step": 5, "loss": 1.2, "lr"'; } >"$TMP/torn.json"
"$PLOT" "$TMP/torn.json" -o "$TMP/torn.png" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ "$rc" -eq 0 ] && [ -s "$TMP/torn.png" ] &&
    grep -q "^dtrain-plot: note: $TMP/torn.json:5: skipped a torn last line (29 bytes, no newline)$" "$TMP/err"; then
    pass "dtrain-plot: $(cat "$TMP/err")"
else
    fail "dtrain-plot on a torn last line: exit $rc: $(cat "$TMP/err")"
fi

# ---- --cuda-graphs on the CPU: the CPU has no graphs (DTRAIN_DEFER_OPS=graphs emulates them for tests) ----
one_line "--cuda-graphs: this rank runs on the CPU (cpu), which has no graphs: use --device cuda, or leave out --cuda-graphs" \
    2 "$DTRAIN" $RUN --device cpu --cuda-graphs
finish
