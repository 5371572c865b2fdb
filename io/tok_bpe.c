/* The byte-level BPE core (see tok_bpe.h): rank table, PCRE2
 * pre-tokenisation (one pattern, or a chain of them), tiktoken's merge rule
 * or a merges list's, a piece -> ids cache. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "io/tok_bpe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define NO_RANK INT32_MAX

/* Pieces longer than this merge through a heap (O(n log n)); shorter ones
 * by tiktoken's scan for the lowest pair (O(n^2), faster when n is small).
 * Both pick the same pair: the lowest rank, leftmost on a tie. */
#define HEAP_MIN_PIECE 128

/* Cache: direct-mapped, 2^CACHE_BITS entries of 64 bytes (2 MiB), for
 * pieces up to CACHE_KEY bytes that encode to at most CACHE_IDS ids. */
#define CACHE_BITS 15
#define CACHE_KEY 22
#define CACHE_IDS 10

typedef struct cache_entry {
    uint8_t klen; /* 0: empty */
    uint8_t nids;
    char key[CACHE_KEY];
    int32_t id[CACHE_IDS];
} cache_entry_t;

/* A table slot keeps a token's first 8 bytes and its length, so most
 * lookups (tokens of at most 8 bytes) never touch the arena. */
typedef struct slot {
    uint64_t head; /* the first 8 bytes, zero-padded */
    uint32_t len;
    int32_t rank; /* -1: empty */
} slot_t;

/* A merges-list entry: the pair (left, right) of ids, packed as
 * (left + 1) << 32 | right so that 0 marks an empty slot. */
typedef struct pair_slot {
    uint64_t key;
    int32_t prio; /* the merge's index in the list: lower merges first */
} pair_slot_t;

typedef struct heap_entry {
    int32_t rank;
    uint32_t left, end; /* the pair is bytes [left, end) */
} heap_entry_t;

struct tok_bpe {
    int32_t n_ranks;
    size_t *off;     /* [n_ranks] token bytes at arena + off[r] */
    uint32_t *len;   /* [n_ranks] 0: unset */
    uint32_t *split; /* [n_ranks] the recorded merge's first part, bytes; 0: none (NULL until one is set) */
    unsigned char *arena;
    size_t arena_n, arena_cap;
    slot_t *table; /* open addressing, linear probing */
    size_t mask;
    int32_t byte_rank[256]; /* rank of each single byte (-1 until set) */

    char **special_name; /* [n_special] */
    int32_t *special_id;
    int n_special;

    /* the pre-tokenizer: level l splits the pieces of level l - 1 */
    pcre2_code *re[TOK_BPE_MAX_LEVELS];
    pcre2_match_data *md[TOK_BPE_MAX_LEVELS];
    int jit[TOK_BPE_MAX_LEVELS];
    int n_levels;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;

    /* merges-list mode (NULL pairs: tiktoken's rule, ranks are priorities) */
    pair_slot_t *pairs;
    size_t pair_mask;
    int32_t *merge_result; /* [n_merges] the id merge i makes */
    int32_t n_merges;
    int whole_first; /* a piece that is a token is that token, unmerged */

    cache_entry_t *cache; /* allocated on first encode */

    /* merge scratch, grown as needed: piece length + 1 */
    uint32_t *start;
    int32_t *pair;
    int32_t *prev;
    uint8_t *alive;
    heap_entry_t *heap;
    size_t scratch_cap, heap_cap;
};

/* FxHash-style: 8 bytes a step, then a final mix; good enough for short
 * keys and cheap. */
static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    const uint64_t k = 0x517cc1b727220a95ULL;
    uint64_t h = n * k;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = ((h << 5 | h >> 59) ^ w) * k;
        p += 8;
        n -= 8;
    }
    if (n > 0) {
        uint64_t w = 0;
        memcpy(&w, p, n);
        h = ((h << 5 | h >> 59) ^ w) * k;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}

