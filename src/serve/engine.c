#include "src/serve/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi/launch.h"
#include "src/train/forward.h"
#include "src/train/sample.h"

#define TAG_JOB 7101    /* world: a job's header, rank 0 to each rank */
#define TAG_SCORES 7102 /* pp: a batch's prompt scores, last stage to rank 0 */
#define TAG_PICKS 7103  /* pp: a step's picks, last stage to rank 0 */

serve_job_t serve_job_of(const serve_req_t *r, uint64_t seed)
{
    return (serve_job_t){.kind = SERVE_JOB_RUN,
                         .n = r->n,
                         .total = r->off[r->n],
                         .echo = r->echo,
                         .logprobs = r->logprobs,
                         .max_tokens = r->max_tokens,
                         .top_k = r->top_k,
                         .temperature = r->temperature,
                         .seed = seed};
}

/* ---- dealing the jobs out --------------------------------------------------------------- */

int serve_job_send(serve_model_t *sm, serve_job_kind_t kind, const serve_req_t *r, uint64_t seed, char *err,
                   size_t errlen)
{
    comm_t *w = sm->grid.world;
    serve_job_t job = kind == SERVE_JOB_RUN ? serve_job_of(r, seed) : (serve_job_t){.kind = kind};
    comm_req_t *q = calloc((size_t)w->size, sizeof *q);
    char cerr[COMM_ERR_MAX];
    int rc = q ? 0 : -1;
    if (!q)
        snprintf(err, errlen, "out of memory");
    /* every header posted before any wait: a rank's receive matches in any order */
    int posted = 1;
    for (; posted < w->size && rc == 0; posted++)
        if (w->ops->isend(w, &job, sizeof job, COMM_BYTE, posted, TAG_JOB, &q[posted], cerr, sizeof cerr) != 0) {
            snprintf(err, errlen, "sending a job to rank %d failed: %s", posted, cerr);
            rc = -1;
        }
    for (int p = 1; p < posted && q; p++)
        if (q[p].active && w->ops->wait(&q[p], cerr, sizeof cerr) != 0 && rc == 0) {
            snprintf(err, errlen, "sending a job to rank %d failed: %s", p, cerr);
            rc = -1;
        }
    free(q);
    if (rc == 0 && kind == SERVE_JOB_RUN && w->size > 1 &&
        (w->ops->broadcast(w, r->off, (size_t)r->n + 1, COMM_INT32, 0, cerr, sizeof cerr) != 0 ||
         w->ops->broadcast(w, r->tok, (size_t)r->off[r->n], COMM_INT32, 0, cerr, sizeof cerr) != 0)) {
        snprintf(err, errlen, "broadcasting a job's prompts failed: %s", cerr);
        rc = -1;
    }
    return rc;
}

int serve_job_recv(serve_model_t *sm, serve_job_t *job, serve_req_t *r, char *err, size_t errlen)
{
    comm_t *w = sm->grid.world;
    comm_req_t q = {0};
    char cerr[COMM_ERR_MAX];
    memset(r, 0, sizeof *r);
    if (w->ops->irecv(w, job, sizeof *job, COMM_BYTE, 0, TAG_JOB, &q, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "waiting for a job failed: %s", cerr);
        return -1;
    }
    /* idle ranks sleep between tests, from 50 us up to 2 ms: a blocking
     * receive would spin a core for as long as no request comes */
    long ns = 50000;
    for (int done = 0;;) {
        if (w->ops->test(&q, &done, cerr, sizeof cerr) != 0) {
            snprintf(err, errlen, "waiting for a job failed: %s", cerr);
            return -1;
        }
        if (done)
            break;
        const struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        ns = ns < 2000000 ? ns * 2 : ns;
    }
    if (job->kind != SERVE_JOB_RUN)
        return 0;
    if (job->n < 1 || job->total < job->n || job->logprobs > SERVE_MAX_LOGPROBS) {
        snprintf(err, errlen, "internal error: a job of %d prompts, %d tokens", job->n, job->total);
        return -1;
    }
    r->n = job->n;
    r->echo = job->echo;
    r->logprobs = job->logprobs;
    r->max_tokens = job->max_tokens;
    r->temperature = job->temperature;
    r->top_k = job->top_k;
    r->off = malloc(((size_t)job->n + 1) * sizeof *r->off);
    r->tok = malloc((size_t)job->total * sizeof *r->tok);
    /* the broadcasts come whatever this rank's memory: take part, then fail */
    int32_t scratch;
    const int ok = r->off && r->tok;
    if (w->ops->broadcast(w, ok ? (void *)r->off : &scratch, ok ? (size_t)job->n + 1 : 1, COMM_INT32, 0, cerr,
                          sizeof cerr) != 0 ||
        w->ops->broadcast(w, ok ? (void *)r->tok : &scratch, ok ? (size_t)job->total : 1, COMM_INT32, 0, cerr,
                          sizeof cerr) != 0) {
        snprintf(err, errlen, "receiving a job's prompts failed: %s", cerr);
        return -1;
    }
    if (!ok) {
        snprintf(err, errlen, "out of memory for a job of %d tokens", job->total);
        return -1;
    }
    return 0;
}

