#!/bin/sh
# The pipeline executor's bubble, measured on the wall clock against each
# schedule's formula: test/test_pipeline --bubble-wall runs 1f1b, gpipe,
# interleaved v2, zb-h1 and zbv through mpi/pipeline.c with sleeps of UNIT
# ms as every stage's forward, B and W (split over the chunks), so the
# stages cost the same and a sleeping rank leaves the cores to the others,
# at PP ranks (default 4) with M = 2 PP and 4 PP microbatches. A rank's
# bubble is 1 - (its time inside the sleeps) / (the step); of four runs
# after a warm-up the shortest step counts. It exits non-zero unless every
# rank is within 2 percentage points of the ideal (pipe_simulate's, equal
# to the formulas (P-1)/(M+P-1), (P-1)/(VM+P-1), (P-1)/(3M+P-1)).
# Waiting ranks poll in MPI, so load from other processes adds wake-up
# delays: run it on a quiet machine. The suite checks the same bubbles
# exactly in virtual time (test_pipeline.sh).
#
#   [PP=4] bench/pp_bubble.sh [UNIT_MS]   (run from the build directory, after make check)
set -eu
unit=${1:-20}
P=${PP:-4}
prog=${PROG:-./test/test_pipeline}
mpiexec=${MPIEXEC:-mpirun}
[ -x "$prog" ] || { echo "pp_bubble.sh: $prog is not built: run 'make check' (or make $prog) first" >&2; exit 2; }
# shellcheck disable=SC2086
$mpiexec --oversubscribe -np "$P" "$prog" --bubble-wall "$unit" | grep -v '^ok '
