/* TensorBoard event files (tfevents.h): TFRecord framing with masked
 * CRC-32C around hand-encoded Event protobufs.
 *
 * The messages and fields written (TensorBoard's compat/proto/event.proto
 * and summary.proto; the tag byte is field << 3 | wire type):
 *
 *   Event.wall_time      1  double  I64     0x09  8-byte LE double
 *   Event.step           2  int64   VARINT  0x10  varint of (uint64)step
 *   Event.file_version   3  string  LEN     0x1A  varint length + bytes
 *   Event.summary        5  Summary LEN     0x2A  varint length + Summary
 *   Summary.value        1  Value   LEN     0x0A  one per scalar
 *   Value.tag            1  string  LEN     0x0A  varint length + UTF-8
 *   Value.simple_value   2  float   I32     0x15  4-byte LE float
 *
 * Fields go out in number order and step 0 is omitted, as a protobuf
 * library serialises them (simple_value is in a oneof upstream, so it is
 * written even when 0). TensorBoard 2.x turns simple_value scalars into
 * its scalar plugin's data by itself: no metadata (Value field 9) needed.
 *
 * Record: uint64 LE length | uint32 LE masked CRC of the 8 length bytes |
 * data | uint32 LE masked CRC of the data, where masked(c) = ((c >> 15) |
 * (c << 17)) + 0xA282EAD8 mod 2^32 (TFRecord's mask, so a CRC stored
 * inside CRC'd data does not cancel out). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "io/tfevents.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "io/crc32c.h"
#include "io/errmsg.h"
#include "io/fsutil.h"

#define FILE_VERSION "brain.Event:2"
#define MAX_SUFFIX 1000 /* files of one second, host and pid tried before giving up */

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

struct tfevents {
    FILE *f;
    char *path;
    uint8_t *buf; /* one record: 12-byte head, payload, 4-byte CRC */
    size_t cap;
    int broken; /* a write failed: the file may end inside a record */
    crc32c_t crc;
};

