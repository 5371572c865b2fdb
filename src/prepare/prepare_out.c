/* dtrain-prepare's outputs.
 *
 * Each split is first one token stream, PREFIX_SPLIT.stream.tmp, which
 * every rank writes with MPI-IO at its documents' global offsets. At the
 * end the stream becomes the outputs, and only then do final names appear:
 *   llmc      cut into n = ceil(N / --shard-tokens) shards of N/n tokens
 *             (the first N mod n one more): no tiny last shard, which
 *             llm.c's loader would refuse. Shards 1.. are copied out (in
 *             parallel, by rank i mod P) with a 1024-byte header; the
 *             stream itself, which kept 1024 bytes free at its start, gets
 *             shard 0's header and is cut to shard 0's length.
 *   megatron  the stream is PREFIX_SPLIT.bin as it is; rank 0 writes
 *             PREFIX_SPLIT.idx from the document lengths.
 * Every file is synced before it is renamed into place, the directory
 * after; the tokenizer sidecar is written last, so a complete sidecar
 * means a complete set of files. */
#define _GNU_SOURCE /* copy_file_range */
#include "src/prepare/prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/megatron.h"
#include "io/publish.h"
#include "io/tok_sidecar.h"
#include "io/tokens.h"

#define LLMC_HEADER_BYTES ((MPI_Offset)TOKENS_HEADER_INTS * 4)
/* %06d names sort correctly up to this index. */
#define MAX_SHARD_INDEX 999999

const char *prep_split_name(prep_split_t s) { return s == PREP_VAL ? "val" : "train"; }

static int splits_used(const prep_opts_t *o) { return o->val_fraction > 0.0 ? PREP_N_SPLITS : 1; }

/* Bytes per token on disk: llm.c's uint16 up to a vocabulary of 65,536,
 * uint32 above; Megatron's own choice of dtype (uint16 below 65,500). */
static void stream_width(const prep_run_t *r, prep_stream_t *st)
{
    int V = r->tk->vocab_size;
    if (r->o->format == PREP_FORMAT_MEGATRON) {
        st->width = megatron_dtype(megatron_dtype_for_vocab(V))->itemsize;
        st->max_id = st->width == 2 ? 65535 : INT32_MAX;
        st->base = 0;
    } else {
        st->width = V <= 65536 ? 2 : 4;
        st->max_id = st->width == 2 ? 65535 : INT32_MAX;
        st->base = LLMC_HEADER_BYTES;
    }
}

static void mpi_err(int rc, const char *what, const char *path, char *err, size_t errlen)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    prep_err(err, errlen, "%s '%s': %s", what, path, s);
}

static int stream_open(const prep_run_t *r, prep_stream_t *st, char *err, size_t errlen)
{
    int w = snprintf(st->tmp_path, sizeof st->tmp_path, "%s_%s.stream.tmp", r->o->out, prep_split_name(st->split));
    if (w < 0 || (size_t)w >= sizeof st->tmp_path) {
        prep_err(err, errlen, "--out prefix '%s' is too long", r->o->out);
        return -1;
    }
    st->stage = malloc(PREP_STAGE_BYTES);
    if (st->stage == NULL) {
        prep_err(err, errlen, "out of memory for the write buffer of '%s'", st->tmp_path);
        return -1;
    }
    int rc = MPI_File_open(MPI_COMM_WORLD, st->tmp_path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &st->fh);
    if (rc != MPI_SUCCESS) {
        mpi_err(rc, "cannot create", st->tmp_path, err, errlen);
        return -1;
    }
    st->open = 1;
    st->wb_fd = open(st->tmp_path, O_RDONLY | O_CLOEXEC); /* -1: no early writeback, still correct */
    /* a stream left by an interrupted run must not lend us its tail */
    rc = MPI_File_set_size(st->fh, 0);
    if (rc != MPI_SUCCESS) {
        mpi_err(rc, "cannot truncate", st->tmp_path, err, errlen);
        return -1;
    }
    return 0;
}

