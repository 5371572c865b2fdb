#include "src/model/moe.h"

#include <math.h>
#include <string.h>

#include "mpi/trace.h"

int moe_etp_whole(const model_t *m) { return m->lay.part.etp == 1 && m->lay.part.tp_size > 1; }
int moe_ffn_local(const model_t *m) { return m->cfg.moe.ffn / (moe_etp_whole(m) ? 1 : m->lay.part.tp_size); }
int moe_tokens(const model_t *m, int N) { return moe_etp_whole(m) ? N / m->lay.part.tp_size : N; }

/* The first of this rank's moe_tokens rows of N (--etp 1: TP rank r's
 * r-th share; else 0). */
static int moe_row0(const model_t *m, int N)
{
    return moe_etp_whole(m) ? m->lay.part.tp_rank * (N / m->lay.part.tp_size) : 0;
}

/* --etp 1: rows [0, r0) and [r0 + n, N) of x[N,C], which other TP ranks
 * compute, zeroed, so the model's sum over TP assembles every row. */
static void zero_other_rows(const model_t *m, float *x, int N, int r0, int n)
{
    const size_t C = (size_t)m->cfg.d_model;
    if (r0 > 0)
        m->ops->zero(m->ops->ctx, x, (size_t)r0 * C * sizeof(float));
    if (r0 + n < N)
        m->ops->zero(m->ops->ctx, x + (size_t)(r0 + n) * C, (size_t)(N - r0 - n) * C * sizeof(float));
}
int moe_fcw_local(const model_t *m) { return (m->cfg.arch == ARCH_LLAMA ? 2 : 1) * moe_ffn_local(m); }

/* --ep: the EP group's size P (1: none) and this rank's experts El = E/P */
static int ep_of(const model_t *m) { return m->lay.part.ep_size > 1 ? m->lay.part.ep_size : 1; }
static int experts_local(const model_t *m) { return m->cfg.moe.experts / ep_of(m); }

/* One all-to-all over the EP group, timed like the TP collectives (the
 * backend's ops finish first, so their time counts as compute). */
static status_t ep_alltoallv(model_t *m, const void *send, const size_t *scnt, const size_t *sdsp, void *recv,
                             const size_t *rcnt, const size_t *rdsp, comm_dtype_t dt, const char *what, char *err,
                             size_t errlen)
{
    m->ops->sync(m->ops->ctx);
    const double t0 = trace_now();
    char cerr[COMM_ERR_MAX];
    comm_t *c = m->lay.ep;
    const status_t rc = c->ops->alltoallv(c, send, scnt, sdsp, recv, rcnt, rdsp, dt, cerr, sizeof cerr);
    m->ep_comm_s += trace_now() - t0;
    return rc != STATUS_OK ? status_set(rc, err, errlen, "expert-parallel all-to-all (%s) failed: %.400s", what, cerr)
                           : STATUS_OK;
}

/* The dispatch's layouts in rows times unit, into m->ma2a_host [4P]:
 * sends (scnt, sdsp: this rank's assignments to EP rank q's experts, a
 * run of its dispatch order) and receives (rcnt, rdsp: what each source
 * sends for this rank's experts, source after source). Returns the rows
 * received, R. */
static size_t ep_layout(model_t *m, const moe_acts_t *a, size_t unit)
{
    const int P = ep_of(m), El = experts_local(m);
    size_t *scnt = m->ma2a_host, *sdsp = scnt + P, *rcnt = sdsp + P, *rdsp = rcnt + P, R = 0;
    for (int q = 0; q < P; q++) {
        sdsp[q] = (size_t)a->hoffs[q * El] * unit;
        scnt[q] = (size_t)(a->hoffs[(q + 1) * El] - a->hoffs[q * El]) * unit;
        size_t n = 0;
        for (int x = 0; x < El; x++)
            n += (size_t)a->hrcnt[q * El + x];
        rdsp[q] = R * unit;
        rcnt[q] = n * unit;
        R += n;
    }
    return R;
}

/* The received rows from source order (source by source, each source's
 * rows expert by expert) to expert order (expert by expert, each
 * expert's rows source by source, so the same routing gives the same
 * order every time): m->mperm (backend [2R]) = perm, where expert-order
 * row j is source-order row perm[j], then its inverse; m->meoffs_host
 * [El+1] each local expert's first expert-order row. */