tok_bpe_t *tok_bpe_new(int32_t n_ranks)
{
    if (n_ranks < 0 || n_ranks > (1 << 28))
        return NULL;
    tok_bpe_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return NULL;
    b->n_ranks = n_ranks;
    size_t cap = 512;
    while (cap < 2 * (size_t)n_ranks)
        cap *= 2;
    b->mask = cap - 1;
    b->off = calloc((size_t)n_ranks + 1, sizeof *b->off);
    b->len = calloc((size_t)n_ranks + 1, sizeof *b->len);
    b->table = malloc(cap * sizeof *b->table);
    if (b->off == NULL || b->len == NULL || b->table == NULL) {
        tok_bpe_free(b);
        return NULL;
    }
    for (size_t i = 0; i < cap; i++)
        b->table[i] = (slot_t){0, 0, -1};
    for (int i = 0; i < 256; i++)
        b->byte_rank[i] = -1;
    b->whole_first = 1;
    return b;
}

int tok_bpe_set_split(tok_bpe_t *b, int32_t rank, size_t split)
{
    if (rank < 0 || rank >= b->n_ranks || split > UINT32_MAX)
        return -1;
    if (b->split == NULL && (b->split = calloc((size_t)b->n_ranks + 1, sizeof *b->split)) == NULL)
        return -1;
    b->split[rank] = (uint32_t)split;
    return 0;
}

size_t tok_bpe_split(const tok_bpe_t *b, int32_t rank)
{
    return b->split != NULL && rank >= 0 && rank < b->n_ranks ? b->split[rank] : 0;
}

void tok_bpe_free(tok_bpe_t *b)
{
    if (b == NULL)
        return;
    for (int i = 0; i < b->n_special; i++)
        free(b->special_name[i]);
    free(b->special_name);
    free(b->special_id);
    for (int l = 0; l < b->n_levels; l++) {
        pcre2_match_data_free(b->md[l]);
        pcre2_code_free(b->re[l]);
    }
    pcre2_match_context_free(b->mctx);
    pcre2_jit_stack_free(b->jit_stack);
    free(b->pairs);
    free(b->merge_result);
    free(b->cache);
    free(b->start);
    free(b->pair);
    free(b->prev);
    free(b->alive);
    free(b->heap);
    free(b->off);
    free(b->len);
    free(b->split);
    free(b->arena);
    free(b->table);
    free(b);
}

int32_t tok_bpe_n_ranks(const tok_bpe_t *b) { return b->n_ranks; }

/* The slot holding bytes p[0..n) (rank >= 0), or the empty slot where
 * they would go. */
static inline uint64_t head_of(const unsigned char *p, size_t n)
{
    uint64_t w = 0;
    memcpy(&w, p, n < 8 ? n : 8);
    return w;
}

static slot_t *find_slot(const tok_bpe_t *b, const unsigned char *p, size_t n, uint64_t h)
{
    uint64_t head = head_of(p, n);
    for (size_t i = h & b->mask;; i = (i + 1) & b->mask) {
        slot_t *s = &b->table[i];
        if (s->rank < 0)
            return s;
        if (s->head == head && s->len == n && (n <= 8 || memcmp(b->arena + b->off[s->rank] + 8, p + 8, n - 8) == 0))
            return s;
    }
}

static inline int32_t rank_of(const tok_bpe_t *b, const unsigned char *p, size_t n)
{
    return find_slot(b, p, n, hash_bytes(p, n))->rank;
}

int32_t tok_bpe_rank(const tok_bpe_t *b, const void *bytes, size_t len) { return len ? rank_of(b, bytes, len) : -1; }