int prep_streams_open(prep_run_t *r, char *err, size_t errlen)
{
    for (int s = 0; s < PREP_N_SPLITS; s++) {
        prep_stream_t *st = &r->stream[s];
        st->split = (prep_split_t)s;
        st->wb_fd = -1;
        stream_width(r, st);
    }
    for (int s = 0; s < splits_used(r->o); s++)
        if (stream_open(r, &r->stream[s], err, errlen) != 0)
            return -1;
    return 0;
}

/* Write the staged tokens at their offset: one MPI_File_write_at. */
int prep_stream_flush(prep_stream_t *st, char *err, size_t errlen)
{
    if (st->staged == 0)
        return 0;
    MPI_Offset off = st->base + (MPI_Offset)(st->stage_at * (uint64_t)st->width);
    MPI_Status status;
    int bytes = (int)(st->staged * (size_t)st->width), wrote = 0; /* <= PREP_STAGE_BYTES */
    int rc = MPI_File_write_at(st->fh, off, st->stage, bytes, MPI_BYTE, &status);
    if (rc == MPI_SUCCESS)
        rc = MPI_Get_count(&status, MPI_BYTE, &wrote);
    if (rc != MPI_SUCCESS) {
        mpi_err(rc, "cannot write", st->tmp_path, err, errlen);
        return -1;
    }
    if (wrote != bytes) {
        prep_err(err, errlen, "short write to '%s' (%d of %d bytes): is the disk full?", st->tmp_path, wrote, bytes);
        return -1;
    }
    if (st->wb_lo == st->wb_hi || off < st->wb_lo)
        st->wb_lo = off;
    if (st->wb_lo == st->wb_hi || off + bytes > st->wb_hi)
        st->wb_hi = off + bytes;
    st->stage_at += st->staged;
    st->staged = 0;
    return 0;
}

void prep_stream_writeback(prep_stream_t *st)
{
#ifdef SYNC_FILE_RANGE_WRITE
    /* Not checked: it only starts I/O early; MPI_File_sync at the end
     * reports any failure to write. */
    if (st->wb_fd >= 0 && st->wb_hi > st->wb_lo)
        (void)sync_file_range(st->wb_fd, (off64_t)st->wb_lo, (off64_t)(st->wb_hi - st->wb_lo), SYNC_FILE_RANGE_WRITE);
#endif
    st->wb_lo = st->wb_hi = 0;
}

/* Narrow ids to the on-disk width into the stage, which is written out
 * when it is full or when this document does not follow the staged ones
 * (another rank's documents lie between). */
int prep_stream_write(prep_stream_t *st, uint64_t at, const int32_t *ids, size_t n, char *err, size_t errlen)
{
    const size_t per = PREP_STAGE_BYTES / (size_t)st->width;
    if (st->staged > 0 && at != st->stage_at + st->staged && prep_stream_flush(st, err, errlen) != 0)
        return -1;
    if (st->staged == 0)
        st->stage_at = at;
    for (size_t done = 0; done < n;) {
        if (st->staged == per && prep_stream_flush(st, err, errlen) != 0)
            return -1;
        size_t m = n - done < per - st->staged ? n - done : per - st->staged;
        for (size_t i = 0; i < m; i++) {
            int32_t id = ids[done + i];
            if (id < 0 || id > st->max_id) {
                prep_err(err, errlen, "token id %d does not fit the output's %d-byte tokens", (int)id, st->width);
                return -1;
            }
            if (st->width == 2)
                ((uint16_t *)st->stage)[st->staged + i] = (uint16_t)id;
            else
                ((int32_t *)st->stage)[st->staged + i] = id;
        }
        st->staged += m;
        done += m;
    }
    return 0;
}

void prep_streams_free(prep_run_t *r)
{
    for (int s = 0; s < PREP_N_SPLITS; s++) {
        free(r->stream[s].doc_len);
        free(r->stream[s].stage);
        r->stream[s].doc_len = NULL;
        r->stream[s].stage = NULL;
    }
}