static void ep_perm(model_t *m, const moe_acts_t *a, size_t R)
{
    const int P = ep_of(m), El = experts_local(m);
    int32_t *perm = m->mperm_host, *inv = perm + R;
    int32_t j = 0;
    for (int x = 0; x < El; x++) {
        m->meoffs_host[x] = j;
        int32_t src0 = 0; /* source s's first row in source order */
        for (int s = 0; s < P; s++) {
            const int32_t *c = a->hrcnt + (size_t)s * El;
            int32_t at = src0;
            for (int y = 0; y < x; y++)
                at += c[y];
            for (int32_t k = 0; k < c[x]; k++, j++) {
                perm[j] = at + k;
                inv[at + k] = j;
            }
            for (int y = 0; y < El; y++)
                src0 += c[y];
        }
    }
    m->meoffs_host[El] = j;
    m->ops->from_host(m->ops->ctx, m->mperm, perm, 2 * R * sizeof(int32_t));
}

/* The forward's dispatch under --ep: each expert's row count to its EP
 * rank (a->hrcnt receives this rank's), then the tokens m->mx [M,C]
 * (dispatch order) into a->xr [R,C] in expert order. Returns R in *R. */
static status_t ep_dispatch(model_t *m, moe_acts_t *a, size_t *R, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    const int P = ep_of(m), El = experts_local(m), E = m->cfg.moe.experts;
    const size_t C = (size_t)m->cfg.d_model;
    for (int x = 0; x < E; x++)
        m->mscnt_host[x] = a->hoffs[x + 1] - a->hoffs[x];
    size_t *v = m->ma2a_host;
    for (int q = 0; q < P; q++) {
        v[q] = v[2 * P + q] = (size_t)El;
        v[P + q] = v[3 * P + q] = (size_t)q * El;
    }
    CHECK(ep_alltoallv(m, m->mscnt_host, v, v + P, a->hrcnt, v + 2 * P, v + 3 * P, COMM_INT32, "counts", err, errlen));
    *R = ep_layout(m, a, C);
    CHECK(ep_alltoallv(m, m->mx, v, v + P, m->mrecv, v + 2 * P, v + 3 * P, COMM_FP32, "tokens", err, errlen));
    ep_perm(m, a, *R);
    o->moe_gather(o->ctx, a->xr, m->mrecv, m->mperm, (int)*R, 1, (int)C);
    return STATUS_OK;
}

/* Rows [R,C] in expert order back to their sources: each lands in dst
 * [M,C] at its assignment's place in the source's dispatch order (the
 * reverse of ep_dispatch's tokens, its layout and permutation current). */
static status_t ep_return(model_t *m, const moe_acts_t *a, float *dst, const float *rows, size_t R, const char *what,
                          char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    const int P = ep_of(m);
    const size_t C = (size_t)m->cfg.d_model;
    o->moe_gather(o->ctx, m->mrecv, rows, m->mperm + R, (int)R, 1, (int)C);
    ep_layout(m, a, C);
    size_t *v = m->ma2a_host;
    return ep_alltoallv(m, m->mrecv, v + 2 * P, v + 3 * P, dst, v, v + P, COMM_FP32, what, err, errlen);
}

/* Each expert's share of the step: the capacity's cap per sequence of t
 * tokens (0: dropless). */
static int moe_capacity(const moe_config_t *e, int t)
{
    return e->capacity > 0 ? (int)ceil((double)e->capacity * (double)t * e->top_k / e->experts) : 0;
}

/* The losses from the routing's reductions (stats, host: moe_stats's,
 * over Ns tokens: the micro batch's, every CP rank's share summed), their
 * gradient weights into a (auxw through the backend) and *st. Ng: the
 * tokens of this rank's share (Ns / cp): its gradients are averaged over
 * the CP ranks with the data-parallel ones, so each holds cp times its
 * part, as the language-model loss's mean over its own tokens does. */
