/* Export target: llm.c's GPT-2 model file (io/llmc_model.h), version 3
 * (fp32) or 5 (bf16), as llm.c's train_gpt2.py write_model writes it:
 * wte padded to a multiple of 128 rows with zeros, weights [out, in],
 * per-layer tensors stacked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/llmc_model.h"
#include "src/convert/export.h"

static int llmc_prepare(export_ctx_t *x, char *err, size_t errlen)
{
    const model_config_t *c = x->cfg;
    if (x->opt->dtype == EXPORT_F16) {
        snprintf(err, errlen, "--dtype fp16: llm.c model files are fp32 (version 3) or bf16 (version 5)");
        return -1;
    }
    llmc_model_t *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    x->impl = m;
    m->version = x->opt->dtype == EXPORT_BF16 ? LLMC_MODEL_VERSION_BF16 : LLMC_MODEL_VERSION_F32;
    m->max_seq = c->max_seq;
    m->vocab = c->vocab_size;
    m->padded_vocab = (c->vocab_size + 127) / 128 * 128; /* llm.c's padding, as hf_map's llm.c entries assume */
    m->n_layer = c->n_layer;
    m->n_head = c->n_head;
    m->d_model = c->d_model;
    return llmc_model_layout(m, err, errlen);
}

static int llmc_create(export_ctx_t *x, char *err, size_t errlen)
{
    return llmc_model_create(x->tmp, x->impl, err, errlen);
}

static int llmc_write_rows(export_ctx_t *x, int i, int64_t r0, int64_t nr, const float *rows, char *err, size_t errlen)
{
    const export_out_t *o = &x->out[i];
    return llmc_model_write_f32(x->tmp, x->impl, (llmc_tensor_t)o->llmc_id, o->layer, r0, nr, rows, err, errlen);
}

static int llmc_sync(export_ctx_t *x, char *err, size_t errlen) { return llmc_model_sync(x->tmp, err, errlen); }

/* The file as llm.c's reader would see it (magic, version, sizes, exact
 * length) before it takes the final name. */
static int llmc_publish(export_ctx_t *x, char *err, size_t errlen)
{
    llmc_model_t back;
    if (llmc_model_open(&back, x->tmp, err, errlen) != 0)
        return -1;
    llmc_model_close(&back);
    snprintf(x->note, sizeof x->note, "llm.c model file version %d (%s), wte padded to %d rows",
             ((llmc_model_t *)x->impl)->version, export_dtype_name(x->opt->dtype),
             ((llmc_model_t *)x->impl)->padded_vocab);
    return export_commit(x->tmp, x->opt->dest, err, errlen);
}

static void llmc_discard(export_ctx_t *x) { export_remove(x->tmp); }

static void llmc_destroy(export_ctx_t *x)
{
    free(x->impl);
    x->impl = NULL;
}

const export_target_t export_target_llmc = {
    .name = "llm.c",
    .map_format = HF_FMT_LLMC,
    .map_prefix = "",
    .prepare = llmc_prepare,
    .create = llmc_create,
    .write_rows = llmc_write_rows,
    .sync = llmc_sync,
    .publish = llmc_publish,
    .discard = llmc_discard,
    .destroy = llmc_destroy,
};
