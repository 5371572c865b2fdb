#!/bin/sh
# Run libFuzzer harnesses (make fuzz calls this; see doc/fuzz.md).
#
#   fuzz/run.sh SRCDIR RUNS TIME HARNESS...
#
# Each HARNESS (a binary fuzz/fuzz_NAME) runs for RUNS executions, or for
# TIME seconds when TIME is not empty, starting from the committed seeds
# in SRCDIR/fuzz/corpus/NAME (read only: new inputs go to
# fuzz/out/NAME/corpus) and the dictionary SRCDIR/fuzz/NAME.dict if there
# is one. Extra libFuzzer flags: FUZZ_FLAGS in the environment. One line
# per harness (executions, seconds, rate, corpus size); exit 1 when any
# harness crashed, leaked, timed out or ran out of memory, with its log and
# the crashing input kept in fuzz/out/.
set -u
if [ $# -lt 4 ]; then
    echo "usage: fuzz/run.sh SRCDIR RUNS TIME HARNESS..." >&2
    exit 2
fi
srcdir=$1 runs=$2 time=$3
shift 3

if [ -n "$time" ]; then
    limit="-max_total_time=$time"
else
    limit="-runs=$runs"
fi

failed=0
for h in "$@"; do
    name=${h##*/fuzz_}
    out=fuzz/out/$name
    rm -rf "$out"
    mkdir -p "$out/corpus" || exit 1
    seeds=$srcdir/fuzz/corpus/$name
    dict=
    [ -f "$srcdir/fuzz/$name.dict" ] && dict="-dict=$srcdir/fuzz/$name.dict"
    [ -d "$seeds" ] || seeds=
    start=$(date +%s)
    # -timeout: one input running 25 s is a hang, reported as a failure.
    # shellcheck disable=SC2086
    "$h" $limit $dict ${FUZZ_FLAGS:-} -timeout=25 -print_final_stats=1 \
        -artifact_prefix="$out/" "$out/corpus" $seeds >"$out/log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out/log" | tail -n 1)
    ncorp=$(ls "$out/corpus" | wc -l)
    if [ "$rc" -eq 0 ] && [ -n "$execs" ]; then
        echo "PASS fuzz_$name: ${execs} executions in ${secs} s (${rate:-?}/s), 0 crashes, corpus +${ncorp} inputs"
    else
        failed=$((failed + 1))
        crash=$(ls "$out" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | head -n 1)
        echo "FAIL fuzz_$name: exit $rc after ${execs:-?} executions in ${secs} s; log $out/log${crash:+, input $out/$crash}"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$out/log" | head -n 3
    fi
done
[ "$failed" -eq 0 ]
