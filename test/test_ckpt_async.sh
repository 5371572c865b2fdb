#!/bin/sh
# test_ckpt.sh with --ckpt-async on every run that writes checkpoints
# (src/ckpt/ckpt_async.c: the state copied to host at the step boundary, the
# file written by a background thread): exact resume, another layout on
# load, --keep, every fault (flipped byte, truncated file, full disk, a job
# killed while writing), and the asynchronous checkpoints and the run
# resumed from one bit-identical to the synchronous ones.
CKPT_ASYNC=--ckpt-async
. "$top_srcdir/test/test_ckpt.sh"
