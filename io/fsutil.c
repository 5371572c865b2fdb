#include "io/fsutil.h"

#include "io/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One component: made, or already a directory. */
static int make_one(const char *dir)
{
    if (mkdir(dir, 0777) == 0)
        return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST) {
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
            return 0;
        e = ENOTDIR;
    }
    errno = e;
    return -1;
}

int fs_mkdir_p(const char *dir, char *failed, size_t failed_len)
{
    size_t n = strlen(dir);
    if (n == 0) {
        errno = ENOENT;
        snprintf(failed, failed_len, "%s", dir);
        return -1;
    }
    char *p = malloc(n + 1);
    if (!p) {
        snprintf(failed, failed_len, "%s", dir);
        return -1;
    }
    memcpy(p, dir, n + 1);
    int rc = 0;
    /* every prefix that ends before a '/', then the whole path */
    for (size_t i = 1; i <= n && rc == 0; i++) {
        if (i < n && (p[i] != '/' || p[i - 1] == '/'))
            continue;
        char c = p[i];
        p[i] = '\0';
        if (make_one(p) != 0) {
            int e = errno;
            snprintf(failed, failed_len, "%s", p);
            errno = e;
            rc = -1;
        }
        p[i] = c;
    }
    int e = errno;
    free(p);
    errno = e;
    return rc;
}

int fs_mkdir_parent(const char *path, char *failed, size_t failed_len)
{
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path)
        return 0;
    size_t n = (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (!dir) {
        snprintf(failed, failed_len, "%s", path);
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    int rc = fs_mkdir_p(dir, failed, failed_len), e = errno;
    free(dir);
    errno = e;
    return rc;
}

int fs_dir_of(const char *path, char *dir, size_t dirlen)
{
    const char *slash = strrchr(path, '/');
    int n = !slash          ? snprintf(dir, dirlen, ".")
            : slash == path ? snprintf(dir, dirlen, "/")
                            : snprintf(dir, dirlen, "%.*s", (int)(slash - path), path);
    return n < 0 || (size_t)n >= dirlen ? -1 : 0;
}

int fs_probe_dir(const char *dir)
{
    char probe[4096];
    if (snprintf(probe, sizeof probe, "%s/.dtrain-probe-XXXXXX", dir) >= (int)sizeof probe) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = mkstemp(probe);
    if (fd < 0)
        return -1;
    close(fd);
    unlink(probe);
    return 0;
}

int fs_probe_parent(const char *path, char *dir, size_t dirlen)
{
    if (fs_dir_of(path, dir, dirlen) != 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return fs_probe_dir(dir);
}

int fs_map_file(const char *path, const char *what, size_t min, void **map, size_t *size, int *regular, char *err,
                size_t errlen)
{
    *map = NULL;
    *size = 0;
    *regular = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open %s '%s': %s", what, path, strerror(errno));
        return -1;
    }
    struct stat st;
    *regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (!*regular || (uint64_t)st.st_size < (uint64_t)min) {
        close(fd);
        return -2;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    close(fd); /* the mapping outlives the descriptor */
    if (m == MAP_FAILED) {
        seterr(err, errlen, "cannot map '%s': %s", path, strerror(e));
        return -1;
    }
    *map = m;
    *size = (size_t)st.st_size;
    return 0;
}

void fs_advise(const void *p, size_t n, int advice)
{
    if (n == 0)
        return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p & ~(page - 1);
    (void)madvise((void *)lo, (uintptr_t)p + n - lo, advice);
}
