/* Token shard files: read (llm.c headered shards, nanoGPT raw uint16) and
 * write (llm.c shards). See tokens.h for the format. */
#define _GNU_SOURCE /* glob(3) error codes */
#include "io/tokens.h"

#include "io/errmsg.h"
#include "io/publish.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Headers and tokens are moved between disk and memory with memcpy, which
 * is only the right byte order on a little-endian host (every machine we
 * run on). A big-endian port must add byte swaps here, so refuse to build
 * rather than silently write files nobody else can read. */
#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/tokens.c assumes a little-endian host: add byte swaps before porting"
#endif

#define HEADER_BYTES ((off_t)TOKENS_HEADER_INTS * (off_t)sizeof(int32_t))

/* Tokens converted per write(2) call: large enough to amortise the syscall,
 * small enough to stay in cache. */
#define WRITE_CHUNK 65536

const char *const tokens_format_names[] = {
    [TOKENS_FORMAT_LLMC] = "llmc", [TOKENS_FORMAT_RAW_U16] = "raw-u16", [TOKENS_FORMAT_MEGATRON] = "megatron", NULL};

int tokens_format_parse(const char *s, tokens_format_t *fmt)
{
    if (s == NULL || fmt == NULL)
        return -1;
    for (int i = 0; tokens_format_names[i]; i++)
        if (strcmp(s, tokens_format_names[i]) == 0) {
            *fmt = (tokens_format_t)i;
            return 0;
        }
    return -1;
}

/* ------------------------------------------------------------------ */
/* Reading                                                              */
/* ------------------------------------------------------------------ */

/* read(2) until `len` bytes arrive: reads from network file systems may
 * return short counts or be interrupted by the signals the trainer uses. */
static int read_full(int fd, void *buf, size_t len, const char *path, char *err, size_t errlen)
{
    char *p = buf;
    while (len > 0) {
        ssize_t got = read(fd, p, len);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            seterr(err, errlen, "cannot read token file '%s': %s", path, strerror(errno));
            return -1;
        }
        if (got == 0) {
            seterr(err, errlen,
                   "token file '%s' shrank while being read (is another "
                   "process rewriting it? wait for it and retry)",
                   path);
            return -1;
        }
        p += got;
        len -= (size_t)got;
    }
    return 0;
}

/* A headerless file is plausible when its size is a whole number of
 * uint16 tokens; only then is suggesting --data-format raw-u16 useful. */
static const char *raw_hint(uint64_t size)
{
    return (size > 0 && size % 2 == 0) ? "; if it is a headerless nanoGPT uint16 file, pass "
                                         "--data-format raw-u16"
                                       : "";
}

/* A file too short to hold the header (checked before reading it). */
static int check_header_room(uint64_t size, const char *path, char *err, size_t errlen)
{
    if (size >= (uint64_t)HEADER_BYTES)
        return 0;
    seterr(err, errlen,
           "token file '%s' is truncated: %llu bytes is shorter than "
           "the %lld-byte llm.c header%s; otherwise re-create it "
           "with dtrain-prepare",
           path, (unsigned long long)size, (long long)HEADER_BYTES, raw_hint(size));
    return -1;
}

int tokens_check_header(const void *hdr_bytes, uint64_t size, const char *path, int *width, size_t *count, char *err,
                        size_t errlen)
{
    if (check_header_room(size, path, err, errlen) != 0)
        return -1;
    /* memcpy: the caller's bytes need not be int32-aligned. */
    int32_t hdr[3];
    memcpy(hdr, hdr_bytes, sizeof hdr);
    int32_t magic = hdr[0], version = hdr[1], n = hdr[2];
    int32_t want_version;

    if (magic == TOKENS_MAGIC_U16) {
        *width = 2;
        want_version = TOKENS_VERSION_U16;
    } else if (magic == TOKENS_MAGIC_U32) {
        *width = 4;
        want_version = TOKENS_VERSION_U32;
    } else {
        seterr(err, errlen,
               "token file '%s': bad magic %d (accepted: %d = llm.c uint16, "
               "%d = llm.c uint32)%s; otherwise re-create it with "
               "dtrain-prepare",
               path, (int)magic, TOKENS_MAGIC_U16, TOKENS_MAGIC_U32, raw_hint(size));
        return -1;
    }
    if (version != want_version) {
        seterr(err, errlen,
               "token file '%s': magic %d needs header version %d but the "
               "file has version %d: re-create it with dtrain-prepare",
               path, (int)magic, (int)want_version, (int)version);
        return -1;
    }
    if (n < 0) {
        seterr(err, errlen,
               "token file '%s': negative token count %d in the header: the "
               "file is corrupt, re-create it with dtrain-prepare",
               path, (int)n);
        return -1;
    }
    if (n == 0) {
        seterr(err, errlen,
               "token file '%s' is an empty shard (header token count 0): "
               "remove it or re-create it from non-empty text",
               path);
        return -1;
    }
    uint64_t want = (uint64_t)HEADER_BYTES + (uint64_t)n * (uint64_t)*width;
    if (size != want) {
        seterr(err, errlen,
               "token file '%s' is %s: the header says %d tokens of %d bytes "
               "= %llu bytes with the header, but the file is %llu bytes: "
               "copy it again or re-create it with dtrain-prepare",
               path, size < want ? "truncated" : "overlong (trailing bytes)", (int)n, *width, (unsigned long long)want,
               (unsigned long long)size);
        return -1;
    }
    *count = (size_t)n;
    return 0;
}

