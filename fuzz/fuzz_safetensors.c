/* libFuzzer harness: safetensors headers (io/safetensors.c), the files of
 * every Hugging Face model users download.
 *
 * Sources: io/safetensors.c, Jansson.
 *
 * Input: the whole file. st_parse_header on it; an accepted file must be
 * consistent (every tensor inside the data region, sizes matching shapes,
 * no overlaps, st_find finding each name), and then every F32/F16/BF16/
 * F64 tensor of at most 2 dimensions is read whole, straight and
 * transposed, and the two must agree (ASan catches any read outside the
 * input). A refused one must come with exactly one non-empty line. */
#include "io/safetensors.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int readable(const st_tensor_t *t)
{
    return (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F64) && t->ndim <= 2 &&
           st_numel(t) <= 4096;
}

static void check_tensor(const st_file_t *f, const st_tensor_t *t)
{
    uint64_t data = f->size - 8 - f->header_len;
    if (t->begin > t->end || t->end > data || t->ndim < 0 || t->ndim > ST_MAX_DIMS)
        abort();
    if (st_find(f, t->name) != t)
        abort();
    if (!readable(t))
        return;
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
    int64_t cols = t->ndim == 2 ? t->shape[1] : t->ndim == 1 ? t->shape[0] : 1;
    size_t n = (size_t)(rows * cols);
    float *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
    char err[512];
    if (st_read_f32(f, t, 0, rows, 0, cols, 0, a, err, sizeof err) != 0 ||
        st_read_f32(f, t, 0, cols, 0, rows, 1, b, err, sizeof err) != 0)
        abort();
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            float x = a[i * cols + j], y = b[j * rows + i];
            if (memcmp(&x, &y, sizeof x) != 0)
                abort();
        }
    /* one past the end is refused */
    if (st_read_f32(f, t, rows, 1, 0, 1, 0, a, err, sizeof err) == 0)
        abort();
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy of exactly size bytes, so ASan sees any overread. */
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    st_file_t f;
    char err[512];
    err[0] = '\0';
    if (st_parse_header(copy, size, &f, err, sizeof err) == 0) {
        if (8 + f.header_len > size)
            abort();
        for (int i = 0; i < f.n; i++) {
            check_tensor(&f, &f.t[i]);
            if (i > 0 && f.t[i].begin < f.t[i - 1].end)
                abort();
        }
        st_close(&f);
    } else if (err[0] == '\0' || strchr(err, '\n') != NULL) {
        abort();
    }
    free(copy);
    return 0;
}
