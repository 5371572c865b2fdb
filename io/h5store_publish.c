/* The file h5store_write creates, from its temporary name to its final
 * one: "<dir>/.<name>.tmp" beside the final path (same file system, so the
 * rename is atomic), its space reserved before any data is written, and,
 * once every rank has flushed and closed it, made durable under the final
 * name by rank 0. */
#define _GNU_SOURCE /* fallocate */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/h5store_internal.h"
#include "io/publish.h"

/* "<dir>/.<base>.tmp" beside the final file (same file system: rename is
 * atomic; hidden, and ckpt.c knows the name of a killed job's leftovers). */
int h5s_temp_path(const char *path, char *tmp, size_t n, char *err, size_t errlen)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (*base == '\0') {
        seterr(err, errlen, "'%s' names a directory, not a file", path);
        return -1;
    }
    int dl = slash ? (int)(slash - path) : 0;
    int b = slash ? snprintf(tmp, n, "%.*s/.%s.tmp", dl, path, base) : snprintf(tmp, n, ".%s.tmp", base);
    if (b < 0 || (size_t)b >= n) {
        seterr(err, errlen, "path too long: %s", path);
        return -1;
    }
    return 0;
}

/* Bytes a file of these tensors can take: the data, plus HDF5's metadata
 * (measured at about 2.7 KiB per chunked dataset with its checksum
 * attribute; three times that is reserved) and the root attributes. */
off_t h5s_file_bytes_bound(const h5store_tensor_t *t, int nt, int nrec)
{
    off_t b = (off_t)1 << 20;
    for (int i = 0; i < nt; i++)
        b += (off_t)t[i].shape[0] * t[i].shape[1] * (off_t)sizeof(float) + 8192;
    return b + (off_t)nrec * 64;
}

/* Rank 0, right after the file is created: reserve its blocks before any
 * data is written. A write that fails for lack of space on one rank but not
 * another leaves HDF5's collective metadata cache in different states on
 * different ranks, and the collective H5Fclose that follows then never
 * returns; reserving the space up front turns a full disk into an error
 * that every rank sees before the first collective write. Where the file
 * system cannot reserve (no fallocate), the free space is checked instead. */
int h5s_reserve_space(const char *tmp, off_t bytes, char *err, size_t errlen)
{
    const double mib = (double)bytes / (1 << 20);
#ifdef FALLOC_FL_KEEP_SIZE
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) {
        seterr(err, errlen, "cannot open %s to reserve space: %s", tmp, strerror(errno));
        return -1;
    }
    /* KEEP_SIZE: the file's length stays HDF5's business */
    int rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, bytes);
    int e = errno;
    if (close(fd) != 0 && rc == 0) {
        seterr(err, errlen, "cannot close %s: %s", tmp, strerror(errno));
        return -1;
    }
    if (rc == 0)
        return 0;
    if (e != EOPNOTSUPP && e != ENOSYS) {
        seterr(err, errlen, "cannot reserve %.1f MiB for %s: %s", mib, tmp, strerror(e));
        return -1;
    }
#endif
    struct statvfs fs;
    if (statvfs(tmp, &fs) != 0) {
        seterr(err, errlen, "cannot query free space for %s: %s", tmp, strerror(errno));
        return -1;
    }
    if ((double)fs.f_bavail * (double)fs.f_frsize < (double)bytes) {
        seterr(err, errlen, "cannot write %s: %s (needs up to %.1f MiB, %.1f MiB free)", tmp, strerror(ENOSPC), mib,
               (double)fs.f_bavail * (double)fs.f_frsize / (1 << 20));
        return -1;
    }
    return 0;
}

/* Rank 0: the part of the reservation past the end of the closed file
 * is given back (where the file system can punch holes). */
static int release_unused(const char *tmp, off_t reserved, char *err, size_t errlen)
{
#ifdef FALLOC_FL_PUNCH_HOLE
    int fd = open(tmp, O_RDWR);
    if (fd < 0) {
        seterr(err, errlen, "cannot open %s: %s", tmp, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) == 0 && st.st_size < reserved &&
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, st.st_size, reserved - st.st_size) != 0 &&
        errno != EOPNOTSUPP && errno != ENOSYS) {
        seterr(err, errlen, "cannot release unused space of %s: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (close(fd) != 0 && rc == 0) {
        seterr(err, errlen, "cannot close %s: %s", tmp, strerror(errno));
        rc = -1;
    }
    return rc;
#else
    (void)tmp, (void)reserved, (void)err, (void)errlen;
    return 0;
#endif
}

/* Rank 0 only: make the closed temporary file durable under its final
 * name: the unused reservation released, then io/publish.c's sync of the
 * data, rename and sync of the directory entry. */
int h5s_publish(const char *tmp, const char *path, off_t reserved, char *err, size_t errlen)
{
    if (release_unused(tmp, reserved, err, errlen))
        return -1;
    return publish_rename(tmp, path, err, errlen);
}