static void moe_losses(model_t *m, moe_acts_t *a, const float *stats, double Ns, double Ng, float dloss,
                       model_moe_stats_t *st)
{
    const moe_config_t *e = &m->cfg.moe;
    const int E = e->experts, K = e->top_k;
    float auxw[4096];
    double aux = 0.0, busiest = 0.0;
    for (int x = 0; x < E; x++) {
        const double f = stats[x] / (Ns * K), P = stats[E + x] / Ns;
        aux += f * P;
        auxw[x] = (float)((double)e->aux_coef * dloss * E * f / Ng);
        busiest = stats[x] > busiest ? stats[x] : busiest; /* routed, before any capacity drop */
    }
    m->ops->from_host(m->ops->ctx, a->auxw, auxw, (size_t)E * sizeof(float));
    a->zw = (float)((double)e->z_coef * dloss / Ng);
    st->aux += aux * E;
    st->z += stats[2 * E] / Ns;
    st->max_load += busiest / (Ns * K / E);
    st->dropped += stats[2 * E + 1];
    st->assigned += Ns * K;
    st->micro++;
}

/* --cp: the routing statistics summed over the CP ranks, which hold the
 * micro batch's sequences between them; timed with the all-to-alls */
static status_t cp_sum(model_t *m, float *buf, size_t n, char *err, size_t errlen)
{
    comm_t *c = m->lay.cp;
    m->ops->sync(m->ops->ctx);
    const double t0 = trace_now();
    char cerr[COMM_ERR_MAX];
    const status_t rc = c->ops->allreduce(c, buf, n, COMM_FP32, COMM_SUM, cerr, sizeof cerr);
    m->ep_comm_s += trace_now() - t0;
    return rc != STATUS_OK
               ? status_set(rc, err, errlen, "the MoE routing statistics' sum over --cp failed: %.400s", cerr)
               : STATUS_OK;
}

status_t moe_fwd(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *ln2_all, float *out_all, int N_all,
                 int t, float dloss, int i, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    const moe_config_t *e = &m->cfg.moe;
    const int gpt = m->cfg.arch == ARCH_GPT2, C = m->cfg.d_model, E = e->experts, K = e->top_k;
    const int Fe = moe_ffn_local(m), FWe = moe_fcw_local(m), sig = e->router == MOE_ROUTER_SIGMOID;
    /* this rank's N tokens: all of them, or under --etp 1 its TP share */
    const int N = moe_tokens(m, N_all), n0 = moe_row0(m, N_all);
    const float *ln2 = ln2_all + (size_t)n0 * C;
    float *out = out_all + (size_t)n0 * C;
    /* route: logits[N,E] = ln2 . router^T in fp32, then the top K */
    o->matmul_fwd(o->ctx, a->logits, ln2, w->router, NULL, N, C, E);
    const float *ebias = m->mbias ? m->mbias + (size_t)i * E : NULL;
    o->moe_route_fwd(o->ctx, a->scores, a->lse, a->idx, a->gate, a->logits, ebias, N, t, E, K, sig, e->norm_topk,
                     moe_capacity(e, t));
    o->moe_plan(o->ctx, a->perm, a->offs, a->where, a->idx, N, E, K);
    o->moe_stats(o->ctx, m->mstats, a->idx, a->scores, a->lse, N, E, K, sig);
    /* --etp 1: the losses are the whole micro batch's, over every TP share */
    if (moe_etp_whole(m))
        CHECK(model_tp_sum(m, m->mstats, 2 * (size_t)E + 2, err, errlen));
    /* --cp: and over the sequences' other chunks */
    const int cp = m->lay.cp && m->lay.cp_size > 1 ? m->lay.cp_size : 1;
    if (cp > 1)
        CHECK(cp_sum(m, m->mstats, 2 * (size_t)E + 2, err, errlen));
    /* the host needs each expert's row count for its GEMMs */
    o->to_host(o->ctx, a->hoffs, a->offs, ((size_t)E + 1) * sizeof(int32_t));
    o->to_host(o->ctx, m->mstats_host, m->mstats, (2 * (size_t)E + 2) * sizeof(float));
    moe_losses(m, a, m->mstats_host, (double)N_all * cp, N_all, dloss, &m->moe_stats[i]);
    for (int x = 0; x < E && dloss != 0.0f; x++) /* the step's loads, for the expert bias */
        m->mload_host[(size_t)i * E + x] += m->mstats_host[x];
    const int M = a->hoffs[E];
    /* dispatch: xe[M,C], each expert's tokens in a row */
    o->moe_gather(o->ctx, m->mx, ln2, a->perm, M, K, C);
    /* the experts' rows: this rank's own (xe, offs over E experts), or
     * under --ep the R rows its El experts received (a->xr, meoffs) */
    const float *xe = m->mx;
    const int32_t *offs = a->hoffs;
    int El = E;
    float *ye = a->ye;
    size_t R = (size_t)M;
    if (ep_of(m) > 1) {
        CHECK(ep_dispatch(m, a, &R, err, errlen));
        xe = a->xr;
        offs = m->meoffs_host;
        El = experts_local(m);
        ye = m->md1; /* [R,C] until sent back */
    }
    /* he[R,FWe] = xe . wfc_e^T (+ bfc_e): every local expert on its rows
     * (offs), in one grouped GEMM */
    model_gmm_fwd(m, a->he, xe, w->ewfc, gpt ? w->ebfc : NULL, offs, El, C, FWe);
    /* ae[R,Fe] = GELU(he) | SwiGLU(gate, up), and under --dtype bf16 its
     * bf16 copy into a16, the proj GEMM's input (the backward reads ae) */
    uint16_t *ae16 = m->lay.bf16 ? m->a16 : NULL;
    if (gpt)
        o->gelu_fwd(o->ctx, a->ae, ae16, a->he, R * Fe);
    else
        o->swiglu_fwd(o->ctx, a->ae, ae16, a->he, (int)R, Fe);
    /* ye[R,C] = ae . wproj_e^T (+ bproj_e, added once: by TP rank 0, or
     * with whole experts by the one rank that computes the row) */
    const int bias = gpt && (m->lay.part.tp_rank == 0 || moe_etp_whole(m));
    model_gmm_fwd(m, ye, ae16 ? NULL : a->ae, w->ewproj, bias ? w->ebproj : NULL, offs, El, Fe, C);
    /* --ep: the outputs back to their tokens' ranks, a->ye [M,C] */
    if (ep_of(m) > 1)
        CHECK(ep_return(m, a, a->ye, ye, R, "expert outputs", err, errlen));
    /* out[n] = sum_j gate[n,j] ye[where[n,j]], in order of j */
    o->moe_combine_fwd(o->ctx, out, a->ye, a->gate, a->where, N, K, C);
    if (moe_etp_whole(m))
        zero_other_rows(m, out_all, N_all, n0, N);
    return STATUS_OK;
}

