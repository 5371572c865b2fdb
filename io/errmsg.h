/* The err/errlen convention of io/: a function that fails writes one line
 * into the caller's buffer (char *err, size_t errlen) and returns -1.
 *
 * seterr formats that line, printf style, truncated to errlen, control
 * bytes replaced by '?' so that it stays one line; err == NULL or
 * errlen == 0 means the caller does not want the text. Needs no MPI
 * (the fuzz harnesses link it with the parsers). */
#ifndef DTRAIN_ERRMSG_H
#define DTRAIN_ERRMSG_H

#include <stddef.h>

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void seterr(char *err, size_t errlen, const char *fmt, ...);

#endif
