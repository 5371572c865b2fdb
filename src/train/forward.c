#include "src/train/forward.h"

/* Pipeline tags of the forward-only passes; the training schedule's
 * messages are pipe_run's own. */
#define TAG_FORWARD 7001

status_t forward_pipeline(model_t *m, const grid_t *g, const int32_t *tok, const int32_t *pos, const int32_t *tgt,
                          int b, int t, float *loss, char *err, size_t errlen)
{
    /* the model's chunks in order: one per stage, or under the interleaved
     * schedule chunk c on stage c % pp (the stage holds n_runs of them).
     * One activation travels at a time, chunk c to c+1 around the stages,
     * so blocking calls suffice on every communicator, the in-order ones
     * (comm.h: NCCL) included, with no group: a stage posts its receive
     * and waits in it until the token reaches it, computes, and sends to
     * the next stage, which has run its earlier chunks (the token passed
     * them before) and waits in exactly that receive; on each link both
     * ends post the same sequence, send k matching receive k. */
    const int P = g->pp_size, C = P * m->lay.part.n_runs;
    const size_t n = model_stage_floats(m, b, t);
    char cerr[COMM_ERR_MAX];
    *loss = 0.0f;
    for (int c = g->pp_rank; c < C; c += P) {
        if (c > 0 && g->pp->ops->recv(g->pp, model_stage_input(m, 0), n, COMM_FP32, (c - 1) % P, TAG_FORWARD, cerr,
                                      sizeof cerr) != 0)
            return status_set(STATUS_FAIL, err, errlen, "receiving the previous stage's activations failed: %s", cerr);
        CHECK(model_forward_chunk(m, c / P, 0, tok, pos, tgt, b, t, 0.0f, loss, err, errlen));
        if (c < C - 1 && g->pp->ops->send(g->pp, model_stage_output(m, 0), n, COMM_FP32, (c + 1) % P, TAG_FORWARD,
                                          cerr, sizeof cerr) != 0)
            return status_set(STATUS_FAIL, err, errlen, "sending the activations to the next stage failed: %s", cerr);
    }
    return STATUS_OK;
}

status_t forward_logits_row(model_t *m, const grid_t *g, int row, float *logits, char *err, size_t errlen)
{
    char cerr[COMM_ERR_MAX];
    if (g->pp_rank == g->pp_size - 1)
        CHECK(model_logits_row(m, 0, row, logits, err, errlen));
    if (g->pp_size > 1 && g->pp->ops->broadcast(g->pp, logits, (size_t)m->cfg.vocab_size, COMM_FP32, g->pp_size - 1,
                                                cerr, sizeof cerr) != 0)
        return status_set(STATUS_FAIL, err, errlen, "broadcasting the logits over the pipeline failed: %s", cerr);
    return STATUS_OK;
}
