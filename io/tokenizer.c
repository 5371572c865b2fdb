/* tokenizer_open's dispatch on the spec string, and the small helpers every
 * kind shares (growable arrays, the sha256 of a vocabulary file). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "io/tokenizer.h"
#include "io/tok_hfjson.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#ifndef DTRAIN_TOKENIZER_DIR
#define DTRAIN_TOKENIZER_DIR "tokenizers"
#endif

int tok_ids_reserve(tok_ids_t *v, size_t extra)
{
    if (v->cap - v->n >= extra)
        return 0;
    size_t cap = v->cap ? v->cap : 256;
    while (cap - v->n < extra)
        cap *= 2;
    int32_t *p = realloc(v->id, cap * sizeof *p);
    if (p == NULL)
        return -1;
    v->id = p;
    v->cap = cap;
    return 0;
}

int tok_ids_push(tok_ids_t *v, int32_t id)
{
    if (v->n == v->cap && tok_ids_reserve(v, 1) != 0)
        return -1;
    v->id[v->n++] = id;
    return 0;
}

int tok_bytes_append(tok_bytes_t *b, const void *data, size_t n)
{
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (p == NULL)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->data + b->n, data, n);
    b->n += n;
    b->data[b->n] = '\0'; /* always a C string too, for printing */
    return 0;
}

int tok_file_sha256(const char *path, char hex[65], char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = -1;
    if (md == NULL || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        snprintf(err, errlen, "cannot start a sha256 digest (OpenSSL)");
        goto out;
    }
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        if (EVP_DigestUpdate(md, buf, got) != 1) {
            snprintf(err, errlen, "sha256 of '%s' failed (OpenSSL)", path);
            goto out;
        }
    if (ferror(f)) {
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        goto out;
    }
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    if (EVP_DigestFinal_ex(md, digest, &dlen) != 1 || dlen != 32) {
        snprintf(err, errlen, "sha256 of '%s' failed (OpenSSL)", path);
        goto out;
    }
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    fclose(f);
    return rc;
}

const char *tokenizer_builtin_dir(void) { return DTRAIN_TOKENIZER_DIR; }

/* The directory the gpt2 kind reads when the spec names none (and where
 * hf:NAME looks). */
static const char *tokenizer_dir(void)
{
    const char *env = getenv("DTRAIN_TOKENIZERS");
    return env && *env ? env : tokenizer_builtin_dir();
}

static int open_kind(tokenizer_t *tk, const char *spec, int spm_add_eos, char *err, size_t errlen)
{
    const char *colon = strchr(spec, ':');
    size_t klen = colon ? (size_t)(colon - spec) : strlen(spec);
    const char *arg = colon ? colon + 1 : NULL;
    if (spm_add_eos && !(klen == 3 && strncmp(spec, "spm", 3) == 0)) {
        snprintf(err, errlen, "an end-of-document EOS is for SentencePiece tokenizers (spm:MODEL), not '%s'", spec);
        return -1;
    }
    if (klen == 4 && strncmp(spec, "byte", 4) == 0) {
        if (arg) {
            snprintf(err, errlen, "tokenizer 'byte' takes no argument: write --tokenizer byte");
            return -1;
        }
        return tok_byte_open(tk, err, errlen);
    }
    if (klen == 4 && strncmp(spec, "gpt2", 4) == 0) {
        char dir[TOK_PATH_MAX];
        if (arg && *arg)
            snprintf(dir, sizeof dir, "%s", arg);
        else
            snprintf(dir, sizeof dir, "%s/gpt2", tokenizer_dir());
        return tok_gpt2_open(tk, dir, err, errlen);
    }
    if (klen == 8 && strncmp(spec, "tiktoken", 8) == 0) {
        if (!arg || !*arg) {
            snprintf(err, errlen, "tokenizer 'tiktoken' needs a rank file: write --tokenizer tiktoken:FILE[:ENCODING]");
            return -1;
        }
        char file[TOK_PATH_MAX];
        snprintf(file, sizeof file, "%s", arg);
        /* FILE:ENCODING: the encoding is what follows the last ':' when it
         * names no existing file (paths may hold ':' too). */
        char *enc = strrchr(file, ':');
        const char *encoding = NULL;
        if (enc && enc != file) {
            *enc = '\0';
            encoding = enc + 1;
        }
        return tok_tiktoken_open(tk, file, encoding, err, errlen);
    }
    if (klen == 3 && strncmp(spec, "spm", 3) == 0) {
        if (!arg || !*arg) {
            snprintf(err, errlen, "tokenizer 'spm' needs a model file: write --tokenizer spm:MODEL");
            return -1;
        }
        return tok_spm_open(tk, arg, spm_add_eos, err, errlen);
    }
    if (klen == 2 && strncmp(spec, "hf", 2) == 0) {
        if (!arg || !*arg) {
            snprintf(err, errlen,
                     "tokenizer 'hf' needs a tokenizer.json: write --tokenizer hf:PATH/tokenizer.json (or hf:DIR, "
                     "or hf:NAME for %s/hf/NAME)",
                     tokenizer_dir());
            return -1;
        }
        return tok_hfjson_open(tk, arg, tokenizer_dir(), err, errlen);
    }
    snprintf(err, errlen,
             "unknown tokenizer '%s': use byte, gpt2[:DIR], tiktoken:FILE[:ENCODING], spm:MODEL or hf:TOKENIZER_JSON",
             spec);
    return -1;
}

int tokenizer_open(tokenizer_t **out, const char *spec, int spm_add_eos, char *err, size_t errlen)
{
    *out = NULL;
    tokenizer_t *tk = calloc(1, sizeof *tk);
    if (tk == NULL) {
        snprintf(err, errlen, "out of memory opening tokenizer '%s'", spec);
        return -1;
    }
    tk->doc_start = TOK_NO_ID;
    tk->doc_end = TOK_NO_ID;
    if (open_kind(tk, spec, spm_add_eos, err, errlen) != 0) {
        tokenizer_close(tk);
        return -1;
    }
    *out = tk;
    return 0;
}

void tokenizer_close(tokenizer_t *tk)
{
    if (tk == NULL)
        return;
    if (tk->ops && tk->ops->destroy)
        tk->ops->destroy(tk);
    free(tk);
}

int tokenizer_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen)
{
    return tk->ops->encode(tk, text, len, out, err, errlen);
}

int tokenizer_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen)
{
    return tk->ops->decode(tk, ids, n, out, err, errlen);
}
