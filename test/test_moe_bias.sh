#!/bin/sh
# DeepSeek-V3's aux-loss-free balancing (--moe-bias-rate, issue 33): the
# sigmoid router's expert bias selects experts (never weighs them) and
# after each step moves by the rate toward balance, b_e += rate *
# sign(mean load - load_e), the loads counted over the whole step.
#  - it balances: tiny-deepseek-moe without the auxiliary loss, the
#    busiest expert's load over the mean (the metrics' max_load) falls
#    with the bias on, over the same batches;
#  - the bias in the checkpoint (attributes moe_bias_<layer>) is a sum of
#    +-rate steps, bit-identical at one rank, ep2 x dp2, tp2 x pp2 and
#    dp2 with ZeRO-1, whose loads are counted from different slices;
#  - a run stopped and resumed from its checkpoint continues bit for bit
#    (the bias is restored; a resume that dropped it would route anew);
#  - --moe-bias-rate with a softmax router is one line and exit 2.
. "$top_srcdir/test/common.sh"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
S="--model tiny-deepseek-moe --steps 12 --val-every 12"
LC_MIN_VALUES=25

# ---- balance ----
B="--model tiny-deepseek-moe --moe-aux-coef 0 --steps 40 --warmup 5 --val-every 40 --check-replicas 0"
layout_run "$TMP/off.json" 1 $B --moe-bias-rate 0 &&
    layout_run "$TMP/on.json" 1 $B --moe-bias-rate 0.02 &&
    if r=$(/usr/bin/python3 - "$TMP/off.json" "$TMP/on.json" <<'EOF'
import json, sys
def late(path):  # mean over layers and steps 21..40 of the busiest expert's load over the mean
    v = [sum(r["moe"]["max_load"]) / len(r["moe"]["max_load"]) for r in map(json.loads, open(path)) if r["step"] > 20 and "moe" in r]
    return sum(v) / len(v), len(v)
(off, n), (on, _) = late(sys.argv[1]), late(sys.argv[2])
print(f"max load {off:.3f} without the bias, {on:.3f} with it, over {n} steps")
sys.exit(0 if n == 20 and on < 0.9 * off else 1)
EOF
    ); then pass "balance: $r"; else fail "balance: $r"; fi

# ---- the bias across layouts ----
bias_of() { # CKPT-DIR: every moe_bias_<layer> attribute of the newest checkpoint, one per line
    /usr/bin/python3 - "$1" <<'EOF'
import h5py, sys
d = sys.argv[1]
f = h5py.File(d + "/" + open(d + "/latest").read().strip(), "r")
for k in sorted(a for a in f.attrs if a.startswith("moe_bias_")):
    v = f.attrs[k]
    print(k, v.decode() if isinstance(v, bytes) else v)
EOF
}
run_bias() { # NAME NP ARGS...
    name=$1 np=$2
    shift 2
    layout_run "$TMP/$name.json" "$np" $S --moe-bias-rate 0.01 --ckpt-dir "$TMP/$name.ck" --ckpt-every 6 "$@" &&
        bias_of "$TMP/$name.ck" >"$TMP/$name.bias"
}
if run_bias one 1 && r=$(/usr/bin/python3 - "$TMP/one.bias" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1])]
vals = [float.fromhex(x) for r in rows for x in r[1:]]
# 12 steps of +-0.01 (or 0) in fp32: each bias within 12 * 0.01, a multiple of 0.01 to fp32's error
steps = [round(v / 0.01) for v in vals]
ok = len(rows) == 3 and all(len(r) == 17 for r in rows) and any(vals) and \
     all(abs(v - k * 0.01) < 1e-6 and abs(k) <= 12 for v, k in zip(vals, steps))
print(f"{len(rows)} layers x {len(rows[0]) - 1 if rows else 0} experts, {sum(1 for v in vals if v)} nonzero, |b| <= {max(map(abs, vals)):.3f}")
sys.exit(0 if ok else 1)
EOF
); then pass "the bias after 12 steps: $r"; else fail "the bias after 12 steps: $r"; fi
for lay in "ep2dp2 4 --ep 2" "tp2pp2 4 --tp 2 --pp 2 --sequence-parallel" "z1 2 --zero 1"; do
    set -- $lay
    name=$1
    shift
    if run_bias "$name" "$@"; then
        if cmp -s "$TMP/one.bias" "$TMP/$name.bias"; then
            pass "$name: the expert bias bit-identical to one rank's"
        else
            fail "$name: the expert bias differs from one rank's: $(diff "$TMP/one.bias" "$TMP/$name.bias" | sed -n 2p | cut -c1-120)"
        fi
        layout_compare "$TMP/one.json" "$TMP/$name.json" "$name with the bias" 1e-5 1e-4 1e-4
    fi
done

# ---- resume ----
# z1 wrote checkpoints at steps 6 and 12: from the first, on to 12
LC_MIN_VALUES=1
layout_run "$TMP/rest.json" 2 $S --zero 1 --moe-bias-rate 0.01 --resume "$TMP/z1.ck/step_00000006.h5" \
    --ckpt-dir "$TMP/rest.ck" --ckpt-every 6 &&
    {
        losses "$TMP/z1.json" | awk '$1 > 6' >"$TMP/full.tail"
        losses "$TMP/rest.json" | awk '$1 > 6' >"$TMP/rest.tail"
        if [ "$(wc -l <"$TMP/rest.tail")" = 6 ] && cmp -s "$TMP/full.tail" "$TMP/rest.tail" &&
            /usr/bin/python3 "$top_srcdir/test/compare_params.py" "$TMP/z1.json.h5" "$TMP/rest.json.h5" 0 >/dev/null 2>&1 &&
            bias_of "$TMP/rest.ck" | cmp -s - "$TMP/z1.bias"; then
            pass "resume at step 6: steps 7-12, the final parameters and the bias bit-identical to the run straight through"
        else
            fail "resume at step 6 differs: $(diff "$TMP/full.tail" "$TMP/rest.tail" | sed -n 2p | cut -c1-160)"
        fi
    }

# ---- bad input ----
if "$MPIEXEC" --quiet -np 2 "$DTRAIN" $(tiny_args) --model tiny-moe --moe-bias-rate 0.01 --steps 1 \
    >"$TMP/bad.log" 2>&1; then
    fail "--moe-bias-rate with a softmax router was accepted"
else
    rc=$?
    n=$(grep -c "needs --moe-router sigmoid" "$TMP/bad.log")
    [ "$rc" = 2 ] && [ "$n" = 1 ] && pass "--moe-bias-rate with softmax: exit 2, one line" ||
        fail "--moe-bias-rate with softmax: exit $rc, $n lines: $(head -n 2 "$TMP/bad.log")"
fi
finish
