/* A mixture-of-experts layer's feed-forward (issue 33), llm.c style, for
 * src/model/model.c: the router, the dispatch to the experts, the experts'
 * MLPs as GEMMs over each expert's rows, and the ordered combine. No
 * communication: the router is replicated over TP (every TP rank routes
 * all N tokens alike) and each rank's experts hold its slice of every
 * expert's width (expert TP = TP), so the combine is this rank's partial
 * sum, which the model reduces over TP with the shared expert's as the
 * dense MLP's row-parallel output is. The one reduction the backward needs
 * (dgate, partial over TP) the model makes between moe_bwd_experts and
 * moe_bwd_router.
 *
 * Shapes: N tokens (all rows), C d_model, E experts, K per token, NK =
 * N*K, M = the kept assignments (<= NK), Fe = moe.ffn / P, FWe = Fe
 * (GPT-2) or 2 Fe (Llama's gate|up). The experts' GEMMs are fp32 under
 * every --dtype in this version. */
#ifndef DTRAIN_MOE_H
#define DTRAIN_MOE_H

#include "src/model/model.h"

/* Expert width on this TP rank, and its fc output width. */
int moe_ffn_local(const model_t *m);
int moe_fcw_local(const model_t *m);

/* out[N,C] (written) = this rank's partial combine of ln2[N,C]'s tokens
 * through the router (w->router) and experts; a (in the slot) receives the
 * routing and activations, and the gradient weights of the layer's losses
 * for dloss (the forward's, 0 for an eval forward). The routing's
 * statistics are added to *st. t: sequence length (the capacity's unit).
 * Returns -1 when the host copy of the routing cannot be made. */
int moe_fwd(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *ln2, float *out, int N, int t,
            float dloss, model_moe_stats_t *st);

/* From dout[N,C] (all rows, the layer output's gradient): the experts'
 * parameter gradients into g (=|+= by accum), their part of dL/d(ln2)
 * into dln[N,C] (=|+= by dln_accum), and this rank's partial dgate in
 * m->mdgate [N,K], to be summed over TP before moe_bwd_router. */
void moe_bwd_experts(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                     const float *ln2, const float *dout, float *dln, int dln_accum, int accum, int N);

/* The router's backward from m->mdgate (summed over TP) and the losses'
 * weights: the router's weight gradient into g->router (=|+= by accum)
 * and, when add_din, its part of dL/d(ln2) added to dln (one TP rank adds
 * it, since dln is summed over TP after). */
void moe_bwd_router(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                    const float *ln2, float *dln, int add_din, int accum, int N);

#endif
