#!/bin/sh
# Every command in README.md's code blocks runs as printed and exits 0, so a
# README that drifts from the programs fails make check.
#
# The commands are taken from the fenced blocks (a trailing backslash joins
# lines) and run in order, as a user would type them from a fresh build
# directory: in a scratch directory holding the build's programs under
# src/, the source's examples/ and the build's data/, with HOME there too
# (the --init-from example's ~/models/gpt2 is a tiny GPT-2 exported
# beforehand). mpirun oversubscribes through the harness's environment
# (OMPI_MCA_rmaps_base_oversubscribe=1, what --oversubscribe sets).
#
# The text is not edited. Step counts are shortened by the environment:
# src/dtrain and src/dreshard here are wrappers that divide every step
# count (--steps, --warmup, --ckpt-every, --stop-at-step, --decay-steps,
# those of a --config file, the default 1000 steps, and the step in a
# checkpoint's name step_NNNNNNNN.h5) by README_STEP_DIVISOR (default 200),
# at least 1, before running the real program. --val-every is left as it
# is: validation still runs before the first step and after the last.
#
# Skipped, with the reason printed: ./scripts/quickstart.sh (it installs
# packages as root and builds; CI runs those steps itself) and make check
# (this suite).
. "$top_srcdir/test/common.sh"

DIV=${README_STEP_DIVISOR:-200}
W="$TMP/user"
mkdir -p "$W/src" "$W/home" || exit 99

# ---- the commands, one per line ----
awk '
    /^```/ { inblock = !inblock; next }
    !inblock { next }
    { line = cont $0; cont = "" }
    /\\$/ { sub(/\\$/, "", line); cont = line; next }
    { print line }
' "$top_srcdir/README.md" | sed 's/^[[:space:]]*//' | grep -v '^$' >"$TMP/commands"
n=$(wc -l <"$TMP/commands")
[ "$n" -ge 20 ] || { fail "only $n commands found in README.md's code blocks"; finish; }

# ---- the scratch build directory ----
for p in dtrain-prepare dtrain-plot dtrain-bench-comm dtrain-bench-gemm; do
    ln -s "$top_builddir/src/$p" "$W/src/$p" || exit 99
done
cp -r "$top_srcdir/examples" "$W/examples" && mkdir -p "$W/data" &&
    cp "$top_builddir"/data/*.bin "$top_builddir"/data/*.tokenizer.json "$W/data/" || exit 99

# scale N: N / DIV, at least 1 (0 stays 0)
cat >"$W/src/scale.sh" <<EOF
scale() { if [ "\$1" -eq 0 ]; then echo 0; else s=\$((\$1 / $DIV)); [ "\$s" -ge 1 ] || s=1; echo "\$s"; fi; }
EOF
cat >"$W/src/dtrain" <<EOF
#!/bin/sh
# the README test's dtrain: step counts divided by $DIV (test/test_readme.sh)
. "$W/src/scale.sh"
conf="" given=" "
for a in "\$@"; do
    case \$prev in --config) conf=\$a ;; esac
    case \$a in --steps|--warmup|--ckpt-every) given="\$given\$a " ;; esac
    prev=\$a
done
set -- "\$@" END
prev=""
for a in "\$@"; do
    [ "\$a" = END ] && break
    case \$prev in
    --steps|--warmup|--ckpt-every|--stop-at-step|--decay-steps) a=\$(scale "\$a") ;;
    esac
    set -- "\$@" "\$a"
    prev=\$a
done
while [ "\$1" != END ]; do shift; done
shift
# the step counts a --config file sets, unless the command line gives them
for k in steps warmup ckpt-every; do
    case \$given in *" --\$k "*) continue ;; esac
    v=""
    [ -n "\$conf" ] && v=\$(sed -n "s/^[[:space:]]*\$k[[:space:]]*=[[:space:]]*\([0-9]*\).*/\1/p" "\$conf" | tail -n 1)
    [ -z "\$v" ] && [ "\$k" = steps ] && v=1000
    [ -n "\$v" ] && set -- "\$@" "--\$k" "\$(scale "\$v")"
done
exec "$DTRAIN" "\$@"
EOF
cat >"$W/src/dreshard" <<EOF
#!/bin/sh
# the README test's dreshard: a checkpoint's step in its name divided by $DIV
. "$W/src/scale.sh"
set -- "\$@" END
for a in "\$@"; do
    [ "\$a" = END ] && break
    case \$a in
    *step_[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9].h5)
        n=\$(echo "\$a" | sed 's/.*step_0*\([0-9][0-9]*\)\.h5$/\1/')
        a=\$(echo "\$a" | sed "s/step_[0-9]*\.h5\$/step_\$(printf %08d "\$(scale "\$n")").h5/") ;;
    esac
    set -- "\$@" "\$a"
done
while [ "\$1" != END ]; do shift; done
shift
exec "$DRESHARD" "\$@"
EOF
chmod +x "$W/src/dtrain" "$W/src/dreshard"

# ~/models/gpt2: a tiny GPT-2 in Hugging Face's layout, for --init-from
(cd "$W" && "$DTRAIN" --model tiny-gpt2 --data 'data/gutenberg-gpt2_train_*.bin' --threads 1 --steps 1 \
    --micro-batch 1 --global-batch 1 --seq-len 32 --val-every 0 --sample-tokens 0 --save-params "$TMP/g.h5" &&
    "$DRESHARD" --in "$TMP/g.h5" --to-hf "$W/home/models/gpt2") >"$TMP/setup.log" 2>&1 ||
    { fail "making ~/models/gpt2: $(tail -n 3 "$TMP/setup.log")"; finish; }

# ---- run them ----
i=0
while IFS= read -r cmd; do
    i=$((i + 1))
    case $cmd in
    ./scripts/quickstart.sh*)
        echo "skip $cmd: installs packages as root and builds (CI runs those steps)"
        continue
        ;;
    "make check"*)
        echo "skip $cmd: this suite"
        continue
        ;;
    esac
    log="$TMP/cmd$i.log"
    start=$(date +%s)
    (cd "$W" && HOME="$W/home" sh -c "$cmd") >"$log" 2>&1 </dev/null
    rc=$?
    secs=$(($(date +%s) - start))
    if [ "$rc" -eq 0 ]; then
        pass "($secs s) $cmd"
    else
        fail "exit $rc: $cmd: $(tail -n 3 "$log" | tr '\n' ' ')"
    fi
done <"$TMP/commands"
finish
