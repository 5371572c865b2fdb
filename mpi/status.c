/* The status convention (status.h). */
#include "mpi/status.h"

#include <stdarg.h>
#include <stdio.h>

status_t status_set(status_t st, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}
