/* The NCCL id-broadcast bootstrap on the CPU: mpiexec -np N test_bootstrap T P [FAIL_RANK].
 *
 * Runs mpi/bootstrap.c -- the code cuda/nccl_comm.c uses with
 * ncclGetUniqueId -- over every group of a tp T x pp P grid, with a fake id
 * maker that writes (its world rank, how many ids it made before) into a
 * 128-byte id (the size of ncclUniqueId). Checks with exact numbers that
 * every member of every group received the id made by that group's rank 0,
 * whose world rank and call count are computed independently from the
 * rank-order formula world_rank = tp + T*(dp + D*pp), and that each rank
 * made exactly as many ids as groups it leads.
 *
 * With FAIL_RANK the maker fails on that world rank: every member of the
 * groups it leads must get -1 and rank 0's message, every other rank must
 * succeed, and nobody may hang (the walk keeps entering every broadcast).
 * Prints "test_bootstrap: ok: ..." on rank 0; exit 0 when every rank agrees. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/bootstrap.h"
#include "mpi/grid.h"

#define ID_LEN 128

typedef struct fake {
    int world_rank, calls, fail_rank;
} fake_t;

static int fake_make(void *id, size_t len, void *ctx, char *err, size_t errlen)
{
    fake_t *f = ctx;
    if (f->world_rank == f->fail_rank) {
        snprintf(err, errlen, "fake id maker failed on world rank %d", f->world_rank);
        return -1;
    }
    memset(id, 0xA5, len); /* filler: every byte must arrive, not just the header */
    int32_t hdr[2] = {f->world_rank, f->calls++};
    memcpy(id, hdr, sizeof hdr);
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int W, r;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    int T = argc > 1 ? atoi(argv[1]) : 1, P = argc > 2 ? atoi(argv[2]) : 1;
    int fail_rank = argc > 3 ? atoi(argv[3]) : -1;
    grid_t g;
    char gerr[COMM_ERR_MAX] = "";
    if (grid_create(&g, T, P, 0, gerr, sizeof gerr) != 0) {
        if (r == 0)
            fprintf(stderr, "test_bootstrap: %s\n", gerr);
        MPI_Finalize();
        return 2;
    }
    const int D = g.dp_size;

    /* expected leader (world rank of group rank 0) of each kind, and
     * whether this rank is a member; kinds in bootstrap order */
    const char *kinds[5] = {"world", "tp", "dp", "pp", "embed"};
    int member[5] = {1, 1, 1, 1, g.pp_rank == 0 || g.pp_rank == P - 1};
    int leader[5] = {0, r - g.tp_rank, r - T * g.dp_rank, r - T * D * g.pp_rank, r - T * D * g.pp_rank};
/* serial: how many ids a leader m made before the one for kind k */
#define COORDS(m) int m##_tp = (m) % T, m##_dp = ((m) / T) % D, m##_pp = (m) / (T * D)
    unsigned char ids[BOOTSTRAP_MAX_GROUPS * ID_LEN];
    comm_t *list[BOOTSTRAP_MAX_GROUPS];
    const char *names[BOOTSTRAP_MAX_GROUPS];
    fake_t f = {r, 0, fail_rank};
    char err[512] = "";
    int n = bootstrap_grid_ids(&g, ID_LEN, fake_make, &f, ids, list, names, err, sizeof err);

    int bad = 0, expect_fail = 0, k = 0, led = 0;
    char first[600] = "";
    for (int kind = 0; kind < 5; kind++) {
        if (!member[kind])
            continue;
        int m = leader[kind];
        COORDS(m);
        int is_leader[5] = {m == 0, m_tp == 0, m_dp == 0, m_pp == 0, m_pp == 0};
        int serial = 0;
        for (int j = 0; j < kind; j++)
            serial += is_leader[j]; /* the leader is a member of every earlier kind it leads */
        led += m == r;
        if (m == fail_rank)
            expect_fail = 1;
        if (n < 0) {
            k++;
            continue;
        }
        if (k >= n || strcmp(names[k], kinds[kind]) != 0) {
            if (!bad++)
                snprintf(first, sizeof first, "group %d is '%s', expected %s", k, k < n ? names[k] : "(none)",
                         kinds[kind]);
            k++;
            continue;
        }
        int32_t hdr[2];
        memcpy(hdr, ids + (size_t)k * ID_LEN, sizeof hdr);
        int fill_ok = 1;
        for (size_t b = sizeof hdr; b < ID_LEN; b++)
            fill_ok &= ids[(size_t)k * ID_LEN + b] == 0xA5;
        if (hdr[0] != m || hdr[1] != serial || !fill_ok) {
            if (!bad++)
                snprintf(first, sizeof first, "%s group: id from world rank %d call %d%s, expected rank %d call %d",
                         kinds[kind], hdr[0], hdr[1], fill_ok ? "" : " (bytes lost)", m, serial);
        }
        k++;
    }
    if (fail_rank < 0 && n != k && !bad++)
        snprintf(first, sizeof first, "%d groups bootstrapped, expected %d (%s)", n, k, err);
    if (fail_rank < 0 && f.calls != led && !bad++)
        snprintf(first, sizeof first, "made %d ids, leads %d groups", f.calls, led);
    if (expect_fail) {
        char want[128];
        snprintf(want, sizeof want, "group rank 0 could not make the id: fake id maker failed on world rank %d",
                 fail_rank);
        if ((n != -1 || !strstr(err, want)) && !bad++)
            snprintf(first, sizeof first, "expected the failure of rank %d's groups, got %d '%s'", fail_rank, n, err);
    } else if (fail_rank >= 0 && n < 0 && !bad++) {
        snprintf(first, sizeof first, "failed although it leads no group of rank %d: %s", fail_rank, err);
    }
    if (bad)
        fprintf(stderr, "test_bootstrap: rank %d: FAIL %s\n", r, first);

    int nbad = 0, nfail = 0, isfail = n < 0;
    MPI_Allreduce(&bad, &nbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&isfail, &nfail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (r == 0 && nbad == 0)
        printf("test_bootstrap: ok: %d ranks, tp %d x dp %d x pp %d, %d group(s) on rank 0, %d rank(s) saw the "
               "injected failure\n",
               W, T, D, P, n < 0 ? k : n, nfail);
    grid_destroy(&g);
    MPI_Finalize();
    return nbad ? 1 : 0;
}