int serve_job_poll(serve_model_t *sm, int *stop, char *err, size_t errlen)
{
    comm_t *w = sm->grid.world;
    int32_t sig = launch_stop_signal();
    char cerr[COMM_ERR_MAX];
    if (w->size > 1 && w->ops->allreduce(w, &sig, 1, COMM_INT32, COMM_MAX, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "the all-reduce of the stop signals failed: %s", cerr);
        return -1;
    }
    *stop = sig != 0;
    return 0;
}

/* ---- one batch of rows ------------------------------------------------------------------ */

/* One batch: rows[b] (prompt indices) with their sequences so far. */
typedef struct batch {
    serve_model_t *sm;
    const serve_job_t *job;
    const serve_req_t *r;
    serve_out_t *out; /* rank 0 */
    int b, L, k;      /* rows, longest sequence a row may reach, alternatives */
    const int *rows;
    int32_t *seq;  /* [b][L] */
    int *len;      /* [b] */
    int *active;   /* [na] the rows still generating, in row order */
    int na;
    int32_t *tok, *tgt; /* [b * T] the forward's batch */
    int T;              /* its length */
    float *logits, *tmp; /* [V] a row's logits (last stage), the sampler's copy */
    double *rec;         /* [b][2 + 2k] picks: token, log p, k ids, k log p */
    int32_t *dec;        /* [b][2] rank 0's decisions: token, done */
} batch_t;

static int is_last(const serve_model_t *sm) { return sm->net.pp_rank == sm->net.pp_size - 1; }
static int is_rank0(const serve_model_t *sm) { return sm->grid.world_rank == 0; }
/* the last stage's rank that sends to rank 0 (in rank 0's pipeline group) */
static int is_sender(const serve_model_t *sm) { return is_last(sm) && sm->net.tp_rank == 0 && sm->net.pp_size > 1; }

/* The forward of the active rows, each its sequence so far, padded to the
 * longest; with targets the next tokens (the prompt's, for scoring). */
static status_t forward_active(batch_t *bt, int with_targets, char *err, size_t errlen)
{
    int T = 0;
    for (int a = 0; a < bt->na; a++)
        T = bt->len[bt->active[a]] > T ? bt->len[bt->active[a]] : T;
    bt->T = T;
    for (int a = 0; a < bt->na; a++) {
        const int i = bt->active[a], n = bt->len[i];
        int32_t *tok = bt->tok + (size_t)a * T, *tgt = bt->tgt + (size_t)a * T;
        const int32_t *s = bt->seq + (size_t)i * bt->L;
        for (int j = 0; j < T; j++) {
            tok[j] = j < n ? s[j] : 0;
            tgt[j] = j + 1 < n ? s[j + 1] : -1;
        }
    }
    float loss;
    return forward_pipeline(&bt->sm->model, &bt->sm->net, bt->tok, NULL, with_targets ? bt->tgt : NULL, bt->na, T,
                            &loss, err, errlen);
}