/* Widen uint16 tokens to int32 in place. The uint16 body occupies the
 * first half of the buffer; walking from the end means every element is
 * read before its bytes are overwritten (element i lands at bytes
 * [4i, 4i+4), which only covers uint16 elements 2i and 2i+1 >= i). */
static void widen_u16(int32_t *tok, size_t n)
{
    const unsigned char *src = (const unsigned char *)tok;
    for (size_t i = n; i-- > 0;) {
        uint16_t v;
        memcpy(&v, src + 2 * i, sizeof v);
        tok[i] = (int32_t)v;
    }
}

/* Opens a shard that must be a regular file; its size into *size. */
static int open_shard(const char *path, int *fd_out, off_t *size, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open token file '%s': %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        seterr(err, errlen, "cannot stat token file '%s': %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        seterr(err, errlen,
               "token file '%s' is not a regular file: make the pattern match "
               "only shard files",
               path);
        close(fd);
        return -1;
    }
    *fd_out = fd;
    *size = st.st_size;
    return 0;
}

/* Token width and count of a shard of `size` bytes: from its llm.c header
 * (read from fd, which is left after it) or, raw-u16, from its size. */
static int shard_layout(int fd, off_t size, tokens_format_t fmt, const char *path, int *width, size_t *count, char *err,
                        size_t errlen)
{
    if (fmt != TOKENS_FORMAT_RAW_U16) {
        if (check_header_room((uint64_t)size, path, err, errlen) != 0)
            return -1;
        int32_t hdr[TOKENS_HEADER_INTS];
        if (read_full(fd, hdr, sizeof hdr, path, err, errlen) != 0)
            return -1;
        return tokens_check_header(hdr, (uint64_t)size, path, width, count, err, errlen);
    }
    if (size == 0) {
        seterr(err, errlen,
               "token file '%s' is an empty shard (0 bytes): remove it "
               "or re-create it",
               path);
        return -1;
    }
    if (size % 2 != 0) {
        seterr(err, errlen,
               "token file '%s' has an odd size (%lld bytes), so it is "
               "not a raw uint16 token file: check the path and "
               "--data-format",
               path, (long long)size);
        return -1;
    }
    *width = 2;
    *count = (size_t)(size / 2);
    return 0;
}

/* A raw read of an llm.c shard would train on its header as if it were
 * text; an exact magic + version + size match is no accident. tok: the
 * first bytes of the count uint16 tokens, not yet widened. */
static int check_not_llmc(const int32_t *tok, size_t count, const char *path, char *err, size_t errlen)
{
    if (count * 2 < (size_t)HEADER_BYTES)
        return 0;
    int32_t hdr[3];
    memcpy(hdr, tok, sizeof hdr);
    if (hdr[0] == TOKENS_MAGIC_U16 && hdr[1] == TOKENS_VERSION_U16 && hdr[2] > 0 &&
        (off_t)count * 2 == HEADER_BYTES + (off_t)hdr[2] * 2) {
        seterr(err, errlen,
               "token file '%s' is an llm.c shard (magic %d), not a "
               "headerless file: drop --data-format raw-u16",
               path, TOKENS_MAGIC_U16);
        return -1;
    }
    return 0;
}

/* Every token below vocab_size. Compare as unsigned so that uint32 values
 * above INT32_MAX, which would turn negative when widened, are caught by
 * the same test. */