int tok_bpe_set(tok_bpe_t *b, int32_t rank, const void *bytes, size_t len, int32_t *other)
{
    if (len == 0 || len > UINT32_MAX || rank < 0 || rank >= b->n_ranks)
        return TOK_BPE_BAD;
    if (b->len[rank] != 0) {
        *other = rank;
        return TOK_BPE_DUP_RANK;
    }
    uint64_t h = hash_bytes(bytes, len);
    slot_t *s = find_slot(b, bytes, len, h);
    if (s->rank >= 0) {
        *other = s->rank;
        return TOK_BPE_DUP_TOKEN;
    }
    if (b->arena_cap - b->arena_n < len) {
        size_t cap = b->arena_cap ? b->arena_cap : 1 << 16;
        while (cap - b->arena_n < len)
            cap *= 2;
        unsigned char *a = realloc(b->arena, cap);
        if (a == NULL)
            return -1;
        b->arena = a;
        b->arena_cap = cap;
    }
    memcpy(b->arena + b->arena_n, bytes, len);
    b->off[rank] = b->arena_n;
    b->len[rank] = (uint32_t)len;
    b->arena_n += len;
    *s = (slot_t){head_of(bytes, len), (uint32_t)len, rank};
    if (len == 1)
        b->byte_rank[*(const unsigned char *)bytes] = rank;
    return 0;
}

const unsigned char *tok_bpe_token(const tok_bpe_t *b, int32_t rank, size_t *len)
{
    if (rank < 0 || rank >= b->n_ranks || b->len[rank] == 0) {
        *len = 0;
        return NULL;
    }
    *len = b->len[rank];
    return b->arena + b->off[rank];
}

int tok_bpe_check(const tok_bpe_t *b, int32_t *missing_rank, int *missing_byte)
{
    *missing_rank = -1;
    *missing_byte = -1;
    for (int32_t r = 0; r < b->n_ranks; r++)
        if (b->len[r] == 0) {
            *missing_rank = r;
            return -1;
        }
    for (int c = 0; c < 256; c++) {
        unsigned char byte = (unsigned char)c;
        if (rank_of(b, &byte, 1) < 0) {
            *missing_byte = c;
            return -1;
        }
    }
    return 0;
}

int tok_bpe_add_special(tok_bpe_t *b, const char *name, int32_t id)
{
    char **names = realloc(b->special_name, (size_t)(b->n_special + 1) * sizeof *names);
    if (names == NULL)
        return -1;
    b->special_name = names;
    int32_t *ids = realloc(b->special_id, (size_t)(b->n_special + 1) * sizeof *ids);
    if (ids == NULL)
        return -1;
    b->special_id = ids;
    char *copy = strdup(name);
    if (copy == NULL)
        return -1;
    names[b->n_special] = copy;
    ids[b->n_special] = id;
    b->n_special++;
    return 0;
}

int tok_bpe_compile(tok_bpe_t *b, const char *pattern, char *err, size_t errlen)
{
    int code;
    PCRE2_SIZE at;
    if (b->n_levels == TOK_BPE_MAX_LEVELS) {
        snprintf(err, errlen, "more than %d pre-tokenizer patterns: join some into one", TOK_BPE_MAX_LEVELS);
        return -1;
    }
    const int l = b->n_levels;
    b->re[l] = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
    if (b->re[l] == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, errlen, "pre-tokenizer pattern does not compile at offset %zu: %s: fix the pattern", (size_t)at,
                 (char *)msg);
        return -1;
    }
    /* Without JIT (a platform PCRE2 has none for) the interpreter gives
     * the same matches, only slower. */
    b->n_levels++;
    b->jit[l] = pcre2_jit_compile(b->re[l], PCRE2_JIT_COMPLETE) == 0;
    b->md[l] = pcre2_match_data_create(1, NULL);
    if (b->mctx == NULL)
        b->mctx = pcre2_match_context_create(NULL);
    if (b->md[l] == NULL || b->mctx == NULL) {
        snprintf(err, errlen, "out of memory compiling the pre-tokenizer pattern");
        return -1;
    }
    if (b->jit[l] && b->jit_stack == NULL) {
        /* Long runs (a 100k-letter word, megabytes of spaces) may need more
         * than the default 32 KiB of JIT stack for backtracking. */
        b->jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
        if (b->jit_stack == NULL) {
            snprintf(err, errlen, "out of memory for the PCRE2 JIT stack");
            return -1;
        }
        pcre2_jit_stack_assign(b->mctx, NULL, b->jit_stack);
    }
    return 0;
}

/* ---- merges-list mode ---- */

static inline uint64_t pair_key(int32_t left, int32_t right)
{
    return ((uint64_t)(uint32_t)left + 1) << 32 | (uint32_t)right;
}