/* With echo and logprobs: the log-probabilities of every prompt token and
 * the alternatives at each position, from the last stage to rank 0 (all
 * rows are active: the first forward). */
static status_t score_prompts(batch_t *bt, char *err, size_t errlen)
{
    serve_model_t *sm = bt->sm;
    const int n = bt->b * bt->T, k = bt->k;
    double *lp = malloc((size_t)n * sizeof *lp), *top_lp = malloc((size_t)n * k * sizeof *top_lp + 1);
    int32_t *top_id = malloc((size_t)n * k * sizeof *top_id + 1);
    status_t rc = lp && top_lp && top_id ? STATUS_OK
                                          : status_set(STATUS_FAIL, err, errlen, "out of memory for %d scores", n);
    char cerr[COMM_ERR_MAX];
    if (rc == STATUS_OK && is_last(sm))
        rc = model_token_logprobs(&sm->model, 0, n, bt->tgt, k, lp, top_id, top_lp, err, errlen);
    comm_t *pp = sm->net.pp;
    if (rc == STATUS_OK && is_sender(sm) &&
        (pp->ops->send(pp, lp, (size_t)n, COMM_FP64, 0, TAG_SCORES, cerr, sizeof cerr) != 0 ||
         (k && pp->ops->send(pp, top_id, (size_t)n * k, COMM_INT32, 0, TAG_SCORES, cerr, sizeof cerr) != 0) ||
         (k && pp->ops->send(pp, top_lp, (size_t)n * k, COMM_FP64, 0, TAG_SCORES, cerr, sizeof cerr) != 0)))
        rc = status_set(STATUS_FAIL, err, errlen, "sending the scores to rank 0 failed: %s", cerr);
    if (rc == STATUS_OK && is_rank0(sm) && !is_last(sm) &&
        (pp->ops->recv(pp, lp, (size_t)n, COMM_FP64, pp->size - 1, TAG_SCORES, cerr, sizeof cerr) != 0 ||
         (k && pp->ops->recv(pp, top_id, (size_t)n * k, COMM_INT32, pp->size - 1, TAG_SCORES, cerr, sizeof cerr) != 0) ||
         (k && pp->ops->recv(pp, top_lp, (size_t)n * k, COMM_FP64, pp->size - 1, TAG_SCORES, cerr, sizeof cerr) != 0)))
        rc = status_set(STATUS_FAIL, err, errlen, "receiving the scores from the last stage failed: %s", cerr);
    if (rc == STATUS_OK && is_rank0(sm)) {
        /* position j predicts token j + 1 */
        for (int a = 0; a < bt->b; a++) {
            const int i = bt->rows[a];
            const size_t o0 = (size_t)bt->r->off[i];
            bt->out->plp[o0] = NAN;
            for (int j = 0; j + 1 < bt->len[a]; j++) {
                const size_t src = (size_t)a * bt->T + j, dst = o0 + (size_t)j + 1;
                bt->out->plp[dst] = lp[src];
                memcpy(bt->out->ptop_id + dst * k, top_id + src * k, (size_t)k * sizeof *top_id);
                memcpy(bt->out->ptop_lp + dst * k, top_lp + src * k, (size_t)k * sizeof *top_lp);
            }
        }
    }
    free(lp);
    free(top_lp);
    free(top_id);
    return rc;
}

/* Last stage: the pick of active row a (its last position's logits) into
 * rec: token, its log p, the k most likely and theirs. Collective over TP. */
