#!/bin/sh
# Fresh Debian 12 machine to a trained model: install what the build needs,
# build, and train the default model (tiny GPT-2, bundled corpus), which
# ends by printing a generated sample.
set -e
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x configure ] || ./autogen.sh
[ -f Makefile ] || ./configure
make -j"$(nproc)"
exec ./src/dtrain --config examples/tiny.conf
