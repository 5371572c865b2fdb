#!/usr/bin/python3
"""A client of dtrain-serve written from lm-evaluation-harness's
local-completions model (lm_eval/models/openai_completions.py and
api_models.py): the request it sends for a log-likelihood,

    {"model", "prompt": [[ids...], ...], "temperature": 0, "max_tokens": 1,
     "logprobs": 1, "seed": 1234, "echo": true}

and the way it reads the answer: choices sorted by "index"; the
continuation's log-likelihood is sum(token_logprobs[ctxlen:-1]) (the last
entry is the one generated token); is_greedy holds when each of those
equals max(top_logprobs[j].values()). Standard library only (urllib,
threading). Each command prints "ok ..." / "FAIL ..." lines and exits 0
when all passed.

  serve_client.py loglik --port P --model M --seqs S.json --ref R.json [--batch N]
  serve_client.py gen    --port P --prompt TEXT --max-tokens N --expect FILE [--temperature T --top-k K --seed S]
  serve_client.py bad    --port P --model M --vocab V --ctx C --max-body BYTES
  serve_client.py load   --port P --model M --seqs S.json --ref R.json --requests N --clients N [--seconds S]
  serve_client.py text   --port P --text FILE --ids FILE
  serve_client.py remote --port P --text FILE --ids FILE --eos TEXT --eos-id N

S.json: token-id sequences; R.json: test/ref/serve_ref.py's float64
reference for them. Each sequence gives two (context, continuation) pairs:
its second half after its first, and its last token replaced by the
reference's most likely token there (a greedy continuation).
"""

import argparse
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

TOL = 1e-5     # relative, on each continuation's summed log-likelihood
CLEAR = 1e-4   # a greedy verdict is compared where the best two tokens differ by more
failures = 0


def say(ok, msg):
    global failures
    print(("ok   " if ok else "FAIL ") + msg)
    failures += 0 if ok else 1


def post(port, body, path="/v1/completions", method="POST", timeout=120):
    """(status, parsed JSON or None, raw text)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data if method == "POST" else None,
                                 method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read().decode()
        status = e.code
    try:
        return status, json.loads(raw), raw
    except ValueError:
        return status, None, raw


def pairs_of(seqs, ref):
    """[(context, continuation, reference sum, reference greedy or None when unclear)]."""
    out = []
    for s, r in zip(seqs, ref):
        n = len(s)
        k = max(1, n // 2)
        lp = sum(r[j][0] for j in range(k, n))
        greedy = all(r[j][1] == s[j] for j in range(k, n))
        clear = all(abs(r[j][2] - r[j][0]) > CLEAR if r[j][1] != s[j] else r[j][2] - r[j][3] > CLEAR
                    for j in range(k, n))
        out.append((s[:k], s[k:], lp, greedy if clear else None))
        # the reference's most likely token in place of the last one
        last = r[n - 1]
        out.append((s[:n - 1], [last[1]], last[2], True if last[2] - last[3] > CLEAR else None))
    return out


def harness_payload(model, batch):
    return {"model": model, "prompt": [c + x for c, x, _, _ in batch], "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True}


def parse_logprobs(out, ctxlens):
    """lm-evaluation-harness's LocalCompletionsAPI.parse_logprobs."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        assert ctxlen > 0
        lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(t == max(top.values()) for t, top in zip(lps, tops))
        res.append((sum(lps), greedy))
    return res


