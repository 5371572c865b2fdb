#!/bin/sh
# io/corpus.c, the document reader of dtrain-prepare, against a reference
# written here in Python (json, gzip) and the zstd command-line tool: the
# document stream (index, file, line and every byte of every text) of plain
# text with and without separators (at read sizes from 1 byte up, so that
# separators and lines straddle reads), JSONL (escapes, unicode, \u0000,
# CR LF, blank lines, a BOM, other fields, a line over 16 MB), gzip,
# multi-member gzip, zstd and concatenated zstd frames, equal byte for
# byte; reading only every Nth document's text (as a rank of dtrain-prepare
# does) gives the same indices and lines. Bad inputs each give exactly one
# error line naming the file (and the line): malformed JSON, a missing or
# non-string field, truncated or corrupt gzip and zstd, a directory, a
# missing file, an empty file.
# Automake protocol: exit 0 pass, 1 fail, 77 skip.
set -u
: "${top_builddir:=.}"
TC=$top_builddir/test/test_corpus
if [ ! -x "$TC" ]; then
    echo "FAIL: $TC is not built (make check builds it)" >&2
    exit 1
fi
TC=$(cd "$(dirname "$TC")" && pwd)/test_corpus

PY=
for p in "${PYTHON_REF:-}" /usr/bin/python3 python3; do
    if [ -n "$p" ] && command -v "$p" >/dev/null 2>&1; then
        PY=$p
        break
    fi
done
if [ -z "$PY" ]; then
    echo "SKIP: no python3 for the reference" >&2
    exit 77
fi

