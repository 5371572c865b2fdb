/* libFuzzer harness: GPT-2 vocabularies (io/tok_gpt2.c): encoder.json
 * (Jansson) and vocab.bpe, untrusted files users point gpt2:DIR at.
 *
 * Sources: fuzz/fuzz_gpt2_vocab.c io/tok_gpt2.c io/tok_bpe.c
 *   io/tokenizer.c io/tok_byte.c io/tok_tiktoken.c fuzz/no_spm.c
 *   with PCRE2, Jansson and libcrypto:
 *   $(pkg-config --cflags --libs libpcre2-8 jansson libcrypto)
 *
 * Input: encoder.json, a NUL byte, vocab.bpe (no NUL: all of it is
 * encoder.json and vocab.bpe is empty). tok_gpt2_open_mem must reject
 * with one non-empty line of error, or give a tokenizer whose vocabulary
 * is 257 + merges, with <|endoftext|> last (= doc_start), that round-trips
 * the whole input as text and refuses the id vocab_size. */
#include "io/tok_bpe.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_err(const char *err)
{
    if (err[0] == '\0' || strchr(err, '\n') != NULL) {
        fprintf(stderr, "error is not one non-empty line: '%s'\n", err);
        abort();
    }
}

static void check_tokenizer(tokenizer_t *tk, const char *text, size_t len)
{
    char err[512] = "";
    tok_ids_t ids = {0};
    tok_bytes_t out = {0};
    if (tk->n_special != 1 || tk->doc_start != tk->vocab_size - 1 || tk->special_id[0] != tk->doc_start ||
        strcmp(tk->special_name[0], "<|endoftext|>") != 0) {
        fprintf(stderr, "special token: %d of %d\n", (int)tk->doc_start, tk->vocab_size);
        abort();
    }
    if (tokenizer_encode(tk, text, len, &ids, err, sizeof err) != 0 ||
        tokenizer_decode(tk, ids.id, ids.n, &out, err, sizeof err) != 0) {
        fprintf(stderr, "encode/decode failed: %s\n", err);
        abort();
    }
    if (out.n != len || (len && memcmp(out.data, text, len) != 0)) {
        fprintf(stderr, "round trip: %zu bytes in, %zu out\n", len, out.n);
        abort();
    }
    int32_t bad = tk->vocab_size;
    if (tokenizer_decode(tk, &bad, 1, &out, err, sizeof err) == 0)
        abort();
    check_err(err);
    free(ids.id);
    free(out.data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t elen = nul ? (size_t)(nul - text) : size;
    const char *vocab = nul ? nul + 1 : text + size;
    size_t vlen = size - elen - (nul != NULL);
    char err[512] = "";
    tokenizer_t *tk = calloc(1, sizeof *tk);
    if (tk == NULL)
        return 0;
    if (tok_gpt2_open_mem(tk, text, elen, vocab, vlen, "fuzz", err, sizeof err) != 0)
        check_err(err);
    else
        check_tokenizer(tk, text, size);
    tokenizer_close(tk);
    return 0;
}
