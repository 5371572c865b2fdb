/* Token shard files.
 *
 * Native format (llm.c's): a header of 256 little-endian int32
 *   [0] magic, [1] version, [2] token count, rest 0
 * then exactly `count` tokens:
 *   magic 20240520, version 1 -> uint16 tokens (GPT-2 style vocabularies)
 *   magic 20240801, version 7 -> uint32 tokens (vocabularies over 65536)
 * Also readable behind an explicit format flag: nanoGPT's headerless
 * uint16 .bin (the whole file is tokens).
 *
 * Readers return 0 on success or -1 with a one-line message in err (naming
 * the file, the problem and the fix); they never print or exit.
 */
#ifndef DTRAIN_TOKENS_H
#define DTRAIN_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define TOKENS_MAGIC_U16 20240520
#define TOKENS_VERSION_U16 1
#define TOKENS_MAGIC_U32 20240801
#define TOKENS_VERSION_U32 7
#define TOKENS_HEADER_INTS 256

typedef enum {
    TOKENS_FORMAT_LLMC = 0,    /* headered shards (default) */
    TOKENS_FORMAT_RAW_U16 = 1, /* nanoGPT: headerless uint16 */
    TOKENS_FORMAT_MEGATRON = 2 /* PREFIX.bin + PREFIX.idx: read by io/megatron_data.h, not tokens_open */
} tokens_format_t;
/* The names of tokens_format_t, indexed by it, NULL-terminated (--data-format). */
extern const char *const tokens_format_names[];

/* One shard, fully read into memory and widened to int32. */
typedef struct token_shard {
    char *path;
    int32_t *tok;
    size_t n;
} token_shard_t;

/* A set of shards from a glob pattern (sorted by path). */
typedef struct token_set {
    token_shard_t *shard;
    int n_shards;
    size_t n_tokens; /* sum over shards */
} token_set_t;

/* Expand `pattern` (glob(3); a plain path is a pattern matching itself),
 * read every file, check its header (magic, version, size == header + count
 * * width), and check every token is < vocab_size. */
int tokens_open(token_set_t *set, const char *pattern, tokens_format_t fmt, int vocab_size, char *err, size_t errlen);
void tokens_close(token_set_t *set);

/* Check an llm.c shard header (TOKENS_HEADER_INTS int32, any alignment)
 * against the size of its file: magic, version, count > 0 and size ==
 * header + count * width. On success *width (2 or 4) and *count describe
 * the body. Pure (no I/O): tokens_open uses it, and so does the fuzzer;
 * path only names the file in err. */
int tokens_check_header(const void *hdr, uint64_t file_size, const char *path, int *width, size_t *count, char *err,
                        size_t errlen);

/* Write one shard in the native format. width 2 (uint16) or 4 (uint32);
 * tokens must fit the width. Written to path.tmp then renamed. */
int tokens_write(const char *path, const int32_t *tok, size_t n, int width, char *err, size_t errlen);

/* "llmc" / "raw-u16" / "megatron" -> format; returns -1 for anything else. */
int tokens_format_parse(const char *s, tokens_format_t *fmt);

#endif
