"""The MoE losses of one routing, in float64 with numpy, from their formulas
(Switch Transformer / GShard load balancing, ST-MoE z-loss), not from
dtrain's code. Reads what test_moe_grad wrote: "N C E K sigmoid", the tokens
x [N, C], the router [E, C], then the two losses moe_fwd reported; prints
both pairs and exits 1 when either differs by more than 1e-5 relative.

  logits = x @ router.T
  probs  = softmax(logits)                 (softmax router)
           sigmoid(logits) / row sum       (sigmoid router: DeepSeek's
                                            normalised affinities)
  chosen = the K highest scores per token  (the scores: softmax probs or
                                            sigmoid values)
  f_e    = (tokens choosing e) / (N K),  P_e = mean over tokens of probs[:, e]
  aux    = E * sum_e f_e P_e
  z      = mean over tokens of logsumexp(logits)^2
"""
import sys

import numpy as np


def main(path):
    with open(path) as f:
        n, c, e, k, sig = (int(v) for v in f.readline().split())
        x = np.array(f.readline().split(), dtype=np.float64).reshape(n, c)
        router = np.array(f.readline().split(), dtype=np.float64).reshape(e, c)
        got_aux, got_z = (float(v) for v in f.readline().split())
    logits = x @ router.T
    m = logits.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
    if sig:
        scores = 1.0 / (1.0 + np.exp(-logits))
        probs = scores / scores.sum(axis=1, keepdims=True)
    else:
        scores = np.exp(logits - lse[:, None])
        probs = scores
    # stable sort on -score: the lower expert first on a tie
    chosen = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    f_e = np.bincount(chosen.ravel(), minlength=e) / (n * k)
    p_e = probs.mean(axis=0)
    aux = e * float((f_e * p_e).sum())
    z = float((lse**2).mean())
    bad = 0
    for name, want, got in (("load-balancing loss", aux, got_aux), ("z-loss", z, got_z)):
        rel = abs(got - want) / abs(want)
        ok = rel < 1e-5
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name} ({'sigmoid' if sig else 'softmax'}): dtrain {got:.9g}, numpy float64 {want:.9g}, rel {rel:.1e}")
    return bad


if __name__ == "__main__":
    sys.exit(1 if sum(main(p) for p in sys.argv[1:]) else 0)
