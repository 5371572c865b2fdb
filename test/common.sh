# Shared by the shell tests. The harness exports DTRAIN, DTRAIN_PREPARE,
# MPIEXEC, top_srcdir, top_builddir and the OpenMPI settings for running as
# root and oversubscribed.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
: "${DTRAIN:=$top_builddir/src/dtrain}"
: "${MPIEXEC:=mpiexec}"
export OMPI_MCA_mpi_yield_when_idle=1
DATA_TRAIN="$top_builddir/data/gutenberg_train_*.bin"
DATA_VAL="$top_builddir/data/gutenberg_val_*.bin"

# A scratch directory under the build tree, removed on exit.
TMP=$(mktemp -d "$top_builddir/test/tmp.XXXXXX") || exit 99
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT

fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
finish() { echo "$fails failure(s)"; [ "$fails" -eq 0 ]; exit $?; }

# Small, fast runs: the tiny model with the bundled corpus.
tiny_args() {
    echo --model tiny --data "$DATA_TRAIN" --val-data "$DATA_VAL" --peak-gflops 100 --threads 2
}

# json_field FILE STEP KEY: the value of KEY in the JSON line of STEP.
json_field() {
    sed -n "s/^{\"step\": $2,.*\"$3\": \([^,}]*\).*/\1/p" "$1"
}

# expect_close LABEL A B TOL: pass when |A - B| / |A| < TOL.
expect_close() {
    if awk -v a="$2" -v b="$3" -v t="$4" 'BEGIN { d = a - b; if (d < 0) d = -d; if (a < 0) a = -a; exit !(a > 0 && d / a < t) }'; then
        pass "$1: $2 vs $3 (rel < $4)"
    else
        fail "$1: $2 vs $3 (rel >= $4)"
    fi
}

# expect_exit2 WANT CMD ARGS...: CMD exits with status 2 and prints exactly
# one line on stderr, containing WANT (the bad-input contract).
expect_exit2() {
    want=$1
    shift
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$want" "$TMP/err"; then
        pass "exit 2: $(cat "$TMP/err")"
    else
        fail "$* -> exit $rc, $lines stderr line(s), wanted '$want': $(head -c 600 "$TMP/err")"
    fi
}

# model_args_of SCRIPT [NODES TASKS]: the dtrain arguments of a batch
# script's model_args array (slurm/train_70b.sbatch) as its job builds them
# in an allocation of NODES nodes x TASKS tasks each (default: the script's
# own #SBATCH --nodes and --ntasks-per-node; the layout comes from
# SLURM_JOB_NUM_NODES and SLURM_NTASKS), without DTRAIN_CONFIG; one line.
model_args_of() {
    mao_n=${2:-$(sed -n 's/^#SBATCH --nodes=//p' "$1")}
    mao_t=${3:-$(sed -n 's/^#SBATCH --ntasks-per-node=//p' "$1")}
    env -u DTRAIN_CONFIG SLURM_JOB_NUM_NODES="$mao_n" SLURM_NTASKS=$((mao_n * mao_t)) bash -c '
        eval "$(sed -n "/^gpus_per_node=/,/^)/p" "$0")" && echo "${model_args[*]}"' "$1"
}

