#!/usr/bin/env bash
# Rehearse the runtime bundle (scripts/bundle.sh) on a bare machine: a
# minimal Debian 12 root (debootstrap --variant=minbase: glibc, libstdc++,
# no OpenMPI, HDF5, OpenBLAS, ...) entered with unshare + chroot. A slow
# developer check (minutes; root; the first run downloads the root), not
# part of make check. See doc/gpu.md.
#
#   scripts/rehearse-bundle.sh [--build DIR] [--cuda-build DIR]
#
# --build DIR (default .): a built CPU or CUDA build directory. Its bundle
#   (a .tar.gz, unpacked inside the root as on a GPU machine) runs tiny at 2
#   ranks with the bundle's mpirun, 30 steps with a checkpoint, dreshard to
#   tp 2 (and --info), and 10 more steps resumed from the resharded file at
#   tp 2, then tiny-gpt2 on the bundle's GPT-2 data (whose sidecar names the
#   build machine's vocabulary path: found by its sha256 in the bundle's
#   tokenizers/), its sample decoded; the same commands run with the build
#   itself on this machine, and the losses (every step, validation included)
#   and dreshard --info must be identical: the same binaries, so bit for bit.
# --cuda-build DIR (default: build-cuda/ beside the source, when it is a
#   configured CUDA build): the same for its bundle (--device auto falls
#   back to the CPU), which must be at most 64 MiB as a tarball; the root
#   gets the CUDA 13 runtime and cuBLAS in /usr/local/cuda/lib64 and NCCL in
#   a Python wheel's directory, as a GPU machine has them, but no driver, so
#   dtrain --selftest must fail with its one no-GPU line (exit 2), not a
#   missing library; bench/gpu.sh must say "no GPU" in one line and exit 1,
#   and with DEVICE=cpu run its GEMM and tiny steps from the bundle.
# The root is cached in /var/tmp/dtrain-rehearse/bookworm-minbase
# (DTRAIN_REHEARSE_ROOT; DEBIAN_MIRROR picks the mirror) and never changed:
# everything the runs need is mounted in a private mount namespace. KEEP=1
# keeps the work directory (bundles, logs, metrics of both sides).
set -euo pipefail
me=rehearse-bundle.sh
die() { echo "$me: $*" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)

build=.
cuda_build=
while [ $# -gt 0 ]; do
    case $1 in
        --build) [ $# -ge 2 ] || die "--build needs a directory"; build=$2; shift ;;
        --cuda-build) [ $# -ge 2 ] || die "--cuda-build needs a directory"; cuda_build=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (try --help)" ;;
    esac
    shift
done
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, unshare, mount, chroot)"
for t in unshare chroot mount tar; do command -v "$t" >/dev/null || die "$t not found"; done
build=$(cd "$build" 2>/dev/null && pwd) || die "no build directory $build"
[ -x "$build/src/dtrain" ] || die "$build/src/dtrain not built: run make first"
srcdir=$(sed -n 's/^abs_top_srcdir = //p' "$build/Makefile" | head -n 1)
if [ -z "$cuda_build" ] && [ -f "$srcdir/build-cuda/config.h" ] && [ "$srcdir/build-cuda" != "$build" ]; then
    cuda_build=$srcdir/build-cuda
fi
if [ -n "$cuda_build" ]; then
    cuda_build=$(cd "$cuda_build" 2>/dev/null && pwd) || die "no CUDA build directory $cuda_build"
    grep -q '^#define HAVE_CUDA 1' "$cuda_build/config.h" 2>/dev/null || die "$cuda_build is not a CUDA build"
fi
t0=$(date +%s)

# ---- the minimal Debian 12 root (cached) ----
R=${DTRAIN_REHEARSE_ROOT:-/var/tmp/dtrain-rehearse/bookworm-minbase}
if [ ! -f "$R/.dtrain-rehearse-complete" ]; then
    command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap (scripts/install-deps.sh)"
    echo "$me: debootstrap --variant=minbase bookworm $R (once; minutes)"
    rm -rf "$R.tmp"
    mkdir -p "$(dirname "$R")"
    debootstrap --variant=minbase bookworm "$R.tmp" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$R.log" 2>&1 ||
        die "debootstrap failed: $(tail -n 1 "$R.log") (log: $R.log)"
    rm -rf "$R"
    mv "$R.tmp" "$R"
    touch "$R/.dtrain-rehearse-complete"
