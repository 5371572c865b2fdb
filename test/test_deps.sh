#!/bin/sh
# scripts/install-deps.sh installs every command the build, the tests, the
# scripts and the benchmarks call (issue 22: pgrep, from procps, was not).
#  - scripts/check-deps.sh on this tree: every listed command and Python
#    module present, every package in install-deps.sh, no unlisted command;
#  - the checker itself, on scratch copies: install-deps.sh without procps
#    fails naming pgrep/pkill and procps; a test script that calls a new
#    program (strace, jq, xxd or bc: whichever is installed) fails naming it
#    and the file and line.
. "$top_srcdir/test/common.sh"

if out=$(bash "$top_srcdir/scripts/check-deps.sh" 2>&1); then
    pass "$(echo "$out" | tail -n 1)"
else
    fail "check-deps.sh: $(echo "$out" | grep -v 'note:' | tr '\n' '|')"
fi

# a scratch tree with the checker, the install script and the scripts it scans
copy_tree() {
    rm -rf "$TMP/tree" && mkdir -p "$TMP/tree" &&
        (cd "$top_srcdir" && tar -cf - scripts test/*.sh test/gpu/*.sh test/*.py test/ref test/emu bench slurm fuzz/run.sh .ci/run autogen.sh 2>/dev/null) |
        (cd "$TMP/tree" && tar -xf -)
}
copy_tree
sed -i 's/ procps$//' "$TMP/tree/scripts/install-deps.sh"
out=$(bash "$TMP/tree/scripts/check-deps.sh" --scan 2>&1)
rc=$?
if [ "$rc" -eq 1 ] && echo "$out" | grep -q "^check-deps: package procps (for pgrep, pkill, ps) is not in scripts/install-deps.sh$"; then
    pass "procps removed from install-deps.sh: exit 1, $(echo "$out" | grep procps)"
else
    fail "procps removed from install-deps.sh: exit $rc: $(echo "$out" | tr '\n' '|')"
fi

new=""
for c in strace jq xxd bc; do command -v "$c" >/dev/null 2>&1 && { new=$c; break; }; done
if [ -n "$new" ]; then
    copy_tree
    printf '\nv=$(%s --version | head -n 1)\n' "$new" >>"$TMP/tree/test/test_ops_grad_new.sh"
    out=$(bash "$TMP/tree/scripts/check-deps.sh" --scan 2>&1)
    rc=$?
    if [ "$rc" -eq 1 ] && echo "$out" | grep -q "^check-deps: $new (test/test_ops_grad_new.sh:2) is not in scripts/check-deps.sh"; then
        pass "a new command is caught: $(echo "$out" | grep "^check-deps: $new ")"
    else
        fail "a script calling $new: exit $rc: $(echo "$out" | tr '\n' '|')"
    fi
else
    echo "note: none of strace, jq, xxd, bc installed: the new-command case is not exercised"
fi
finish