def check_batch(port, model, batch):
    """(worst relative error, greedy compared, greedy wrong, problem or None) of one request."""
    status, out, raw = post(port, harness_payload(model, batch))
    if status != 200 or out is None:
        return 0.0, 0, 0, "status %d: %s" % (status, raw[:200])
    if len(out["choices"]) != len(batch):
        return 0.0, 0, 0, "%d choices for %d prompts" % (len(out["choices"]), len(batch))
    for ch, (c, x, _, _) in zip(sorted(out["choices"], key=lambda c: c["index"]), batch):
        if len(ch["logprobs"]["token_logprobs"]) != len(c) + len(x) + 1:
            return 0.0, 0, 0, "echo of %d positions for a prompt of %d" % (
                len(ch["logprobs"]["token_logprobs"]), len(c) + len(x))
    worst, compared, wrong = 0.0, 0, 0
    for (lp, greedy), (_, _, ref_lp, ref_greedy) in zip(parse_logprobs(out, [len(c) for c, _, _, _ in batch]), batch):
        worst = max(worst, abs(lp - ref_lp) / abs(ref_lp))
        if ref_greedy is not None:
            compared += 1
            wrong += greedy != ref_greedy
    return worst, compared, wrong, None


def cmd_loglik(a):
    seqs, ref = json.load(open(a.seqs)), json.load(open(a.ref))
    pairs = pairs_of(seqs, ref)
    worst, compared, wrong, greedy_true = 0.0, 0, 0, sum(p[3] is True for p in pairs)
    for i in range(0, len(pairs), a.batch):
        w, c, g, problem = check_batch(a.port, a.model, pairs[i:i + a.batch])
        if problem:
            say(False, "log-likelihood request %d: %s" % (i // a.batch, problem))
            return
        worst, compared, wrong = max(worst, w), compared + c, wrong + g
    say(worst <= TOL, "%d continuations in batches of %d: worst |serve - torch| / |torch| %.2e (tol %.0e)"
        % (len(pairs), a.batch, worst, TOL))
    say(wrong == 0 and compared >= len(pairs) // 2 and greedy_true > 0,
        "greedy flags: %d of %d compared (%d clear greedy), %d differ from the float64 reference"
        % (compared, len(pairs), greedy_true, wrong))


def cmd_gen(a):
    want = open(a.expect, "rb").read().decode("utf-8", "replace")
    body = {"prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": a.temperature, "top_k": a.top_k,
            "echo": True}
    if a.seed is not None:
        body["seed"] = a.seed
    status, out, raw = post(a.port, body)
    got = out["choices"][0]["text"] if status == 200 and out else None
    say(got == want, "generated text at temperature %g, top-k %d: %s%r"
        % (a.temperature, a.top_k, "equals dtrain's sample: " if got == want else "differs: got ", got
           if got != want else got[:60]))
    if got != want:
        print("     want %r" % want)


def cmd_bad(a):
    big = b'{"prompt": "' + b"a" * (a.max_body + 10) + b'"}'
    long_prompt = [[1] * a.ctx]
    cases = [
        ("malformed JSON", b'{"prompt": [[1, 2]', 400),
        ("not an object", b'[1, 2, 3]', 400),
        ("empty body", b'', 400),
        ("prompt missing", {"max_tokens": 1}, 400),
        ("prompt of a wrong type", {"prompt": 17}, 400),
        ("a list mixing ids and lists", {"prompt": [[1, 2], 3]}, 400),
        ("token id outside the vocabulary", {"prompt": [[1, a.vocab]]}, 400),
        ("negative token id", {"prompt": [[-1]]}, 400),
        ("empty prompt", {"prompt": [[]]}, 400),
        ("max_tokens a string", {"prompt": "a", "max_tokens": "5"}, 400),
        ("max_tokens negative", {"prompt": "a", "max_tokens": -1}, 400),
        ("temperature a string", {"prompt": "a", "temperature": "hot"}, 400),
        ("logprobs beyond 20", {"prompt": "a", "logprobs": 21}, 400),
        ("echo a number", {"prompt": "a", "echo": 1}, 400),
        ("stop a number", {"prompt": "a", "stop": 3}, 400),
        ("five stop sequences", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400),
        ("unknown field", {"prompt": "a", "frequency_penalty": 0.5}, 400),
        ("stream", {"prompt": "a", "stream": True}, 400),
        ("n 2", {"prompt": "a", "n": 2}, 400),
        ("top_p 0.9", {"prompt": "a", "top_p": 0.9}, 400),
        ("beyond the context length", {"prompt": long_prompt, "max_tokens": 1}, 400),
        ("duplicate keys", b'{"prompt": "a", "prompt": "b"}', 400),
        ("another model", {"model": "not-" + a.model, "prompt": "a"}, 404),
        ("a body over --max-body", big, 413),
    ]
    for name, body, want in cases:
        status, out, raw = post(a.port, body)
        one_line = "\n" not in raw.strip()
        msg = out.get("error", {}).get("message") if isinstance(out, dict) else None
        say(status == want and msg and one_line, "%s: %d %s" % (name, status, (msg or raw)[:110]))
    for name, path, method, want in [("unknown path", "/v1/chat/completions", "POST", 404),
                                     ("GET of completions", "/v1/completions", "GET", 405)]:
        status, out, raw = post(a.port, {"prompt": "a"}, path=path, method=method)
        say(status == want and out and "error" in out, "%s: %d %s" % (name, status, raw[:100]))
    # a client that goes away half way through its body
    s = socket.create_connection(("127.0.0.1", a.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
    s.close()
    status, out, _ = post(a.port, "", path="/health", method="GET")
    status2, out2, raw2 = post(a.port, {"prompt": [[1, 2, 3]], "max_tokens": 2, "temperature": 0})
    say(status == 200 and out == {"status": "ok"} and status2 == 200 and len(out2["choices"]) == 1,
        "after the bad requests and a dropped connection the server still answers: health %d, completion %d" % (
            status, status2))
    status, out, raw = post(a.port, "", path="/v1/models", method="GET")
    say(status == 200 and out["data"][0]["id"] == a.model and out["data"][0]["max_model_len"] == a.ctx,
        "GET /v1/models: %s" % raw[:120])


def cmd_load(a):
    seqs, ref = json.load(open(a.seqs)), json.load(open(a.ref))
    pairs = pairs_of(seqs, ref)
    lock = threading.Lock()
    stats = {"done": 0, "worst": 0.0, "problems": [], "late": 0}
    deadline = time.time() + a.seconds
    per = (a.requests + a.clients - 1) // a.clients

    def client(c):
        for r in range(per):
            i = c * per + r
            if i >= a.requests:
                return
            if time.time() > deadline:
                with lock:
                    stats["late"] += 1
                continue
            n = 1 + i % 3  # 1 to 3 prompts a request
            batch = [pairs[(i * 7 + j) % len(pairs)] for j in range(n)]
            try:
                w, _, g, problem = check_batch(a.port, a.model, batch)
            except OSError as e:
                w, g, problem = 0.0, 0, repr(e)
            with lock:
                stats["done"] += 1
                stats["worst"] = max(stats["worst"], w)
                if problem or g:
                    stats["problems"].append(problem or "greedy flags differ")

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.time() - t0
    ok = stats["done"] == a.requests and not stats["problems"] and stats["worst"] <= TOL and stats["late"] == 0
    say(ok, "%d requests from %d concurrent clients in %.1f s: %d answered, worst relative error %.2e, %d problems%s%s"
        % (a.requests, a.clients, dt, stats["done"], stats["worst"], len(stats["problems"]),
           (": " + stats["problems"][0]) if stats["problems"] else "",
           ", %d not sent within %g s" % (stats["late"], a.seconds) if stats["late"] else ""))


def cmd_text(a):
    """A text prompt against the same prompt as ids (the server's tokenizer
    against dtrain's, encoded by test/tok_tool): the same scores, and the
    echoed text is the prompt."""
    text = open(a.text, "rb").read().decode("utf-8")
    ids = [int(x) for x in open(a.ids).read().split()]
    answers = []
    for prompt in (text, [ids]):
        status, out, raw = post(a.port, {"prompt": prompt, "echo": True, "logprobs": 3, "max_tokens": 0})
        if status != 200:
            say(False, "text prompt: status %d %s" % (status, raw[:200]))
            return
        answers.append(out["choices"][0])
    t, i = answers
    lp = t["logprobs"]
    say(t["text"] == text and i["text"] == text, "echo of a %d-character text prompt (%d ids): the prompt itself"
        % (len(text), len(ids)))
    say(lp == i["logprobs"] and len(lp["tokens"]) == len(ids) and lp["text_offset"][0] == 0,
        "text prompt and its ids: the same %d tokens, log-probabilities, alternatives and offsets" % len(ids))
    whole = [tok for tok in lp["tokens"] if not tok.startswith("bytes:")]
    say(len(whole) < len(ids) and "".join(whole) != text,
        "%d tokens hold part of a character and are named bytes:\\x..: %s"
        % (len(ids) - len(whole), [tok for tok in lp["tokens"] if tok.startswith("bytes:")][:3]))


def cmd_remote(a):
    """The endpoints of lm-evaluation-harness's remote tokenizer backend
    (lm_eval/utils.py RemoteTokenizer, check_remote_tokenizer_support): the
    server's tokenizer gives dtrain's ids, and the end-of-text text is its
    one id, as a Hugging Face tokenizer reads it."""
    text = open(a.text, "rb").read().decode("utf-8")
    ids = [int(x) for x in open(a.ids).read().split()]
    status, info, raw = post(a.port, "", path="/tokenizer_info", method="GET")
    say(status == 200 and isinstance(info, dict) and info.get("eos_token") == a.eos,
        "GET /tokenizer_info: %s" % raw[:150])
    _, tok, raw = post(a.port, {"prompt": text, "add_special_tokens": False}, path="/tokenize")
    _, eos, _ = post(a.port, {"prompt": a.eos}, path="/tokenize")
    _, back, _ = post(a.port, {"tokens": ids}, path="/detokenize")
    say(tok and tok.get("tokens") == ids and eos and eos.get("tokens") == [a.eos_id] and back
        and back.get("prompt") == text,
        "POST /tokenize: the text's %d ids are dtrain's, %r is [%d]; POST /detokenize gives the text back"
        % (len(ids), a.eos, a.eos_id))
    status, out, raw = post(a.port, {"tokens": [-1]}, path="/detokenize")
    say(status == 400 and out and "error" in out, "/detokenize of id -1: %d %s" % (status, raw[:100]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("loglik", "gen", "bad", "load", "text", "remote"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--model", default=None)
        if name in ("loglik", "load"):
            p.add_argument("--seqs", required=True)
            p.add_argument("--ref", required=True)
        if name == "loglik":
            p.add_argument("--batch", type=int, default=5)
        if name == "gen":
            p.add_argument("--prompt", required=True)
            p.add_argument("--max-tokens", type=int, required=True)
            p.add_argument("--expect", required=True)
            p.add_argument("--temperature", type=float, default=0.0)
            p.add_argument("--top-k", type=int, default=0)
            p.add_argument("--seed", type=int, default=None)
        if name == "bad":
            p.add_argument("--vocab", type=int, required=True)
            p.add_argument("--ctx", type=int, required=True)
            p.add_argument("--max-body", type=int, required=True)
        if name in ("text", "remote"):
            p.add_argument("--text", required=True)
            p.add_argument("--ids", required=True)
        if name == "remote":
            p.add_argument("--eos", required=True)
            p.add_argument("--eos-id", type=int, required=True)
        if name == "load":
            p.add_argument("--requests", type=int, required=True)
            p.add_argument("--clients", type=int, required=True)
            p.add_argument("--seconds", type=float, default=90.0)
    a = ap.parse_args()
    {"loglik": cmd_loglik, "gen": cmd_gen, "bad": cmd_bad, "load": cmd_load, "text": cmd_text, "remote": cmd_remote}[a.cmd](a)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