mkdir -p "$top_builddir/test" || exit 1
tmp=$(mktemp -d "$top_builddir/test/tmp.corpus.XXXXXX") || exit 1
[ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

# The inputs, and a manifest of cases, one per line, tab-separated:
#   ok   NAME  -     ARGS   (stdout must equal NAME.want, stderr empty)
#   err  NAME  WANT  ARGS   (exit 2, one stderr line containing WANT)
# ARGS are split at spaces and never globbed; paths are relative to $tmp.
cat >"$tmp/gen.py" <<'EOF'
import gzip, json, os, random, shutil, subprocess, sys, zlib

rnd = random.Random(18)
cases = []
have_zstd = shutil.which("zstd") is not None
BOM = b"\xef\xbb\xbf"


def put(name, data):
    with open(name, "wb") as f:
        f.write(data)


def zstd(plain_parts, name):
    """Concatenated zstd frames of the parts, by the zstd tool."""
    out = b""
    for part in plain_parts:
        out += subprocess.run(["zstd", "-q", "-c"], input=part, check=True,
                              stdout=subprocess.PIPE).stdout
    put(name, out)


def text_docs(data, sep):
    if sep is None:
        return [(1, data)]
    docs, pos = [], 0
    for piece in data.split(sep):
        if piece:
            docs.append((1 + data.count(b"\n", 0, pos), piece))
        pos += len(piece) + len(sep)
    return docs


def jsonl_docs(data, field):
    """(line, text or None when the line is not valid for the field)."""
    if data.startswith(BOM):
        data = data[3:]
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    docs = []
    for i, l in enumerate(lines, 1):
        if l.endswith(b"\r"):
            l = l[:-1]
        if l.strip(b" \t\r") == b"":
            continue
        try:
            v = json.loads(l.decode("utf-8"))[field]
            assert isinstance(v, str)
            docs.append((i, v.encode("utf-8")))
        except Exception:
            docs.append((i, None))
    return docs


def dump(files, ranks=1, rank=0):
    out, idx = [], 0
    for f, docs in enumerate(files):
        for line, text in docs:
            if idx % ranks == rank:
                assert text is not None
                out.append(b"doc %d %d %d %d\n" % (idx, f, line, len(text)))
                out.append(text + b"\n")
            else:
                out.append(b"doc %d %d %d -\n" % (idx, f, line))
            idx += 1
    out.append(b"end %d\n" % idx)
    return b"".join(out)


def ok(name, args, files, rank_variants=((1, 0), (2, 1), (3, 2))):
    for ranks, rank in rank_variants:
        n = "%s.r%dof%d" % (name, rank, ranks)
        put(n + ".want", dump(files, ranks, rank))
        a = args if ranks == 1 else "--rank %d --ranks %d %s" % (rank, ranks, args)
        cases.append(("ok", n, "-", a))


def err(name, want, args):
    cases.append(("err", name, want, args))


# ---- plain text --------------------------------------------------------
prose = (b"\n\nIt was the best of times.\nIt was the worst of times.\n\n\n\n"
         b"Chapter 2\r\n\r\nCR LF lines.\r\n\n\nThe end.\n\n")
uni = ("Grüße, 日本語, emoji 👩‍👩‍👧, עברית, العربية, e\u0301\n").encode() * 50
allbytes = bytes(range(256)) * 40 + bytes(rnd.randrange(256) for _ in range(30000))
# Small alphabets: separators occur often, next to each other and across
# every read boundary.
small = bytes(rnd.choice(b"aab\n\n\x00\x01") for _ in range(20000))
put("prose.txt", prose)
put("uni.txt", uni)
put("bytes.bin", allbytes)
put("small.txt", small)
ok("text_whole", "prose.txt uni.txt bytes.bin small.txt",
   [text_docs(d, None) for d in (prose, uni, allbytes, small)])
for b in (1, 7, 0):
    ok("text_whole_buf%d" % b, "--buf %d bytes.bin uni.txt" % b,
       [text_docs(d, None) for d in (allbytes, uni)])

seps = [("\\n\\n", b"\n\n"), ("aab", b"aab"), ("a\\nb", b"a\nb"),
        ("\\0\\x01", b"\x00\x01"), ("\\x61\\x61\\x61\\x61", b"aaaa")]
for k, (esc, sep) in enumerate(seps):
    for b in (1, 2, 3, 4, 5, 8, 13, 64, 4096, 0):
        ok("sep%d_buf%d" % (k, b), "--sep %s --buf %d small.txt prose.txt" % (esc, b),
           [text_docs(small, sep), text_docs(prose, sep)])
ok("sep_uni", "--sep \\n uni.txt prose.txt bytes.bin",
   [text_docs(d, b"\n") for d in (uni, prose, allbytes)])
# A file of separators only, and an empty file: no documents, no error.
put("onlysep.txt", b"\n\n" * 5)
put("empty.txt", b"")
ok("sep_empty", "--sep \\n\\n onlysep.txt empty.txt prose.txt",
   [[], [], text_docs(prose, b"\n\n")])

# ---- JSONL --------------------------------------------------------------
recs = [
    {"text": "plain"},
    {"id": 7, "meta": {"text": "nested, not this"}, "text": "after other fields"},
    {"text": "escapes: \" \\ / \b \f \n \r \t end"},
    {"text": "NUL \u0000 inside \u0000"},
    {"text": "unicode: Grüße 日本語 👩‍👩‍👧 \U0001F600 עברית"},
    {"text": ""},
    {"text": "x" * 1000, "score": 1.5e300, "tags": ["a", None, True]},
    {"id": 2**100, "text": "an id beyond 64 bits"},
]
lines = []
for i, r in enumerate(recs * 3):
    s = json.dumps(r, ensure_ascii=(i % 2 == 0)).encode()
    lines.append(s)
    if i % 5 == 1:
        lines.append(b"")               # blank
    if i % 7 == 3:
        lines.append(b" \t \r")         # white space only
jl = [l + (b"\r\n" if i % 3 == 0 else b"\n") for i, l in enumerate(lines)]
main = b"".join(jl)
main_bom_noeol = BOM + main + b'{"text": "last line, no LF"}'
put("main.jsonl", main)
put("bom.jsonl", main_bom_noeol)
content = b"".join(b'{"text": "wrong", "content": %s}\n' % json.dumps("doc %d\n" % i).encode()
                   for i in range(100))
put("content.jsonl", content)
for b in (1, 3, 64, 0):
    ok("jsonl_buf%d" % b, "--jsonl text --buf %d main.jsonl bom.jsonl" % b,
       [jsonl_docs(main, "text"), jsonl_docs(main_bom_noeol, "text")])
ok("jsonl_field", "--jsonl content content.jsonl", [jsonl_docs(content, "content")])

# A line over 16 MB between short ones, read 4 KB at a time and 1 MB.
big_text = "".join(rnd.choices("abcdefghij \n\"\\é😀", k=8_000_000))
big = (b'{"text": "before"}\n' + json.dumps({"text": big_text}).encode() +
       b'\n\n{"text": "after"}\n')
assert len(big) > 16 * 2**20, len(big)
put("big.jsonl", big)
big_docs = jsonl_docs(big, "text")
for b in (4096, 0):
    ok("jsonl_big_buf%d" % b, "--jsonl text --buf %d big.jsonl" % b,
       [big_docs], ((1, 0), (2, 0)))

# ---- compressed (detected by magic: no .gz/.zst names) ------------------
put("main.gzdata", gzip.compress(main))
cut = len(main) // 2 + 3                # inside a line
put("main2.gzdata", gzip.compress(main[:cut]) + b"\0" * 8 + gzip.compress(main[cut:]))
scut = small.find(b"aab") + 1           # inside a separator
put("small2.gzdata", gzip.compress(small[:scut]) + gzip.compress(small[scut:]))
put("uni.gzdata", gzip.compress(uni))
for b in (1, 5, 0):
    ok("gz_jsonl_buf%d" % b, "--jsonl text --buf %d main.gzdata main2.gzdata main.jsonl" % b,
       [jsonl_docs(main, "text")] * 3)
    ok("gz_sep_buf%d" % b, "--sep aab --buf %d small2.gzdata" % b,
       [text_docs(small, b"aab")])
ok("gz_whole", "uni.gzdata bytes.bin", [text_docs(uni, None), text_docs(allbytes, None)])
if have_zstd:
    zstd([main], "main.zstdata")
    zstd([main[:cut], main[cut:]], "main2.zstdata")
    zstd([small[:scut], small[scut:]], "small2.zstdata")
    zstd([big], "big.zstdata")
    for b in (1, 5, 0):
        ok("zst_jsonl_buf%d" % b, "--jsonl text --buf %d main.zstdata main2.zstdata main.gzdata" % b,
           [jsonl_docs(main, "text")] * 3)
        ok("zst_sep_buf%d" % b, "--sep aab --buf %d small2.zstdata" % b,
           [text_docs(small, b"aab")])
    ok("zst_big", "--jsonl text big.zstdata", [big_docs], ((1, 0), (2, 0)))
else:
    print("note: no zstd tool: the zstd cases are not run", file=sys.stderr)

# ---- bad inputs ---------------------------------------------------------
bad_json = b'{"text": "a"}\n{"text": "b"}\n{"text": "c"\n{"text": "d"}\n'
put("bad_json.jsonl", bad_json)
err("bad_json", "bad_json.jsonl:3: not valid JSON", "--jsonl text bad_json.jsonl")
# The rank that does not own line 3 (document 2) does not parse it.
ok("bad_json_other_rank", "--jsonl text bad_json.jsonl", [jsonl_docs(bad_json, "text")],
   ((2, 1), (3, 0)))
put("bad_missing.jsonl", b'{"text": "a"}\n{"content": "b", "id": 2}\n')
err("bad_missing", 'bad_missing.jsonl:2: no "text" field', "--jsonl text bad_missing.jsonl")
put("bad_type.jsonl", b'{"text": "a"}\n\n\r\n{"text": 5}\n')
err("bad_type", 'bad_type.jsonl:4: field "text" is a number', "--jsonl text bad_type.jsonl")
put("bad_array.jsonl", b'["text", "a"]\n')
err("bad_array", "bad_array.jsonl:1: the line is an array", "--jsonl text bad_array.jsonl")
put("bad_two.jsonl", b'{"text": "a"} {"text": "b"}\n')
err("bad_two", "bad_two.jsonl:1: not valid JSON", "--jsonl text bad_two.jsonl")
put("bad_utf8.jsonl", b'{"text": "a"}\n{"text": "\xff"}\n')
err("bad_utf8", "bad_utf8.jsonl:2: not valid JSON", "--jsonl text bad_utf8.jsonl")
gz = gzip.compress(main)
put("trunc.gzdata", gz[: len(gz) * 2 // 3])
err("trunc_gz", "trunc.gzdata:", "--jsonl text main.jsonl trunc.gzdata")
# The line reached: 1 + the line ends in what zlib can decode of it.
reached = 1 + zlib.decompressobj(31).decompress(gz[: len(gz) * 2 // 3]).count(b"\n")
err("trunc_gz_msg", "trunc.gzdata:%d: truncated gzip" % reached, "--jsonl text trunc.gzdata")
put("corrupt.gzdata", gz[:200] + bytes(b ^ 0x5a for b in gz[200:260]) + gz[260:])
err("corrupt_gz", "corrupt.gzdata:", "--jsonl text corrupt.gzdata")
put("garbage.gzdata", gz + b"garbage after the member")
err("garbage_gz", "garbage.gzdata:", "--jsonl text garbage.gzdata")
if have_zstd:
    zstd([big], "z.tmp")
    z = open("z.tmp", "rb").read()
    os.remove("z.tmp")
    put("trunc.zstdata", z[: len(z) // 2])
    err("trunc_zst", "trunc.zstdata:", "--jsonl text trunc.zstdata")
    err("trunc_zst_msg", "truncated zstd", "--jsonl text trunc.zstdata")
    m = len(z) // 2
    put("corrupt.zstdata", z[:m] + bytes(b ^ 0xa5 for b in z[m:m + 64]) + z[m + 64:])
    err("corrupt_zst", "corrupt.zstdata:", "--jsonl text corrupt.zstdata")
os.mkdir("adir")
err("directory", "'adir' is a directory", "--jsonl text main.jsonl adir")
err("missing", "'missing.jsonl': No such file", "--jsonl text main.jsonl missing.jsonl")
err("empty", "empty.txt: empty input", "prose.txt empty.txt")
put("empty.gzdata", gzip.compress(b""))
err("empty_gz", "empty.gzdata: empty input", "empty.gzdata")
err("bad_escape", "unknown escape", "--sep a\\qb prose.txt")
err("bad_hex", "two hex digits", "--sep \\x4 prose.txt")
err("lone_backslash", "lone backslash", "--sep ab\\ prose.txt")

with open("cases.txt", "w") as f:
    for c in cases:
        f.write("\t".join(c) + "\n")
EOF

(cd "$tmp" && "$PY" gen.py) || { echo "FAIL: the reference could not be written" >&2; exit 1; }

fails=0
n=0
tab=$(printf '\t')
# Each case streamed, then read mapped with its documents found as
# dtrain-prepare's ranks find them (test_corpus --split): one range, and
# 2 or 3 ranges per window with windows so small that ranges cut
# separators, CR LFs and lines everywhere (big.jsonl: larger windows, a
# 5-byte one would take minutes). The expected output is the same.
set -f
while IFS=$tab read -r kind name want args; do
    case $args in
    *big*) variants="-:--split 1:--split 3 --window 65521" ;;
    *) variants="-:--split 1:--split 2 --window 4093:--split 3 --window 5:--split 2 --window 1" ;;
    esac
    IFS=:
    for v in $variants; do
        IFS=' '
        [ "$v" = - ] && v=
        n=$((n + 1))
        (cd "$tmp" && "$TC" $v $args >"$name.out" 2>"$name.err")
        rc=$?
        if [ "$kind" = ok ]; then
            if [ "$rc" -eq 0 ] && [ ! -s "$tmp/$name.err" ] && cmp -s "$tmp/$name.out" "$tmp/$name.want"; then
                echo "ok   $name${v:+ ($v)}: $(tail -n 1 "$tmp/$name.out")"
            else
                echo "FAIL $name ($v $args): exit $rc, $(head -c 300 "$tmp/$name.err"); $(cmp "$tmp/$name.out" "$tmp/$name.want" 2>&1 | head -c 300)"
                fails=$((fails + 1))
            fi
        else
            lines=$(wc -l <"$tmp/$name.err")
            if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$tmp/$name.err"; then
                printf "ok   %s%s: %s\n" "$name" "${v:+ ($v)}" "$(cat "$tmp/$name.err")"
            else
                echo "FAIL $name ($v $args): exit $rc, $lines stderr line(s), wanted '$want': $(head -c 300 "$tmp/$name.err")"
                fails=$((fails + 1))
            fi
        fi
        rm -f "$tmp/$name.out"
        IFS=:
    done
    IFS=$tab
done <"$tmp/cases.txt"
IFS=' 	
'
set +f

# The separator escapes themselves.
want=$(printf 'a\n\r\t\\\036b' | od -An -tx1)
got=$("$TC" --unescape 'a\n\r\t\\\x1eb' | od -An -tx1)
n=$((n + 1))
if [ "$got" = "$want" ]; then
    echo "ok   unescape: $got"
else
    echo "FAIL unescape: $got, wanted $want"
    fails=$((fails + 1))
fi
got=$("$TC" --unescape 'x\0y' | od -An -tx1)
n=$((n + 1))
if [ "$got" = "$(printf 'x\000y' | od -An -tx1)" ]; then
    echo "ok   unescape NUL: $got"
else
    echo "FAIL unescape NUL: $got"
    fails=$((fails + 1))
fi

echo "$fails of $n case(s) failed"
[ "$fails" -eq 0 ] || exit 1
exit 0
