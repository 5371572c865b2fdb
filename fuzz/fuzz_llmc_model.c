/* libFuzzer harness: llm.c's GPT-2 model file header (io/llmc_model.c).
 *
 * Sources: io/llmc_model.c.
 *
 * Input: 1 flag byte, then a header (up to 1024 bytes, zero-padded) and
 * 8 bytes of claimed file size. llmc_model_parse cannot be handed a
 * 500 MB file, so the fuzzed size goes through llmc_model_layout (as the
 * parser does) and the bytes themselves through llmc_model_parse: an
 * accepted layout must have its tensors back to back inside file_size,
 * and an accepted parse must equal its input's length and read its last
 * and first elements in range. Refusals: exactly one non-empty line. */
#include "io/llmc_model.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_layout(const llmc_model_t *m)
{
    uint64_t off = LLMC_MODEL_HEADER_BYTES;
    for (int i = 0; i < LLMC_N_TENSORS; i++) {
        if (m->offset[i] != off)
            abort();
        off += (uint64_t)m->shape[i][0] * (uint64_t)m->shape[i][1] * (uint64_t)m->shape[i][2] * m->itemsize;
    }
    if (off != m->file_size)
        abort();
}

static void refused(const char *err)
{
    if (err[0] == '\0' || strchr(err, '\n') != NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flag = data[0];
    data++, size--;
    char err[512];
    /* 1. the header's sizes through the layout */
    int32_t h[8] = {0};
    memcpy(h, data, size < sizeof h ? size : sizeof h);
    llmc_model_t m = {.version = h[1],
                      .max_seq = h[2],
                      .vocab = h[3],
                      .n_layer = h[4],
                      .n_head = h[5],
                      .d_model = h[6],
                      .padded_vocab = h[7]};
    err[0] = '\0';
    if (llmc_model_layout(&m, err, sizeof err) == 0)
        check_layout(&m);
    else
        refused(err);
    /* 2. the bytes as a whole file (small models fit); flag bit 0: a
     * file of exactly the size the header asks for, zeros after */
    size_t len = size;
    if ((flag & 1) && m.file_size > 0 && m.file_size <= (1u << 20) && m.file_size >= size)
        len = (size_t)m.file_size;
    uint8_t *copy = calloc(1, len ? len : 1);
    memcpy(copy, data, size);
    llmc_model_t p;
    err[0] = '\0';
    if (llmc_model_parse(copy, len, &p, err, sizeof err) == 0) {
        check_layout(&p);
        if (p.file_size != len)
            abort();
        float x[2];
        const int64_t *s = p.shape[LLMC_LNFB];
        if (llmc_model_read_f32(&p, LLMC_LNFB, 0, 0, 1, s[2] - 1, 1, x, err, sizeof err) != 0 ||
            llmc_model_read_f32(&p, LLMC_WTE, 0, 0, 1, 0, 1, x, err, sizeof err) != 0)
            abort();
        if (llmc_model_read_f32(&p, LLMC_LNFB, 1, 0, 1, 0, 1, x, err, sizeof err) == 0)
            abort();
        llmc_model_close(&p);
    } else {
        refused(err);
    }
    free(copy);
    return 0;
}
