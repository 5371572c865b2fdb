#!/usr/bin/env python3
"""Rewrites calls through the ops table (base/ops.h) to pass the backend's
context first: X->matmul_fwd(a, b) becomes X->matmul_fwd(X->ctx, a, b), and
X->sync() becomes X->sync(X->ctx), for every method of ops_t, where X is an
expression naming an ops table (a chain ending in one of OPS_NAMES, or one
given with --name). A statement the rewrite makes longer than 120 columns is
rewrapped, its arguments aligned after the call's opening parenthesis.

Written for issue 20 (ops_t methods take the backend's context); kept so
that code merged later can be rewritten the same way:

    scripts/dev/ops_ctx_rewrite.py [--dry-run] [--name EXPR_TAIL ...] FILE...

Prints each rewritten call as FILE:LINE: EXPR->METHOD. Idempotent: a call
whose first argument is already EXPR->ctx is left alone."""
import argparse
import re
import sys

METHODS = """release sync alloc free copy to_host from_host zero matmul_fwd matmul_bwd
matmul_fwd_bf16 matmul_bwd_bf16 matmul_gelu_fwd matmul_gelu_fwd_bf16 matmul_dgelu_bwd
matmul_dgelu_bwd_bf16 layernorm_fwd layernorm_bwd rmsnorm_fwd rmsnorm_bwd rope_fwd rope_bwd
attention_fwd attention_bwd gelu_fwd gelu_bwd swiglu_fwd swiglu_bwd add embedding_fwd
embedding_bwd xent_max xent_sumexp xent_finish adamw sumsq scale cast_f32_to_bf16
cast_bf16_to_f32""".split()

# The last component of an expression that holds a const ops_t * (or an
# ops_t, with '.') in this tree: ops, m->ops, z->ops, s->gpu, st->cpu, ...
OPS_NAMES = ["ops", "gpu", "cpu", "base", "o", "mem"]

WIDTH = 120


def split_args(text):
    """Top-level comma split of a call's argument text."""
    out, depth, cur, i, q = [], 0, [], 0, None
    while i < len(text):
        ch = text[i]
        if q:
            cur.append(ch)
            if ch == "\\":
                cur.append(text[i + 1])
                i += 1
            elif ch == q:
                q = None
        elif ch in "\"'":
            q = ch
            cur.append(ch)
        elif ch in "([{":
            depth += 1
            cur.append(ch)
        elif ch in ")]}":
            depth -= 1
            cur.append(ch)
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
        i += 1
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def matching_paren(s, open_i):
    depth, i, q = 0, open_i, None
    while i < len(s):
        ch = s[i]
        if q:
            if ch == "\\":
                i += 1
            elif ch == q:
                q = None
        elif ch in "\"'":
            q = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def rewrap(s, open_i, close_i):
    """Rewraps the call whose parentheses are at open_i/close_i when its
    lines run past WIDTH: arguments packed greedily, continuation lines
    aligned one column after the opening parenthesis. Returns new s."""
    line_start = s.rfind("\n", 0, open_i) + 1
    line_end = s.find("\n", close_i)
    line_end = len(s) if line_end < 0 else line_end
    if all(len(ln) <= WIDTH for ln in s[line_start:line_end].split("\n")):
        return s
    inner = s[open_i + 1:close_i]
    if "//" in inner or "/*" in inner or "#" in inner:
        return s  # comments or directives inside: leave it to a person
    args = split_args(" ".join(x.strip() for x in inner.split("\n")))
    head = s[line_start:open_i + 1]
    if "\n" in head:
        return s
    col = len(head)
    tail_end = s.find("\n", close_i)
    tail = s[close_i:tail_end if tail_end >= 0 else len(s)]
    lines, cur = [], head
    for k, a in enumerate(args):
        piece = a + ("," if k < len(args) - 1 else "")
        sep = "" if cur.endswith("(") else " "
        extra = len(tail) if k == len(args) - 1 else 0
        if len(cur) + len(sep) + len(piece) + extra > WIDTH and cur.strip() and not cur.endswith("("):
            lines.append(cur)
            cur = " " * col + piece
        else:
            cur += sep + piece
    lines.append(cur + tail)
    return s[:line_start] + "\n".join(lines) + s[tail_end if tail_end >= 0 else len(s):]


def in_comment(src, i):
    """Whether offset i is inside a /* */ or // comment (strings ignored)."""
    if src.rfind("/*", 0, i) > src.rfind("*/", 0, i):
        return True
    line = src[src.rfind("\n", 0, i) + 1:i]
    return "//" in line


def rewrite(src, names, path, dry):
    tail = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    meth = "|".join(METHODS)
    pat = re.compile(r"((?:[A-Za-z_]\w*(?:\[[^\]\n]*\])?(?:->|\.))*(?:%s))(->|\.)(%s)\s*\(" % (tail, meth))
    pos, n = 0, 0
    while True:
        m = pat.search(src, pos)
        if not m:
            break
        start = m.start()
        # the chain must not continue a longer expression (a->b.ops ok; xops no)
        if start > 0 and (src[start - 1].isalnum() or src[start - 1] in "_>.") or in_comment(src, start):
            pos = m.end()
            continue
        expr, arrow, method = m.group(1), m.group(2), m.group(3)
        ctx = expr + arrow + "ctx"
        open_i = m.end() - 1
        close_i = matching_paren(src, open_i)
        after = src[open_i + 1:close_i]
        if after.strip().startswith(ctx):
            pos = m.end()
            continue
        ins = ctx if after.strip() == "" else ctx + ", "
        if after.strip() == "":
            src = src[:open_i + 1] + ins + src[close_i:]
        else:
            src = src[:open_i + 1] + ins + src[open_i + 1:]
        close_i = matching_paren(src, open_i)
        line = src.count("\n", 0, start) + 1
        print("%s:%d: %s%s%s" % (path, line, expr, arrow, method))
        n += 1
        src = rewrap(src, open_i, close_i)
        pos = open_i + 1
    return src, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--name", action="append", default=[], help="another expression tail naming an ops table")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    total = 0
    for path in a.files:
        with open(path) as f:
            src = f.read()
        out, n = rewrite(src, OPS_NAMES + a.name, path, a.dry_run)
        total += n
        if n and not a.dry_run:
            with open(path, "w") as f:
                f.write(out)
    print("%d calls rewritten" % total, file=sys.stderr)


if __name__ == "__main__":
    main()
