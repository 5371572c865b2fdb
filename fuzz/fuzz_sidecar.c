/* libFuzzer target: the tokenizer sidecar parser (tok_sidecar_parse), the
 * JSON dtrain reads beside its data files.
 *
 * Links: fuzz/fuzz_sidecar.c io/tok_sidecar.c io/fsutil.c io/errmsg.c
 * io/publish.c, and Jansson (-ljansson).
 * io/tokenizer.c is not linked (it pulls in every tokenizer kind, the C++
 * SentencePiece one included): tokenizer_open, tokenizer_close,
 * tokenizer_builtin_dir and tok_file_sha256, which only
 * tok_sidecar_open_tokenizer calls, are fuzz-only stubs below.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. \
 *     fuzz/fuzz_sidecar.c io/tok_sidecar.c io/fsutil.c io/errmsg.c io/publish.c -ljansson -o fuzz_sidecar
 *   ./fuzz_sidecar -runs=1000000 -dict=fuzz/sidecar.dict NEW_DIR fuzz/corpus/sidecar
 *
 * Each input is parsed; one that parses is formatted again and must parse
 * to the same fields (what dtrain-prepare writes, dtrain reads back). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tok_sidecar.h"

/* fuzz-only stubs: the parser never opens a tokenizer */
int tokenizer_open(tokenizer_t **tk, const char *spec, int spm_add_eos, char *err, size_t errlen)
{
    (void)spec;
    (void)spm_add_eos;
    *tk = NULL;
    snprintf(err, errlen, "no tokenizers in the fuzz build");
    return -1;
}

void tokenizer_close(tokenizer_t *tk) { (void)tk; }

const char *tokenizer_builtin_dir(void) { return "tokenizers"; }

int tok_file_sha256(const char *path, char hex[65], char *err, size_t errlen)
{
    (void)path;
    hex[0] = '\0';
    snprintf(err, errlen, "no sha256 in the fuzz build");
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tok_sidecar_t a, b; /* 8 KB each: off the stack */
    char err[512];
    if (tok_sidecar_parse((const char *)data, size, &a, err, sizeof err) != 0) {
        if (err[0] == '\0' || memchr(err, '\n', strnlen(err, sizeof err)))
            abort(); /* an error is exactly one line */
        return 0;
    }
    /* every parsed string is UTF-8 (Jansson checks), so formatting cannot fail */
    char *text = tok_sidecar_format(&a, NULL, err, sizeof err);
    if (text == NULL || tok_sidecar_parse(text, strlen(text), &b, err, sizeof err) != 0 ||
        memcmp(&a, &b, sizeof a) != 0) {
        fprintf(stderr, "round trip differs: %s\n%s\n", err, text);
        abort();
    }
    free(text);
    return 0;
}
