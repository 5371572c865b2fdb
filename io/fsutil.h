/* Output paths: make missing directories as `mkdir -p` does; input
 * files: map one whole and read-only; advice on mapped pages. */
#ifndef DTRAIN_FSUTIL_H
#define DTRAIN_FSUTIL_H

#include <stddef.h>

/* Makes DIR and every missing parent (mode 0777 less the umask); an
 * existing directory is fine. 0, or -1 with errno set and the directory
 * that could not be made (or exists as something else: ENOTDIR) in
 * failed. */
int fs_mkdir_p(const char *dir, char *failed, size_t failed_len);

/* fs_mkdir_p of the directory part of the file PATH; nothing to do when
 * PATH has none ("out.h5", "/out.h5"). */
int fs_mkdir_parent(const char *path, char *failed, size_t failed_len);

/* The directory part of PATH into dir: "." when PATH has none, "/" for a
 * file in the root. 0, or -1 when it does not fit dirlen. */
int fs_dir_of(const char *path, char *dir, size_t dirlen);

/* Whether a new file can be made in DIR: creates and removes a temporary
 * file there, so a read-only file system, a directory the user may not
 * write and a pseudo file system (/sys, /proc) are all found before any
 * work, where access(2) would pass root. 0, or -1 with errno set. */
int fs_probe_dir(const char *dir);

/* fs_probe_dir of PATH's directory (fs_dir_of, its name into dir). */
int fs_probe_parent(const char *path, char *dir, size_t dirlen);

/* Maps the regular file PATH whole, read-only and private (the readers of
 * llm.c models and safetensors files). 0 with *map and *size; -1 with one
 * line in err ("cannot open WHAT 'PATH': ...", "cannot map 'PATH': ...");
 * -2, err untouched, when PATH is not a regular file (*regular = 0) or is
 * shorter than min bytes (*regular = 1): the caller names its format.
 * Unmap with munmap(*map, *size). */
int fs_map_file(const char *path, const char *what, size_t min, void **map, size_t *size, int *regular, char *err,
                size_t errlen);

/* madvise(advice) over the whole pages [p, p+n) lies on (from p's page
 * down; the kernel rounds the end up). Advice only: a failure changes
 * nothing (a kernel without MADV_POPULATE_*, before 5.14, refuses those
 * with EINVAL and leaves the work to the first touch). n 0: nothing. */
void fs_advise(const void *p, size_t n, int advice);

#endif
