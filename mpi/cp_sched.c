/* Zigzag context parallelism's layout and ring steps (see cp_sched.h). */
#include "mpi/cp_sched.h"

#include <stdio.h>

int cp_shape_check(int cp, int T, char *err, size_t errlen)
{
    if (cp >= 1 && T >= 1 && T % (2 * cp) == 0)
        return 0;
    if (!err || !errlen)
        return -1;
    if (cp < 1)
        snprintf(err, errlen, "context parallelism over %d ranks: needs at least one rank", cp);
    else
        snprintf(err, errlen,
                 "context parallelism over %d ranks: sequence length %d is not a positive multiple of 2 x %d = %d "
                 "(the zigzag layout cuts a sequence into 2 x cp chunks); pick a multiple of %d",
                 cp, T, cp, 2 * cp, 2 * cp);
    return -1;
}

int cp_chunk_of(int cp, int rank, int half) { return half ? 2 * cp - 1 - rank : rank; }

int cp_global_pos(int cp, int T, int rank, int i)
{
    int c = T / (2 * cp);
    return cp_chunk_of(cp, rank, i >= c) * c + i % c;
}

void cp_local_positions(int cp, int T, int rank, int32_t *pos)
{
    for (int i = 0; i < T / cp; i++)
        pos[i] = cp_global_pos(cp, T, rank, i);
}

int cp_ring_step(int cp, int T, int rank, int step, cp_step_t *out)
{
    if (cp_shape_check(cp, T, NULL, 0) || rank < 0 || rank >= cp || step < 0 || step >= cp)
        return -1;
    int c = T / (2 * cp), src = ((rank - step) % cp + cp) % cp;
    cp_step_t s = {.src = src};
    if (step == 0)
        s = (cp_step_t){CP_STEP_DIAG, src, 0, 2 * c, 0, 2 * c, 1};
    else if (src < rank) /* chunk src precedes both local chunks; chunk 2cp-1-src follows both */
        s = (cp_step_t){CP_STEP_LOWER, src, 0, 2 * c, 0, c, 0};
    else /* both held chunks follow chunk rank and precede chunk 2cp-1-rank */
        s = (cp_step_t){CP_STEP_UPPER, src, c, c, 0, 2 * c, 0};
    *out = s;
    return 0;
}

const char *cp_step_kind_name(cp_step_kind_t k)
{
    return k == CP_STEP_DIAG ? "diagonal" : k == CP_STEP_LOWER ? "lower" : "upper";
}
