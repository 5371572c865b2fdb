/* The one wall clock for timings: now_s(), CLOCK_MONOTONIC in seconds.
 *
 * In mpi/, the bottom layer, so that every layer may include it; it needs
 * no MPI (the fuzz harnesses and cuda/ use it as they are). Only
 * differences of two readings on one process mean anything: the clock's
 * zero is arbitrary and differs between nodes (trace.h shifts ranks onto
 * one clock where it has to). MPI_Wtime, which some tools used before, is
 * the same kind of clock in OpenMPI, so their timings mean what they did. */
#ifndef DTRAIN_CLOCK_H
#define DTRAIN_CLOCK_H

double now_s(void);

#endif