static status_t pick_row(batch_t *bt, int a, char *err, size_t errlen)
{
    serve_model_t *sm = bt->sm;
    const int V = sm->cfg.vocab_size, i = bt->active[a], k = bt->k;
    CHECK(model_logits_row(&sm->model, 0, a * bt->T + bt->len[i] - 1, bt->logits, err, errlen));
    const float *x = bt->logits;
    float mx = x[0];
    for (int v = 1; v < V; v++)
        mx = x[v] > mx ? x[v] : mx;
    double sum = 0.0;
    for (int v = 0; v < V; v++)
        sum += exp((double)x[v] - (double)mx);
    const double lse = (double)mx + log(sum);
    memcpy(bt->tmp, x, (size_t)V * sizeof *x);
    const int tok = sample_next(bt->tmp, V, bt->job->temperature, bt->job->top_k, bt->job->seed, bt->len[i]);
    double *rec = bt->rec + (size_t)a * (2 + 2 * k);
    rec[0] = tok;
    rec[1] = (double)x[tok] - lse;
    if (k > 0) {
        float val[MODEL_TOP_MAX];
        int32_t id[MODEL_TOP_MAX];
        model_top_row(x, V, 0, k, val, id);
        for (int j = 0; j < k; j++) {
            rec[2 + j] = id[j];
            rec[2 + k + j] = id[j] >= 0 ? (double)val[j] - lse : -INFINITY;
        }
    }
    return STATUS_OK;
}

/* One generation step after a forward of the active rows: the last stage
 * picks, rank 0 records and decides which rows are done, every rank
 * appends the picks and drops the finished rows. */
static status_t step(batch_t *bt, serve_stop_fn stop, void *stop_ctx, char *err, size_t errlen)
{
    serve_model_t *sm = bt->sm;
    const int k = bt->k, per = 2 + 2 * k, na = bt->na, M = bt->job->max_tokens;
    char cerr[COMM_ERR_MAX];
    comm_t *pp = sm->net.pp;
    for (int a = 0; a < na && is_last(sm); a++)
        CHECK(pick_row(bt, a, err, errlen));
    if (is_sender(sm) && pp->ops->send(pp, bt->rec, (size_t)na * per, COMM_FP64, 0, TAG_PICKS, cerr, sizeof cerr) != 0)
        return status_set(STATUS_FAIL, err, errlen, "sending the picks to rank 0 failed: %s", cerr);
    if (is_rank0(sm) && !is_last(sm) &&
        pp->ops->recv(pp, bt->rec, (size_t)na * per, COMM_FP64, pp->size - 1, TAG_PICKS, cerr, sizeof cerr) != 0)
        return status_set(STATUS_FAIL, err, errlen, "receiving the picks from the last stage failed: %s", cerr);
    if (is_rank0(sm)) {
        serve_out_t *o = bt->out;
        for (int a = 0; a < na; a++) {
            const int i = bt->rows[bt->active[a]];
            const double *rec = bt->rec + (size_t)a * per;
            const size_t g = (size_t)i * M + (size_t)o->gen_n[i];
            o->gen[g] = (int32_t)rec[0];
            o->glp[g] = rec[1];
            for (int j = 0; j < k; j++) {
                o->gtop_id[g * k + j] = (int32_t)rec[2 + j];
                o->gtop_lp[g * k + j] = rec[2 + k + j];
            }
            o->gen_n[i]++;
            long cut = -1;
            const int stopped = stop && stop(stop_ctx, i, o->gen + (size_t)i * M, o->gen_n[i], &cut);
            if (stopped)
                o->stop_at[i] = cut;
            bt->dec[2 * a] = o->gen[g];
            bt->dec[2 * a + 1] = stopped || o->gen_n[i] == M;
        }
    }
    comm_t *w = sm->grid.world;
    if (w->size > 1 && w->ops->broadcast(w, bt->dec, (size_t)na * 2, COMM_INT32, 0, cerr, sizeof cerr) != 0)
        return status_set(STATUS_FAIL, err, errlen, "broadcasting the picks failed: %s", cerr);
    int still = 0;
    for (int a = 0; a < na; a++) {
        const int i = bt->active[a];
        bt->seq[(size_t)i * bt->L + bt->len[i]++] = bt->dec[2 * a];
        if (!bt->dec[2 * a + 1])
            bt->active[still++] = i;
    }
    bt->na = still;
    return STATUS_OK;
}

