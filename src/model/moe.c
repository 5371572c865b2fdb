#include "src/model/moe.h"

#include <math.h>
#include <string.h>

int moe_ffn_local(const model_t *m) { return m->cfg.moe.ffn / m->lay.part.tp_size; }
int moe_fcw_local(const model_t *m) { return (m->cfg.arch == ARCH_LLAMA ? 2 : 1) * moe_ffn_local(m); }

/* Each expert's share of the step: the capacity's cap per sequence of t
 * tokens (0: dropless). */
static int moe_capacity(const moe_config_t *e, int t)
{
    return e->capacity > 0 ? (int)ceil((double)e->capacity * (double)t * e->top_k / e->experts) : 0;
}

/* The losses from the routing's reductions (stats, host: moe_stats's),
 * their gradient weights into a (auxw through the backend) and *st. */
static void moe_losses(model_t *m, moe_acts_t *a, const float *stats, int N, float dloss, model_moe_stats_t *st)
{
    const moe_config_t *e = &m->cfg.moe;
    const int E = e->experts, K = e->top_k;
    float auxw[4096];
    double aux = 0.0, busiest = 0.0;
    for (int x = 0; x < E; x++) {
        const double f = stats[x] / ((double)N * K), P = stats[E + x] / (double)N;
        aux += f * P;
        auxw[x] = (float)((double)e->aux_coef * dloss * E * f / N);
        busiest = stats[x] > busiest ? stats[x] : busiest; /* routed, before any capacity drop */
    }
    m->ops->from_host(m->ops->ctx, a->auxw, auxw, (size_t)E * sizeof(float));
    a->zw = (float)((double)e->z_coef * dloss / N);
    st->aux += aux * E;
    st->z += stats[2 * E] / (double)N;
    st->max_load += busiest / ((double)N * K / E);
    st->dropped += stats[2 * E + 1];
    st->assigned += (double)N * K;
    st->micro++;
}

int moe_fwd(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *ln2, float *out, int N, int t,
            float dloss, model_moe_stats_t *st)
{
    const ops_t *o = m->ops;
    const moe_config_t *e = &m->cfg.moe;
    const int gpt = m->cfg.arch == ARCH_GPT2, C = m->cfg.d_model, E = e->experts, K = e->top_k;
    const int Fe = moe_ffn_local(m), FWe = moe_fcw_local(m), sig = e->router == MOE_ROUTER_SIGMOID;
    /* route: logits[N,E] = ln2 . router^T in fp32, then the top K */
    o->matmul_fwd(o->ctx, a->logits, ln2, w->router, NULL, N, C, E);
    o->moe_route_fwd(o->ctx, a->scores, a->lse, a->idx, a->gate, a->logits, N, t, E, K, sig, e->norm_topk,
                     moe_capacity(e, t));
    o->moe_plan(o->ctx, a->perm, a->offs, a->where, a->idx, N, E, K);
    o->moe_stats(o->ctx, m->mstats, a->idx, a->scores, a->lse, N, E, K, sig);
    /* the host needs each expert's row count for its GEMMs */
    o->to_host(o->ctx, a->hoffs, a->offs, ((size_t)E + 1) * sizeof(int32_t));
    o->to_host(o->ctx, m->mstats_host, m->mstats, (2 * (size_t)E + 2) * sizeof(float));
    moe_losses(m, a, m->mstats_host, N, dloss, st);
    const int M = a->hoffs[E];
    /* dispatch: xe[M,C], each expert's tokens in a row */
    o->moe_gather(o->ctx, m->mx, ln2, a->perm, M, K, C);
    /* he[M,FWe] = xe . wfc_e^T (+ bfc_e), expert by expert */
    for (int x = 0; x < E; x++) {
        const int r0 = a->hoffs[x], n = a->hoffs[x + 1] - r0;
        if (n > 0)
            o->matmul_fwd(o->ctx, a->he + (size_t)r0 * FWe, m->mx + (size_t)r0 * C, w->ewfc + (size_t)x * FWe * C,
                          gpt ? w->ebfc + (size_t)x * Fe : NULL, n, C, FWe);
    }
    /* ae[M,Fe] = GELU(he) | SwiGLU(gate, up) */
    if (gpt)
        o->gelu_fwd(o->ctx, a->ae, a->he, (size_t)M * Fe);
    else
        o->swiglu_fwd(o->ctx, a->ae, a->he, M, Fe);
    /* ye[M,C] = ae . wproj_e^T (+ bproj_e, added once: by TP rank 0) */
    const int bias = gpt && m->lay.part.tp_rank == 0;
    for (int x = 0; x < E; x++) {
        const int r0 = a->hoffs[x], n = a->hoffs[x + 1] - r0;
        if (n > 0)
            o->matmul_fwd(o->ctx, a->ye + (size_t)r0 * C, a->ae + (size_t)r0 * Fe, w->ewproj + (size_t)x * C * Fe,
                          bias ? w->ebproj + (size_t)x * C : NULL, n, Fe, C);
    }
    /* out[n] = sum_j gate[n,j] ye[where[n,j]], in order of j */
    o->moe_combine_fwd(o->ctx, out, a->ye, a->gate, a->where, N, K, C);
    return 0;
}