# ---- SLURM jobs (test_slurm.sh, test_slurm_multinode.sh) ----
# The client commands (scontrol, scancel) run through $SLURM_ON, a command
# prefix (empty: here; on simulated nodes: test/multinode/nodes.sh run
# node1, since only the nodes reach slurmctld).
SLURM_ON=${SLURM_ON:-}
# job_field JOB KEY: KEY's value in `scontrol show job` (kept MinJobAge=300 s)
job_field() { $SLURM_ON scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# wait_job JOB RESTARTS TIMEOUT_S: waits for a final state reached after
# RESTARTS requeues; prints the state. A final state with fewer requeues
# that lasts 20 s is final too (a requeue passes through PENDING, never a
# final state): printed as STATE-after-N-restarts.
wait_job() {
    end=$(($(date +%s) + $3))
    early=""
    while :; do
        st=$(job_field "$1" JobState)
        case $st in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
            wj_r=$(job_field "$1" Restarts)
            [ "$wj_r" -ge "$2" ] && { echo "$st"; return; }
            [ -n "$early" ] || early=$(($(date +%s) + 20))
            [ "$(date +%s)" -lt "$early" ] || { echo "$st-after-$wj_r-restarts"; return; } ;;
        *) early="" ;;
        esac
        [ "$(date +%s)" -lt "$end" ] || { echo "still-$st-after-$3-s"; return; }
        sleep 0.3
    done
}
# signal_at_step JOB NAME STEP: once NAME's log shows STEP, the warning
# signal to the batch shell
signal_at_step() {
    end=$(($(date +%s) + 120))
    until grep -Eq "^step +$3/" "$TMP/$2.out" 2>/dev/null; do
        [ "$(date +%s)" -lt "$end" ] || { fail "$2: step $3 not reached in 120 s: $(tail -n 3 "$TMP/$2.out")"; return 1; }
        sleep 0.2
    done
    $SLURM_ON scancel --batch --signal=USR1 "$1" && echo "$2: SIGUSR1 sent to job $1 at step $3"
}
# losses FILE...: "step loss val_loss lr grad_norm" of every training step
# (and the validation loss where there is one)
losses() {
    sed -En 's/^\{"step": ([0-9]+), "loss": ([^,]*), ("val_loss": ([^,]*), )?"lr": ([^,]*), "grad_norm": ([^,]*),.*/\1 \2 \4 \5 \6/p' "$@"
}
# check_preempted NAME JOB STATE LAUNCH-LINE REF: job NAME (output in
# $TMP/NAME.out, metrics under $TMP/logs, final parameters in $TMP/NAME.h5),
# signalled with signal_at_step, stopped with a checkpoint, requeued once,
# resumed and COMPLETED ($STEPS steps in all), its LAUNCH-LINE in the
# banner of both attempts; every loss and the final parameters identical
# to those of the uninterrupted job REF ($TMP/REF.losses, $TMP/REF.h5)
check_preempted() {
    name=$1 job=$2 st=$3 launch=$4 cp_ref=$5 out="$TMP/$1.out"
    stop=$(grep "^stopping at step" "$out")
    n=$(echo "$stop" | sed -n 's/^stopping at step \([0-9]*\): SIGUSR1 received, checkpoint .*step_0*\([0-9]*\)\.h5 written; requeue to continue.*/\1 \2/p')
    set -- $n
    if [ "$st" = COMPLETED ] && [ "$(job_field "$job" Restarts)" = 1 ] && [ "$(grep -c "^stopping at step" "$out")" = 1 ] &&
        [ -n "${1:-}" ] && [ "$1" = "${2:-}" ] && [ "$1" -ge 3 ] && [ "$1" -lt $STEPS ] &&
        grep -q "^job $job: dtrain stopped at the warning signal; requeueing (restart 1)" "$out" &&
        grep -q "^slurm: job $job, restart 1," "$out" && grep -q "^resume: .*step_0*$1\.h5, step $1," "$out" &&
        [ "$(grep -c "^$launch$" "$out")" = 2 ] && grep -q "^done: $((STEPS - $1)) steps" "$out"; then
        pass "$name: stopped at step $1 by SIGUSR1 with a checkpoint, requeued, resumed at restart 1, $st"
    else
        fail "$name: state $st, restarts $(job_field "$job" Restarts), '$stop': $(grep -E '^(stopping|resume|slurm|launch|done|job)' "$out" | tr '\n' '|')"
        return
    fi
    # the resumed attempt's steps against the reference's, bit for bit
    losses "$TMP/logs/$name-$job/metrics.restart0.json" "$TMP/logs/$name-$job/metrics.restart1.json" |
        awk '!seen[$1]++' >"$TMP/$name.losses"
    if cmp -s "$TMP/$cp_ref.losses" "$TMP/$name.losses" && [ "$(wc -l <"$TMP/$name.losses")" -eq $STEPS ]; then
        pass "$name: losses, learning rates, gradient norms of all $STEPS steps and the final validation loss bit-identical to the uninterrupted job"
    else
        fail "$name: losses differ from the uninterrupted job: $(diff "$TMP/$cp_ref.losses" "$TMP/$name.losses" | head -n 4 | tr '\n' '|')"
    fi
    if p=$(/usr/bin/python3 "$top_srcdir/test/compare_params.py" "$TMP/$cp_ref.h5" "$TMP/$name.h5" 0 2>&1); then
        pass "$name: final parameters bit-identical to the uninterrupted job: $p"
    else
        fail "$name: final parameters: $p"
    fi
}