/* Sync and close a stream (collective). */
static int stream_close(prep_stream_t *st, char *err, size_t errlen)
{
    if (!st->open)
        return 0;
    int rc = MPI_File_sync(st->fh);
    int rc2 = MPI_File_close(&st->fh);
    st->open = 0;
    if (st->wb_fd >= 0)
        close(st->wb_fd);
    st->wb_fd = -1;
    if (rc != MPI_SUCCESS || rc2 != MPI_SUCCESS) {
        mpi_err(rc != MPI_SUCCESS ? rc : rc2, "cannot sync and close", st->tmp_path, err, errlen);
        return -1;
    }
    return 0;
}

static int shard_name(const prep_run_t *r, prep_split_t s, uint64_t i, const char *suffix, char *path, size_t len,
                      char *err, size_t errlen)
{
    int w = snprintf(path, len, "%s_%s_%06llu.bin%s", r->o->out, prep_split_name(s), (unsigned long long)i, suffix);
    if (w < 0 || (size_t)w >= len) {
        prep_err(err, errlen, "--out prefix '%s' is too long", r->o->out);
        return -1;
    }
    return 0;
}

/* Shard i of n over N tokens: its first token and its length. */
static void shard_range(uint64_t N, uint64_t n, uint64_t i, uint64_t *first, uint64_t *len)
{
    uint64_t q = N / n, rem = N % n;
    *first = i * q + (i < rem ? i : rem);
    *len = q + (i < rem);
}

static void llmc_header(int32_t hdr[TOKENS_HEADER_INTS], int width, uint64_t n)
{
    memset(hdr, 0, TOKENS_HEADER_INTS * sizeof *hdr);
    hdr[0] = width == 2 ? TOKENS_MAGIC_U16 : TOKENS_MAGIC_U32;
    hdr[1] = width == 2 ? TOKENS_VERSION_U16 : TOKENS_VERSION_U32;
    hdr[2] = (int32_t)n;
}

static int write_all(int fd, const void *buf, size_t len, off_t off, const char *path, char *err, size_t errlen)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = pwrite(fd, p, len, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            prep_err(err, errlen, "cannot write '%s': %s", path, w < 0 ? strerror(errno) : "no progress");
            return -1;
        }
        p += w;
        len -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Copy len bytes at src offset `from` to dst offset `to`: in the kernel
 * where it can (copy_file_range), else through a buffer. */
static int copy_range(int in, int out, off_t from, off_t to, size_t len, const char *path, char *err, size_t errlen)
{
    while (len > 0) {
        ssize_t c = copy_file_range(in, &from, out, &to, len, 0);
        if (c > 0) {
            len -= (size_t)c;
            continue;
        }
        if (c < 0 && errno == EINTR)
            continue;
        if (c == 0 || (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP)) {
            prep_err(err, errlen, "cannot copy into '%s': %s", path, c == 0 ? "stream ended early" : strerror(errno));
            return -1;
        }
        char buf[1 << 16];
        size_t m = len < sizeof buf ? len : sizeof buf;
        ssize_t got = pread(in, buf, m, from);
        if (got <= 0 || write_all(out, buf, (size_t)got, to, path, err, errlen) != 0) {
            if (got <= 0)
                prep_err(err, errlen, "cannot read back the token stream for '%s'", path);
            return -1;
        }
        from += got;
        to += got;
        len -= (size_t)got;
    }
    return 0;
}

