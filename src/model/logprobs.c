/* model_token_logprobs: the log-probabilities of a forward's targets and
 * of each position's most likely tokens (dtrain-serve's echo with
 * logprobs, what lm-evaluation-harness scores). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/model.h"

/* Rows of logits copied to the host at a time: 16 MiB of floats. */
#define TOP_CHUNK_FLOATS ((size_t)1 << 22)

/* (v, i) ranks above (bv, bi): an empty place (bi < 0), a larger value,
 * or the same value at a lower id. */
static int ranks_above(float v, int32_t i, float bv, int32_t bi) { return bi < 0 || v > bv || (v == bv && i < bi); }

/* Inserts (v, i) into val/id[0..k), kept best first. */
static void top_insert(float *val, int32_t *id, int k, float v, int32_t i)
{
    if (!ranks_above(v, i, val[k - 1], id[k - 1]))
        return;
    int j = k - 1;
    for (; j > 0 && ranks_above(v, i, val[j - 1], id[j - 1]); j--) {
        val[j] = val[j - 1];
        id[j] = id[j - 1];
    }
    val[j] = v;
    id[j] = i;
}

void model_top_row(const float *x, int n, int v0, int k, float *val, int32_t *id)
{
    for (int j = 0; j < k; j++) {
        val[j] = -INFINITY;
        id[j] = -1;
    }
    for (int c = 0; c < n; c++)
        if (id[k - 1] < 0 || x[c] > val[k - 1])
            top_insert(val, id, k, x[c], v0 + c);
}

/* The k best of each of rows rows of logits [rows, ld] (the first `held`
 * columns real, column c is vocabulary id v0 + c) into cand[rows][k][2]:
 * {value, id as float} (ids below 2^24 are exact; id -1: no entry). */
static void local_top(const float *logits, int rows, int ld, int held, int v0, int k, float *cand)
{
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float val[MODEL_TOP_MAX];
        int32_t id[MODEL_TOP_MAX];
        model_top_row(logits + (size_t)r * ld, held, v0, k, val, id);
        for (int j = 0; j < k; j++) {
            cand[((size_t)r * k + j) * 2] = val[j];
            cand[((size_t)r * k + j) * 2 + 1] = (float)id[j];
        }
    }
}

/* Rows [r0, r0 + rows) of the slot: every TP rank's candidates merged into
 * top_id/top_lp (log p = logit - lse[r]). cand: [P][rows][k][2]. */
static void merge_top(const float *cand, int P, int rows, int k, int r0, const double *lse, int32_t *top_id,
                      double *top_lp)
{
    for (int r = 0; r < rows; r++) {
        float val[MODEL_TOP_MAX];
        int32_t id[MODEL_TOP_MAX];
        for (int j = 0; j < k; j++) {
            val[j] = -INFINITY;
            id[j] = -1;
        }
        for (int p = 0; p < P; p++)
            for (int j = 0; j < k; j++) {
                const float *c = cand + (((size_t)p * rows + r) * k + j) * 2;
                if (c[1] >= 0.0f)
                    top_insert(val, id, k, c[0], (int32_t)c[1]);
            }
        for (int j = 0; j < k; j++) {
            top_id[(size_t)(r0 + r) * k + j] = id[j];
            top_lp[(size_t)(r0 + r) * k + j] = id[j] >= 0 ? (double)val[j] - lse[r0 + r] : -INFINITY;
        }
    }
}

/* The top k of rows [0, n) of the slot's logits, chunk by chunk. */
static status_t slot_top(model_t *m, const model_slot_t *sl, int n, int k, const double *lse, int32_t *top_id,
                         double *top_lp, char *err, size_t errlen)
{
    const int P = m->lay.part.tp_size, Vl = m->v_rows;
    const int chunk = (size_t)Vl >= TOP_CHUNK_FLOATS ? 1 : (int)(TOP_CHUNK_FLOATS / (size_t)Vl);
    const int rows_max = chunk < n ? chunk : n;
    float *rows = malloc((size_t)rows_max * Vl * sizeof *rows);
    float *mine = malloc((size_t)rows_max * k * 2 * sizeof *mine);
    float *all = P > 1 ? malloc((size_t)P * rows_max * k * 2 * sizeof *all) : mine;
    status_t rc = STATUS_OK;
    if (!rows || !mine || !all)
        rc = status_set(STATUS_FAIL, err, errlen, "out of memory for the top %d of %d rows of logits", k, rows_max);
    for (int r0 = 0; r0 < n && rc == STATUS_OK; r0 += rows_max) {
        const int nr = n - r0 < rows_max ? n - r0 : rows_max;
        m->ops->to_host(m->ops->ctx, rows, sl->logits + (size_t)r0 * Vl, (size_t)nr * Vl * sizeof(float));
        local_top(rows, nr, Vl, m->v_held, m->v0, k, mine);
        char cerr[COMM_ERR_MAX];
        if (P > 1 && m->lay.tp->ops->allgather(m->lay.tp, mine, all, (size_t)nr * k * 2, COMM_FP32, cerr,
                                               sizeof cerr) != STATUS_OK)
            rc = status_set(STATUS_FAIL, err, errlen, "tensor-parallel collective failed: %.400s", cerr);
        else
            merge_top(all, P, nr, k, r0, lse, top_id, top_lp);
    }
    free(rows);
    if (all != mine)
        free(all);
    free(mine);
    return rc;
}

status_t model_token_logprobs(model_t *m, int slot, int n, const int32_t *targets, int k, double *lp, int32_t *top_id,
                              double *top_lp, char *err, size_t errlen)
{
    const model_slot_t *sl = &m->slots[slot];
    if (k > 0 && m->cfg.vocab_size > (1 << 24)) /* ids travel as floats between the TP ranks */
        return status_set(STATUS_FAIL, err, errlen, "the top tokens of a vocabulary above 2^24 are not supported");
    if (!m->lay.part.has_head || sl->has_dlogits || k < 0 || k > MODEL_TOP_MAX || n > sl->b * sl->t)
        return status_set(STATUS_FAIL, err, errlen, "internal error: model_token_logprobs on a stage without the "
                                                    "head, after a training forward, or beyond the forward");
    if (k > 0 && !sl->logits)
        return status_set(STATUS_FAIL, err, errlen, "internal error: the top tokens need a layout that keeps the whole "
                                                    "logits (logits_chunk whole)");
    float *stats = malloc((size_t)n * 3 * sizeof *stats);
    double *lse = malloc((size_t)n * sizeof *lse);
    if (!stats || !lse) {
        free(stats);
        free(lse);
        return status_set(STATUS_FAIL, err, errlen, "out of memory for the log-probabilities of %d tokens", n);
    }
    /* the forward's row statistics, reduced over TP: max, sum of exp(x -
     * max), the target's logit (0 where the target is < 0) */
    float *xmax = stats, *xstats = stats + n;
    m->ops->to_host(m->ops->ctx, xmax, sl->xmax, (size_t)n * sizeof(float));
    m->ops->to_host(m->ops->ctx, xstats, sl->xstats, (size_t)n * 2 * sizeof(float));
    for (int i = 0; i < n; i++) {
        lse[i] = (double)xmax[i] + log((double)xstats[2 * i]);
        lp[i] = targets[i] >= 0 ? (double)xstats[2 * i + 1] - lse[i] : 0.0;
    }
    status_t rc = k > 0 ? slot_top(m, sl, n, k, lse, top_id, top_lp, err, errlen) : STATUS_OK;
    free(stats);
    free(lse);
    return rc;
}
