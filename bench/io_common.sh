# Helpers of the I/O benchmarks (bench/ckpt_bandwidth.sh,
# bench/hf_bandwidth.sh), sourced by them.
#   drop            sync, then drop the page cache; sets cold=no where that
#                   is not allowed (not root)
#   median          of the numbers on stdin, one per line
#   now / since T0  seconds since the epoch / since T0
#   gbps BYTES S    GB/s (1e9 bytes)
#   pct A B         100 A / B as "NN %"
cold=yes
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || cold=no; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { print b - a }'; }
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.3f", b / s / 1e9 }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f %%", 100 * a / b }'; }