status_t moe_bwd_experts(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                         const float *ln2_all, const float *dout_all, float *dln_all, int dln_accum, int accum,
                         int N_all, char *err, size_t errlen)
{
    const ops_t *o = m->ops;
    const moe_config_t *e = &m->cfg.moe;
    const int gpt = m->cfg.arch == ARCH_GPT2, C = m->cfg.d_model, E = e->experts, K = e->top_k;
    const int Fe = moe_ffn_local(m), FWe = moe_fcw_local(m), M = a->hoffs[E];
    const int N = moe_tokens(m, N_all), n0 = moe_row0(m, N_all);
    const float *ln2 = ln2_all + (size_t)n0 * C, *dout = dout_all + (size_t)n0 * C;
    float *dln = dln_all + (size_t)n0 * C;
    if (moe_etp_whole(m) && !dln_accum) /* the rows other TP ranks' shares fill */
        zero_other_rows(m, dln_all, N_all, n0, N);
    /* dye[M,C] (md1) = gate * dout; dgate[N,K] = dout . ye (this rank's part) */
    o->moe_combine_bwd(o->ctx, m->md1, m->mdgate, dout, a->ye, a->gate, a->where, N, K, C);
    const float *xe = m->mx;
    const int32_t *offs = a->hoffs;
    int El = E;
    size_t R = (size_t)M;
    if (ep_of(m) > 1) {
        /* --ep: dye to the experts' ranks, in expert order into md1 [R,C];
         * their tokens are the forward's a->xr */
        R = ep_layout(m, a, (size_t)C);
        size_t *v = m->ma2a_host;
        const int P = ep_of(m);
        CHECK(ep_alltoallv(m, m->md1, v, v + P, m->mrecv, v + 2 * P, v + 3 * P, COMM_FP32, "output gradients", err,
                           errlen));
        ep_perm(m, a, R);
        o->moe_gather(o->ctx, m->md1, m->mrecv, m->mperm, (int)R, 1, C);
        xe = a->xr;
        offs = m->meoffs_host;
        El = experts_local(m);
    } else {
        /* the gathered tokens again: xe[M,C] (mx) */
        o->moe_gather(o->ctx, m->mx, ln2, a->perm, M, K, C);
    }
    /* proj: dae[R,Fe] (md2; GPT-2: through GELU already, = dhe, the
     * GELU input he its pre) and the proj weight (and bias) gradients,
     * all local experts in one grouped GEMM */
    model_gmm_bwd(m, m->md2, g->ewproj, gpt ? g->ebproj : NULL, m->md1, a->ae, gpt ? a->he : NULL, w->ewproj, offs, El,
                  Fe, C, accum);
    /* dhe[R,FWe]: GPT-2's is md2; SwiGLU's into md1 */
    const float *dhe = m->md2;
    if (!gpt) {
        o->swiglu_bwd(o->ctx, m->md1, NULL, a->he, m->md2, (int)R, Fe);
        dhe = m->md1;
    }
    float *dxe = gpt ? m->md1 : m->md2;
    /* fc: dxe[R,C] and the fc weight (and bias) gradients, grouped */
    model_gmm_bwd(m, dxe, g->ewfc, gpt ? g->ebfc : NULL, dhe, xe, NULL, w->ewfc, offs, El, C, FWe, accum);
    /* --ep: dxe back to the tokens' ranks, [M,C] in dispatch order (mx) */
    if (ep_of(m) > 1) {
        CHECK(ep_return(m, a, m->mx, dxe, R, "input gradients", err, errlen));
        dxe = m->mx;
    }
    /* dln[n] (+)= sum_j dxe[where[n,j]] */
    o->moe_scatter_bwd(o->ctx, dln, dxe, a->where, N, K, C, dln_accum);
    return STATUS_OK;
}