void moe_bwd_experts(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                     const float *ln2, const float *dout, float *dln, int dln_accum, int accum, int N)
{
    const ops_t *o = m->ops;
    const moe_config_t *e = &m->cfg.moe;
    const int gpt = m->cfg.arch == ARCH_GPT2, C = m->cfg.d_model, E = e->experts, K = e->top_k;
    const int Fe = moe_ffn_local(m), FWe = moe_fcw_local(m), M = a->hoffs[E];
    /* dye[M,C] (md1) = gate * dout; dgate[N,K] = dout . ye (this rank's part) */
    o->moe_combine_bwd(o->ctx, m->md1, m->mdgate, dout, a->ye, a->gate, a->where, N, K, C);
    /* the gathered tokens again: xe[M,C] (mx) */
    o->moe_gather(o->ctx, m->mx, ln2, a->perm, M, K, C);
    /* proj: dae[M,Fe] (md2; GPT-2: through GELU already, = dhe) */
    for (int x = 0; x < E; x++) {
        const int r0 = a->hoffs[x], n = a->hoffs[x + 1] - r0;
        float *dw = g->ewproj + (size_t)x * C * Fe, *db = gpt ? g->ebproj + (size_t)x * C : NULL;
        if (gpt)
            o->matmul_dgelu_bwd(o->ctx, m->md2 + (size_t)r0 * Fe, dw, db, m->md1 + (size_t)r0 * C,
                                a->ae + (size_t)r0 * Fe, a->he + (size_t)r0 * Fe, w->ewproj + (size_t)x * C * Fe, n,
                                Fe, C, accum);
        else
            o->matmul_bwd(o->ctx, m->md2 + (size_t)r0 * Fe, dw, db, m->md1 + (size_t)r0 * C, a->ae + (size_t)r0 * Fe,
                          w->ewproj + (size_t)x * C * Fe, n, Fe, C, 0, accum);
    }
    /* dhe[M,FWe]: GPT-2's is md2; SwiGLU's into md1 */
    const float *dhe = m->md2;
    if (!gpt) {
        o->swiglu_bwd(o->ctx, m->md1, a->he, m->md2, M, Fe);
        dhe = m->md1;
    }
    float *dxe = gpt ? m->md1 : m->md2;
    /* fc: dxe[M,C] and the fc weight (and bias) gradients */
    for (int x = 0; x < E; x++) {
        const int r0 = a->hoffs[x], n = a->hoffs[x + 1] - r0;
        o->matmul_bwd(o->ctx, dxe + (size_t)r0 * C, g->ewfc + (size_t)x * FWe * C,
                      gpt ? g->ebfc + (size_t)x * Fe : NULL, dhe + (size_t)r0 * FWe, m->mx + (size_t)r0 * C,
                      w->ewfc + (size_t)x * FWe * C, n, C, FWe, 0, accum);
    }
    /* dln[n] (+)= sum_j dxe[where[n,j]] */
    o->moe_scatter_bwd(o->ctx, dln, dxe, a->where, N, K, C, dln_accum);
}

void moe_bwd_router(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                    const float *ln2, float *dln, int add_din, int accum, int N)
{
    const ops_t *o = m->ops;
    const moe_config_t *e = &m->cfg.moe;
    const int C = m->cfg.d_model, E = e->experts, K = e->top_k;
    o->moe_route_bwd(o->ctx, m->mdlogits, m->mdgate, a->logits, a->scores, a->lse, a->idx,
                     e->aux_coef > 0 ? a->auxw : NULL, a->zw, N, E, K, e->router == MOE_ROUTER_SIGMOID,
                     e->norm_topk);
    o->matmul_bwd(o->ctx, add_din ? dln : NULL, g->router, NULL, m->mdlogits, ln2, w->router, N, C, E, 1, accum);
}
