#include "src/convert/deal.h"

#include <stdlib.h>

typedef struct piece {
    int64_t bytes;
    int index;
} piece_t;

static int cmp_piece(const void *a, const void *b)
{
    const piece_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

int deal_by_size(const int64_t *bytes, int n, int nranks, int *owner)
{
    piece_t *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    int64_t *load = calloc((size_t)(nranks > 0 ? nranks : 1), sizeof *load);
    if (!order || !load) {
        free(order);
        free(load);
        return -1;
    }
    for (int i = 0; i < n; i++)
        order[i] = (piece_t){.bytes = bytes[i], .index = i};
    qsort(order, (size_t)n, sizeof *order, cmp_piece);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int r = 1; r < nranks; r++)
            if (load[r] < load[best])
                best = r;
        owner[order[i].index] = best;
        load[best] += order[i].bytes;
    }
    free(order);
    free(load);
    return 0;
}
