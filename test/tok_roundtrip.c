/* tok_roundtrip: decode(encode(x)) == x for many random byte strings.
 *
 *   tok_roundtrip SPEC COUNT SEED
 *
 * The strings (0..400 bytes, seeded, reproducible) are heavy in what breaks
 * byte-level tokenizers: invalid UTF-8 (lone continuation bytes, truncated
 * and overlong sequences, surrogates, bytes F5..FF), NUL, CR LF, runs of
 * spaces and digits, contractions, and valid multi-byte characters beside
 * them. Prints "SPEC: COUNT strings, B bytes, I ids, D differences"; exit 0
 * when D is 0, 1 otherwise (the first difference on stderr). */
#include "io/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t next_u64(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One random fragment appended to buf. */
static int fragment(uint64_t *rng, tok_bytes_t *buf)
{
    static const char *const pieces[] = {
        "\r\n",
        "\n",
        "\r",
        " ",
        "  ",
        "\t",
        "\0",
        "'s",
        "'LL",
        "'Re",
        "'t ",
        "123",
        "4567890",
        "\xc3\xa9",
        "\xe6\x97\xa5",
        "\xf0\x9f\x8c\x8d",
        "\xe2\x80\x8d",
        "\xc2\xa0",
        "\xe3\x80\x80",
        "\xef\xbb\xbf",
        "\xc2\x85",
        "<|endoftext|>",
        "Hello",
        " world",
        "!!",
        "...",
        "\xcc\x81",
        /* invalid UTF-8 */
        "\x80",
        "\xbf",
        "\xc3",
        "\xe6\x97",
        "\xf0\x9f\x8c",
        "\xc0\x80",
        "\xed\xa0\x80",
        "\xf4\x90\x80\x80",
        "\xff",
        "\xfe",
        "\xf8\x88\x80\x80\x80",
    };
    int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    unsigned kind = (unsigned)(next_u64(rng) % 4);
    if (kind == 0) { /* a run of random bytes */
        unsigned char b[16];
        size_t n = 1 + next_u64(rng) % sizeof b;
        for (size_t i = 0; i < n; i++)
            b[i] = (unsigned char)next_u64(rng);
        return tok_bytes_append(buf, b, n);
    }
    if (kind == 1) { /* printable ASCII */
        char c = (char)(0x20 + next_u64(rng) % 95);
        return tok_bytes_append(buf, &c, 1);
    }
    int k = (int)(next_u64(rng) % (uint64_t)n_pieces);
    size_t len = strlen(pieces[k]);
    return tok_bytes_append(buf, pieces[k], len ? len : 1); /* "\0" is one NUL byte */
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: tok_roundtrip SPEC COUNT SEED\n");
        return 2;
    }
    long count = atol(argv[2]);
    uint64_t rng = strtoull(argv[3], NULL, 10);
    tokenizer_t *tk;
    char err[1024];
    if (tokenizer_open(&tk, argv[1], 0, err, sizeof err) != 0) {
        fprintf(stderr, "tok_roundtrip: %s\n", err);
        return 1;
    }
    tok_bytes_t in = {0}, out = {0};
    tok_ids_t ids = {0};
    size_t bytes = 0, n_ids = 0;
    long diffs = 0;
    int rc = 0;
    for (long s = 0; s < count && rc == 0; s++) {
        in.n = out.n = ids.n = 0;
        size_t target = next_u64(&rng) % 400;
        while (in.n < target && rc == 0)
            rc = fragment(&rng, &in);
        if (rc != 0 || tokenizer_encode(tk, in.data ? in.data : "", in.n, &ids, err, sizeof err) != 0 ||
            tokenizer_decode(tk, ids.id, ids.n, &out, err, sizeof err) != 0) {
            fprintf(stderr, "tok_roundtrip: string %ld: %s\n", s, rc ? "out of memory" : err);
            rc = 1;
            break;
        }
        bytes += in.n;
        n_ids += ids.n;
        if (out.n != in.n || (in.n && memcmp(in.data, out.data, in.n) != 0)) {
            if (diffs++ == 0)
                fprintf(stderr, "tok_roundtrip: string %ld (%zu bytes) decodes to %zu different bytes\n", s, in.n,
                        out.n);
        }
    }
    if (rc == 0)
        printf("%s: %ld strings, %zu bytes, %zu ids, %ld differences\n", argv[1], count, bytes, n_ids, diffs);
    free(in.data);
    free(out.data);
    free(ids.id);
    tokenizer_close(tk);
    return rc != 0 || diffs != 0;
}
