/* The byte-level BPE core shared by the gpt2 and tiktoken kinds.
 *
 * A vocabulary is a rank table: token byte string <-> rank (the id), ranks
 * 0..n_ranks-1 dense, every single byte present (so any byte string can be
 * encoded), plus special tokens with ids of their own (text for decode
 * only: encoding is "ordinary").
 *
 * Encoding, as tiktoken does it:
 *   1. pre-tokenise: a PCRE2 pattern (UTF + UCP, JIT) cuts the text into
 *      pieces; bytes no match covers (only invalid UTF-8 can be uncovered,
 *      or any byte by a pattern that does not cover all text) form pieces
 *      of their own, so decode(encode(x)) == x for every x. A chain of
 *      patterns (tokenizer.json's Sequence of Split steps) cuts each piece
 *      of the one before again;
 *   2. each piece: whole-piece rank if it has one, else repeatedly merge the
 *      adjacent pair whose concatenation has the lowest rank (leftmost on a
 *      tie) until no pair has a rank; the parts' ranks are the ids.
 * Merges-list mode (tokenizer.json's BPE model, tok_bpe_use_merges): step 2
 * merges the adjacent pair of ids that comes first in the merges list
 * (leftmost on a tie) into the id the list gives; the whole-piece rank is
 * tried first only when asked (the model's ignore_merges).
 * A direct-mapped cache of short piece -> ids sits in front of step 2.
 */
#ifndef DTRAIN_TOK_BPE_H
#define DTRAIN_TOK_BPE_H

#include "io/tokenizer.h"

/* ECMAScript's \s, which js-tiktoken (the reference encoder) runs the
 * OpenAI patterns with: TAB LF VT FF CR, Unicode Zs, U+2028, U+2029 and
 * U+FEFF. PCRE2's own \s (with UCP) differs: it adds U+0085 and U+180E and
 * lacks U+FEFF. For use inside a character class. */
#define TOK_JS_SPACE "\\t\\n\\x{0b}\\f\\r\\p{Zs}\\x{2028}\\x{2029}\\x{feff}"

/* GPT-2's pre-tokenizer (= tiktoken's r50k_base), in PCRE2 syntax:
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
#define TOK_PAT_GPT2                                                                                                   \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" TOK_JS_SPACE "\\p{L}\\p{N}]+|[" TOK_JS_SPACE                    \
    "]+(?![^" TOK_JS_SPACE "])|[" TOK_JS_SPACE "]+"

typedef struct tok_bpe tok_bpe_t;

/* An empty table for ranks 0..n_ranks-1; NULL when out of memory. */
tok_bpe_t *tok_bpe_new(int32_t n_ranks);
void tok_bpe_free(tok_bpe_t *b);
int32_t tok_bpe_n_ranks(const tok_bpe_t *b);

/* Give bytes[0..len) rank `rank`. Returns 0; TOK_BPE_DUP_TOKEN when the
 * bytes already have a rank (*other = it); TOK_BPE_DUP_RANK when the rank
 * is taken (*other = rank); TOK_BPE_BAD when len is 0 or the rank is out of
 * range; -1 when out of memory. */
enum { TOK_BPE_DUP_TOKEN = 1, TOK_BPE_DUP_RANK = 2, TOK_BPE_BAD = 3 };
int tok_bpe_set(tok_bpe_t *b, int32_t rank, const void *bytes, size_t len, int32_t *other);

/* The rank of bytes[0..len), or -1. */
int32_t tok_bpe_rank(const tok_bpe_t *b, const void *bytes, size_t len);

/* The bytes of a rank (NULL, *len 0 when unset). */
const unsigned char *tok_bpe_token(const tok_bpe_t *b, int32_t rank, size_t *len);

/* The merge that made a rank, as a vocabulary's merges file gives it:
 * its first part is the token's first split bytes. tok_bpe_split: that
 * length, or 0 when no merge was recorded (single bytes; kinds without a
 * merges file, whose merges tok_hf.c recovers by running BPE). Set: 0, or
 * -1 when out of memory or out of range. */
int tok_bpe_set_split(tok_bpe_t *b, int32_t rank, size_t split);
size_t tok_bpe_split(const tok_bpe_t *b, int32_t rank);

/* After the last tok_bpe_set: 0, or -1 with *missing_rank (>= 0) the first
 * rank without a token, or *missing_byte (>= 0) the first byte value
 * without a single-byte token (the other is -1). */
int tok_bpe_check(const tok_bpe_t *b, int32_t *missing_rank, int *missing_byte);

/* Merges-list mode: n_merges merges, given by tok_bpe_set_merge (priority
 * prio in 0..n_merges-1: lower merges first; a pair given twice keeps the
 * last); whole_first: a piece that is a token is that token without
 * merging. -1 when out of memory or called twice. */
int tok_bpe_use_merges(tok_bpe_t *b, int32_t n_merges, int whole_first);
int tok_bpe_set_merge(tok_bpe_t *b, int32_t prio, int32_t left, int32_t right, int32_t result);

/* A special token: its text (decode only) and id, outside the ranks. */
int tok_bpe_add_special(tok_bpe_t *b, const char *name, int32_t id);

/* Compile a pre-tokenizer pattern (PCRE2 syntax; UTF, UCP,
 * MATCH_INVALID_UTF, JIT when the platform has it). Each call adds one to
 * the chain (at most TOK_BPE_MAX_LEVELS): the second splits the pieces of
 * the first, and so on. */
#define TOK_BPE_MAX_LEVELS 8
int tok_bpe_compile(tok_bpe_t *b, const char *pattern, char *err, size_t errlen);

/* Encode / decode with the table alone (for callers without a tokenizer_t). */
int tok_bpe_encode_bytes(tok_bpe_t *b, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen);
int tok_bpe_decode_ids(const tok_bpe_t *b, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen);

/* Hand b to tk (tk->impl; special names and ids; vocab_size = the largest
 * id + 1) with the kind's ops table, whose functions are the three below. */
void tok_bpe_attach(tokenizer_t *tk, tok_bpe_t *b, const tokenizer_ops_t *ops);
int tok_bpe_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen);
int tok_bpe_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen);
void tok_bpe_destroy(tokenizer_t *tk);

/* Read a whole file (NUL-terminated too, for parsers that want it); free
 * *data. -1 with one line in err. */
int tok_bpe_read_file(const char *path, char **data, size_t *len, char *err, size_t errlen);

/* Memory entry points of the two kinds (the fuzz harnesses call these;
 * file names in errors are `label`s). */
int tok_gpt2_open_mem(tokenizer_t *tk, const char *encoder_json, size_t encoder_len, const char *vocab_bpe,
                      size_t vocab_len, const char *label, char *err, size_t errlen);
int tok_tiktoken_open_mem(tokenizer_t *tk, const char *data, size_t len, const char *label, const char *encoding,
                          char *err, size_t errlen);
/* Parse a tiktoken rank file into a new table (no pattern, no specials). */
int tok_tiktoken_parse(tok_bpe_t **out, const char *data, size_t len, const char *label, char *err, size_t errlen);

#endif
