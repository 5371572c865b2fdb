/* The byte tokenizer: id = byte value, vocabulary 256, no special tokens.
 * Documents are kept apart by text: "\n\n" after a document that does not
 * end with a newline (doc_sep). */
#include "io/tokenizer.h"

#include <stdio.h>

static int byte_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen)
{
    (void)tk;
    if (tok_ids_reserve(out, len) != 0) {
        snprintf(err, errlen, "out of memory encoding %zu bytes", len);
        return -1;
    }
    const unsigned char *b = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++)
        out->id[out->n + i] = b[i];
    out->n += len;
    return 0;
}

static int byte_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen)
{
    (void)tk;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] > 255) {
            snprintf(err, errlen, "token id %d at %zu is not a byte (0..255)", (int)ids[i], i);
            return -1;
        }
        char c = (char)(unsigned char)ids[i];
        if (tok_bytes_append(out, &c, 1) != 0) {
            snprintf(err, errlen, "out of memory decoding %zu ids", n);
            return -1;
        }
    }
    return 0;
}

static const tokenizer_ops_t byte_ops = {
    .kind = "byte",
    .encode = byte_encode,
    .decode = byte_decode,
    .destroy = NULL,
};

int tok_byte_open(tokenizer_t *tk, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    tk->ops = &byte_ops;
    tk->vocab_size = 256;
    tk->doc_sep = "\n\n";
    snprintf(tk->spec, sizeof tk->spec, "byte");
    return 0;
}
