#!/bin/sh
# ZeRO with expert parallelism (--zero 1/2/3 with --ep, issue 33): the
# dense tensors' optimizer state (gradients from ZeRO-2, block parameters
# from ZeRO-3) sharded over the data-parallel group, the routed experts'
# over the expert-data-parallel group (mpi/zero.h's expert parts).
#  - tiny-moe and tiny-deepseek-moe at ep2 x dp4 (expert-DP 2) with ZeRO-1,
#    2 and 3, tiny-moe at ep2 x tp2 (sequence parallel) with ZeRO-3, at
#    ep2 x pp2 with ZeRO-1, at ep2 x pp2 under zb-h1 with ZeRO-2 (the
#    gradients kept and reduce-scattered from the model's buffer) and at
#    ep2 x dp2 with ZeRO-2 and two microbatches of accumulation train the
#    one-rank model: every loss and the final validation loss within 1e-5
#    relative, gradient norms (the clipping norm: dense pieces over DP,
#    expert pieces over expert-DP and EP) and final parameters within 1e-4
#    (10 steps, as test_moe_ep.sh: routing flips on last-bit differences
#    later on). --check-replicas compares the gathered parameters every 5
#    steps.
#  - ep2 x dp4 with ZeRO-3 twice: bit-identical losses and parameters.
#  - Checkpoints: ep2 x tp2 with ZeRO-3, 5 steps + resume + 5 steps, is
#    bit-identical to 10 steps; its step-5 file resumed at ep4 with ZeRO-1
#    and without ZeRO gives bit-identical losses and step-10 checkpoints
#    (the moments loaded into ZeRO-1's expert-DP pieces exactly), and
#    within 1e-5 of the uninterrupted run at ep4, at one rank and at ep2
#    without ZeRO; at one rank the file and its dreshard copy resume
#    bit-identically. The ep2 x tp2 ZeRO-1 checkpoint equals the --zero 0
#    one bit for bit (parameters and moments, gathered as logical tensors).
#  - dreshard of the ep2 x tp2 ZeRO-3 checkpoint to tp1 x dp4 ZeRO-1: every
#    tensor bit-identical, the chunks dtrain writes at tp1 x dp4 ZeRO-1,
#    and its checksum records except for the one-block expert stacks
#    (moe.wproj, moe.bproj), which dreshard records per expert chunk and
#    dtrain per writing rank; at one rank the dreshard copy resumes
#    bit-identically to the original.
#  - --hybrid-shard with --ep (the experts sharded over the expert-DP
#    ranks inside each shard group, replicated across the groups with the
#    dense pieces): ep2 x dp4 with ZeRO-2 and shard groups of 2, ep2 x dp8
#    with ZeRO-1 and ZeRO-3 and shard groups of 4 (expert shards of 2)
#    train the one-rank model as above; a shard group that is not a
#    multiple of the EP group exits 2 with one line.
. "$top_srcdir/test/common.sh"

PY=/usr/bin/python3
: "${DRESHARD:=$top_builddir/src/dreshard}"
LC_MIN_VALUES=21
S="--steps 10 --val-every 10"
zl() { # NAME NP LABEL ARGS...: a layout against the one-rank run $TMP/NAME.1.json
    ref=$1
    np=$2
    lbl=$3
    shift 3
    zo="$TMP/$ref.$(echo "$np $*" | tr -cd 'a-z0-9')" # layout_run sets $out
    layout_run "$zo.json" "$np" $S "$@" && layout_compare "$TMP/$ref.1.json" "$zo.json" "$lbl"
}

# ---- the one-rank model, at each layout ----
layout_run "$TMP/moe.1.json" 1 $S --model tiny-moe || finish
DS="--model tiny-deepseek-moe --moe-z-coef 0.001"
layout_run "$TMP/ds.1.json" 1 $S $DS || finish
for z in 1 2 3; do
    zl moe 4 "tiny-moe ep2 x dp4 (expert-DP 2) --zero $z" --model tiny-moe --ep 2 --zero $z
    zl ds 4 "tiny-deepseek-moe ep2 x dp4 (expert-DP 2) --zero $z" $DS --ep 2 --zero $z
done
zl moe 4 "tiny-moe ep2 x tp2 sequence-parallel --zero 3" --model tiny-moe --ep 2 --tp 2 --sequence-parallel --zero 3
zl moe 4 "tiny-moe ep2 x pp2 --zero 1" --model tiny-moe --ep 2 --pp 2 --zero 1
zl moe 4 "tiny-moe ep2 x pp2 zb-h1 --zero 2" --model tiny-moe --ep 2 --pp 2 --pp-schedule zb-h1 --zero 2
zl moe 2 "tiny-moe ep2 x dp2, 2 microbatches accumulated, --zero 2" --model tiny-moe --ep 2 --zero 2
grep -q "the routed experts' over the 2 expert-data-parallel ranks" "$TMP/moe.4modeltinymoeep2zero3.json.log" &&
    pass "banner: $(grep '^ZeRO-3' "$TMP/moe.4modeltinymoeep2zero3.json.log")" ||
    fail "no ZeRO --ep banner: $(grep '^ZeRO' "$TMP/moe.4modeltinymoeep2zero3.json.log")"

