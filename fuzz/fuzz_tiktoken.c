/* libFuzzer harness: tiktoken rank files (io/tok_tiktoken.c), untrusted
 * files users download or copy, and the BPE core behind them.
 *
 * Sources: fuzz/fuzz_tiktoken.c io/tok_tiktoken.c io/tok_bpe.c
 *   io/tokenizer.c io/tok_byte.c io/tok_gpt2.c fuzz/no_spm.c
 *   with PCRE2, Jansson and libcrypto:
 *   $(pkg-config --cflags --libs libpcre2-8 jansson libcrypto)
 *
 * Input: the bytes of a rank file.
 *   - tok_tiktoken_parse: a rejected file gives one non-empty line of
 *     error; an accepted one has every rank 0..n-1 and all 256 bytes, and
 *     with GPT-2's pattern must give decode(encode(x)) == x for x = the
 *     input itself (any bytes) and reject the id n;
 *   - tok_tiktoken_open_mem under each named encoding (rejects any file
 *     whose rank count differs; one line of error, or a working
 *     tokenizer whose special ids decode to their names). */
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

/* decode(encode(text)) == text, and an id outside the table is refused. */
static void round_trip(tok_bpe_t *b, const char *text, size_t len, int32_t bad_id)
{
    char err[512] = "";
    tok_ids_t ids = {0};
    tok_bytes_t out = {0};
    if (tok_bpe_encode_bytes(b, text, len, &ids, err, sizeof err) != 0 ||
        tok_bpe_decode_ids(b, ids.id, ids.n, &out, err, sizeof err) != 0) {
        fprintf(stderr, "encode/decode failed: %s\n", err);
        abort();
    }
    if (out.n != len || (len && memcmp(out.data, text, len) != 0)) {
        fprintf(stderr, "round trip: %zu bytes in, %zu out\n", len, out.n);
        abort();
    }
    out.n = 0;
    if (tok_bpe_decode_ids(b, &bad_id, 1, &out, err, sizeof err) == 0) {
        fprintf(stderr, "id %d outside the table decoded\n", (int)bad_id);
        abort();
    }
    check_err(err);
    free(ids.id);
    free(out.data);
}

static void parse(const char *data, size_t size)
{
    char err[512] = "";
    tok_bpe_t *b;
    if (tok_tiktoken_parse(&b, data, size, "fuzz.tiktoken", err, sizeof err) != 0) {
        check_err(err);
        return;
    }
    int32_t missing_rank;
    int missing_byte;
    if (tok_bpe_check(b, &missing_rank, &missing_byte) != 0) {
        fprintf(stderr, "accepted a table without rank %d / byte %d\n", (int)missing_rank, missing_byte);
        abort();
    }
    if (tok_bpe_compile(b, TOK_PAT_GPT2, err, sizeof err) != 0) {
        fprintf(stderr, "GPT-2 pattern: %s\n", err);
        abort();
    }
    round_trip(b, data, size, tok_bpe_n_ranks(b));
    tok_bpe_free(b);
}

static void open_named(const char *data, size_t size, const char *encoding)
{
    char err[512] = "";
    tokenizer_t *tk = calloc(1, sizeof *tk);
    if (tk == NULL)
        return;
    if (tok_tiktoken_open_mem(tk, data, size, "fuzz.tiktoken", encoding, err, sizeof err) != 0) {
        check_err(err);
    } else {
        for (int i = 0; i < tk->n_special; i++) {
            tok_bytes_t out = {0};
            if (tokenizer_decode(tk, &tk->special_id[i], 1, &out, err, sizeof err) != 0 ||
                strcmp(out.data, tk->special_name[i]) != 0)
                abort();
            free(out.data);
        }
    }
    tokenizer_close(tk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"r50k_base", "cl100k_base", "o200k_base", "llama3", "nope"};
    parse((const char *)data, size);
    open_named((const char *)data, size, names[size % 5]);
    return 0;
}
