/* --straggler-every N: every N steps, name the rank (and its host) whose
 * compute per step was the largest over those N steps, with the median over
 * ranks. Compute is a rank's step time less the time it spent blocked on its
 * peers (exposed communication, the pipeline bubble), so the rank that makes
 * the others wait is the one named, not the ones that waited for it. Each
 * rank sums its own compute; at the report step one all-gather of one double
 * per rank over the world brings every rank's mean to all.
 *
 * Test-only: DTRAIN_TEST_SLOW_RANK=R:MS (read once by straggler_setup) makes
 * world rank R sleep MS milliseconds at the start of every step, inside its
 * compute, so that tests have a straggler to find. Not for production use. */
#ifndef DTRAIN_STRAGGLER_H
#define DTRAIN_STRAGGLER_H

#include <stddef.h>

#include "mpi/comm.h"

#define STRAGGLER_HOST_MAX 64

typedef struct straggler {
    int every;      /* N; 0: never reported (nothing gathered) */
    int rank, size; /* in the world */
    char *hosts;    /* [size][STRAGGLER_HOST_MAX]: every rank's host, gathered at setup (every > 0) */
    double *means;  /* [2 * size]: the all-gather's receive buffer (ms per step), then a sorted copy */
    double sum_s;   /* this rank's compute seconds since the last report */
    int n, first;   /* steps summed, and the first of them (1-based) */
    double slow_s;  /* DTRAIN_TEST_SLOW_RANK: this rank's delay per step, seconds (0: none) */
} straggler_t;

/* What rank 0 reports after a window of steps. */
typedef struct straggler_report {
    int steps;       /* steps in the window; 0: no report this step */
    int first, last; /* the window, 1-based steps */
    int rank;        /* the slowest world rank */
    char host[STRAGGLER_HOST_MAX];
    double ms, median_ms; /* its compute per step, and the median over ranks */
} straggler_report_t;

/* Reads the test-only delay and, with every > 0, gathers every rank's host
 * name (gethostname). Collective over world. 0, or -1 with one line in err;
 * straggler_free is safe after either. */
int straggler_setup(straggler_t *s, comm_t *world, int every, char *err, size_t errlen);

/* The test-only delay: sleeps this rank's DTRAIN_TEST_SLOW_RANK time. */
void straggler_test_delay(const straggler_t *s);

/* After step `step` (1-based), whose compute on this rank took compute_s:
 * adds it, and every `every` steps gathers the means (collective over
 * world: every rank calls this at every step) and fills rep (its steps 0
 * otherwise). 0, or -1 with one line in err. */
int straggler_step(straggler_t *s, comm_t *world, int step, double compute_s, straggler_report_t *rep, char *err,
                   size_t errlen);

/* "straggler: rank 3 (node7) compute 412 ms/step, 1.38x the median 298 ms
 * (steps 41-50)" without a newline. */
void straggler_format(const straggler_report_t *rep, char *buf, size_t len);

void straggler_free(straggler_t *s);

#endif
