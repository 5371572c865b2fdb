#include "zero.h"

#include <stdlib.h>
#include <string.h>

#include "mem.h"

int zero_create(zero_t *z, int stage, comm_t *group, size_t n, const size_t *unit_start, int n_units)
{
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->group = group;
    z->n = n;
    z->n_units = n_units;
    z->unit_start = malloc(((size_t)n_units + 1) * sizeof *z->unit_start);
    z->chunk = malloc(((size_t)n_units + 1) * sizeof *z->chunk);
    z->shard_start = malloc(((size_t)n_units + 1) * sizeof *z->shard_start);
    if (!z->unit_start || !z->chunk || !z->shard_start) {
        zero_destroy(z);
        return -1;
    }
    const size_t S = (size_t)group->size;
    size_t max_c = 0;
    z->shard_start[0] = 0;
    for (int u = 0; u < n_units; u++) {
        const size_t len = unit_start[u + 1] - unit_start[u];
        z->unit_start[u] = unit_start[u];
        z->chunk[u] = (len + S - 1) / S;
        z->shard_start[u + 1] = z->shard_start[u] + z->chunk[u];
        if (z->chunk[u] > max_c)
            max_c = z->chunk[u];
    }
    z->unit_start[n_units] = n;
    z->shard_n = z->shard_start[n_units];
    z->stage_n = S * max_c;
    z->stage_buf = mem_alloc(MEM_COMM, (z->stage_n ? z->stage_n : 1) * sizeof(float));
    if (!z->stage_buf) {
        zero_destroy(z);
        return -1;
    }
    return 0;
}

void zero_destroy(zero_t *z)
{
    if (z->stage_buf)
        mem_free(MEM_COMM, z->stage_buf, (z->stage_n ? z->stage_n : 1) * sizeof(float));
    free(z->unit_start);
    free(z->chunk);
    free(z->shard_start);
    memset(z, 0, sizeof *z);
}

void zero_piece(const zero_t *z, int u, size_t *lo, size_t *hi)
{
    const size_t len = z->unit_start[u + 1] - z->unit_start[u];
    size_t a = (size_t)z->group->rank * z->chunk[u], b = a + z->chunk[u];
    if (a > len)
        a = len;
    if (b > len)
        b = len;
    *lo = z->unit_start[u] + a;
    *hi = z->unit_start[u] + b;
}

int zero_allgather(zero_t *z, float *buf)
{
    comm_t *c = z->group;
    for (int u = 0; u < z->n_units; u++) {
        const size_t cu = z->chunk[u], len = z->unit_start[u + 1] - z->unit_start[u];
        if (cu == 0)
            continue;
        size_t lo, hi;
        zero_piece(z, u, &lo, &hi);
        /* the send piece is padded to c with zeros so every rank sends c */
        float *mine = z->stage_buf + (size_t)c->rank * cu;
        memcpy(mine, buf + lo, (hi - lo) * sizeof(float));
        memset(mine + (hi - lo), 0, (cu - (hi - lo)) * sizeof(float));
        /* send == recv + rank*c: the communicator's in-place form */
        if (c->ops->allgather(c, mine, z->stage_buf, cu) != 0)
            return -1;
        memcpy(buf + z->unit_start[u], z->stage_buf, len * sizeof(float));
    }
    return 0;
}

void zero_flat_to_shard(const zero_t *z, const float *flat, float *shard)
{
    for (int u = 0; u < z->n_units; u++) {
        size_t lo, hi;
        zero_piece(z, u, &lo, &hi);
        float *dst = shard + z->shard_start[u];
        memcpy(dst, flat + lo, (hi - lo) * sizeof(float));
        memset(dst + (hi - lo), 0, (z->chunk[u] - (hi - lo)) * sizeof(float));
    }
}

void zero_shard_to_flat(const zero_t *z, const float *shard, float *flat)
{
    for (int u = 0; u < z->n_units; u++) {
        size_t lo, hi;
        zero_piece(z, u, &lo, &hi);
        memcpy(flat + lo, shard + z->shard_start[u], (hi - lo) * sizeof(float));
    }
}

int zero_fsdp_stage(const char *mode)
{
    if (strcmp(mode, "full_shard") == 0)
        return 3;
    if (strcmp(mode, "shard_grad_op") == 0)
        return 2;
    if (strcmp(mode, "no_shard") == 0)
        return 0;
    return -1;
}