static int check_vocab(const int32_t *tok, size_t count, int vocab_size, const char *path, char *err, size_t errlen)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t v = (uint32_t)tok[i];
        if (v >= (uint32_t)vocab_size) {
            seterr(err, errlen,
                   "token file '%s': token at index %zu has value %u, which "
                   "is >= vocab size %d: the file was made with a different "
                   "tokenizer (check the tokenizer and --vocab-size)",
                   path, i, (unsigned)v, vocab_size);
            return -1;
        }
    }
    return 0;
}

/* Read one shard into sh (path already set). The file is checked fully
 * before the caller sees any of it, so training never starts on a file
 * that fails halfway through. */
static int read_shard(token_shard_t *sh, tokens_format_t fmt, int vocab_size, char *err, size_t errlen)
{
    const char *path = sh->path;
    int rc = -1, fd, width;
    off_t size;
    size_t count;
    if (open_shard(path, &fd, &size, err, errlen) != 0)
        return -1;
    if (shard_layout(fd, size, fmt, path, &width, &count, err, errlen) != 0)
        goto out;
    if (count > SIZE_MAX / sizeof(int32_t)) {
        seterr(err, errlen, "token file '%s' is too large for this host", path);
        goto out;
    }
    sh->tok = malloc(count * sizeof(int32_t));
    if (sh->tok == NULL) {
        seterr(err, errlen,
               "out of memory reading token file '%s' (%zu tokens need %zu "
               "bytes): use fewer or smaller shards",
               path, count, count * sizeof(int32_t));
        goto out;
    }
    if (read_full(fd, sh->tok, count * (size_t)width, path, err, errlen) != 0)
        goto out;
    if (fmt == TOKENS_FORMAT_RAW_U16 && check_not_llmc(sh->tok, count, path, err, errlen) != 0)
        goto out;
    if (width == 2)
        widen_u16(sh->tok, count);
    if (check_vocab(sh->tok, count, vocab_size, path, err, errlen) != 0)
        goto out;
    sh->n = count;
    rc = 0;
out:
    if (close(fd) != 0 && rc == 0) {
        seterr(err, errlen, "cannot close token file '%s': %s", path, strerror(errno));
        rc = -1;
    }
    if (rc != 0) {
        free(sh->tok);
        sh->tok = NULL;
    }
    return rc;
}

