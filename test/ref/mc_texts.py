"""The strings dtrain-prepare --eval-mc encodes, read from the JSONL by the
format's own rules (context or ctx, then each ending with the optional
leading space): test/test_prepare_mc.sh encodes them with js-tiktoken."""
import json, sys
def texts(path, space):
    out = []
    for line in open(path, encoding="utf-8"):
        if line.strip():
            o = json.loads(line)
            out.append(o.get("context", o.get("ctx")))
            out += [(" " if space else "") + s for s in o["endings"]]
    return out
if __name__ == "__main__":
    for i, t in enumerate(texts(sys.argv[1], int(sys.argv[2]))):
        open("%s/t_%d.txt" % (sys.argv[3], i), "w", encoding="utf-8", newline="").write(t)
        print("%s/t_%d.txt %s/t_%d.ids" % (sys.argv[3], i, sys.argv[3], i))