# ---- determinism ----
layout_run "$TMP/again.json" 4 $S --model tiny-moe --ep 2 --zero 3 &&
    layout_twice "$TMP/moe.4modeltinymoeep2zero3.json" "$TMP/again.json" "tiny-moe ep2 x dp4 --zero 3"

# ---- checkpoints ----
ck() { # OUT NP ARGS...: 10 steps of tiny-moe, checkpoints every 5
    out=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $(tiny_args) --model tiny-moe --threads 1 --steps 10 --warmup 5 \
        --micro-batch 2 --global-batch 8 --seq-len 64 --val-every 0 --sample-tokens 0 --metrics "$out" \
        --ckpt-every 5 "$@" >"$out.log" 2>&1 || { fail "np $np $*: exit status $? $(tail -n 2 "$out.log")"; return 1; }
}
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\).*/\1 \2/p' "$1"; }
bitsame() { # A B LABEL: the same losses, bit for bit
    losses "$1" >"$TMP/a"
    losses "$2" >"$TMP/b"
    if [ "$(wc -l <"$TMP/b")" -ge 5 ] && cmp -s "$TMP/a" "$TMP/b"; then
        pass "$3: $(wc -l <"$TMP/b") losses bit-identical"
    else
        fail "$3: $(diff "$TMP/a" "$TMP/b" | head -n 3 | tr '\n' ' ')"
    fi
}
near() { # FULL RESUMED LABEL: the resumed run's losses (steps 6-10) within 1e-5 of the uninterrupted one's
    losses "$1" | tail -n 5 >"$TMP/a"
    losses "$2" >"$TMP/b"
    set -- "$3" $(paste "$TMP/a" "$TMP/b" |
        awk '$1 == $3 { d = $2 - $4; if (d < 0) d = -d; d /= $2; if (d > w) w = d; n++ } END { printf "%.2e %d", w, n }')
    if [ "$3" -eq 5 ] && awk -v w="$2" 'BEGIN { exit !(w < 1e-5) }'; then
        pass "$1: steps 6-10 within $2 of the uninterrupted run"
    else
        fail "$1: worst $2 over $3 losses"
    fi
}
same_ckpt() { # A B LABEL
    if out=$("$PY" "$top_srcdir/test/same_ckpt.py" "$1" "$2" 40 2>&1); then
        pass "$3: $out"
    else
        fail "$3: $out"
    fi
}
EPTP="--ep 2 --tp 2"
ck "$TMP/full.json" 4 $EPTP --zero 3 --ckpt-dir "$TMP/full"
A="$TMP/full/step_00000005.h5"
ck "$TMP/half.json" 4 $EPTP --zero 3 --ckpt-dir "$TMP/half" --resume "$A"
losses "$TMP/full.json" | tail -n 5 >"$TMP/a"
losses "$TMP/half.json" >"$TMP/b"
if [ "$(wc -l <"$TMP/b")" -eq 5 ] && cmp -s "$TMP/a" "$TMP/b"; then
    pass "ep2 x tp2 --zero 3: 5 steps + resume + 5 steps bit-identical to 10 steps"
else
    fail "ep2 x tp2 --zero 3 resume: $(diff "$TMP/a" "$TMP/b" | head -n 3 | tr '\n' ' ')"
fi
[ -f "$TMP/half/step_00000010.h5" ] && same_ckpt "$TMP/full/step_00000010.h5" "$TMP/half/step_00000010.h5" \
    "ep2 x tp2 --zero 3: the resumed run's step-10 checkpoint equals the uninterrupted one's"
ck "$TMP/ep4z1.json" 4 --ep 4 --zero 1 --ckpt-dir "$TMP/ep4z1" --resume "$A" &&
    ck "$TMP/ep4z0.json" 4 --ep 4 --ckpt-dir "$TMP/ep4z0" --resume "$A" &&
    bitsame "$TMP/ep4z0.json" "$TMP/ep4z1.json" "ep2 x tp2 --zero 3 checkpoint at ep4: --zero 1 and --zero 0" &&
    same_ckpt "$TMP/ep4z0/step_00000010.h5" "$TMP/ep4z1/step_00000010.h5" \
        "... and their step-10 checkpoints (ep4 --zero 1 against --zero 0)"
near "$TMP/full.json" "$TMP/ep4z1.json" "ep2 x tp2 --zero 3 checkpoint continued at ep4 --zero 1"
ck "$TMP/one.json" 1 --ckpt-dir "$TMP/one" --resume "$A" &&
    near "$TMP/full.json" "$TMP/one.json" "ep2 x tp2 --zero 3 checkpoint continued at one rank"
ck "$TMP/ep2.json" 2 --ep 2 --ckpt-dir "$TMP/ep2" --resume "$A" &&
    near "$TMP/full.json" "$TMP/ep2.json" "ep2 x tp2 --zero 3 checkpoint continued at ep2 without ZeRO"
