/* Every CUDA op against the CPU op (cuda/selftest.c: random inputs of
 * several shapes, each output within its stated relative error bound).
 * Exit 0 when all agree, 1 when any comparison fails, 77 (Automake SKIP)
 * with the CUDA error string when no GPU is visible.
 *
 *   test_ops_cuda           run the comparisons
 *   test_ops_cuda --probe   only say whether a GPU is usable (0 or 77);
 *                           the GPU shell tests use it to decide SKIP */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "cuda/device.h"
#include "src/backend/backend.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int probe = argc > 1 && strcmp(argv[1], "--probe") == 0;
    char err[512] = "";
    int n = cuda_device_count(err, sizeof err);
    if (n <= 0) {
        printf("SKIP: no GPU visible: %s\n", n < 0 ? err : "cudaGetDeviceCount found 0 devices");
        MPI_Finalize();
        return 77;
    }
    if (probe) {
        printf("test_ops_cuda: %d GPU(s) visible\n", n);
        MPI_Finalize();
        return 0;
    }
    int rc = backend_selftest(0, stdout, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "test_ops_cuda: %s\n", err);
    MPI_Finalize();
    return rc == 0 ? 0 : rc < 0 ? 99 : 1;
}
