/* tok_tool: the tokenizer interface from the shell, for the tests.
 *
 *   tok_tool encode SPEC FILE        ids of the whole file, one per line
 *   tok_tool encode-lines SPEC FILE  one line of space-separated ids per
 *                                    input line (the '\n' is not encoded)
 *   tok_tool decode SPEC             ids (whitespace-separated) on stdin ->
 *                                    bytes on stdout
 *   tok_tool roundtrip SPEC FILE     decode(encode(file)) == file, else exit 1
 *   tok_tool info SPEC               kind, vocabulary size, special ids
 *   tok_tool hfjson SPEC             the tokenizer as Hugging Face's
 *                                    tokenizer.json (io/tok_hf.h), on stdout
 *
 * Exit 0 on success, 1 on a mismatch or error (one line on stderr). */
#include "io/tok_hf.h"
#include "io/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "tok_tool: cannot open '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    tok_bytes_t b = {0};
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        if (tok_bytes_append(&b, buf, got) != 0) {
            fprintf(stderr, "tok_tool: out of memory reading '%s'\n", path);
            exit(1);
        }
    if (f != stdin)
        fclose(f);
    if (b.data == NULL && tok_bytes_append(&b, "", 0) != 0)
        exit(1);
    *len = b.n;
    return b.data;
}

static void print_ids(const tok_ids_t *v, const char *sep, const char *end)
{
    for (size_t i = 0; i < v->n; i++)
        printf("%s%d", i ? sep : "", (int)v->id[i]);
    fputs(end, stdout);
}

static int encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *v)
{
    char err[1024];
    v->n = 0;
    if (tokenizer_encode(tk, text, len, v, err, sizeof err) != 0) {
        fprintf(stderr, "tok_tool: %s\n", err);
        return -1;
    }
    return 0;
}

static int cmd_encode(tokenizer_t *tk, const char *path, int by_line)
{
    size_t len;
    char *text = read_file(path, &len);
    if (text == NULL)
        return 1;
    tok_ids_t v = {0};
    int rc = 0;
    if (!by_line) {
        rc = encode(tk, text, len, &v) == 0 ? 0 : 1;
        if (rc == 0)
            print_ids(&v, "\n", v.n ? "\n" : "");
    } else {
        size_t start = 0;
        while (rc == 0 && start < len) {
            const char *nl = memchr(text + start, '\n', len - start);
            size_t end = nl ? (size_t)(nl - text) : len;
            rc = encode(tk, text + start, end - start, &v) == 0 ? 0 : 1;
            if (rc == 0)
                print_ids(&v, " ", "\n");
            start = end + 1;
        }
    }
    free(v.id);
    free(text);
    return rc;
}

static int cmd_decode(tokenizer_t *tk)
{
    tok_ids_t v = {0};
    long id;
    while (scanf("%ld", &id) == 1)
        if (tok_ids_push(&v, (int32_t)id) != 0)
            return 1;
    tok_bytes_t out = {0};
    char err[1024];
    int rc = 0;
    if (tokenizer_decode(tk, v.id, v.n, &out, err, sizeof err) != 0) {
        fprintf(stderr, "tok_tool: %s\n", err);
        rc = 1;
    } else if (out.n && fwrite(out.data, 1, out.n, stdout) != out.n) {
        rc = 1;
    }
    free(v.id);
    free(out.data);
    return rc;
}

static int cmd_roundtrip(tokenizer_t *tk, const char *path)
{
    size_t len;
    char *text = read_file(path, &len);
    if (text == NULL)
        return 1;
    tok_ids_t v = {0};
    tok_bytes_t out = {0};
    char err[1024];
    int rc = 1;
    if (encode(tk, text, len, &v) != 0)
        goto done;
    if (tokenizer_decode(tk, v.id, v.n, &out, err, sizeof err) != 0) {
        fprintf(stderr, "tok_tool: %s\n", err);
        goto done;
    }
    if (out.n != len || (len && memcmp(out.data, text, len) != 0)) {
        size_t i = 0;
        while (i < len && i < out.n && out.data[i] == text[i])
            i++;
        fprintf(stderr, "tok_tool: round trip of '%s' differs at byte %zu (%zu bytes in, %zu out)\n", path, i, len,
                out.n);
        goto done;
    }
    printf("%zu bytes, %zu ids, round trip exact\n", len, v.n);
    rc = 0;
done:
    free(v.id);
    free(out.data);
    free(text);
    return rc;
}

static int cmd_info(const tokenizer_t *tk)
{
    printf("kind %s\nspec %s\nvocab_size %d\ndoc_start %d\ndoc_end %d\nvocab_path %s\nvocab_sha256 %s\n", tk->ops->kind,
           tk->spec, tk->vocab_size, (int)tk->doc_start, (int)tk->doc_end, tk->vocab_path, tk->vocab_sha256);
    for (int i = 0; i < tk->n_special; i++)
        printf("special %s %d\n", tk->special_name[i], (int)tk->special_id[i]);
    return 0;
}

static int cmd_hfjson(const tokenizer_t *tk)
{
    char *json, err[1024];
    const char *pattern = tok_hf_pattern(tk);
    if (!pattern && strcmp(tk->ops->kind, "byte") != 0) {
        fprintf(stderr, "tok_tool: %s: no Hugging Face pre-tokenizer pattern for this kind\n", tk->spec);
        return 1;
    }
    if (tok_hf_tokenizer_json(tk, pattern, &json, err, sizeof err) != 0) {
        fprintf(stderr, "tok_tool: %s\n", err);
        return 1;
    }
    int rc = fputs(json, stdout) < 0 ? 1 : 0;
    free(json);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tok_tool encode|encode-lines|decode|roundtrip|info|hfjson SPEC [FILE]\n");
        return 2;
    }
    const char *cmd = argv[1];
    int needs_file = strcmp(cmd, "decode") != 0 && strcmp(cmd, "info") != 0 && strcmp(cmd, "hfjson") != 0;
    if (needs_file && argc < 4) {
        fprintf(stderr, "tok_tool: %s needs a FILE\n", cmd);
        return 2;
    }
    tokenizer_t *tk;
    char err[1024];
    if (tokenizer_open(&tk, argv[2], 0, err, sizeof err) != 0) {
        fprintf(stderr, "tok_tool: %s\n", err);
        return 1;
    }
    int rc;
    if (strcmp(cmd, "encode") == 0)
        rc = cmd_encode(tk, argv[3], 0);
    else if (strcmp(cmd, "encode-lines") == 0)
        rc = cmd_encode(tk, argv[3], 1);
    else if (strcmp(cmd, "decode") == 0)
        rc = cmd_decode(tk);
    else if (strcmp(cmd, "roundtrip") == 0)
        rc = cmd_roundtrip(tk, argv[3]);
    else if (strcmp(cmd, "info") == 0)
        rc = cmd_info(tk);
    else if (strcmp(cmd, "hfjson") == 0)
        rc = cmd_hfjson(tk);
    else {
        fprintf(stderr, "tok_tool: unknown command '%s'\n", cmd);
        rc = 2;
    }
    tokenizer_close(tk);
    if (fflush(stdout) != 0)
        rc = 1;
    return rc;
}