ck "$TMP/z1.json" 4 $EPTP --zero 1 --ckpt-dir "$TMP/z1" --stop-at-step 5 &&
    ck "$TMP/z0.json" 4 $EPTP --ckpt-dir "$TMP/z0" --stop-at-step 5 &&
    same_ckpt "$TMP/z0/step_00000005.h5" "$TMP/z1/step_00000005.h5" \
        "ep2 x tp2: the --zero 1 checkpoint equals the --zero 0 one"

# ---- dreshard: ep2 x tp2 ZeRO-3 -> tp1 x dp4 ZeRO-1, as dtrain writes it there ----
ck "$TMP/dp4z1.json" 4 --zero 1 --ckpt-dir "$TMP/dp4z1" --resume "$A"
if "$MPIEXEC" --quiet -np 2 "$DRESHARD" --in "$A" --out "$TMP/rs.h5" --tp 1 --dp 4 --zero 1 >"$TMP/rs.log" 2>&1; then
    if out=$("$PY" - "$A" "$TMP/rs.h5" "$TMP/dp4z1/step_00000010.h5" 2>&1 <<'PYEOF'
import sys, h5py, numpy as np
a, b, ref = (h5py.File(p, "r") for p in sys.argv[1:4])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
bnames = []
b.visititems(lambda n, o: bnames.append(n) if isinstance(o, h5py.Dataset) else None)
assert sorted(names) == sorted(bnames) and len(names) > 40, (len(names), len(bnames))
nrec = nexp = nstack = 0
for n in names:
    x, y = a[n][()], b[n][()]
    assert x.dtype == y.dtype and x.shape == y.shape and (x.view(np.uint32) == y.view(np.uint32)).all(), n
    assert b[n].chunks == ref[n].chunks, (n, b[n].chunks, ref[n].chunks)
    nexp += ".moe.w" in n or ".moe.b" in n
    # the one-block expert stacks (moe.wproj, moe.bproj): dreshard records
    # one slice per expert chunk, dtrain one per writing rank (its EP
    # rank's rows; all rows without --ep), whatever the ZeRO stage
    if n.endswith(".moe.wproj") or n.endswith(".moe.bproj"):
        nstack += 1
        continue
    x, y = b[n].attrs["crc32c"][:, :4], ref[n].attrs["crc32c"][:, :4]
    assert x.shape == y.shape and (x == y).all(), (n, x.tolist()[:3], y.tolist()[:3])
    nrec += len(x)
assert b.attrs["layout"] == ref.attrs["layout"] == "tp 1 pp 1 dp 4 zero 1", (b.attrs["layout"], ref.attrs["layout"])
print("%d tensors (%d of experts) bit-identical; chunks as dtrain's tp1 x dp4 ZeRO-1 file, and its %d checksum "
      "records but for the %d one-block expert stacks" % (len(names), nexp, nrec, nstack))
PYEOF
    ); then
        pass "dreshard ep2 x tp2 --zero 3 -> tp 1 dp 4 zero 1: $out"
    else
        fail "dreshard ep2 x tp2 -> tp1 x dp4: $(echo "$out" | tail -n 3)"
    fi
    ck "$TMP/onars.json" 1 --ckpt-dir "$TMP/onars" --resume "$TMP/rs.h5" &&
        bitsame "$TMP/one.json" "$TMP/onars.json" "one rank resumed from the ep2 x tp2 --zero 3 file and from its dreshard copy"
else
    fail "dreshard: $(cat "$TMP/rs.log")"
fi

# ---- --hybrid-shard with --ep: the experts sharded over the expert-DP
# ranks inside each shard group, replicated across the groups as the
# dense pieces are ----
zl moe 4 "tiny-moe ep2 x dp4 --zero 2 --hybrid-shard 2 (expert shard 1, replicas 2)" --model tiny-moe --ep 2 --zero 2 \
    --hybrid-shard 2
layout_run "$TMP/mb1.1.json" 1 $S --model tiny-moe --micro-batch 1 &&
    for z in 1 3; do
        zl mb1 8 "tiny-moe ep2 x dp8 --zero $z --hybrid-shard 4 (expert shard 2, replicas 2)" --model tiny-moe \
            --micro-batch 1 --ep 2 --zero $z --hybrid-shard 4
    done
grep -q "the routed experts' over the 2 expert-data-parallel ranks (--ep), replicated over 2 shard groups" \
    "$TMP/mb1.8modeltinymoemicrobatch1ep2zero3hybridshard4.json.log" &&
    pass "ep2 x dp8 --zero 3 --hybrid-shard 4: the banner names the experts' 2-rank shards and 2 replicas" ||
    fail "ep2 x dp8 --hybrid-shard 4: $(grep ZeRO "$TMP/mb1.8modeltinymoemicrobatch1ep2zero3hybridshard4.json.log")"

# ---- bad input ----
expect_exit2 "--hybrid-shard 2 with --ep 4: the shard group must be a multiple of the EP group" "$MPIEXEC" --quiet \
    -np 4 "$DTRAIN" $(tiny_args) --model tiny-moe --steps 1 --micro-batch 2 --seq-len 64 --ep 4 --zero 2 \
    --hybrid-shard 2
finish