/* splitmix64's finalizer: every key bit reaches the low bits the mask
 * keeps (ids are small and dense; a bare multiply clusters them). */
static inline size_t pair_hash(uint64_t key)
{
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ULL;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebULL;
    return (size_t)(key ^ key >> 31);
}

int tok_bpe_use_merges(tok_bpe_t *b, int32_t n_merges, int whole_first)
{
    if (n_merges < 0 || n_merges > (1 << 28) || b->pairs != NULL)
        return -1;
    size_t cap = 512;
    while (cap < 2 * (size_t)n_merges)
        cap *= 2;
    b->pairs = calloc(cap, sizeof *b->pairs);
    b->merge_result = malloc(((size_t)n_merges + 1) * sizeof *b->merge_result);
    if (b->pairs == NULL || b->merge_result == NULL)
        return -1;
    b->pair_mask = cap - 1;
    b->n_merges = n_merges;
    b->whole_first = whole_first;
    return 0;
}

int tok_bpe_set_merge(tok_bpe_t *b, int32_t prio, int32_t left, int32_t right, int32_t result)
{
    if (b->pairs == NULL || prio < 0 || prio >= b->n_merges || left < 0 || right < 0 || result < 0)
        return -1;
    const uint64_t key = pair_key(left, right);
    size_t i = pair_hash(key) & b->pair_mask;
    while (b->pairs[i].key != 0 && b->pairs[i].key != key)
        i = (i + 1) & b->pair_mask;
    /* a pair listed twice merges at its last place (Hugging Face's and
     * transformers.js's maps both keep the last) */
    b->pairs[i] = (pair_slot_t){key, prio};
    b->merge_result[prio] = result;
    return 0;
}

/* The priority of merging ids left and right, or NO_RANK. */
static inline int32_t pair_prio(const tok_bpe_t *b, int32_t left, int32_t right)
{
    const uint64_t key = pair_key(left, right);
    for (size_t i = pair_hash(key) & b->pair_mask;; i = (i + 1) & b->pair_mask) {
        if (b->pairs[i].key == key)
            return b->pairs[i].prio;
        if (b->pairs[i].key == 0)
            return NO_RANK;
    }
}

/* ---- merging ---- */

static int grow_scratch(tok_bpe_t *b, size_t n)
{
    if (n <= b->scratch_cap)
        return 0;
    size_t cap = b->scratch_cap ? b->scratch_cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *start = realloc(b->start, cap * sizeof *start);
    if (start == NULL)
        return -1;
    b->start = start;
    int32_t *pair = realloc(b->pair, cap * sizeof *pair);
    if (pair == NULL)
        return -1;
    b->pair = pair;
    int32_t *prev = realloc(b->prev, cap * sizeof *prev);
    if (prev == NULL)
        return -1;
    b->prev = prev;
    uint8_t *alive = realloc(b->alive, cap);
    if (alive == NULL)
        return -1;
    b->alive = alive;
    b->scratch_cap = cap;
    return 0;
}

static inline int32_t pair_rank(const tok_bpe_t *b, const unsigned char *p, size_t from, size_t to)
{
    int32_t r = rank_of(b, p + from, to - from);
    return r < 0 ? NO_RANK : r;
}

/* The priority of merging the parts [from, mid) and [mid, to) whose ids
 * are left and right: tiktoken's rule (the rank of the bytes together) or
 * the merges list's (the pair's place in it). */
static inline int32_t pair_of(const tok_bpe_t *b, const unsigned char *p, size_t from, size_t to, int32_t left,
                              int32_t right)
{
    return b->pairs ? pair_prio(b, left, right) : pair_rank(b, p, from, to);
}

/* The id a merge of priority prio makes. */
static inline int32_t merged_id(const tok_bpe_t *b, int32_t prio) { return b->pairs ? b->merge_result[prio] : prio; }

/* tiktoken's scan. Parts i = 0..m-1 are bytes [start[i], start[i+1])
 * with start[m] = n, ids[i] their ranks; pair[i] is the rank of parts i
 * and i+1 together (NO_RANK: none). Returns m, the ids in ids[0..m). */
