/* Output paths: make missing directories as `mkdir -p` does. */
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

#endif
