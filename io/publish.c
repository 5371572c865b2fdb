/* Atomic publishing of a file (see publish.h). */
#define _GNU_SOURCE /* O_DIRECTORY */
#include "io/publish.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/errmsg.h"

int pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *path, char *err, size_t errlen)
{
    const char *q = buf;
    while (len > 0) {
        ssize_t w = pwrite(fd, q, len, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            seterr(err, errlen, "cannot write '%s': %s: check free space and permissions", path,
                   w < 0 ? strerror(errno) : "no progress");
            return -1;
        }
        q += w, off += (uint64_t)w, len -= (size_t)w;
    }
    return 0;
}

int publish_sync_dir_of(const char *path, char *err, size_t errlen)
{
    char *dir = strdup(path);
    if (dir == NULL) {
        seterr(err, errlen, "out of memory writing '%s'", path);
        return -1;
    }
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        strcpy(dir, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    int rc = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open directory '%s' of '%s' to sync it: %s", dir, path, strerror(errno));
        rc = -1;
    } else {
        if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
            seterr(err, errlen, "cannot sync directory '%s' of '%s': %s", dir, path, strerror(errno));
            rc = -1;
        }
        if (close(fd) != 0 && rc == 0) {
            seterr(err, errlen, "cannot close directory '%s': %s", dir, strerror(errno));
            rc = -1;
        }
    }
    free(dir);
    return rc;
}

int publish_fsync_path(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open '%s' to sync it: %s", path, strerror(errno));
        return -1;
    }
    int rc = fsync(fd) != 0 ? -1 : 0;
    if (rc != 0)
        seterr(err, errlen, "cannot sync '%s': %s: check free space", path, strerror(errno));
    close(fd);
    return rc;
}

int publish_rename(const char *tmp, const char *path, char *err, size_t errlen)
{
    if (publish_fsync_path(tmp, err, errlen) != 0)
        return -1;
    if (rename(tmp, path) != 0) {
        seterr(err, errlen, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        return -1;
    }
    return publish_sync_dir_of(path, err, errlen);
}

int publish_open(publish_t *p, const char *path, mode_t mode, char *err, size_t errlen)
{
    *p = (publish_t){.path = path, .fd = -1};
    size_t n = strlen(path);
    p->tmp = malloc(n + 5);
    if (p->tmp == NULL) {
        seterr(err, errlen, "out of memory writing '%s'", path);
        return -1;
    }
    memcpy(p->tmp, path, n);
    memcpy(p->tmp + n, ".tmp", 5);
    p->fd = open(p->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (p->fd < 0) {
        seterr(err, errlen, "cannot create '%s': %s: check that the directory exists and is writable", p->tmp,
               strerror(errno));
        free(p->tmp);
        p->tmp = NULL;
        return -1;
    }
    return 0;
}

int publish_write(publish_t *p, const void *buf, size_t len, char *err, size_t errlen)
{
    if (pwrite_full(p->fd, buf, len, p->off, p->tmp, err, errlen) != 0)
        return -1;
    p->off += len;
    return 0;
}

void publish_abort(publish_t *p, char *err, size_t errlen)
{
    if (p->fd >= 0)
        close(p->fd);
    if (p->tmp != NULL && unlink(p->tmp) != 0 && errno != ENOENT && err != NULL && errlen > 0) {
        size_t used = strnlen(err, errlen);
        if (used + 1 < errlen)
            snprintf(err + used, errlen - used, " (and '%s' was left behind)", p->tmp);
    }
    free(p->tmp);
    *p = (publish_t){.fd = -1};
}

int publish_commit(publish_t *p, char *err, size_t errlen)
{
    /* A rename of unsynced data can survive a crash as a file of zeros:
     * sync first, so that PATH only ever names a whole file. */
    if (fsync(p->fd) != 0) {
        seterr(err, errlen, "cannot sync '%s': %s: check free space", p->tmp, strerror(errno));
        publish_abort(p, err, errlen);
        return -1;
    }
    int fd = p->fd;
    p->fd = -1;
    if (close(fd) != 0) {
        seterr(err, errlen, "cannot close '%s': %s: check free space", p->tmp, strerror(errno));
        publish_abort(p, err, errlen);
        return -1;
    }
    if (rename(p->tmp, p->path) != 0) {
        seterr(err, errlen, "cannot rename '%s' to '%s': %s", p->tmp, p->path, strerror(errno));
        publish_abort(p, err, errlen);
        return -1;
    }
    free(p->tmp);
    const char *path = p->path;
    *p = (publish_t){.fd = -1};
    return publish_sync_dir_of(path, err, errlen);
}