fi
bare=$(find "$R/usr/lib/x86_64-linux-gnu" -maxdepth 2 -regextype posix-extended \
    -regex '.*/lib(mpi|open-pal|pmix|hdf5.*|openblas|gomp|gfortran|sentencepiece|jansson|crypto)\.so.*' -printf '%f\n')
[ -z "$bare" ] || die "$R is not bare: it has $(echo "$bare" | paste -sd' ' -)"

W=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-rehearse.XXXXXX")
if [ -n "${KEEP:-}" ]; then echo "$me: keeping $W (KEEP)"; else trap 'rm -rf "$W"' EXIT; fi
mkdir -p "$W/in/out"
chmod 755 "$W" "$W/in" "$W/in/out"
# A foreign PMIx in the system's path, as the GPU machines have one (another
# version's pmix_mca_pcompress_zlib.so, needing a symbol the bundle's libpmix
# lacks): laid over the root's library directory (a read-only overlay, the
# cached root unchanged); the bundle's PMIx must not load it.
foreign=$W/foreign/pmix2/lib/pmix
mkdir -p "$foreign"
echo 'extern int pmix_output_info(void); int pmix_mca_pcompress_zlib_component(void) { return pmix_output_info(); }' |
    gcc -x c -shared -fPIC -o "$foreign/pmix_mca_pcompress_zlib.so" - || die "gcc: cannot build the foreign PMIx component"

# The run compared: tiny at 2 ranks, a checkpoint, dreshard, a resumed run,
# and tiny-gpt2 on the bundle's GPT-2 data.
# TOP has src/ and data/; mpirun is the one in PATH.
cat >"$W/in/train-seq.sh" <<'EOF'
#!/bin/bash
set -euo pipefail
top=$1 conf=$2 w=$3
mkdir -p "$w"
cd "$top"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
step() { # LOG CMD...: run, keep the output, one line on failure
    local log=$1; shift
    "$@" >"$w/$log" 2>&1 || { echo "FAIL $log: exit $?: $(tail -n 2 "$w/$log" | tr '\n' ' ')"; exit 1; }
}
args=(--config "$conf" --threads 1 --val-batches 4 --sample-tokens 0)
step train.log mpirun -np 2 src/dtrain "${args[@]}" --steps 30 --val-every 30 --ckpt-dir "$w/ck" --metrics "$w/train.jsonl"
step dreshard.log mpirun -np 2 src/dreshard --in "$w/ck/step_00000030.h5" --out "$w/tp2.h5" --tp 2
step info.txt src/dreshard --info "$w/tp2.h5"
step resume.log mpirun -np 2 src/dtrain "${args[@]}" --tp 2 --steps 40 --val-every 40 --resume "$w/tp2.h5" --metrics "$w/resume.jsonl"
# GPT-2 BPE data, whose sidecar names the build machine's vocabulary path:
# found by its sha256 in $DTRAIN_TOKENIZERS (the bundle's tokenizers/)
step gpt2.log mpirun -np 2 src/dtrain --config "${conf%/*}/tiny-gpt2.conf" --threads 1 --steps 3 --val-every 3 \
    --val-batches 2 --sample-tokens 8 --metrics "$w/gpt2.jsonl"
grep -q "^tokenizer: gpt2:" "$w/gpt2.log" || { echo "FAIL gpt2.log: no GPT-2 tokenizer line"; exit 1; }
echo "ok: train, checkpoint, dreshard, resume at tp 2, tiny-gpt2 with its sample decoded"
EOF

# What runs inside the root: NAME KIND (cpu|cuda)
cat >"$W/in/inside.sh" <<'EOF'
#!/bin/bash
set -euo pipefail
name=$1 kind=$2
o=/mnt/out/$name
mkdir -p "$o"
cd /opt
tar -xzf "/mnt/$name.tar.gz"
B=/opt/$name
. "$B/env.sh" 2>"$o/env.err"
cat "$o/env.err" >&2
# every ELF file of the bundle: nothing "not found"
find "$B" -type f \( -perm -u+x -o -name '*.so*' \) -print0 | { xargs -0 ldd 2>/dev/null || true; } |
    awk '/^\/.*:$/ { f = $1 } /not found/ { print f, $0 }' >"$o/missing.txt"
