/* The parallel-HDF5 tensor store. See h5store.h for the API,
 * h5store_internal.h for which file holds what, and doc/format.md for the
 * file layout. This file: what every piece uses (error lines, the quiet
 * error stack, closing objects, agreement, the staging size, file access).
 *
 * Collective discipline: every HDF5 call that is collective under MPI-IO
 * (file create/open/flush/close, dataset and attribute creation with
 * collective metadata writes) is entered by every rank in the same order.
 * Inputs are validated and agreed on before the file is created, and ranks
 * agree again after each tensor, so a rank never goes on to the next
 * collective call after another rank failed. Data moves by independent
 * transfers both ways (a failed data write leaves no collective state
 * behind); reads also use independent metadata reads, so ranks may read
 * different tensors in any order. */
#include "io/h5store.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/h5store_internal.h"

/* Data move between the caller's tensors and the file through a staging
 * buffer of this many floats (8 MiB; more when one row is longer), a
 * block of rows at a time: the kernel then copies to and from the same few
 * pages every time instead of walking gigabytes of the caller's memory.
 * On the dev VM the kernel's first touch of each user page costs ~6 us (a
 * 1.5 GB checkpoint: ~2 s per direction); the user-space memcpy into the
 * stage costs ~0.2 s, and the CRC of a block is taken while it is in cache. */
#define STAGE_ELEMS ((int64_t)1 << 21)

/* The stage size: STAGE_ELEMS, or H5STORE_STAGE_FLOATS from the environment
 * (for tests: a stage of a few floats makes small tensors take many
 * blocks and rows longer than the stage). */
int64_t h5s_stage_elems(void)
{
    const char *v = getenv("H5STORE_STAGE_FLOATS");
    const long long x = v ? atoll(v) : 0;
    return x > 0 ? (int64_t)x : STAGE_ELEMS;
}

int64_t h5s_stage_rows(int64_t elems, int64_t cols)
{
    const int64_t r = cols > 0 ? elems / cols : elems;
    return r > 0 ? r : 1;
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

typedef struct ewalk {
    char *buf;
    size_t len;
    int n;
} ewalk_t;

/* Walking upward starts at the innermost (most specific) entry; keep it
 * with its class names and the one above it, as platform.md recommends. */
static herr_t ewalk_cb(unsigned n, const H5E_error2_t *e, void *data)
{
    ewalk_t *w = data;
    (void)n;
    if (w->n >= 2)
        return 0;
    size_t used = strlen(w->buf);
    if (used + 1 >= w->len)
        return 0;
    if (w->n == 0) {
        char maj[128] = "", min[128] = "";
        if (H5Eget_msg(e->maj_num, NULL, maj, sizeof maj) < 0)
            maj[0] = '\0';
        if (H5Eget_msg(e->min_num, NULL, min, sizeof min) < 0)
            min[0] = '\0';
        snprintf(w->buf + used, w->len - used, "%s() %s (%s: %s)", e->func_name, e->desc ? e->desc : "", maj, min);
    } else {
        snprintf(w->buf + used, w->len - used, " <- %s() %s", e->func_name, e->desc ? e->desc : "");
    }
    w->n++;
    return 0;
}

static void h5err_v(char *err, size_t errlen, const char *fmt, va_list ap)
{
    char what[MSG_LEN], why[MSG_LEN] = "";
    vsnprintf(what, sizeof what, fmt, ap);
    ewalk_t w = {why, sizeof why, 0};
    if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, ewalk_cb, &w) < 0 || why[0] == '\0')
        snprintf(why, sizeof why, "unknown HDF5 error");
    if (H5Eclear2(H5E_DEFAULT) < 0) {
        /* nothing more to report: the line below already says what failed */
    }
    for (char *p = why; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    seterr(err, errlen, "%s: %s", what, why);
}

void h5s_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    h5err_v(err, errlen, fmt, ap);
    va_end(ap);
}

void h5s_mpierr(char *err, size_t errlen, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    seterr(err, errlen, "%s failed: %s", what, s);
}

void h5s_quiet_on(h5s_quiet_t *q)
{
    q->saved = H5Eget_auto2(H5E_DEFAULT, &q->fn, &q->data) >= 0;
    if (H5Eset_auto2(H5E_DEFAULT, NULL, NULL) < 0) {
        /* still correct, only noisier */
    }
}

void h5s_quiet_off(const h5s_quiet_t *q)
{
    if (q->saved && H5Eset_auto2(H5E_DEFAULT, q->fn, q->data) < 0) {
        /* the caller's handler stays off; nothing else to do */
    }
}

int h5s_close(hid_t id, h5s_close_fn close_fn, int rc) { return id >= 0 && close_fn(id) < 0 && rc == 0 ? -1 : rc; }

int h5s_close_msg(hid_t id, h5s_close_fn close_fn, int rc, char *err, size_t errlen, const char *fmt, ...)
{
    if (id < 0 || close_fn(id) >= 0 || rc != 0)
        return rc;
    va_list ap;
    va_start(ap, fmt);
    h5err_v(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ------------------------------------------------------------------ */
/* File access                                                        */
/* ------------------------------------------------------------------ */

hid_t h5s_mpio_fapl(MPI_Comm comm, int collective_metadata, char *err, size_t errlen)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0 ||
        /* v18+ object headers: attributes over 64 KiB (large checksum
         * tables) go to dense storage instead of failing */
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0 ||
        (collective_metadata && (H5Pset_all_coll_metadata_ops(fapl, 1) < 0 || H5Pset_coll_metadata_write(fapl, 1) < 0 ||
                                 /* the writer: every chunk of 4 KiB or more starts at a multiple
           * of 64 bytes, so a reader's view of it (h5store_view) is a
           * float array that SIMD loads and the transposes can take; at
           * most 63 bytes a chunk (the space bound allows 8 KiB) */
                                 H5Pset_alignment(fapl, 4096, 64) < 0))) {
        h5s_err(err, errlen, "cannot set up MPI-IO file access");
        (void)h5s_close(fapl, H5Pclose, -1); /* already failing */
        return H5I_INVALID_HID;
    }
    return fapl;
}
