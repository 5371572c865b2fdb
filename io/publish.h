/* Publishing a file atomically, and the durable writes around it.
 *
 * A published file is written under "PATH.tmp" beside PATH (the same file
 * system, so the rename is atomic), synced, closed, renamed over PATH, and
 * then PATH's directory is synced so that the new name itself survives a
 * crash. A reader sees the old PATH or the whole new one, never a part;
 * after a failure PATH is as it was and PATH.tmp is removed.
 *
 * File data is always synced, and a failed fsync of a file is an error. A
 * directory that cannot be synced (fsync says EINVAL or ENOTSUP, as some
 * network, FUSE and virtual file systems do for directories) counts as
 * synced: that is those file systems' normal behaviour, not a failure.
 *
 * Every function reports one line into err/errlen (errmsg.h) and returns
 * 0 or -1. No MPI: writers on several ranks call these on rank 0, and the
 * fuzz harnesses link this file with the parsers.
 *
 *     publish_t p;
 *     if (publish_open(&p, path, 0644, err, errlen) != 0)
 *         return -1;
 *     if (publish_write(&p, hdr, sizeof hdr, err, errlen) != 0 || ...) {
 *         publish_abort(&p, err, errlen);
 *         return -1;
 *     }
 *     return publish_commit(&p, err, errlen);
 */
#ifndef DTRAIN_PUBLISH_H
#define DTRAIN_PUBLISH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct publish {
    const char *path; /* the caller's string: it must outlive the publish */
    char *tmp;        /* "PATH.tmp" */
    int fd;           /* tmp, open for writing */
    uint64_t off;     /* bytes written so far */
} publish_t;

/* Creates (or truncates) PATH.tmp with mode (less the umask). */
int publish_open(publish_t *p, const char *path, mode_t mode, char *err, size_t errlen);

/* Appends len bytes to the temporary file. */
int publish_write(publish_t *p, const void *buf, size_t len, char *err, size_t errlen);

/* Syncs and closes the temporary file, renames it to PATH and syncs the
 * directory. Ends the publish either way; on a failure before the rename
 * the temporary file is removed. */
int publish_commit(publish_t *p, char *err, size_t errlen);

/* Ends a publish that will not be committed: closes and removes the
 * temporary file. err keeps the caller's message (the first error is the
 * one to fix); a temporary that cannot be removed is added to it as
 * " (and 'PATH.tmp' was left behind)". */
void publish_abort(publish_t *p, char *err, size_t errlen);

/* A temporary file that was written and closed elsewhere (by several
 * ranks, say) into place: sync tmp, rename it to path, sync the directory. */
int publish_rename(const char *tmp, const char *path, char *err, size_t errlen);

/* Syncs the file at path (written by this process or another one). */
int publish_fsync_path(const char *path, char *err, size_t errlen);

/* Syncs the directory holding path ("." when path has no '/'), so that a
 * rename or a creation in it is durable. */
int publish_sync_dir_of(const char *path, char *err, size_t errlen);

/* All of buf at offset off of fd (EINTR retried); path names the file in
 * the message ("cannot write 'PATH': ...: check free space and
 * permissions"). */
int pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *path, char *err, size_t errlen);

#endif
