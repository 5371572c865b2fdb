#!/bin/sh
# Fresh Debian 12 machine to a trained model: install what the build needs,
# build, and train the default model (tiny GPT-2, bundled corpus) on four
# MPI ranks as a 2 x 2 grid of tensor and pipeline parallelism, which ends
# by printing a generated sample.
set -e
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x configure ] || ./autogen.sh
[ -f Makefile ] || ./configure
make -j"$(nproc)"
# mpirun refuses root unless told; one OpenMP thread per rank on 2 cores
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_coll_libnbc_iallreduce_algorithm=1
exec mpirun --oversubscribe --bind-to none -np 4 ./src/dtrain --config examples/tiny.conf --threads 1 --tp 2 --pp 2