void moe_bwd_router(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                    const float *ln2_all, float *dln_all, int add_din, int accum, int N_all)
{
    const ops_t *o = m->ops;
    const moe_config_t *e = &m->cfg.moe;
    const int C = m->cfg.d_model, E = e->experts, K = e->top_k;
    const int N = moe_tokens(m, N_all), n0 = moe_row0(m, N_all);
    const float *ln2 = ln2_all + (size_t)n0 * C;
    float *dln = dln_all + (size_t)n0 * C;
    o->moe_route_bwd(o->ctx, m->mdlogits, m->mdgate, a->logits, a->scores, a->lse, a->idx,
                     e->aux_coef > 0 ? a->auxw : NULL, a->zw, N, E, K, e->router == MOE_ROUTER_SIGMOID, e->norm_topk);
    o->matmul_bwd(o->ctx, add_din ? dln : NULL, g->router, NULL, m->mdlogits, ln2, w->router, N, C, E, 1, accum);
}

void moe_shared_gate_fwd(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *ln2, const float *y,
                         float *out, int N)
{
    const ops_t *o = m->ops;
    const int C = m->cfg.d_model;
    /* sgate[N] = ln2 . w_gate^T, the logits, then their sigmoids */
    o->matmul_fwd(o->ctx, a->sgate, ln2, w->sgate, NULL, N, C, 1);
    o->moe_shared_gate_fwd(o->ctx, out, a->sgate, y, N, C);
}

void moe_shared_gate_bwd(model_t *m, const moe_acts_t *a, const float *dout, int N)
{
    m->ops->moe_shared_gate_bwd(m->ops->ctx, m->msdy, m->msdz, dout, a->sy, a->sgate, N, m->cfg.d_model);
}

void moe_shared_gate_bwd_weight(model_t *m, const block_tensors_t *w, const block_tensors_t *g, const float *ln2,
                                float *dln, int add_din, int accum, int N)
{
    const ops_t *o = m->ops;
    o->matmul_bwd(o->ctx, add_din ? dln : NULL, g->sgate, NULL, m->msdz, ln2, w->sgate, N, m->cfg.d_model, 1, 1, accum);
}
