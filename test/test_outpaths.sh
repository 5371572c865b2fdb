#!/bin/sh
# Output paths make their missing directories as `mkdir -p` does (issue 22:
# `--ckpt-dir ckpt/dtrain-small` failed when ckpt/ did not exist). Rank 0
# makes them; every rank agrees on a failure: one line, exit 2.
#  - dtrain at 2 ranks, from an empty working directory, with relative
#    --ckpt-dir a/b/c, --metrics, --trace and --save-params three levels
#    deep: the run ends 0 and every file is where it was asked for;
#  - the same options under a regular file (a parent that cannot be a
#    directory): exit 2 and one line naming the option and the directory;
#  - dtrain --plan --metrics and dreshard --out (2 ranks) likewise;
#  - a directory that exists but takes no new file (/sys, even for root):
#    dtrain's --save-params, --trace and --metrics, dreshard's --out,
#    --to-hf and --to-llmc, and dtrain-prepare's --out all exit 2 at start
#    with one line naming the directory (a probe file, not access(2)).
. "$top_srcdir/test/common.sh"

W="$TMP/work"
mkdir -p "$W" && : >"$W/afile" || exit 99
STEPS=2
RUN="--model tiny --data $DATA_TRAIN --peak-gflops 100 --threads 1 --steps $STEPS --micro-batch 2 --seq-len 32 \
    --val-every 0 --sample-tokens 0"

# ---- dtrain: everything three levels deep, relative to the working directory ----
(cd "$W" && "$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN --ckpt-dir a/b/c --metrics m/x/y/m.json --trace t/x/y/t.json \
    --save-params s/x/y/p.h5) >"$TMP/run.log" 2>&1
rc=$?
lines=$(grep -c '"loss"' "$W/m/x/y/m.json" 2>/dev/null)
if [ "$rc" -eq 0 ] && [ -f "$W/a/b/c/step_0000000$STEPS.h5" ] && [ "${lines:-0}" -eq $STEPS ] &&
    [ -s "$W/t/x/y/t.json" ] && [ -s "$W/s/x/y/p.h5" ]; then
    pass "np 2: --ckpt-dir a/b/c, --metrics m/x/y/m.json ($lines steps), --trace t/x/y/t.json, --save-params s/x/y/p.h5 made with their parents: $(grep '^checkpoint:' "$TMP/run.log")"
else
    fail "np 2 with missing parents: exit $rc, metrics lines '$lines', files: $(cd "$W" && find a m t s -type f 2>/dev/null | tr '\n' ' '): $(tail -n 3 "$TMP/run.log")"
fi
# an existing directory (the second run into the same a/b/c) is fine, as for mkdir -p
if (cd "$W" && "$DTRAIN" $RUN --ckpt-dir a/b/c --resume auto --steps $((STEPS + 1))) >"$TMP/run2.log" 2>&1 &&
    grep -q "^resume: .*a/b/c/step_0000000$STEPS\.h5" "$TMP/run2.log"; then
    pass "--ckpt-dir a/b/c existing: resumed from $(sed -n 's/^resume: \([^,]*\.h5\),.*/\1/p' "$TMP/run2.log")"
else
    fail "--ckpt-dir a/b/c existing: $(tail -n 3 "$TMP/run2.log")"
fi

# ---- a parent that is a regular file: one line, exit 2 on every rank ----
for opt in "--ckpt-dir afile/ck" "--metrics afile/m/m.json" "--trace afile/t.json" "--save-params afile/x/p.h5"; do
    set -- $opt
    (cd "$W" && "$MPIEXEC" --quiet -np 2 "$DTRAIN" $RUN $opt) >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
        grep -q -- "^dtrain: error: $1 $2: cannot create directory afile: Not a directory$" "$TMP/err"; then
        pass "np 2 $opt: exit 2: $(cat "$TMP/err")"
    else
        fail "np 2 $opt: exit $rc, wanted one line '$1 $2: cannot create directory afile': $(head -c 600 "$TMP/err")"
    fi
done

# ---- dtrain --plan --metrics ----
if (cd "$W" && "$DTRAIN" $RUN --plan --metrics p/x/plan.json) >"$TMP/plan.log" 2>&1 && grep -q '"plan": 1' "$W/p/x/plan.json"; then
    pass "--plan --metrics p/x/plan.json made with its parents"
else
    fail "--plan --metrics p/x/plan.json: $(tail -n 2 "$TMP/plan.log")"
fi
expect_exit2 "^dtrain: error: --metrics $W/afile/plan.json: cannot create directory $W/afile: Not a directory$" \
    "$DTRAIN" $RUN --plan --metrics "$W/afile/plan.json"

# ---- dreshard --out ----
if (cd "$W" && "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "a/b/c/step_0000000$STEPS.h5" --out r/x/y/tp2.h5 --tp 2) \
    >"$TMP/re.log" 2>&1 && [ -s "$W/r/x/y/tp2.h5" ]; then
    pass "dreshard np 2 --out r/x/y/tp2.h5 made with its parents"
else
    fail "dreshard --out r/x/y/tp2.h5: $(tail -n 2 "$TMP/re.log")"
fi
expect_exit2 "^dreshard: error: --out $W/afile/x/tp2.h5: Not a directory$" \
    "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "$W/a/b/c/step_0000000$STEPS.h5" --out "$W/afile/x/tp2.h5" --tp 2
# ---- a directory that exists but takes no new file (/sys, even for root) ----
# Found at start by creating a file there, before any work: exit 2 and one
# line from every program (the convention: an output path that cannot be
# written is the command line's to fix).
if ! (: >/sys/dtrain-probe) 2>/dev/null; then
    PARAMS="$W/s/x/y/p.h5"
    for c in "$DTRAIN $RUN --save-params /sys/p.h5|--save-params /sys/p.h5: cannot write into directory /sys" \
        "$DTRAIN $RUN --trace /sys/t.json|--trace /sys/t.json: cannot write into directory /sys" \
        "$DTRAIN $RUN --metrics /sys/m.json|--metrics /sys/m.json: cannot create" \
        "$DRESHARD --in $PARAMS --out /sys/x.h5|--out /sys/x.h5: cannot write into directory /sys" \
        "$DRESHARD --in $PARAMS --to-hf /sys/hf|/sys/hf: cannot write into directory /sys" \
        "$DRESHARD --in $PARAMS --to-llmc /sys/x.bin|/sys/x.bin: cannot write into directory /sys" \
        "$DTRAIN_PREPARE --out /sys/x $top_srcdir/examples/data/carroll-alice.txt|--out '/sys/x': cannot write into directory '/sys'"; do
        cmd=${c%%|*} want=${c#*|}
        # shellcheck disable=SC2086
        $cmd >"$TMP/out" 2>"$TMP/err"
        rc=$?
        if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -qF -- "$want" "$TMP/err" && ! grep -q "MPI_ERR\|H5FD" "$TMP/err"; then
            pass "exit 2: $(cat "$TMP/err")"
        else
            fail "$cmd: exit $rc, wanted one line with '$want': $(head -c 500 "$TMP/err")"
        fi
    done
else
    echo "skip: /sys takes new files here"
fi
finish
