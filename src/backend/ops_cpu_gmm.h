/* The CPU backend's grouped GEMMs (src/backend/ops_cpu_gmm.c), the ops
 * table's gmm_* (base/ops.h), which src/backend/ops_cpu.c's table calls
 * with its context's workspace; and the bf16 panel size both files'
 * bf16 GEMMs split their sums by, so that a group's sums are split as the
 * dense op's are. */
#ifndef DTRAIN_OPS_CPU_GMM_H
#define DTRAIN_OPS_CPU_GMM_H

#include <stddef.h>
#include <stdint.h>

/* The bf16 GEMMs widen their operands to fp32 in panels of at most this
 * many floats (src/backend/ops_cpu.c: why). */
#define CPU_BF16_PANEL ((size_t)4 << 20)

/* Rows per panel of a matrix with `cols` columns: in [1, rows]. */
static inline int cpu_bf16_panel_rows(int cols, int rows)
{
    size_t r = CPU_BF16_PANEL / (size_t)(cols > 0 ? cols : 1);
    return r < 1 ? 1 : r > (size_t)rows ? rows : (int)r;
}

/* The bf16 grouped GEMMs' widening buffers, one pair per thread, kept
 * across calls and grown when a call needs more (as the dense bf16 GEMMs'
 * panels are: allocating per call page-faults them in every time). */
typedef struct cpu_gmm_ws {
    float *buf;
    size_t floats; /* of buf */
} cpu_gmm_ws_t;

void cpu_gmm_ws_free(cpu_gmm_ws_t *ws);

void cpu_gmm_fwd(float *out, const float *in, const float *w, const float *b, const int32_t *offs, int G, int IC,
                 int OC);
void cpu_gmm_bwd(float *din, float *dw, float *db, const float *dout, const float *in, const float *pre, const float *w,
                 const int32_t *offs, int G, int IC, int OC, int accum_din, int accum_dw);
void cpu_gmm_fwd_bf16(cpu_gmm_ws_t *ws, float *out, const uint16_t *in, const uint16_t *w, const float *b,
                      const int32_t *offs, int G, int IC, int OC);
void cpu_gmm_bwd_bf16(cpu_gmm_ws_t *ws, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                      const uint16_t *in, const float *pre, const uint16_t *w, const int32_t *offs, int G, int IC,
                      int OC, int accum_din, int accum_dw);

#endif
