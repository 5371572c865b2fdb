"""The bytes of model.c's activation and workspace arenas, by the formula in
the comment above layout_acts() (what a planner must reproduce), for the
rank that holds the most (what --metrics' mem_peak reports: the maximum over
ranks). Standard library only; run with /usr/bin/python3.

    act_bytes.py MODEL B T TP SP PP ACCUM SCHEDULE RECOMPUTE [DTYPE [LOGITS]]

prints "ACTIVATIONS WORKSPACE". DTYPE is fp32 (the default) or bf16
(--dtype bf16: ln1, ln2 and fc_act kept in bf16, the attention output's
bf16 copy, and the bf16 GEMM operand workspace). LOGITS is --logits-chunk: auto (the default), whole
or a number of rows. MODEL is a preset name known below; SP is
0 or 1; PP stages get balanced layer counts, the remainder to the first."""
import sys

PRESETS = {  # arch, V, L, NH, NKV, C, F (src/model/model_config.c)
    "tiny": ("gpt2", 256, 4, 4, 4, 128, 512),
    "tiny-llama": ("llama", 256, 4, 4, 2, 128, 352),
    "gpt2-124m": ("gpt2", 50257, 12, 12, 12, 768, 3072),
    "gpt2-350m": ("gpt2", 50257, 24, 16, 16, 1024, 4096),
    "llama-7b": ("llama", 32000, 32, 32, 32, 4096, 11008),
    "llama-70b": ("llama", 32000, 80, 64, 8, 8192, 28672),
}


def r(n):
    """n floats as one 64-byte aligned piece"""
    return 64 * ((4 * n + 63) // 64)


def h(n):
    """n bf16 values as one 64-byte aligned piece"""
    return r((n + 1) // 2)


def logits_rows(chunk, N, Vl, scratch):
    """the fused classifier's rows per chunk (model_logits_rows)"""
    rows = int(chunk) if chunk != "auto" else max(scratch // Vl, 256)
    return max(1, min(rows, N))


def stage_bytes(model, B, T, P, sp, Ls, slots, has_head, mode, bf16, chunk="auto"):
    arch, V, L, NH, NKV, C, F = PRESETS[model]
    N = B * T
    NR = N // P if sp else N
    HS = C // NH
    nh, nkv, Fl = NH // P, NKV // P, F // P
    QKV, QD = (nh + 2 * nkv) * HS, nh * HS
    FW = 2 * Fl if arch == "llama" else Fl
    q = 128 * P
    Vl = (V + q - 1) // q * q // P
    big = max(QKV, FW, QD)
    # attention keeps its log-sum-exp (B*nh*T), nothing T x T
    ln = h(N * C) if bf16 else r(N * C)
    core = 2 * ln + 4 * r(NR) + r(N * QKV) + r(B * nh * T) + r(N * QD) + r(NR * C) + r(N * FW)
    if bf16:  # the attention output's bf16 copy, kept beside it for wo's backward
        core += h(N * QD)
    act = h(N * Fl) if bf16 else r(N * Fl)
    block = {"none": core + act, "selective": core, "full": 0}[mode]
    fused = has_head and chunk != "whole"
    # the fused classifier keeps no logits: one chunk's, over dbig and dbig2
    # (2 r(N*big) bytes) where they fit, else their own
    logits = 0 if fused else r(N * Vl)
    head = r(N * C) + 2 * r(NR) + logits + 2 * r(N) + r(2 * N) if has_head else 0
    slot = r((Ls + 1) * NR * C) + Ls * block + head + 2 * r(N)
    work = 3 * r(NR * C) + 3 * r(N * C) + 2 * r(N * big)
    X = logits_rows(chunk, N, Vl, 2 * r(N * big) // 4) if fused else 0
    if X * Vl > 2 * r(N * big) // 4:
        work += r(X * Vl)
    if arch == "llama":  # RoPE's inverse frequencies
        work += r(HS // 2)
    work += {"none": 0, "selective": 0, "full": core}[mode]
    if bf16:  # one GEMM's input and output gradient (no ZeRO-3 weight here)
        oc = max(C, big, Vl) if has_head and not fused else max(C, big)
        work += h(N * max(C, QD, Fl)) + h(max(N * oc, X * Vl))
    return slots * slot, work


def main():
    model, B, T, P, sp, pp, accum, sched, mode = sys.argv[1:10]
    bf16 = len(sys.argv) > 10 and sys.argv[10] == "bf16"
    chunk = sys.argv[11] if len(sys.argv) > 11 else "auto"
    B, T, P, sp, pp, accum = int(B), int(T), int(P), int(sp), int(pp), int(accum)
    L = PRESETS[model][2]
    acts = work = 0
    for s in range(pp):
        Ls = L // pp + (s < L % pp)
        slots = accum if sched == "gpipe" else min(pp - s, accum)
        a, w = stage_bytes(model, B, T, P, sp, Ls, slots, s == pp - 1, mode, bf16, chunk)
        acts, work = max(acts, a), max(work, w)
    print(acts, work)


main()
