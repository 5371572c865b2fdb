#include "src/model/docmask.h"

void docmask_positions(const int32_t *tok, int B, int T, int32_t doc_start, int32_t doc_end, int32_t *pos)
{
    for (int b = 0; b < B; b++) {
        const int32_t *tk = tok + (size_t)b * T;
        int32_t *p = pos + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            const int starts =
                t == 0 || (doc_start >= 0 && tk[t] == doc_start) || (doc_end >= 0 && tk[t - 1] == doc_end);
            p[t] = starts ? 0 : p[t - 1] + 1;
        }
    }
}

double docmask_square_sum(const int32_t *pos, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += 2.0 * (double)pos[i] + 1.0;
    return s;
}