static size_t merge_scan(tok_bpe_t *b, const unsigned char *p, size_t n, int32_t *ids)
{
    uint32_t *start = b->start;
    int32_t *pair = b->pair;
    size_t m = n;
    for (size_t i = 0; i < n; i++) {
        start[i] = (uint32_t)i;
        ids[i] = b->byte_rank[p[i]];
    }
    for (size_t i = 0; i < n; i++)
        pair[i] = i + 1 < n ? pair_of(b, p, i, i + 2, ids[i], ids[i + 1]) : NO_RANK;
    start[n] = (uint32_t)n;
    while (m > 1) {
        size_t best = 0;
        int32_t low = NO_RANK;
        for (size_t i = 0; i + 1 < m; i++)
            if (pair[i] < low) {
                low = pair[i];
                best = i;
            }
        if (low == NO_RANK)
            break;
        /* part best absorbs part best+1 */
        ids[best] = merged_id(b, low);
        memmove(start + best + 1, start + best + 2, (m - best - 1) * sizeof *start);
        memmove(ids + best + 1, ids + best + 2, (m - best - 2) * sizeof *ids);
        memmove(pair + best + 1, pair + best + 2, (m - best - 2) * sizeof *pair);
        m--;
        pair[best] = best + 1 < m ? pair_of(b, p, start[best], start[best + 2], ids[best], ids[best + 1]) : NO_RANK;
        if (best > 0)
            pair[best - 1] = pair_of(b, p, start[best - 1], start[best + 1], ids[best - 1], ids[best]);
    }
    return m;
}

/* A binary min-heap on (rank, left): the leftmost lowest pair on top. */
static inline int heap_less(heap_entry_t x, heap_entry_t y)
{
    return x.rank < y.rank || (x.rank == y.rank && x.left < y.left);
}

