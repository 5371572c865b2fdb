/* TensorBoard event files: scalars a run reports, one Event per step.
 *
 * A file is a sequence of TFRecords (uint64 LE length | masked CRC-32C of
 * those 8 bytes | data | masked CRC-32C of the data), each record's data an
 * `Event` protobuf: the first {wall_time, file_version "brain.Event:2"},
 * then {wall_time, step, summary {value {tag, simple_value}...}} per call
 * of tfevents_scalars. The three messages are encoded by hand (the field
 * numbers of TensorBoard's event.proto and summary.proto are in
 * tfevents.c), so no protobuf library is needed. TensorBoard reads any
 * file whose name contains "tfevents" in the directory it is pointed at.
 *
 * Each record is flushed to the kernel as it is written, so a run that
 * crashes keeps every step it reported (not fsynced: a power loss may lose
 * the last ones). Every function reports one line naming the file into
 * err/errlen (io/errmsg.h) and returns 0 or -1. No MPI: the caller writes
 * from one rank.
 *
 *     tfevents_t *w;
 *     if (tfevents_open(dir, host, getpid(), tfevents_now(), &w, err, errlen) != 0) ...
 *     tfevents_scalar_t v[] = {{"train/loss", loss}, {"train/lr", lr}};
 *     if (tfevents_scalars(w, step, tfevents_now(), v, 2, err, errlen) != 0) ...
 *     if (tfevents_close(w, err, errlen) != 0) ...
 *
 * (metrics_write_tfevents, src/train/metrics.h, turns a step's record into its
 * scalars.)
 */
#ifndef DTRAIN_TFEVENTS_H
#define DTRAIN_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tfevents tfevents_t;

typedef struct tfevents_scalar {
    const char *tag; /* "train/loss", "perf/mfu", ...: UTF-8, '/' groups them in TensorBoard */
    double value;    /* stored as a float (simple_value); NaN and infinities are kept */
} tfevents_scalar_t;

/* Creates dir with its missing parents (as mkdir -p does) and in it
 * "events.out.tfevents.<secs>.<host>.<pid>.<n>": secs = wall_time's whole
 * seconds, 10 digits; n = 0, or the next free number when a file of that
 * name exists (never overwritten). Writes the header record, stamped
 * wall_time (seconds since the Unix epoch). host must not contain '/'. */
int tfevents_open(const char *dir, const char *host, long pid, double wall_time, tfevents_t **w, char *err,
                  size_t errlen);

/* One Event at step (omitted when 0, as proto3 does) and wall_time with
 * the n scalars of v, in that order; then flushed. n >= 1. */
int tfevents_scalars(tfevents_t *w, int64_t step, double wall_time, const tfevents_scalar_t *v, int n, char *err,
                     size_t errlen);

/* Now, in seconds since the Unix epoch (CLOCK_REALTIME): the wall_time
 * TensorBoard's "relative" and "wall" axes use. */
double tfevents_now(void);

/* The file's path (valid until tfevents_close). */
const char *tfevents_path(const tfevents_t *w);

/* Closes the file and frees w (also after a failed write; w may be NULL).
 * Reports a failed close (the last buffered bytes not written). */
int tfevents_close(tfevents_t *w, char *err, size_t errlen);

#endif