# ---- layout equivalence (test_layout_*.sh) ----
# tiny / tiny-llama, 20 steps at one global batch of 8 sequences of 64
# tokens, validated at the end, replicas checked every 5 steps.
strip_timing() { sed 's/, "ms": .*//' "$1"; }

# layout_run OUT NP ARGS...: the run's metrics in OUT, its output in OUT.log
layout_run() {
    out=$1
    np=$2
    shift 2
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" $(tiny_args) --threads 1 --steps 20 --warmup 5 --micro-batch 2 \
        --global-batch 8 --seq-len 64 --val-every 20 --val-batches 4 --sample-tokens 0 --check-replicas 5 \
        --metrics "$out" --save-params "$out.h5" "$@" >"$out.log" 2>&1 ||
        { fail "np $np $*: exit status $? $(tail -n 3 "$out.log")"; return 1; }
}

# plan_equals_run PLAN RUN: the planner's bytes of every category
# (--plan --metrics PLAN, its mem_worst) equal the run's measured peaks
# (--metrics RUN, its last mem_peak); prints them as plan/run and fails
# on a difference
plan_equals_run() {
    /usr/bin/python3 - "$1" "$2" <<'PYEOF'
import json, sys
plan = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["mem_worst"]
run = json.loads([l for l in open(sys.argv[2]) if '"mem_peak"' in l][-1])["mem_peak"]
keys = sorted(k for k in plan if k != "total")
print(", ".join("%s %s/%s" % (k, plan[k], run.get(k)) for k in keys))
sys.exit(0 if all(plan[k] == run.get(k) for k in keys) else 1)
PYEOF
}