/* Shard i >= 1 of a split, as PATH.tmp: header + its slice of the stream. */
static int copy_shard(const prep_run_t *r, const prep_stream_t *st, uint64_t n_sh, uint64_t i, char *err, size_t errlen)
{
    char path[PREP_PATH_MAX];
    if (shard_name(r, st->split, i, ".tmp", path, sizeof path, err, errlen) != 0)
        return -1;
    uint64_t first, len;
    shard_range(st->n_tokens, n_sh, i, &first, &len);
    int in = open(st->tmp_path, O_RDONLY | O_CLOEXEC);
    int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = -1;
    if (in < 0 || out < 0) {
        prep_err(err, errlen, "cannot open '%s': %s", in < 0 ? st->tmp_path : path, strerror(errno));
        goto out;
    }
    int32_t hdr[TOKENS_HEADER_INTS];
    llmc_header(hdr, st->width, len);
    if (write_all(out, hdr, sizeof hdr, 0, path, err, errlen) != 0 ||
        copy_range(in, out, (off_t)(st->base + (MPI_Offset)(first * (uint64_t)st->width)), (off_t)sizeof hdr,
                   (size_t)(len * (uint64_t)st->width), path, err, errlen) != 0)
        goto out;
    if (fsync(out) != 0) {
        prep_err(err, errlen, "cannot sync '%s': %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (in >= 0)
        close(in);
    if (out >= 0 && close(out) != 0 && rc == 0) {
        prep_err(err, errlen, "cannot close '%s': %s", path, strerror(errno));
        rc = -1;
    }
    return rc;
}

/* Rank 0: the stream becomes shard 0 (header in its free first 1024
 * bytes, cut to its length); every shard is renamed into place. */
static int publish_llmc(const prep_run_t *r, const prep_stream_t *st, uint64_t n_sh, char *err, size_t errlen)
{
    uint64_t first, len;
    shard_range(st->n_tokens, n_sh, 0, &first, &len);
    int fd = open(st->tmp_path, O_WRONLY | O_CLOEXEC);
    int32_t hdr[TOKENS_HEADER_INTS];
    llmc_header(hdr, st->width, len);
    off_t size = (off_t)sizeof hdr + (off_t)(len * (uint64_t)st->width);
    if (fd < 0 || write_all(fd, hdr, sizeof hdr, 0, st->tmp_path, err, errlen) != 0 || ftruncate(fd, size) != 0 ||
        fsync(fd) != 0 || close(fd) != 0) {
        if (fd >= 0)
            close(fd);
        prep_err(err, errlen, "cannot finish '%s': %s", st->tmp_path, strerror(errno));
        return -1;
    }
    char from[PREP_PATH_MAX], to[PREP_PATH_MAX];
    for (uint64_t i = 0; i < n_sh; i++) {
        if (shard_name(r, st->split, i, "", to, sizeof to, err, errlen) != 0 ||
            (i > 0 && shard_name(r, st->split, i, ".tmp", from, sizeof from, err, errlen) != 0))
            return -1;
        if (rename(i == 0 ? st->tmp_path : from, to) != 0) {
            prep_err(err, errlen, "cannot rename '%s' to '%s': %s", i == 0 ? st->tmp_path : from, to, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Remove shards index >= from left by an earlier run that made more: the
 * readers glob PREFIX_SPLIT_*.bin and would mix two runs. */
static int remove_stale_shards(const prep_run_t *r, prep_split_t s, uint64_t from, char *err, size_t errlen)
{
    char path[PREP_PATH_MAX];
    for (uint64_t i = from; i <= MAX_SHARD_INDEX; i++) {
        if (shard_name(r, s, i, "", path, sizeof path, err, errlen) != 0)
            return -1;
        if (unlink(path) != 0) {
            if (errno == ENOENT)
                return 0;
            prep_err(err, errlen, "cannot remove stale shard '%s': %s: remove it by hand", path, strerror(errno));
            return -1;
        }
        printf("%s: removed (stale, from an earlier run)\n", path);
    }
    return 0;
}

/* Check each shard's size on disk against what was meant. */
static int verify_llmc(const prep_run_t *r, const prep_stream_t *st, uint64_t n_sh, char *err, size_t errlen)
{
    for (uint64_t i = 0; i < n_sh; i++) {
        char path[PREP_PATH_MAX];
        uint64_t first, len;
        shard_range(st->n_tokens, n_sh, i, &first, &len);
        struct stat sb;
        if (shard_name(r, st->split, i, "", path, sizeof path, err, errlen) != 0)
            return -1;
        off_t want = (off_t)LLMC_HEADER_BYTES + (off_t)(len * (uint64_t)st->width);
        if (stat(path, &sb) != 0 || sb.st_size != want) {
            prep_err(err, errlen, "'%s' is not the %lld bytes written: check the file system", path, (long long)want);
            return -1;
        }
        printf("%s: %llu tokens\n", path, (unsigned long long)len);
    }
    return 0;
}

static int finish_llmc(prep_run_t *r, prep_stream_t *st)
{
    char err[PREP_ERRLEN] = "";
    uint64_t n_sh = (st->n_tokens + r->o->shard_tokens - 1) / r->o->shard_tokens;
    int failed = n_sh - 1 > MAX_SHARD_INDEX;
    if (failed)
        prep_err(err, sizeof err, "more than %d %s shards: raise --shard-tokens", MAX_SHARD_INDEX + 1,
                 prep_split_name(st->split));
    for (uint64_t i = 1 + (uint64_t)r->rank; !failed && i < n_sh; i += (uint64_t)r->nranks)
        failed = copy_shard(r, st, n_sh, i, err, sizeof err) != 0;
    if (prep_agree(r, failed, (uint64_t)r->rank, err))
        return PREP_EXIT_IO;
    if (r->rank == 0)
        failed = publish_llmc(r, st, n_sh, err, sizeof err) != 0 ||
                 remove_stale_shards(r, st->split, n_sh, err, sizeof err) != 0 ||
                 publish_sync_dir_of(r->o->out, err, sizeof err) != 0 || verify_llmc(r, st, n_sh, err, sizeof err) != 0;
    return prep_agree(r, failed, 0, err) ? PREP_EXIT_IO : 0;
}

/* Rank 0: PREFIX_SPLIT.idx from the document lengths, the stream renamed
 * to PREFIX_SPLIT.bin, and both read back through the validating reader. */
static int publish_megatron(const prep_run_t *r, const prep_stream_t *st, char *err, size_t errlen)
{
    char prefix[PREP_PATH_MAX], idx[PREP_PATH_MAX + 8], bin[PREP_PATH_MAX + 8];
    snprintf(prefix, sizeof prefix, "%s_%s", r->o->out, prep_split_name(st->split));
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    int64_t *doc_idx = malloc((st->n_docs + 1) * sizeof *doc_idx);
    if (doc_idx == NULL) {
        prep_err(err, errlen, "out of memory for the document index of '%s'", idx);
        return -1;
    }
    for (uint64_t d = 0; d <= st->n_docs; d++)
        doc_idx[d] = (int64_t)d;
    int rc = megatron_idx_write(idx, megatron_dtype_for_vocab(r->tk->vocab_size), st->doc_len, st->n_docs, doc_idx,
                                st->n_docs + 1, err, errlen);
    free(doc_idx);
    if (rc != 0)
        return -1;
    if (rename(st->tmp_path, bin) != 0) {
        prep_err(err, errlen, "cannot rename '%s' to '%s': %s", st->tmp_path, bin, strerror(errno));
        return -1;
    }
    if (publish_sync_dir_of(bin, err, errlen) != 0)
        return -1;
    megatron_idx_t check;
    if (megatron_idx_open(&check, prefix, err, errlen) != 0)
        return -1;
    megatron_idx_close(&check);
    printf("%s: %llu tokens, %llu documents (+ %s)\n", bin, (unsigned long long)st->n_tokens,
           (unsigned long long)st->n_docs, idx);
    return 0;
}

static int finish_megatron(prep_run_t *r, prep_stream_t *st)
{
    char err[PREP_ERRLEN] = "";
    int failed = r->rank == 0 && publish_megatron(r, st, err, sizeof err) != 0;
    return prep_agree(r, failed, 0, err) ? PREP_EXIT_IO : 0;
}

/* With --val-fraction 0 no validation files are written: remove those of
 * an earlier run, or a reader's val glob would pick up old data. */
static int remove_stale_val(const prep_run_t *r, char *err, size_t errlen)
{
    if (r->o->format == PREP_FORMAT_LLMC)
        return remove_stale_shards(r, PREP_VAL, 0, err, errlen);
    const char *ext[2] = {"bin", "idx"};
    for (int k = 0; k < 2; k++) {
        char path[PREP_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s_val.%s", r->o->out, ext[k]);
        if (unlink(path) == 0)
            printf("%s: removed (stale, from an earlier run)\n", path);
        else if (errno != ENOENT) {
            prep_err(err, errlen, "cannot remove stale '%s': %s: remove it by hand", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int write_sidecar(const prep_run_t *r, char *err, size_t errlen)
{
    tok_sidecar_t s;
    char path[PREP_PATH_MAX];
    tok_sidecar_from_tokenizer(&s, r->tk);
    snprintf(s.data_format, sizeof s.data_format, "%s", r->o->format == PREP_FORMAT_MEGATRON ? "megatron" : "llmc");
    s.token_bytes = r->stream[PREP_TRAIN].width;
    for (int k = 0; k < PREP_N_SPLITS; k++) {
        s.docs[k] = r->stream[k].n_docs;
        s.tokens[k] = r->stream[k].n_tokens;
    }
    if (tok_sidecar_path(r->o->out, path, sizeof path) != 0) {
        prep_err(err, errlen, "--out prefix '%s' is too long", r->o->out);
        return -1;
    }
    if (tok_sidecar_write(path, &s, r->tk, err, errlen) != 0)
        return -1;
    printf("%s: tokenizer %s, vocabulary %d\n", path, r->tk->spec, r->tk->vocab_size);
    return 0;
}

/* Splits with no tokens are bad input: say which and what to change. */
static int check_not_empty(const prep_run_t *r, char *err, size_t errlen)
{
    if (r->stream[PREP_TRAIN].n_tokens == 0) {
        prep_err(err, errlen, "no training tokens: the inputs hold no documents");
        return -1;
    }
    if (splits_used(r->o) > 1 && r->stream[PREP_VAL].n_tokens == 0) {
        prep_err(err, errlen,
                 "the validation split is empty: %llu document(s) and --val-fraction %g choose none (the last "
                 "of every 1/F documents is validation): give more documents (--doc-separator splits files) or "
                 "a larger --val-fraction, or --val-fraction 0",
                 (unsigned long long)r->n_docs, r->o->val_fraction);
        return -1;
    }
    return 0;
}

int prep_streams_finish(prep_run_t *r)
{
    char err[PREP_ERRLEN] = "";
    int failed = 0;
    for (int s = 0; s < splits_used(r->o); s++)
        failed |= stream_close(&r->stream[s], err, sizeof err) != 0;
    if (prep_agree(r, failed, (uint64_t)r->rank, err))
        return PREP_EXIT_IO;
    failed = check_not_empty(r, err, sizeof err) != 0;
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_USAGE;
    for (int s = 0; s < splits_used(r->o); s++) {
        prep_stream_t *st = &r->stream[s];
        int rc = r->o->format == PREP_FORMAT_MEGATRON ? finish_megatron(r, st) : finish_llmc(r, st);
        if (rc != 0)
            return rc;
    }
    failed = r->rank == 0 && ((splits_used(r->o) == 1 && remove_stale_val(r, err, sizeof err) != 0) ||
                              write_sidecar(r, err, sizeof err) != 0);
    return prep_agree(r, failed, 0, err) ? PREP_EXIT_IO : 0;
}

void prep_streams_abandon(prep_run_t *r)
{
    char err[PREP_ERRLEN];
    for (int s = 0; s < PREP_N_SPLITS; s++) {
        prep_stream_t *st = &r->stream[s];
        if (st->open && MPI_File_close(&st->fh) == MPI_SUCCESS)
            st->open = 0;
        if (st->wb_fd >= 0)
            close(st->wb_fd);
        st->wb_fd = -1;
        if (r->rank == 0 && st->tmp_path[0])
            unlink(st->tmp_path);
        /* shard copies made before a failure */
        for (uint64_t i = 1; r->rank == 0 && st->tmp_path[0] && i <= MAX_SHARD_INDEX; i++) {
            char path[PREP_PATH_MAX];
            if (shard_name(r, st->split, i, ".tmp", path, sizeof path, err, sizeof err) != 0 || unlink(path) != 0)
                break;
        }
    }
}
