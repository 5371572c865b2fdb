#!/bin/sh
# The suite's driver for its shell tests (SH_LOG_COMPILER): runs one test
# script with the shell make gives (the first argument) and ends its log
# with its wall time ("# time: N s"), so that CI can list the slowest
# tests (.ci/run) and the suite be trimmed by measurement. The test's
# exit status is kept.
sh=$1
shift
t0=$(date +%s)
"$sh" "$@"
rc=$?
echo "# time: $(($(date +%s) - t0)) s"
exit $rc
