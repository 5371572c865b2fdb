/* libFuzzer harness: the Hugging Face config.json reader of dtrain
 * --init-from (hf_config_parse, src/convert/hf_config.c).
 *
 * Sources: src/convert/hf_config.c, src/model/model_config.c
 * (model_config_check; it needs only libc), mpi/status.c, and Jansson
 * (-ljansson).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. \
 *     fuzz/fuzz_hf_config.c src/convert/hf_config.c src/model/model_config.c mpi/status.c \
 *     -ljansson -o fuzz_hf_config
 *   ./fuzz_hf_config -runs=1000000 -dict=fuzz/hf_config.dict NEW_DIR fuzz/corpus/hf_config
 *
 * The input is the file's bytes, not NUL-terminated (libFuzzer's buffer
 * is exactly their length, so ASan sees any overread). An accepted config
 * must describe a model dtrain can build: model_config_check passes, every
 * size is in the parser's range, the heads divide as attention needs, the
 * floats are positive and finite. A refusal is exactly one non-empty line
 * that begins with the file's name. */
#include "src/convert/hf_config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH "fuzz/config.json"

static int in_range(int v) { return v >= 1 && v <= (1 << 30); }

static void check_model(const model_config_t *c)
{
    char why[512];
    if (model_config_check(c, why, sizeof why) != 0) {
        fprintf(stderr, "accepted a model that model_config_check refuses: %s\n", why);
        abort();
    }
    if (!in_range(c->vocab_size) || c->vocab_size < 2 || !in_range(c->n_layer) || !in_range(c->n_head) ||
        !in_range(c->n_kv_head) || !in_range(c->d_model) || !in_range(c->d_ff) || !in_range(c->max_seq))
        abort();
    /* an explicit head_dim (Qwen3's) frees the head size from d_model / n_head */
    if ((!c->head_dim && c->d_model % c->n_head != 0) || c->head_dim < 0 || c->n_head % c->n_kv_head != 0)
        abort();
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        abort();
    if (c->arch == ARCH_GPT2) {
        if (c->n_kv_head != c->n_head || c->rope_theta != 0)
            abort();
    } else if (c->arch == ARCH_LLAMA) {
        if (model_head_size(c) % 2 != 0 || !(c->rope_theta > 0) || !isfinite(c->rope_theta))
            abort();
    } else {
        abort();
    }
}

/* One line, non-empty, naming the file first. */
static void check_refusal(const char *err, size_t errlen)
{
    size_t n = strnlen(err, errlen);
    if (n == 0 || n == errlen || strncmp(err, PATH ": ", strlen(PATH ": ")) != 0) {
        fprintf(stderr, "refusal without a proper message: '%.*s'\n", (int)n, err);
        abort();
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)err[i] < 0x20 || err[i] == 0x7f) {
            fprintf(stderr, "refusal of more than one line: '%s'\n", err);
            abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    model_config_t a, b;
    char err[512];
    err[0] = '\0';
    if (hf_config_parse((const char *)data, size, PATH, &a, err, sizeof err) != 0) {
        check_refusal(err, sizeof err);
        return 0;
    }
    check_model(&a);
    /* the same bytes give the same model (no state kept between calls) */
    if (hf_config_parse((const char *)data, size, PATH, &b, err, sizeof err) != 0 || memcmp(&a, &b, sizeof a) != 0)
        abort();
    return 0;
}
