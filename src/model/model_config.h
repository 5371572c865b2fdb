/* Model shapes: the named presets (tiny, gpt2-124m, llama-70b, ...) and
 * the derived quantities every other part of the program uses. */
#ifndef DTRAIN_MODEL_CONFIG_H
#define DTRAIN_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ARCH_GPT2 = 0, ARCH_LLAMA = 1 } model_arch_t;

typedef struct model_config {
    model_arch_t arch;
    int vocab_size; /* V */
    int n_layer;    /* L */
    int n_head;     /* NH */
    int n_kv_head;  /* NKV (== NH for GPT-2) */
    int d_model;    /* C */
    int d_ff;       /* F: MLP hidden width */
    int max_seq;    /* longest sequence (GPT-2: rows of wpe) */
    float norm_eps;
    float rope_theta; /* Llama only */
} model_config_t;

typedef struct model_preset {
    const char *name;
    const char *about;
    model_config_t cfg;
} model_preset_t;

/* NULL-terminated by name == NULL. */
const model_preset_t *model_presets(void);
/* The preset called name, or NULL. */
const model_preset_t *model_preset_find(const char *name);
const char *model_arch_name(model_arch_t a);

static inline int model_head_size(const model_config_t *c) { return c->d_model / c->n_head; }

/* Checks shapes are consistent; on failure writes one line to err. */
int model_config_check(const model_config_t *c, char *err, size_t errlen);

#endif