/* ---- protobuf encoding ---- */

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    for (; v >= 0x80; v >>= 7)
        n++;
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    for (; v >= 0x80; v >>= 7)
        *p++ = (uint8_t)(v | 0x80);
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *put_le(uint8_t *p, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *put_key(uint8_t *p, unsigned field, unsigned wire_type)
{
    return put_varint(p, (uint64_t)(field << 3 | wire_type));
}

static uint8_t *put_bytes(uint8_t *p, unsigned field, const void *s, size_t n)
{
    p = put_varint(put_key(p, field, WT_LEN), n);
    memcpy(p, s, n);
    return p + n;
}

static uint8_t *put_double(uint8_t *p, unsigned field, double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return put_le(put_key(p, field, WT_I64), u, 8);
}

static uint8_t *put_float(uint8_t *p, unsigned field, float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return put_le(put_key(p, field, WT_I32), u, 4);
}

/* A length-delimited field of n bytes, key and length included. */
static size_t len_field(size_t n) { return 1 + varint_len(n) + n; }

/* Value{tag, simple_value} without its own key and length. */
static size_t value_len(const char *tag) { return len_field(strlen(tag)) + 1 + 4; }

static size_t summary_len(const tfevents_scalar_t *v, int n)
{
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += len_field(value_len(v[i].tag));
    return len;
}

/* The Event's encoded size: a header (version set, no scalars) or a step's. */
static size_t event_len(int64_t step, const char *version, const tfevents_scalar_t *v, int n)
{
    size_t len = 1 + 8;
    if (step != 0)
        len += 1 + varint_len((uint64_t)step);
    if (version)
        len += len_field(strlen(version));
    if (n > 0)
        len += len_field(summary_len(v, n));
    return len;
}

static uint8_t *put_event(uint8_t *p, double wall_time, int64_t step, const char *version, const tfevents_scalar_t *v,
                          int n)
{
    p = put_double(p, 1, wall_time);
    if (step != 0)
        p = put_varint(put_key(p, 2, WT_VARINT), (uint64_t)step);
    if (version)
        p = put_bytes(p, 3, version, strlen(version));
    if (n > 0) {
        p = put_varint(put_key(p, 5, WT_LEN), summary_len(v, n));
        for (int i = 0; i < n; i++) {
            p = put_varint(put_key(p, 1, WT_LEN), value_len(v[i].tag));
            p = put_bytes(p, 1, v[i].tag, strlen(v[i].tag));
            p = put_float(p, 2, (float)v[i].value);
        }
    }
    return p;
}

/* ---- records ---- */

static uint32_t masked_crc(const crc32c_t *c, const uint8_t *data, size_t n)
{
    uint32_t crc = crc32c_update(c, 0, data, n);
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

static int fail_write(tfevents_t *w, int e, char *err, size_t errlen)
{
    w->broken = 1;
    seterr(err, errlen, "cannot write '%s': %s: check free space and permissions", w->path, strerror(e));
    return -1;
}

/* Encodes one Event into a record and hands it to the kernel. */
static int write_event(tfevents_t *w, double wall_time, int64_t step, const char *version, const tfevents_scalar_t *v,
                       int n, char *err, size_t errlen)
{
    if (w->broken) {
        seterr(err, errlen, "cannot write '%s': an earlier write to it failed", w->path);
        return -1;
    }
    size_t len = event_len(step, version, v, n), total = 12 + len + 4;
    if (total > w->cap) {
        uint8_t *b = realloc(w->buf, total);
        if (!b) {
            seterr(err, errlen, "cannot write '%s': out of memory for a %zu-byte record", w->path, total);
            return -1;
        }
        w->buf = b;
        w->cap = total;
    }
    uint8_t *p = put_le(w->buf, len, 8);
    p = put_le(p, masked_crc(&w->crc, w->buf, 8), 4);
    p = put_event(p, wall_time, step, version, v, n);
    put_le(p, masked_crc(&w->crc, w->buf + 12, len), 4);
    errno = 0;
    if (fwrite(w->buf, 1, total, w->f) != total || fflush(w->f) != 0)
        return fail_write(w, errno ? errno : EIO, err, errlen);
    return 0;
}

/* ---- files ---- */

/* mkdir -p (io/fsutil.h), with the directory that failed in the message. */
static int mkdir_p(const char *dir, char *err, size_t errlen)
{
    char failed[4096];
    if (fs_mkdir_p(dir, failed, sizeof failed) == 0)
        return 0;
    seterr(err, errlen, "cannot create directory '%s': %s", failed,
           errno == ENOTDIR ? "a file of that name exists" : strerror(errno));
    return -1;
}

/* Creates the first free "events.out.tfevents.SECS.HOST.PID.N" in dir. */
static int create_file(tfevents_t *w, const char *dir, const char *host, long pid, double wall_time, char *err,
                       size_t errlen)
{
    size_t len = strlen(dir) + strlen(host) + 96;
    if (!(w->path = malloc(len))) {
        seterr(err, errlen, "cannot create an event file in '%s': out of memory", dir);
        return -1;
    }
    long long secs = (long long)wall_time;
    for (int k = 0; k < MAX_SUFFIX; k++) {
        snprintf(w->path, len, "%s/events.out.tfevents.%010lld.%s.%ld.%d", dir, secs, host, pid, k);
        /* "x": never truncate a file another writer (or an earlier run in
         * this second with this pid) made */
        if ((w->f = fopen(w->path, "wbx")))
            return 0;
        if (errno != EEXIST) {
            seterr(err, errlen, "cannot create '%s': %s: check the directory's permissions", w->path, strerror(errno));
            return -1;
        }
    }
    seterr(err, errlen, "cannot create '%s': %d event files of this second, host and pid exist already", w->path,
           MAX_SUFFIX);
    return -1;
}

int tfevents_open(const char *dir, const char *host, long pid, double wall_time, tfevents_t **w, char *err,
                  size_t errlen)
{
    *w = NULL;
    if (!dir[0] || !host[0] || strchr(host, '/')) {
        seterr(err, errlen, "cannot create an event file in '%s' for host '%s': %s", dir, host,
               dir[0] ? "the host name must be non-empty and without '/'" : "the directory name is empty");
        return -1;
    }
    if (!(wall_time >= 0 && wall_time < 1e10)) {
        seterr(err, errlen, "cannot create an event file in '%s': wall time %g is not seconds since 1970", dir,
               wall_time);
        return -1;
    }
    tfevents_t *t = calloc(1, sizeof *t);
    if (!t) {
        seterr(err, errlen, "cannot create an event file in '%s': out of memory", dir);
        return -1;
    }
    crc32c_init(&t->crc, 1);
    if (mkdir_p(dir, err, errlen) != 0 || create_file(t, dir, host, pid, wall_time, err, errlen) != 0) {
        tfevents_close(t, NULL, 0);
        return -1;
    }
    if (write_event(t, wall_time, 0, FILE_VERSION, NULL, 0, err, errlen) != 0) {
        remove(t->path); /* a file without its header is no event file */
        tfevents_close(t, NULL, 0);
        return -1;
    }
    *w = t;
    return 0;
}

int tfevents_scalars(tfevents_t *w, int64_t step, double wall_time, const tfevents_scalar_t *v, int n, char *err,
                     size_t errlen)
{
    if (n < 1) {
        seterr(err, errlen, "'%s': an event needs at least one scalar (got %d)", w->path, n);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (!v[i].tag || !v[i].tag[0]) {
            seterr(err, errlen, "'%s': scalar %d of step %lld has no tag", w->path, i, (long long)step);
            return -1;
        }
    return write_event(w, wall_time, step, NULL, v, n, err, errlen);
}

double tfevents_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *tfevents_path(const tfevents_t *w) { return w->path; }

int tfevents_close(tfevents_t *w, char *err, size_t errlen)
{
    if (!w)
        return 0;
    int rc = 0;
    if (w->f && fclose(w->f) != 0 && !w->broken) {
        seterr(err, errlen, "cannot write '%s': %s: check free space and permissions", w->path, strerror(errno));
        rc = -1;
    }
    free(w->path);
    free(w->buf);
    free(w);
    return rc;
}
