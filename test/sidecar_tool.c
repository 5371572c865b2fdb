/* test/sidecar_tool: the tokenizer sidecar API from the shell, for
 * test/test_sidecar.sh.
 *   sidecar_tool write SPEC PATH [FORMAT BYTES TRAIN_DOCS TRAIN_TOKENS VAL_DOCS VAL_TOKENS]
 *   sidecar_tool read PATH         the parsed fields, one "key value" a line
 *   sidecar_tool find DATA         the sidecar of a data file or glob
 *   sidecar_tool open PATH         the tokenizer it names: "spec vocab_size"
 * Exit status: 0 done, 1 find found none, 2 an error (one line on stderr). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tok_sidecar.h"

static int die(const char *err)
{
    fprintf(stderr, "sidecar_tool: %s\n", err);
    return 2;
}

static int cmd_write(int argc, char **argv, char *err, size_t errlen)
{
    tokenizer_t *tk;
    if (tokenizer_open(&tk, argv[2], 0, err, errlen) != 0)
        return die(err);
    tok_sidecar_t s;
    tok_sidecar_from_tokenizer(&s, tk);
    snprintf(s.data_format, sizeof s.data_format, "%s", argc > 4 ? argv[4] : "llmc");
    s.token_bytes = argc > 5 ? atoi(argv[5]) : tk->vocab_size > 65536 ? 4 : 2;
    for (int i = 0; i < 2; i++) {
        s.docs[i] = argc > 6 + 2 * i ? strtoull(argv[6 + 2 * i], NULL, 10) : 0;
        s.tokens[i] = argc > 7 + 2 * i ? strtoull(argv[7 + 2 * i], NULL, 10) : 0;
    }
    int rc = tok_sidecar_write(argv[3], &s, tk, err, errlen);
    tokenizer_close(tk);
    return rc != 0 ? die(err) : 0;
}

static int cmd_read(const char *path, char *err, size_t errlen)
{
    tok_sidecar_t s;
    if (tok_sidecar_read(path, &s, err, errlen) != 0)
        return die(err);
    printf("kind %s\nspec %s\nvocab_path %s\nvocab_sha256 %s\nvocab_size %d\ndoc_start %d\ndoc_end %d\n"
           "data_format %s\ntoken_bytes %d\ntrain %" PRIu64 " %" PRIu64 "\nval %" PRIu64 " %" PRIu64 "\n",
           s.kind, s.spec, s.vocab_path, s.vocab_sha256, s.vocab_size, (int)s.doc_start, (int)s.doc_end, s.data_format,
           s.token_bytes, s.docs[0], s.tokens[0], s.docs[1], s.tokens[1]);
    return 0;
}

static int cmd_open(const char *path, char *err, size_t errlen)
{
    tok_sidecar_t s;
    tokenizer_t *tk;
    if (tok_sidecar_read(path, &s, err, errlen) != 0 || tok_sidecar_open_tokenizer(&s, path, &tk, err, errlen) != 0)
        return die(err);
    printf("%s %d\n", tk->spec, tk->vocab_size);
    tokenizer_close(tk);
    return 0;
}

int main(int argc, char **argv)
{
    char err[2048], out[8192];
    const char *cmd = argc > 2 ? argv[1] : "";
    if (strcmp(cmd, "write") == 0 && argc >= 4)
        return cmd_write(argc, argv, err, sizeof err);
    if (strcmp(cmd, "read") == 0)
        return cmd_read(argv[2], err, sizeof err);
    if (strcmp(cmd, "open") == 0)
        return cmd_open(argv[2], err, sizeof err);
    if (strcmp(cmd, "find") == 0) {
        int rc = tok_sidecar_find_glob(argv[2], out, sizeof out);
        if (rc == 0)
            printf("%s\n", out);
        return rc < 0 ? die("path too long") : rc;
    }
    fprintf(stderr, "usage: sidecar_tool write SPEC PATH [FORMAT BYTES TRAIN_DOCS TRAIN_TOKENS VAL_DOCS "
                    "VAL_TOKENS] | read PATH | find DATA | open PATH\n");
    return 2;
}