static int heap_push(tok_bpe_t *b, size_t *hn, heap_entry_t e)
{
    if (*hn == b->heap_cap) {
        size_t cap = b->heap_cap ? 2 * b->heap_cap : 1024;
        heap_entry_t *h = realloc(b->heap, cap * sizeof *h);
        if (h == NULL)
            return -1;
        b->heap = h;
        b->heap_cap = cap;
    }
    heap_entry_t *h = b->heap;
    size_t i = (*hn)++;
    while (i > 0 && heap_less(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
    return 0;
}

static heap_entry_t heap_pop(tok_bpe_t *b, size_t *hn)
{
    heap_entry_t *h = b->heap;
    heap_entry_t top = h[0], last = h[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(h[c + 1], h[c]))
            c++;
        if (!heap_less(h[c], last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (n > 0)
        h[i] = last;
    return top;
}

static int push_pair(tok_bpe_t *b, size_t *hn, const unsigned char *p, uint32_t left, uint32_t end, const int32_t *ids,
                     uint32_t mid)
{
    int32_t r = pair_of(b, p, left, end, ids[left], ids[mid]);
    return r == NO_RANK ? 0 : heap_push(b, hn, (heap_entry_t){r, left, end});
}

/* The same merges for long pieces: parts form a list over their start
 * bytes (pair[] holds the next start, prev[] the previous, alive[] marks
 * starts of parts, ids[start] the part's rank); stale heap entries are
 * skipped when popped. Leaves the m ids in ids[0..m). */
static int merge_heap(tok_bpe_t *b, const unsigned char *p, size_t n, int32_t *ids, size_t *parts)
{
    int32_t *next = b->pair, *prev = b->prev;
    uint8_t *alive = b->alive;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        next[i] = (int32_t)i + 1;
        prev[i] = (int32_t)i - 1;
        alive[i] = 1;
        ids[i] = b->byte_rank[p[i]];
    }
    for (size_t i = 0; i + 1 < n; i++)
        if (push_pair(b, &hn, p, (uint32_t)i, (uint32_t)i + 2, ids, (uint32_t)i + 1) != 0)
            return -1;
    while (hn > 0) {
        heap_entry_t e = heap_pop(b, &hn);
        uint32_t mid = (uint32_t)next[e.left];
        if (!alive[e.left] || mid >= n || (uint32_t)next[mid] != e.end)
            continue; /* one of the two parts has merged since */
        alive[mid] = 0;
        next[e.left] = (int32_t)e.end;
        ids[e.left] = merged_id(b, e.rank);
        if (e.end < n)
            prev[e.end] = (int32_t)e.left;
        if (prev[e.left] >= 0 && push_pair(b, &hn, p, (uint32_t)prev[e.left], e.end, ids, e.left) != 0)
            return -1;
        if (e.end < n && push_pair(b, &hn, p, e.left, (uint32_t)next[e.end], ids, e.end) != 0)
            return -1;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i = (size_t)next[i])
        ids[m++] = ids[i]; /* m <= i: compacting in place is safe */
    *parts = m;
    return 0;
}

/* ---- encoding ---- */

static cache_entry_t *cache_slot(tok_bpe_t *b, uint64_t h) { return &b->cache[(h >> 7) & ((1u << CACHE_BITS) - 1)]; }

static void cache_put(cache_entry_t *c, const unsigned char *p, size_t n, const int32_t *ids, size_t nids)
{
    if (nids > CACHE_IDS)
        return;
    c->klen = (uint8_t)n;
    c->nids = (uint8_t)nids;
    memcpy(c->key, p, n);
    memcpy(c->id, ids, nids * sizeof *ids);
}

static int encode_piece(tok_bpe_t *b, const unsigned char *p, size_t n, tok_ids_t *out)
{
    uint64_t h = hash_bytes(p, n);
    cache_entry_t *c = n <= CACHE_KEY ? cache_slot(b, h) : NULL;
    if (c && c->klen == n && memcmp(c->key, p, n) == 0) {
        if (tok_ids_reserve(out, c->nids) != 0)
            return -1;
        memcpy(out->id + out->n, c->id, c->nids * sizeof *c->id);
        out->n += c->nids;
        return 0;
    }
    int32_t whole = b->whole_first || n == 1 ? find_slot(b, p, n, h)->rank : -1;
    if (whole >= 0) {
        if (c)
            cache_put(c, p, n, &whole, 1);
        return tok_ids_push(out, whole);
    }
    /* n >= 2 here: every single byte has a rank */
    if (n >= INT32_MAX)
        return -2; /* merge positions are 32-bit */
    size_t m;
    if (grow_scratch(b, n + 1) != 0 || tok_ids_reserve(out, n) != 0)
        return -1;
    int32_t *ids = out->id + out->n;
    if (n < HEAP_MIN_PIECE)
        m = merge_scan(b, p, n, ids);
    else if (merge_heap(b, p, n, ids, &m) != 0)
        return -1;
    if (c)
        cache_put(c, p, n, ids, m);
    out->n += m;
    return 0;
}

static int match_error(size_t at, int rc, char *err, size_t errlen)
{
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    snprintf(err, errlen, "pre-tokenizer match failed at byte %zu: %s", at, (char *)msg);
    return -1;
}

static int piece_error(int rc, size_t at, size_t len, char *err, size_t errlen)
{
    if (rc == -2)
        snprintf(err, errlen, "a pre-token at byte %zu is 2 GiB or longer: split the document", at);
    else
        snprintf(err, errlen, "out of memory encoding %zu bytes", len);
    return -1;
}

static int split_level(tok_bpe_t *b, int level, const unsigned char *t, size_t len, size_t at, size_t total,
                       tok_ids_t *out, char *err, size_t errlen);

/* Piece t[0..len) (at byte `at` of the text, total bytes long) to the next
 * pattern, or to BPE after the last. */
static int piece(tok_bpe_t *b, int level, const unsigned char *t, size_t len, size_t at, size_t total, tok_ids_t *out,
                 char *err, size_t errlen)
{
    if (level < b->n_levels)
        return split_level(b, level, t, len, at, total, out, err, errlen);
    int rc = encode_piece(b, t, len, out);
    return rc ? piece_error(rc, at, total, err, errlen) : 0;
}

/* Pattern `level` cuts t[0..len) into its matches and the gaps between
 * them (transformers.js's regexSplit, Hugging Face's Split "Isolated"). */
static int split_level(tok_bpe_t *b, int level, const unsigned char *t, size_t len, size_t at, size_t total,
                       tok_ids_t *out, char *err, size_t errlen)
{
    pcre2_code *re = b->re[level];
    pcre2_match_data *md = b->md[level];
    size_t off = 0, gap = 0; /* gap: the first byte no match has covered yet */
    while (off < len) {
        int rc = b->jit[level] ? pcre2_jit_match(re, t, len, off, 0, md, b->mctx)
                               : pcre2_match(re, t, len, off, 0, md, b->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return match_error(at + off, rc, err, errlen);
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > gap && piece(b, level + 1, t + gap, ms - gap, at + gap, total, out, err, errlen) != 0)
            return -1;
        if (me == ms) { /* an empty match (a custom pattern): step past it */
            gap = ms;
            off = ms + 1;
            continue;
        }
        if (piece(b, level + 1, t + ms, me - ms, at + ms, total, out, err, errlen) != 0)
            return -1;
        gap = off = me;
    }
    return gap < len ? piece(b, level + 1, t + gap, len - gap, at + gap, total, out, err, errlen) : 0;
}

int tok_bpe_encode_bytes(tok_bpe_t *b, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen)
{
    if (b->n_levels == 0) {
        snprintf(err, errlen, "BPE tokenizer has no pre-tokenizer pattern");
        return -1;
    }
    if (b->cache == NULL && (b->cache = calloc((size_t)1 << CACHE_BITS, sizeof *b->cache)) == NULL)
        return piece_error(-1, 0, len, err, errlen);
    return split_level(b, 0, (const unsigned char *)text, len, 0, len, out, err, errlen);
}

int tok_bpe_decode_ids(const tok_bpe_t *b, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const void *bytes = tok_bpe_token(b, ids[i], &len);
        for (int s = 0; bytes == NULL && s < b->n_special; s++)
            if (b->special_id[s] == ids[i]) {
                bytes = b->special_name[s];
                len = strlen(b->special_name[s]);
            }
        if (bytes == NULL) {
            snprintf(err, errlen,
                     "token id %d at position %zu is not in the vocabulary: decode ids this tokenizer made",
                     (int)ids[i], i);
            return -1;
        }
        if (tok_bytes_append(out, bytes, len) != 0) {
            snprintf(err, errlen, "out of memory decoding %zu ids", n);
            return -1;
        }
    }
    return 0;
}

void tok_bpe_attach(tokenizer_t *tk, tok_bpe_t *b, const tokenizer_ops_t *ops)
{
    int32_t top = b->n_ranks - 1;
    for (int i = 0; i < b->n_special; i++)
        if (b->special_id[i] > top)
            top = b->special_id[i];
    tk->ops = ops;
    tk->impl = b;
    tk->vocab_size = top + 1;
    tk->special_name = b->special_name;
    tk->special_id = b->special_id;
    tk->n_special = b->n_special;
}

int tok_bpe_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen)
{
    return tok_bpe_encode_bytes(tk->impl, text, len, out, err, errlen);
}

int tok_bpe_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen)
{
    return tok_bpe_decode_ids(tk->impl, ids, n, out, err, errlen);
}

void tok_bpe_destroy(tokenizer_t *tk)
{
    tok_bpe_free(tk->impl);
    tk->impl = NULL;
}

int tok_bpe_read_file(const char *path, char **data, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    tok_bytes_t buf = {0};
    char chunk[1 << 16];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (tok_bytes_append(&buf, chunk, got) != 0) {
            snprintf(err, errlen, "out of memory reading '%s'", path);
            goto fail;
        }
    if (ferror(f)) {
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (buf.data == NULL && tok_bytes_append(&buf, "", 0) != 0) {
        snprintf(err, errlen, "out of memory reading '%s'", path);
        goto fail;
    }
    fclose(f);
    *data = buf.data;
    *len = buf.n;
    return 0;
fail:
    fclose(f);
    free(buf.data);
    return -1;
}