static status_t run_batch(batch_t *bt, serve_stop_fn stop, void *stop_ctx, char *err, size_t errlen)
{
    const serve_job_t *job = bt->job;
    const int scoring = job->echo && job->logprobs >= 0;
    for (int a = 0; a < bt->b; a++)
        bt->active[a] = a;
    bt->na = bt->b;
    if (!scoring && job->max_tokens == 0)
        return STATUS_OK; /* the prompt's text alone */
    CHECK(forward_active(bt, scoring, err, errlen));
    if (scoring)
        CHECK(score_prompts(bt, err, errlen));
    if (job->max_tokens == 0)
        return STATUS_OK;
    CHECK(step(bt, stop, stop_ctx, err, errlen));
    while (bt->na > 0) {
        CHECK(forward_active(bt, 0, err, errlen));
        CHECK(step(bt, stop, stop_ctx, err, errlen));
    }
    return STATUS_OK;
}

/* ---- the job ---------------------------------------------------------------------------- */

/* The prompts' order of computation: longest first, by index on a tie.
 * Each entry {length, index}. */
static int by_length(const void *a, const void *b)
{
    const int *x = a, *y = b;
    return x[0] != y[0] ? y[0] - x[0] : x[1] - y[1];
}

int serve_engine_run(serve_model_t *sm, const serve_job_t *job, const serve_req_t *r, serve_out_t *out,
                     serve_stop_fn stop, void *stop_ctx, char *err, size_t errlen)
{
    const int B = sm->B, n = r->n, V = sm->cfg.vocab_size, k = job->logprobs > 0 ? job->logprobs : 0;
    int longest = 0;
    for (int i = 0; i < n; i++)
        longest = r->off[i + 1] - r->off[i] > longest ? r->off[i + 1] - r->off[i] : longest;
    const int L = longest + job->max_tokens;
    if (L > sm->T) {
        snprintf(err, errlen, "internal error: a job of %d tokens in a context of %d", L, sm->T);
        return -1;
    }
    int *order = malloc((size_t)n * 2 * sizeof *order);
    batch_t bt = {.sm = sm, .job = job, .r = r, .out = out, .L = L, .k = k};
    bt.seq = malloc((size_t)B * L * sizeof *bt.seq);
    bt.len = malloc((size_t)B * sizeof *bt.len);
    bt.active = malloc((size_t)B * sizeof *bt.active);
    bt.tok = malloc((size_t)B * L * sizeof *bt.tok);
    bt.tgt = malloc((size_t)B * L * sizeof *bt.tgt);
    bt.logits = malloc((size_t)V * sizeof *bt.logits);
    bt.tmp = malloc((size_t)V * sizeof *bt.tmp);
    bt.rec = malloc((size_t)B * (2 + 2 * k) * sizeof *bt.rec);
    bt.dec = malloc((size_t)B * 2 * sizeof *bt.dec);
    status_t rc = STATUS_OK;
    if (!order || !bt.seq || !bt.len || !bt.active || !bt.tok || !bt.tgt || !bt.logits || !bt.tmp || !bt.rec ||
        !bt.dec)
        rc = status_set(STATUS_FAIL, err, errlen, "out of memory for a batch of %d rows of %d tokens", B, L);
    if (rc == STATUS_OK) {
        for (int i = 0; i < n; i++) {
            order[2 * i] = r->off[i + 1] - r->off[i];
            order[2 * i + 1] = i;
        }
        qsort(order, (size_t)n, 2 * sizeof *order, by_length);
        for (int i = 0; i < n; i++)
            order[i] = order[2 * i + 1];
    }
    for (int c0 = 0; c0 < n && rc == STATUS_OK; c0 += B) {
        bt.b = n - c0 < B ? n - c0 : B;
        bt.rows = order + c0;
        for (int a = 0; a < bt.b; a++) {
            const int i = bt.rows[a];
            bt.len[a] = r->off[i + 1] - r->off[i];
            memcpy(bt.seq + (size_t)a * L, r->tok + r->off[i], (size_t)bt.len[a] * sizeof *bt.seq);
        }
        rc = run_batch(&bt, stop, stop_ctx, err, errlen);
    }
    free(order);
    free(bt.seq);
    free(bt.len);
    free(bt.active);
    free(bt.tok);
    free(bt.tgt);
    free(bt.logits);
    free(bt.tmp);
    free(bt.rec);
    free(bt.dec);
    return rc == STATUS_OK ? 0 : -1;
}
