#!/usr/bin/python3
"""Two-rank speed-up of dtrain-prepare, measured on a busy machine.

Alternates one-rank and two-rank runs of each binary on the corpus
(GPT-2 BPE, paragraph documents), each pair started after a quiet
1.5 s (other processes under 15 % of one core) and kept as "clean" only
when other processes used under 0.25 CPU s during each of its runs (the
machine's busy time from /proc/stat minus the runs' own CPU time). Prints
every pair, then per binary the clean pairs' rates and median speed-up.

    bench/prepare_pairs.py CORPUS PAIRS SECONDS BINARY...

e.g. after `for _ in $(seq 128); do cat examples/data/*.txt; done >
/tmp/corpus.txt`: bench/prepare_pairs.py /tmp/corpus.txt 8 1800
/tmp/dtrain-prepare.before src/dtrain-prepare (the first binary, a build of
an older commit, for a before/after comparison in the same session)."""
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

corpus, want, limit, bins = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
out = os.path.join(tempfile.mkdtemp(), "o")


def busy():
    """CPU seconds the whole machine has been busy."""
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def quiet(secs=1.5):
    b0 = busy()
    time.sleep(secs)
    return busy() - b0 < 0.15 * secs


def run(b, n):
    """dtrain-prepare's own seconds, and the CPU others used meanwhile."""
    ru0, b0 = resource.getrusage(resource.RUSAGE_CHILDREN), busy()
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", str(n), b, "--out", out, "--tokenizer", "gpt2",
                        "--doc-separator", "\\n\\n", corpus], env=env, capture_output=True, text=True, check=True)
    ru1, b1 = resource.getrusage(resource.RUSAGE_CHILDREN), busy()
    ours = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
    return float(re.search(r"in ([0-9.]+) s", p.stdout).group(1)), b1 - b0 - ours


mb = os.path.getsize(corpus) / 1e6
got = {b: [] for b in bins}
deadline = time.time() + limit
while time.time() < deadline and min(len(v) for v in got.values()) < want:
    for b in bins:
        if not quiet():
            continue
        (s1, o1), (s2, o2) = run(b, 1), run(b, 2)
        clean = o1 < 0.25 and o2 < 0.25
        print("%s %s  1 rank %.2f s (others %.2f)  2 ranks %.2f s (others %.2f)  x%.2f" %
              ("clean" if clean else "busy ", b, s1, o1, s2, o2, s1 / s2), flush=True)
        if clean:
            got[b].append((s1, s2))
for b, v in got.items():
    if not v:
        print("%s: no clean pair" % b)
        continue
    x = sorted(s1 / s2 for s1, s2 in v)
    r1 = sorted(mb / s1 for s1, _ in v)
    r2 = sorted(mb / s2 for _, s2 in v)
    print("%s: %d clean pairs, median 1 rank %.1f MB/s, 2 ranks %.1f MB/s, speed-up median x%.2f (%s)" %
          (b, len(v), r1[len(v) // 2], r2[len(v) // 2], x[len(x) // 2], " ".join("%.2f" % s for s in x)))