echo "ldd: $(grep -c . "$o/missing.txt" || true) missing libraries"
bash /mnt/train-seq.sh "$B" "$B/examples/tiny.conf" "$o/run"
# the foreign PMIx component must never have been opened
ls /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_pcompress_zlib.so >"$o/foreign.txt"
grep -h -i -E 'pmix_mca_base_component_repository_open|usable compression' "$o"/run/*.log >"$o/pmix.txt" || true
if [ "$kind" = cuda ]; then
    rc=0; dtrain --selftest >"$o/selftest.out" 2>&1 || rc=$?
    echo "$rc" >"$o/selftest.rc"
    echo "dtrain --selftest: exit $rc: $(cat "$o/selftest.out")"
    rc=0; "$B/bench/gpu.sh" >"$o/gpu.out" 2>&1 || rc=$?
    echo "$rc" >"$o/gpu.rc"
    echo "bench/gpu.sh: exit $rc: $(cat "$o/gpu.out")"
    rc=0
    (cd /tmp && DEVICE=cpu MODELS=tiny GEMM_ARGS="--shapes 128x128x128 --iters 2" GELU_ARGS="--shapes 128x64x128 --iters 2" \
        TINY_ARGS="--micro-batch 2 --seq-len 64" "$B/bench/gpu.sh" --out "$o/gpu-cpu" 3 >"$o/gpu-cpu.out" 2>&1) || rc=$?
    echo "$rc" >"$o/gpu-cpu.rc"
    echo "DEVICE=cpu bench/gpu.sh: exit $rc: $(grep -c '^| tiny' "$o/gpu-cpu/results.md" 2>/dev/null || echo 0) tiny rows in results.md"
fi
EOF

# enter the root in a private mount namespace: proc, sys, dev, a fresh /tmp
# and /opt, $W/in (bundle, scripts; outputs in out/) on /mnt; for CUDA the
# toolkit's libraries
enter() { # NAME KIND
    local cudalibs=""
    if [ "$2" = cuda ]; then
        cudalibs=$(for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
            p=$(ldd "$cuda_build/src/dtrain" | awk -v s="$so" '$1 == s { print $3 }')
            [ -n "$p" ] || { echo "$me: $so not found for $cuda_build/src/dtrain" >&2; exit 1; }
            echo "$so=$(readlink -f "$p")"
        done) || exit 1
    fi
    CUDALIBS=$cudalibs unshare --mount --pid --fork --kill-child bash -euo pipefail -c '
        R=$1; W=$2
        mount --make-rprivate /
        mount -t proc proc "$R/proc"
        mount --rbind /sys "$R/sys"
        mount --rbind /dev "$R/dev"
        mount -t tmpfs tmpfs "$R/tmp"
        mount -t tmpfs tmpfs "$R/opt"
        mount --bind "$W/in" "$R/mnt"
        mount -t overlay overlay -o "lowerdir=$W/foreign:$R/usr/lib/x86_64-linux-gnu" "$R/usr/lib/x86_64-linux-gnu"
        if [ -n "$CUDALIBS" ]; then
            mount -t tmpfs tmpfs "$R/usr/local"
            nccl=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
            mkdir -p "$R/usr/local/cuda-13.0/lib64" "$R$nccl"
            ln -s cuda-13.0 "$R/usr/local/cuda"
            for l in $CUDALIBS; do
                so=${l%%=*}; src=${l#*=}
                case $so in libnccl*) dst=$R$nccl/$so ;; *) dst=$R/usr/local/cuda-13.0/lib64/$so ;; esac
                : >"$dst"
                mount --bind -o ro "$src" "$dst"
            done
        fi
        exec chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
            /bin/bash /mnt/inside.sh "$3" "$4"
    ' rehearse "$R" "$W" "$1" "$2"
}

strip() { sed 's/, "ms": .*//' "$1"; }
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

