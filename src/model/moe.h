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
 * Expert parallelism (--ep P): this rank holds experts [r E/P, (r+1) E/P)
 * of EP rank r; each forward routes its own tokens, sends each expert's
 * rows to the expert's rank (MPI_Alltoallv through comm_t: the counts,
 * then the rows), computes its experts on what it received, in expert
 * order with each expert's rows by source rank (a fixed order, so the
 * same routing gives the same bits), and sends the outputs back, where
 * the combine is the same ordered sum. Every TP rank of an EP rank does
 * the same dispatch over its own EP group (the same TP rank's).
 *
 * Whole experts (--etp 1 at tp > 1, Megatron's expert TP 1): the EP
 * group is cut from the TP x DP plane, so TP ranks hold other experts,
 * each whole. TP rank r routes only rows [r N/tp, (r+1) N/tp) of ln2
 * (every TP rank holds all N) and writes only those rows of the combine,
 * the others zeroed, so the model's sum over TP (as for the dense MLP)
 * assembles the layer's output; the backward likewise fills its rows of
 * dln. The routing statistics are summed over TP before the losses (the
 * whole micro batch's, as at --etp tp), and the router's gradient, from
 * this rank's rows only, is summed over TP by the model once the step's
 * last micro batch is in.
 *
 * Shapes: N tokens (all rows; with --etp 1 this rank's N/tp in the
 * routing and expert buffers), C d_model, E experts, K per token, NK =
 * N*K, M = the kept assignments (<= NK), Fe = moe.ffn / tp (whole
 * experts: moe.ffn), FWe = Fe (GPT-2) or 2 Fe (Llama's gate|up). The
 * experts' GEMMs are grouped GEMMs over the local experts' rows
 * (model_gmm_fwd/bwd: ops gmm_*), in the model's precision (bf16 operands
 * under --dtype bf16); the router stays fp32. */
#ifndef DTRAIN_MOE_H
#define DTRAIN_MOE_H

#include "src/model/model.h"

/* --etp 1 at tp > 1: whole experts (expert TP 1), each TP rank routing
 * its share of the tokens. */
int moe_etp_whole(const model_t *m);
/* Expert width on this TP rank, and its fc output width. */
int moe_ffn_local(const model_t *m);
int moe_fcw_local(const model_t *m);
/* The tokens of N this rank routes: N, or N / tp under --etp 1. */
int moe_tokens(const model_t *m, int N);


/* out[N,C] (written) = this rank's partial combine of ln2[N,C]'s tokens
 * through the router (w->router, and the expert bias m->mbias of local
 * block i under the sigmoid router) and experts; a (in the slot) receives
 * the routing and activations, and the gradient weights of the layer's
 * losses for dloss (the forward's, 0 for an eval forward). The routing's
 * statistics are added to m->moe_stats[i], and under dloss != 0 each
 * expert's assignments to m->mload_host's row i. t: sequence length (the capacity's unit).
 * Under --ep (lay.part.ep_size > 1) the tokens travel to the ranks of
 * their experts and the outputs back by all-to-all over lay.ep, counts
 * first: collective over the EP group. Returns a status, one line in err
 * (a failed all-to-all). */
status_t moe_fwd(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *ln2, float *out, int N, int t,
                 float dloss, int i, char *err, size_t errlen);

/* From dout[N,C] (all rows, the layer output's gradient): the experts'
 * parameter gradients into g (=|+= by accum), their part of dL/d(ln2)
 * into dln[N,C] (=|+= by dln_accum), and this rank's partial dgate in
 * m->mdgate [N,K], to be summed over TP before moe_bwd_router. Under
 * --ep the output gradients travel to the experts' ranks and the input
 * gradients back, as the forward's tokens and outputs did (collective over
 * the EP group); the expert gradients are then this rank's experts',
 * from every token of the EP group routed to them. */
status_t moe_bwd_experts(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                         const float *ln2, const float *dout, float *dln, int dln_accum, int accum, int N, char *err,
                         size_t errlen);

/* The router's backward from m->mdgate (summed over TP) and the losses'
 * weights: the router's weight gradient into g->router (=|+= by accum)
 * and, when add_din, its part of dL/d(ln2) added to dln (one TP rank adds
 * it, since dln is summed over TP after). */
void moe_bwd_router(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                    const float *ln2, float *dln, int add_din, int accum, int N);

/* --moe-shared-gate (Qwen2-MoE's shared_expert_gate): out[N,C] (written;
 * may be y) = sigmoid(ln2[N,C] . w->sgate^T) * y[N,C], y this rank's
 * partial shared-expert output (a->sy), scaled per token; a->sgate keeps
 * the sigmoids. The gate's dot is over all C, so every TP rank computes
 * the same one (ln2 is whole on each). */
void moe_shared_gate_fwd(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *ln2, const float *y,
                         float *out, int N);

/* Its backward from dout[N,C] (all rows): the shared expert's output
 * gradient m->msdy [N,C] = s * dout, and this rank's partial gradient at
 * the gate's logits m->msdz [N], to be summed over TP before
 * moe_shared_gate_bwd_weight. */
void moe_shared_gate_bwd(model_t *m, const moe_acts_t *a, const float *dout, int N);

/* From m->msdz summed over TP: the gate's weight gradient into g->sgate
 * (=|+= by accum; the same on every TP rank) and, when add_din (one TP
 * rank), its part of dL/d(ln2) added to dln. */
void moe_shared_gate_bwd_weight(model_t *m, const block_tensors_t *w, const block_tensors_t *g, const float *ln2,
                                float *dln, int add_din, int accum, int N);

#endif
