#!/bin/sh
# The host AdamW of issue 36 (src/optim/adamw_host.c) against a STREAM-style
# triad on the same cores: GB/s of each vector path (p, m, v read and
# written, g read: 28 bytes an element; 30 with the bf16 copy) at all cores
# and at one, and the CPU ops table's adamw for comparison. Run from a
# build directory after make check has built test/test_adamw_host:
#
#   bench/offload.sh [ELEMENTS] [REPS]     default 2^25 elements (512 MiB of state), 5
#
# The step time of a model with --offload on and off is the next slice of
# issue 36 (the option does not exist yet).
set -eu
B=${B:-.}
n=${1:-33554432}
reps=${2:-5}
[ -x "$B/test/test_adamw_host" ] || { echo "bench/offload.sh: $B/test/test_adamw_host is not built: run make check (or make test/test_adamw_host)" >&2; exit 1; }
cores=$(nproc)
echo "## $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
for t in "$cores" 1; do
    echo
    OMP_NUM_THREADS=$t OMP_PROC_BIND=close "$B/test/test_adamw_host" --bench "$n" "$reps"
done