rehearse() { # BUILD KIND NAME
    local b=$1 kind=$2 name=$3 flag=() t src conf
    t=$(date +%s)
    [ "$kind" = cuda ] && flag=(--cuda)
    echo "== $kind build $b"
    bash "$here/bundle.sh" "${flag[@]}" --build "$b" "$W/in/$name.tar.gz" || { bad "$name: bundle.sh failed"; return; }
    ok "$name: bundle made ($(($(date +%s) - t)) s)"
    src=$(sed -n 's/^abs_top_srcdir = //p' "$b/Makefile" | head -n 1)
    conf=$src/examples/tiny.conf
    t=$(date +%s)
    # the same clean environment as in the root (an OPENBLAS_CORETYPE, say,
    # changes OpenBLAS's kernels and with them the last bits)
    if out=$(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
        bash "$W/in/train-seq.sh" "$b" "$conf" "$W/host-$name" 2>&1); then ok "$name: this machine, the build: $out ($(($(date +%s) - t)) s)"
    else bad "$name: this machine, the build: $out"; return; fi
    t=$(date +%s)
    enter "$name" "$kind" 2>&1 | sed 's/^/   chroot: /' || true
    local o=$W/in/out/$name
    [ -f "$o/missing.txt" ] || { bad "$name: nothing came back from the chroot"; return; }
    [ ! -s "$o/missing.txt" ] && ok "$name: every ELF file in the bundle finds its libraries in the bare root" ||
        bad "$name: missing libraries in the bare root: $(head -n 3 "$o/missing.txt")"
    [ ! -s "$o/env.err" ] || bad "$name: env.sh said: $(cat "$o/env.err")"
    for f in train.jsonl resume.jsonl gpt2.jsonl; do
        if [ -s "$o/run/$f" ] && cmp -s <(strip "$W/host-$name/$f") <(strip "$o/run/$f"); then
            ok "$name: $f: $(wc -l <"$o/run/$f") lines, losses bit-identical to the build's run (last: $(tail -n 1 "$o/run/$f" | sed 's/, "lr".*//; s/[{}"]//g'))"
        else
            bad "$name: $f differs from the build's run: $(diff <(strip "$W/host-$name/$f") <(strip "$o/run/$f" 2>/dev/null) | head -n 3 | tr '\n' ' ')"
        fi
    done
    if [ -s "$o/foreign.txt" ] && [ ! -s "$o/pmix.txt" ]; then
        ok "$name: a foreign PMIx component in the system path ($(cat "$o/foreign.txt")) stays unopened"
    else
        bad "$name: the foreign PMIx component: $(head -n 2 "$o/pmix.txt" 2>/dev/null | tr '\n' ' ')"
    fi
    if cmp -s <(grep -v '^file:' "$W/host-$name/info.txt") <(grep -v '^file:' "$o/run/info.txt" 2>/dev/null); then
        ok "$name: dreshard --info of the tp 2 file identical ($(tail -n 1 "$o/run/info.txt"))"
    else
        bad "$name: dreshard --info differs"
    fi
    if [ "$kind" = cuda ]; then
        local rc line
        rc=$(cat "$o/selftest.rc" 2>/dev/null || echo none)
        line=$(cat "$o/selftest.out" 2>/dev/null)
        if [ "$rc" = 2 ] && [ "$(grep -c . <<<"$line")" = 1 ] && grep -q 'no usable GPU' <<<"$line" &&
            ! grep -q 'error while loading shared libraries' <<<"$line"; then
            ok "$name: dtrain --selftest without a GPU: exit 2, one line: $line"
        else
            bad "$name: dtrain --selftest: exit $rc: $line"
        fi
        rc=$(cat "$o/gpu.rc" 2>/dev/null || echo none)
        line=$(cat "$o/gpu.out" 2>/dev/null)
        if [ "$rc" = 1 ] && [ "$(grep -c . <<<"$line")" = 1 ] && grep -q 'no GPU' <<<"$line"; then
            ok "$name: bench/gpu.sh without a GPU: exit 1, one line: $line"
        else
            bad "$name: bench/gpu.sh: exit $rc: $(head -n 3 <<<"$line")"
        fi
        rc=$(cat "$o/gpu-cpu.rc" 2>/dev/null || echo none)
        if [ "$rc" = 0 ] && grep -q '^| tiny, CPU, bf16' "$o/gpu-cpu/results.md" && [ -s "$o/gpu-cpu/logs.tar.gz" ]; then
            ok "$name: DEVICE=cpu bench/gpu.sh from the bundle: results.md and logs.tar.gz written"
        else
            bad "$name: DEVICE=cpu bench/gpu.sh: exit $rc: $(tail -n 3 "$o/gpu-cpu.out" 2>/dev/null | tr '\n' ' ')"
        fi
    fi
    echo "   ($name in the root: $(($(date +%s) - t)) s)"
}

rehearse "$build" "$(grep -q '^#define HAVE_CUDA 1' "$build/config.h" && echo cuda || echo cpu)" dtrain-bundle
if [ -n "$cuda_build" ]; then
    rehearse "$cuda_build" cuda dtrain-bundle-cuda
else
    echo "note: no CUDA build (--cuda-build DIR, or build-cuda/ beside the source): its bundle was not rehearsed"
fi
echo "$me: $fails failure(s) in $(($(date +%s) - t0)) s"
[ "$fails" -eq 0 ]