# layout_compare REF OUT LABEL [LOSS NORM PARAMS]: every step's loss and
# (at least LC_MIN_VALUES values, default 41: 20 steps' losses and norms
# and the validation loss)
# the final validation loss within LOSS (default 1e-5) relative, the
# gradient norm within NORM (1e-4: a loss spike amplifies fp32
# reduction-order noise in the norm about 100-fold), and the final
# parameters (--save-params) within PARAMS (1e-4) relative, worst tensor
# (||a-b|| / ||a||; a max-element measure would be ruled by the few weights
# whose gradient is near zero, where AdamW's update direction is noise)
layout_compare() {
    ref=$1
    out=$2
    lc_loss=${4:-1e-5}
    lc_norm=${5:-1e-4}
    lc_params=${6:-1e-4}
    worst=$(awk -v ref="$1" -v out="$2" '
        function val(line, key,   m) { if (match(line, "\"" key "\": [-0-9.e+]+")) return substr(line, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0; return "" }
        BEGIN { nk = split("loss val_loss grad_norm", keys, " ")
                while ((getline l < ref) > 0) { match(l, /"step": [0-9]+/); s = substr(l, RSTART + 8, RLENGTH - 8)
                    for (k = 1; k <= nk; k++) r[s, k] = val(l, keys[k]) }
                n = 0; wl = 0; wn = 0
                while ((getline l < out) > 0) { match(l, /"step": [0-9]+/); s = substr(l, RSTART + 8, RLENGTH - 8)
                    for (k = 1; k <= nk; k++) { x = val(l, keys[k]); y = r[s, k]
                        if (x == "" && y == "") continue
                        if (x == "" || y == "") { print "missing"; exit }
                        d = x - y; if (d < 0) d = -d; d /= (y < 0 ? -y : y); n++
                        if (k == 3) { if (d > wn) wn = d } else if (d > wl) wl = d } }
                printf "%.2e %.2e %d\n", wl, wn, n }')
    set -- "$3" $worst
    if [ "$2" != "missing" ] && [ "${4:-0}" -ge "${LC_MIN_VALUES:-41}" ] &&
        awk -v l="$2" -v n="$3" -v tl="$lc_loss" -v tn="$lc_norm" 'BEGIN { exit !(l + 0 < tl + 0 && n + 0 < tn + 0) }'; then
        pass "$1: $4 values, worst relative difference: losses $2 (< $lc_loss), norms $3 (< $lc_norm)"
    else
        fail "$1: worst relative difference: losses $2, norms ${3:-}, over ${4:-0} values (limits $lc_loss, $lc_norm)"
    fi
    label=$1
    if params=$(/usr/bin/python3 "$top_srcdir/test/compare_params.py" "$ref.h5" "$out.h5" "$lc_params" 2>&1); then
        pass "$label: final parameters: $params (< $lc_params)"
    else
        fail "$label: final parameters: $params"
    fi
}

# layout_twice FIRST SECOND LABEL: two runs of one layout, bit-identical
# losses and parameters
layout_twice() {
    strip_timing "$1" >"$TMP/twice.a" && strip_timing "$2" >"$TMP/twice.b" || { fail "$3: no metrics"; return; }
    if ! cmp -s "$TMP/twice.a" "$TMP/twice.b"; then
        fail "$3 twice: the losses differ: $(diff "$TMP/twice.a" "$TMP/twice.b" | sed -n 2p | cut -c1-160)"
    elif ! out=$(/usr/bin/python3 "$top_srcdir/test/compare_params.py" "$1.h5" "$2.h5" 0 2>&1); then
        fail "$3 twice: the parameters differ: $(echo "$out" | tail -n 1 | cut -c1-160)"
    else
        pass "$3 twice: bit-identical losses and parameters"
    fi
}

# resumed NAME FULL RESUMED: the resumed run's 5 losses (steps 6-10, from
# --metrics) within 1e-5 relative of the uninterrupted run's
resumed() {
    losses "$2" | awk '{ print $1, $2 }' | tail -n 5 >"$TMP/ck.l"
    losses "$3" | awk '{ print $1, $2 }' >"$TMP/re.l"
    set -- "$1" $(paste "$TMP/ck.l" "$TMP/re.l" |
        awk '{ d = $2 - $4; if (d < 0) d = -d; d /= $2; if (d > w) w = d; n++ } END { printf "%.2e %d", w, n }')
    if [ "$3" -eq 5 ] && [ "$(cut -d' ' -f1 "$TMP/re.l" | tr '\n' ' ')" = "6 7 8 9 10 " ] &&
        awk -v w="$2" 'BEGIN { exit !(w < 1e-5) }'; then
        pass "$1: 5 losses within $2 of the uninterrupted run"
    else
        fail "$1: worst $2 over $3 losses"
    fi
}

# ---- --init-from (test_init_from.sh, test_hf_models.sh) ----
# init_val0 SOURCE TOKENS NP ARGS...: dtrain's validation loss at step 0
# after --init-from SOURCE (the 4 microbatches of 2 x 16 tokens that
# test/ref/hf_ref.py's reference computes), with --save-params of the
# unchanged weights (lr 0) in $TMP/last.h5
init_val0() {
    src=$1
    tok=$2
    np=$3
    shift 3
    rm -f "$TMP/last.json"
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" --init-from "$src" --data "$tok" --val-data "$tok" --steps 1 --lr 0 \
        --min-lr 0 --warmup 0 --micro-batch 2 --seq-len 16 --val-every 1 --val-batches 4 --sample-tokens 0 \
        --peak-gflops 100 --threads 1 --metrics "$TMP/last.json" --save-params "$TMP/last.h5" "$@" \
        >"$TMP/last.log" 2>&1 || { echo "dtrain failed: $(tail -n 2 "$TMP/last.log")" >&2; return 1; }
    json_field "$TMP/last.json" 0 val_loss
}

# finetune_run OUT NP SRC [ARGS...]: 20 fine-tuning steps from --init-from
# SRC on the bundled corpus at NP ranks (sequence FT_SEQ_LEN, default 64),
# metrics in OUT, final parameters in OUT.h5, log in OUT.log
finetune_run() {
    out=$1
    np=$2
    src=$3
    shift 3
    "$MPIEXEC" --quiet -np "$np" "$DTRAIN" --init-from "$src" --data "$DATA_TRAIN" --val-data "$DATA_VAL" \
        --peak-gflops 100 --threads 1 --steps 20 --warmup 5 --lr 3e-4 --min-lr 3e-5 --micro-batch 2 --global-batch 8 \
        --seq-len "${FT_SEQ_LEN:-64}" --val-every 20 --val-batches 4 --sample-tokens 0 --check-replicas 5 \
        --metrics "$out" --save-params "$out.h5" "$@" >"$out.log" 2>&1 ||
        { fail "fine-tune np $np $*: exit status $? $(tail -n 3 "$out.log")"; return 1; }
}

# ---- Hugging Face models (test_hf_models.sh, test_hf_moe.sh) ----
# agree LABEL MODEL NP ARGS...: init_val0 of $TMP/MODEL within 1e-5 of its
# reference's loss (test/ref/hf_ref.py check); status 1 when not
agree() {
    label=$1
    m=$2
    shift 2
    if loss=$(init_val0 "$TMP/$m" "$TMP/$m.tok" "$@") &&
        out=$("$PYTHON_REF" "$top_srcdir/test/ref/hf_ref.py" check "$TMP/$m" "$loss" --label "$label"); then
        pass "$(echo "$out" | sed "s/^ok *//")"
    else
        fail "$label: ${out:-dtrain failed}"
        return 1
    fi
}

# same_params LABEL A B: parameter files A and B bit-identical
same_params() {
    if out=$("$PYTHON_REF" "$top_srcdir/test/compare_params.py" "$2" "$3" 0 2>&1); then
        pass "$1: parameters bit-identical to 1 rank's ($out)"
    else
        fail "$1: parameters differ from 1 rank's: $out"
    fi
}

# bad_model NAME FROM EDIT WANT: FROM's weights under its config.json, as
# the Python statements EDIT change them (c: the config, W: the tensors);
# dtrain at 2 ranks, asked to write parameters, metrics and checkpoints,
# must refuse with WANT and leave none of them
bad_model() {
    d=$TMP/bad_$1
    mkdir -p "$d"
    "$PYTHON_REF" - "$TMP/$2" "$d" "$3" "$top_srcdir/test/ref" <<'EOF' || { fail "bad_model $1: cannot write it"; return; }
import json, os, sys
src, dst, edit, ref = sys.argv[1:5]
sys.path.insert(0, ref)
import hf_ref
c = json.load(open(os.path.join(src, "config.json")))
W = hf_ref.read_model_dir(src)
exec(edit)
json.dump(c, open(os.path.join(dst, "config.json"), "w"))
hf_ref.write_model_dir(dst, [(k, "F32", v.shape, v.astype("<f4").tobytes()) for k, v in W.items()], 1)
EOF
    rm -rf "$TMP/bw"
    mkdir "$TMP/bw"
    expect_exit2 "$4" "$MPIEXEC" --quiet -np 2 "$DTRAIN" --init-from "$d" --data "$TMP/$2.tok" \
        --val-every 0 --seq-len 16 --steps 1 --sample-tokens 0 --peak-gflops 100 --threads 1 \
        --save-params "$TMP/bw/p.h5" --metrics "$TMP/bw/m.json" --ckpt-dir "$TMP/bw/ck" --ckpt-every 1
    left=$(ls -A "$TMP/bw")
    [ -z "$left" ] || fail "$1: the refused run left $left"
}
