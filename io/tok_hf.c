#include "io/tok_hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "io/tok_bpe.h"

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 map to U+0100.. in byte order. */
static void byte_alphabet(unsigned cp[256])
{
    unsigned next = 256;
    for (unsigned b = 0; b < 256; b++) {
        const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? b : next++;
    }
}

/* bytes[0..n) in that alphabet as UTF-8 into out (at least 2n + 1 bytes;
 * every code point is below U+0800). */
static void to_alphabet(const unsigned cp[256], const unsigned char *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        const unsigned c = cp[bytes[i]];
        if (c < 0x80) {
            *out++ = (char)c;
        } else {
            *out++ = (char)(0xC0 | (c >> 6));
            *out++ = (char)(0x80 | (c & 0x3F));
        }
    }
    *out = '\0';
}

/* The two parts BPE leaves of token t (rank r) with ranks below r:
 * *split = the first part's length. -1 when it does not leave two. parts:
 * scratch of len + 1 boundaries. */
static int merge_of(const tok_bpe_t *b, const unsigned char *t, size_t len, int32_t r, size_t *bound, size_t *split)
{
    size_t n = len; /* parts: [bound[i], bound[i+1]) */
    for (size_t i = 0; i <= len; i++)
        bound[i] = i;
    while (n > 1) {
        size_t best = n;
        int32_t best_rank = r;
        for (size_t i = 0; i + 1 < n; i++) {
            const int32_t pr = tok_bpe_rank(b, t + bound[i], bound[i + 2] - bound[i]);
            if (pr >= 0 && pr < best_rank) {
                best_rank = pr;
                best = i;
            }
        }
        if (best == n)
            break;
        memmove(&bound[best + 1], &bound[best + 2], (n - best - 1) * sizeof *bound);
        n--;
    }
    if (n != 2)
        return -1;
    *split = bound[1];
    return 0;
}

/* vocab (rank order) and merges ("left right", the order of the ranks they
 * make) of the rank table. */
static int vocab_and_merges(const tok_bpe_t *b, json_t *vocab, json_t *merges, char *err, size_t errlen)
{
    unsigned cp[256];
    byte_alphabet(cp);
    size_t cap = 0;
    char *s = NULL, *m = NULL;
    size_t *bound = NULL;
    int rc = 0;
    for (int32_t r = 0; r < tok_bpe_n_ranks(b) && rc == 0; r++) {
        size_t len, split;
        const unsigned char *t = tok_bpe_token(b, r, &len);
        if (len + 1 > cap) {
            cap = 2 * (len + 1);
            char *s2 = realloc(s, 2 * cap + 1), *m2 = realloc(m, 2 * cap + 2);
            size_t *b2 = realloc(bound, (cap + 1) * sizeof *bound);
            s = s2 ? s2 : s, m = m2 ? m2 : m, bound = b2 ? b2 : bound;
            if (!s2 || !m2 || !b2) {
                snprintf(err, errlen, "out of memory writing tokenizer.json");
                rc = -1;
                break;
            }
        }
        to_alphabet(cp, t, len, s);
        if (json_object_set_new(vocab, s, json_integer(r)) != 0) {
            snprintf(err, errlen, "out of memory writing tokenizer.json");
            rc = -1;
        } else if (len > 1) {
            split = tok_bpe_split(b, r); /* gpt2: its merges file's; tiktoken: BPE's */
            if (split == 0 && merge_of(b, t, len, r, bound, &split) != 0) {
                snprintf(err, errlen,
                         "token %d (%zu bytes) is not the merge of two tokens of lower rank: not a "
                         "BPE vocabulary Hugging Face's BPE model can express",
                         (int)r, len);
                rc = -1;
                break;
            }
            to_alphabet(cp, t, split, m);
            size_t k = strlen(m);
            m[k++] = ' '; /* no token holds a space: byte 0x20 is U+0120 in the alphabet */
            to_alphabet(cp, t + split, len - split, m + k);
            if (json_array_append_new(merges, json_string(m)) != 0) {
                snprintf(err, errlen, "out of memory writing tokenizer.json");
                rc = -1;
            }
        }
    }
    free(s);
    free(m);
    free(bound);
    return rc;
}

static json_t *added_tokens(const tokenizer_t *tk)
{
    json_t *a = json_array();
    for (int i = 0; i < tk->n_special; i++)
        json_array_append_new(a, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)tk->special_id[i],
                                           "content", tk->special_name[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                           "normalized", 0, "special", 1));
    return a;
}

/* The byte kind: id b is byte b, 256 single-symbol tokens, no merges. */
static int byte_vocab(json_t *vocab)
{
    unsigned cp[256];
    byte_alphabet(cp);
    char s[4];
    for (unsigned b = 0; b < 256; b++) {
        const unsigned char byte = (unsigned char)b;
        to_alphabet(cp, &byte, 1, s);
        if (json_object_set_new(vocab, s, json_integer(b)) != 0)
            return -1;
    }
    return 0;
}

/* Split by the pattern, then the bytes as the alphabet's symbols; the byte
 * kind has no pattern (every byte is a token). */
static json_t *pre_tokenizer(const char *pattern)
{
    json_t *byte_level = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets",
                                   1, "use_regex", 0);
    if (!pattern)
        return json_pack("{s:s, s:[o]}", "type", "Sequence", "pretokenizers", byte_level);
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Split",
                     "pattern", "Regex", pattern, "behavior", "Isolated", "invert", 0, byte_level);
}

int tok_hf_tokenizer_json(const tokenizer_t *tk, const char *pattern, char **json, char *err, size_t errlen)
{
    *json = NULL;
    const int byte = strcmp(tk->ops->kind, "byte") == 0;
    if (strcmp(tk->ops->kind, "hf") == 0) {
        snprintf(
            err, errlen,
            "writing back an hf tokenizer's tokenizer.json is not implemented yet: copy %s into the export by hand",
            tk->vocab_path);
        return -1;
    }
    if (!byte && strcmp(tk->ops->kind, "gpt2") != 0 && strcmp(tk->ops->kind, "tiktoken") != 0) {
        snprintf(err, errlen, "a %s tokenizer is not byte-level BPE: no tokenizer.json", tk->ops->kind);
        return -1;
    }
    json_t *vocab = json_object(), *merges = json_array();
    if (!vocab || !merges || (byte ? byte_vocab(vocab) : vocab_and_merges(tk->impl, vocab, merges, err, errlen)) != 0) {
        if (!vocab || !merges)
            snprintf(err, errlen, "out of memory writing tokenizer.json");
        json_decref(vocab);
        json_decref(merges);
        return -1;
    }
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:n, s:{s:s, s:b, s:b, s:b},"
                             " s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
                             "version", "1.0", "truncation", "padding", "added_tokens", added_tokens(tk), "normalizer",
                             "pre_tokenizer", pre_tokenizer(byte ? NULL : pattern), "post_processor", "decoder", "type",
                             "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type",
                             "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                             "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab, "merges", merges);
    *json = root ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
    json_decref(root);
    if (!*json) {
        snprintf(err, errlen, "out of memory writing tokenizer.json");
        return -1;
    }
    return 0;
}
