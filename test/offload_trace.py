"""When --offload's gradient copies begin, from a --trace file (test_offload.sh).

    offload_trace.py TRACE.json ACCUM DURING

For every rank and every step (the steps are cut at the "optimizer"
compute spans), the "to_host grads" spans (the copies begun, on the
communication rows) against the step's backward spans ("bwd ..." on the
compute row, each with its microbatch): no copy begins before the step's
last microbatch's backward does (a non-final microbatch's gradients
change again), and, with DURING 1, the first copy begins before the
step's last backward span ends (the copies are issued during the
backward; where a reduction completes is up to the communicator, so
DURING 1 suits the cases the trainer completes there itself: one rank,
ZeRO-2/3's windows). Prints
one line per rank with the numbers, "FAIL ..." and exit 1 otherwise.
Standard library only; run with /usr/bin/python3."""
import json
import sys


def main():
    path, accum, need_during = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    with open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    ranks = sorted({e["pid"] for e in ev})
    fails = 0
    for r in ranks:
        mine = sorted((e for e in ev if e["pid"] == r), key=lambda e: float(e["ts"]))
        steps, cur = [], []
        for e in mine:
            cur.append(e)
            if e["name"] == "optimizer":
                steps.append(cur)
                cur = []
        early = during = total = 0
        for k, st in enumerate(steps):
            bwd = [e for e in st if e["name"].startswith("bwd")]
            copies = [e for e in st if e["name"] == "to_host grads"]
            if not bwd or not copies:
                print("FAIL rank %d step %d: %d backward spans, %d copies" % (r, k + 1, len(bwd), len(copies)))
                fails += 1
                continue
            last_mb = [e for e in bwd if e.get("args", {}).get("microbatch") == accum - 1]
            bwd_end = max(float(e["ts"]) + float(e["dur"]) for e in bwd)
            last_start = min(float(e["ts"]) for e in last_mb) if last_mb else float("inf")
            first = min(float(e["ts"]) for e in copies)
            total += len(copies)
            during += sum(1 for e in copies if float(e["ts"]) < bwd_end)
            early += sum(1 for e in copies if float(e["ts"]) < last_start)
            if need_during and first >= bwd_end:
                print("FAIL rank %d step %d: the first copy begins %.1f us after the last backward span ends"
                      % (r, k + 1, first - bwd_end))
                fails += 1
        if early:
            print("FAIL rank %d: %d copies begin before their step's last microbatch's backward" % (r, early))
            fails += 1
        print("rank %d: %d steps, %d copies, %d of them begun during the backward, %d before its last microbatch"
              % (r, len(steps), total, during, early))
    sys.exit(1 if fails or not ranks else 0)


main()
