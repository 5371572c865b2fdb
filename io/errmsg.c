/* seterr (see errmsg.h). */
#include "io/errmsg.h"

#include <stdarg.h>
#include <stdio.h>

void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    /* control bytes (a newline in a file name, a CR in a quoted excerpt
     * of the input) would break the one line */
    for (char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
}
