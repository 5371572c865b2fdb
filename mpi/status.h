/* The one error convention of dtrain, from the bottom layer up (modelled on
 * nccl-tests' testResult_t/TESTCHECK and PETSc's PetscCall).
 *
 * A fallible call returns a status_t and writes one line, its message, into
 * the caller's error buffer (char *err, size_t errlen: the per-call error
 * context; the innermost failing call writes it, callers above pass it up
 * untouched or prefix what they were doing). 0 is success. The failures are
 * negative, so every "!= 0" and "< 0" test of the older 0/-1 functions holds
 * for a status_t too, and a -1 from one of them is STATUS_FAIL:
 *
 *   STATUS_FAIL   a runtime failure (I/O, MPI, out of memory): exit 1
 *   STATUS_INPUT  bad input the user can fix (options, layout, a file that
 *                 does not fit the model): exit 2, as main() exits for
 *                 option errors
 *
 * CHECK(call) returns the call's status from the enclosing function when it
 * is not STATUS_OK. Ranks that must decide together pass their status and
 * message to agree() (mpi/agree.h), which returns the same status and
 * message on every rank. */
#ifndef DTRAIN_STATUS_H
#define DTRAIN_STATUS_H

#include <stddef.h>

typedef enum {
    STATUS_OK = 0,
    STATUS_FAIL = -1,
    STATUS_INPUT = -2,
} status_t;

/* The process exit code of a status: 0, 1 (STATUS_FAIL and anything else
 * nonzero) or 2 (STATUS_INPUT). */
static inline int status_exit_code(status_t st) { return st == STATUS_OK ? 0 : st == STATUS_INPUT ? 2 : 1; }

/* A 0/-1 return value (or a status) as a status_t: 0 stays STATUS_OK, the
 * two failure codes stay, any other nonzero value is STATUS_FAIL. */
static inline status_t status_of(int rc)
{
    return rc == 0 ? STATUS_OK : rc == STATUS_INPUT ? STATUS_INPUT : STATUS_FAIL;
}

/* Formats the message into err (when err is not NULL and errlen > 0) and
 * returns st: `return status_set(STATUS_INPUT, err, errlen, "--tp %d ...", tp);` */
status_t status_set(status_t st, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Returns from the enclosing function (which returns status_t or int) with
 * the status of `call` when it failed; its message is already in the
 * caller's error buffer. */
#define CHECK(call)                                                                                                    \
    do {                                                                                                               \
        const status_t check_st_ = status_of(call);                                                                    \
        if (check_st_ != STATUS_OK)                                                                                    \
            return check_st_;                                                                                          \
    } while (0)

#endif
