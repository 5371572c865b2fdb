#!/usr/bin/env bash
# Where a training step's GPU time goes, kernel by kernel: Nsight Compute
# (ncu, with the CUDA toolkit) times the first LAUNCHES kernels (default
# 1500) of a STEPS-step dtrain run (one metric, gpu__time_duration.sum, so
# each kernel runs once and is not replayed), and the kernels are summed by
# name. ncu serialises the kernels: on an H200 (2026-11-26) 300 kernels of
# tiny took 36 s under it, about 0.1 s a kernel, and GPT-2 124M has several
# hundred a step, so keep STEPS at 1 or 2 and LAUNCHES near one step's.
#
#   bench/gpu_kernels.sh [--out DIR] [--launches N] [STEPS] [-- DTRAIN_ARGS...]
#
# From a CUDA build directory or an unpacked bundle (as bench/gpu.sh).
# DTRAIN_ARGS default to gpt2-124m, bf16, micro batch 16 x 1024 on the
# bundled corpus. STEPS defaults to 1. Writes DIR/kernels.md (default the
# current directory): per kernel name its launches, total milliseconds per
# step and share, the sum of kernel time per step beside dtrain's own
# ms/step (the difference is the time the GPU waited for the host), and
# DIR/ncu.csv.gz, ncu's raw table.
set -euo pipefail
me=gpu_kernels.sh
die() { echo "$me: $*" >&2; exit 1; }
outdir=.
steps=1
launches=1500
while [ $# -gt 0 ]; do
    case $1 in
        --out) [ $# -ge 2 ] || die "--out needs a directory"; outdir=$2; shift ;;
        --out=*) outdir=${1#--out=} ;;
        --launches) [ $# -ge 2 ] || die "--launches needs a number"; launches=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        [0-9]*) steps=$1 ;;
        *) die "unknown argument $1 (try --help)" ;;
    esac
    shift
done
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -f "$root/env.sh" ]; then
    # shellcheck disable=SC1091
    . "$root/env.sh" || die "sourcing $root/env.sh failed"
    top=$root
else
    top=$(pwd)
    [ -x "$top/src/dtrain" ] || die "run it from a build directory or from an unpacked bundle"
fi
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
[ -n "$ncu" ] || die "ncu (Nsight Compute) not found: it comes with the CUDA toolkit"
python=
for p in python3 /usr/bin/python3; do
    if LD_LIBRARY_PATH=${DTRAIN_BUNDLE_SAVED_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}} "$p" -c 1 2>/dev/null; then python=$p; break; fi
done
[ -n "$python" ] || die "python3 not found (it sums the kernels)"
if [ $# -eq 0 ]; then
    set -- --model gpt2-124m --dtype bf16 --micro-batch 16 --seq-len 1024 --data "$top/data/gutenberg_train_*.bin"
fi
mkdir -p "$outdir"
out=$(cd "$outdir" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-kernels.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# the run without ncu first: dtrain's own ms/step
"$top/src/dtrain" --device cuda "$@" --steps $((steps + 3)) --warmup 1 --val-every 0 --sample-tokens 0 \
    --peak-gflops 989400 --metrics "$work/plain.json" >"$work/plain.txt" 2>&1 || die "dtrain failed: $(tail -n 2 "$work/plain.txt")"
"$ncu" --metrics gpu__time_duration.sum --csv --target-processes all --cache-control none --clock-control none \
    --launch-count "$launches" \
    "$top/src/dtrain" --device cuda "$@" --steps "$steps" --warmup 1 --val-every 0 --sample-tokens 0 \
    --peak-gflops 989400 >"$work/ncu.csv" 2>"$work/ncu.err" || die "ncu failed: $(tail -n 2 "$work/ncu.err")"
gzip -c "$work/ncu.csv" >"$out/ncu.csv.gz"
LD_LIBRARY_PATH=${DTRAIN_BUNDLE_SAVED_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}} "$python" - "$work/ncu.csv" "$work/plain.json" \
    "$steps" "$*" "$launches" >"$out/kernels.md" <<'PY'
import csv, json, re, sys, statistics
path, plain, steps, args, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
unit = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3, "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
tot, cnt = {}, {}
with open(path, newline="") as f:
    rows = [l for l in f if l.startswith('"')]
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = re.sub(r"\(.*", "", r["Kernel Name"]).strip() or r["Kernel Name"]
    name = re.sub(r"^void ", "", name)
    ms = float(r["Metric Value"].replace(",", "")) * unit[r["Metric Unit"]]
    tot[name] = tot.get(name, 0.0) + ms
    cnt[name] = cnt.get(name, 0) + 1
ms_step = [json.loads(l)["ms"] for l in open(plain) if l.startswith("{")][2:]
wall = statistics.median(ms_step) if ms_step else float("nan")
allk = sum(tot.values()) / steps
n = sum(cnt.values())
print("Kernels of `dtrain --device cuda %s`, %d step(s) under ncu (gpu__time_duration.sum), %d kernels timed, "
      "per step:\n" % (args, steps, n))
if n >= cap:
    print("- the --launches cap (%d) was reached: the run had more kernels, and the per-step figures below "
          "cover only those timed\n" % cap)
print("- GPU kernel time %.1f ms per step; dtrain's own median %.1f ms/step without ncu (%.0f %% of it in kernels)\n"
      % (allk, wall, 100 * allk / wall if wall == wall else float("nan")))
print("| kernel | launches/step | ms/step | share |")
print("|---|---:|---:|---:|")
for name in sorted(tot, key=tot.get, reverse=True)[:25]:
    print("| `%s` | %g | %.2f | %.1f %% |" % (name[:90], cnt[name] / steps, tot[name] / steps, 100 * tot[name] / sum(tot.values())))
PY
cat "$out/kernels.md"