static int cmp_path(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void tokens_close(token_set_t *set)
{
    if (set == NULL)
        return;
    for (int i = 0; i < set->n_shards; i++) {
        free(set->shard[i].path);
        free(set->shard[i].tok);
    }
    free(set->shard);
    memset(set, 0, sizeof *set);
}

/* The files pattern names into *g (sorted by glob; gl_pathc 0 when
 * pattern is itself a file's name). */
static int expand_pattern(const char *pattern, glob_t *g, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    errno = 0;
    int grc = glob(pattern, GLOB_ERR, NULL, g);
    if (grc == GLOB_NOMATCH) {
        /* A file name containing glob metacharacters ("run[1].bin") does
         * not match itself as a pattern; accept it as a plain path. */
        struct stat st;
        globfree(g);
        memset(g, 0, sizeof *g);
        if (stat(pattern, &st) == 0)
            return 0;
        seterr(err, errlen,
               "no token files match '%s': run dtrain-prepare, or check the "
               "path",
               pattern);
        return -1;
    } else if (grc != 0) {
        int e = errno;
        globfree(g);
        seterr(err, errlen,
               "cannot expand token file pattern '%s': %s: check that its "
               "directories exist and are readable",
               pattern,
               grc == GLOB_NOSPACE ? "out of memory"
               : e != 0            ? strerror(e)
                                   : "a directory could not be read");
        return -1;
    }
    return 0;
}

/* set's shards named (paths copied) and sorted, none read yet. */
static int list_shards(token_set_t *set, const glob_t *g, const char *pattern, char *err, size_t errlen)
{
    size_t n = (g->gl_pathc > 0) ? g->gl_pathc : 1;
    if (n > INT_MAX) {
        seterr(err, errlen, "pattern '%s' matches too many files", pattern);
        return -1;
    }
    set->shard = calloc(n, sizeof *set->shard);
    if (set->shard == NULL) {
        seterr(err, errlen, "out of memory listing token files '%s'", pattern);
        return -1;
    }
    set->n_shards = (int)n;
    for (size_t i = 0; i < n; i++) {
        const char *p = (g->gl_pathc > 0) ? g->gl_pathv[i] : pattern;
        set->shard[i].path = strdup(p);
        if (set->shard[i].path == NULL) {
            tokens_close(set);
            seterr(err, errlen, "out of memory listing token files '%s'", pattern);
            return -1;
        }
    }
    /* glob sorts by the locale's collation; sort again bytewise so every
     * rank sees the same shard order whatever its environment says. */
    qsort(set->shard, n, sizeof *set->shard, cmp_path);
    return 0;
}

int tokens_open(token_set_t *set, const char *pattern, tokens_format_t fmt, int vocab_size, char *err, size_t errlen)
{
    if (set == NULL || pattern == NULL) {
        seterr(err, errlen, "tokens_open: no token set or pattern given");
        return -1;
    }
    memset(set, 0, sizeof *set);
    if (fmt != TOKENS_FORMAT_LLMC && fmt != TOKENS_FORMAT_RAW_U16) {
        seterr(err, errlen, "tokens_open '%s': unknown data format %d", pattern, (int)fmt);
        return -1;
    }
    if (vocab_size <= 0) {
        seterr(err, errlen,
               "tokens_open '%s': vocab size %d is not positive: set "
               "--vocab-size",
               pattern, vocab_size);
        return -1;
    }
    glob_t g;
    if (expand_pattern(pattern, &g, err, errlen) != 0)
        return -1;
    int rc = list_shards(set, &g, pattern, err, errlen);
    globfree(&g);
    if (rc != 0)
        return -1;
    for (int i = 0; i < set->n_shards; i++) {
        if (read_shard(&set->shard[i], fmt, vocab_size, err, errlen) != 0) {
            tokens_close(set);
            return -1;
        }
        set->n_tokens += set->shard[i].n;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Writing                                                              */
/* ------------------------------------------------------------------ */

int tokens_write(const char *path, const int32_t *tok, size_t n, int width, char *err, size_t errlen)
{
    if (path == NULL || (tok == NULL && n > 0)) {
        seterr(err, errlen, "tokens_write: no path or tokens given");
        return -1;
    }
    if (width != 2 && width != 4) {
        seterr(err, errlen,
               "tokens_write '%s': token width %d is not supported (use 2 "
               "for uint16 or 4 for uint32)",
               path, width);
        return -1;
    }
    if (n == 0) {
        seterr(err, errlen,
               "tokens_write '%s': refusing to write an empty shard (readers "
               "reject them)",
               path);
        return -1;
    }
    if (n > (size_t)INT32_MAX) {
        seterr(err, errlen,
               "tokens_write '%s': %zu tokens exceed the llm.c header's "
               "int32 count: write more, smaller shards",
               path, n);
        return -1;
    }
    /* Check before creating anything, so a bad call leaves no file. */
    int32_t max = (width == 2) ? (int32_t)UINT16_MAX : INT32_MAX;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] > max) {
            seterr(err, errlen,
                   "tokens_write '%s': token at index %zu has value %d, "
                   "which does not fit a %d-byte token (0..%d): use width 4 "
                   "for vocabularies over 65536",
                   path, i, (int)tok[i], width, (int)max);
            return -1;
        }
    }

    unsigned char *buf = malloc((size_t)WRITE_CHUNK * (size_t)width);
    if (buf == NULL) {
        seterr(err, errlen, "out of memory writing '%s'", path);
        return -1;
    }
    publish_t pub;
    if (publish_open(&pub, path, 0644, err, errlen) != 0) {
        free(buf);
        return -1;
    }

    int32_t hdr[TOKENS_HEADER_INTS];
    memset(hdr, 0, sizeof hdr);
    hdr[0] = (width == 2) ? TOKENS_MAGIC_U16 : TOKENS_MAGIC_U32;
    hdr[1] = (width == 2) ? TOKENS_VERSION_U16 : TOKENS_VERSION_U32;
    hdr[2] = (int32_t)n;
    int rc = publish_write(&pub, hdr, sizeof hdr, err, errlen);

    for (size_t off = 0; rc == 0 && off < n; off += WRITE_CHUNK) {
        size_t m = (n - off < WRITE_CHUNK) ? n - off : WRITE_CHUNK;
        if (width == 2) {
            for (size_t i = 0; i < m; i++) {
                uint16_t v = (uint16_t)tok[off + i];
                memcpy(buf + 2 * i, &v, sizeof v);
            }
        } else {
            memcpy(buf, tok + off, m * sizeof(int32_t));
        }
        rc = publish_write(&pub, buf, m * (size_t)width, err, errlen);
    }
    free(buf);
    if (rc != 0) {
        publish_abort(&pub, err, errlen);
        return -1;
    }
    return publish_commit(&pub, err, errlen);
}
