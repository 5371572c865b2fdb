/* Ring attention's executor over a CP group (see cp_ring.h for the
 * contract and the order of the messages).
 *
 * Deadlock freedom. Every request is posted without waiting on anything
 * but this rank's earlier waits, and a rank's waits at step i need only
 * postings its neighbours make at steps <= i before their own waits of
 * step i: the K,V block from r-1 (posted at the start of r-1's step i),
 * the gradient from r-1 (posted at the end of r-1's step i-1), the K,V
 * receive of r+1 (the start of its step i) and the gradient receive of r+1
 * (the end of its step i-1 or earlier). By induction on the step every
 * wait returns. OpenMPI has no progress thread, but each wait progresses
 * all of the process's requests. */
#include "mpi/cp_ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/cp_sched.h"
#include "mpi/trace.h"

struct cp_ring {
    comm_t *comm;
    const ops_t *ops;
    cp_ring_shape_t sh;
    int cp, rank, L;
    size_t n_kv;       /* floats a block: B*L*2*NKV*HS */
    int32_t *pos_host; /* [cp][L]: global positions of every rank's rows */
    int32_t *pos;      /* the same in the backend's memory */
    float *kv[2], *dacc[2], *dinc, *pout, *plse;
    comm_req_t kv_send, kv_recv, d_send[2], d_recv;
};

static void release(const ops_t *o, void *p)
{
    if (p)
        o->free(o->ctx, p);
}

void cp_ring_destroy(cp_ring_t *r)
{
    if (!r)
        return;
    const ops_t *o = r->ops;
    for (int j = 0; j < 2; j++) {
        release(o, r->kv[j]);
        release(o, r->dacc[j]);
    }
    release(o, r->dinc);
    release(o, r->pout);
    release(o, r->plse);
    release(o, r->pos);
    free(r->pos_host);
    free(r);
}

int cp_ring_rows(const cp_ring_t *r) { return r->L; }
const int32_t *cp_ring_positions(const cp_ring_t *r) { return r->pos_host + (size_t)r->rank * r->L; }

static status_t check_shape(comm_t *comm, const ops_t *ops, const cp_ring_shape_t *s, char *err, size_t errlen)
{
    char why[200];
    if (cp_shape_check(comm->size, s->T, why, sizeof why) != 0)
        return status_set(STATUS_INPUT, err, errlen, "cp ring: %s", why);
    if (s->B < 1 || s->NH < 1 || s->NKV < 1 || s->HS < 1 || s->NH % s->NKV != 0)
        return status_set(STATUS_INPUT, err, errlen,
                          "cp ring: B %d, %d heads, %d KV heads, head size %d: each must be positive and the heads "
                          "a multiple of the KV heads",
                          s->B, s->NH, s->NKV, s->HS);
    if (!ops->attention_block_fwd || !ops->attention_merge || !ops->attention_block_bwd || !ops->attention_kv_pack ||
        !ops->attention_kv_unpack || !ops->add || !ops->zero)
        return status_set(STATUS_INPUT, err, errlen,
                          "cp ring: the %s backend has no ring attention ops yet (context parallelism runs on the "
                          "CPU backend)",
                          ops->name);
    if (!ops->host_readable && strcmp(comm->ops->name, "nccl") != 0)
        return status_set(STATUS_INPUT, err, errlen,
                          "cp ring: the %s communicator cannot reach the %s backend's memory (use NCCL with CUDA)",
                          comm->ops->name, ops->name);
    return STATUS_OK;
}

static void *zalloc(const ops_t *o, size_t bytes) { return o->alloc(o->ctx, bytes ? bytes : sizeof(float)); }

size_t cp_ring_bytes(const cp_ring_shape_t *sh, int cp)
{
    const size_t L = (size_t)(sh->T / cp), rows = (size_t)sh->B * L, OC = (size_t)sh->NH * sh->HS;
    const size_t n_kv = rows * 2 * (size_t)sh->NKV * sh->HS;
    /* pos, kv[2], dacc[2], dinc, pout, plse: as cp_ring_create */
    return (size_t)cp * L * sizeof(int32_t) + 5 * n_kv * sizeof(float) + rows * OC * sizeof(float) +
           rows * (size_t)sh->NH * sizeof(float);
}

status_t cp_ring_create(comm_t *comm, const ops_t *ops, const cp_ring_shape_t *sh, cp_ring_t **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    CHECK(check_shape(comm, ops, sh, err, errlen));
    cp_ring_t *r = calloc(1, sizeof *r);
    if (!r)
        return status_set(STATUS_FAIL, err, errlen, "cp ring: out of memory");
    r->comm = comm;
    r->ops = ops;
    r->sh = *sh;
    r->cp = comm->size;
    r->rank = comm->rank;
    r->L = sh->T / r->cp;
    const size_t rows = (size_t)sh->B * r->L, OC = (size_t)sh->NH * sh->HS;
    r->n_kv = rows * 2 * (size_t)sh->NKV * sh->HS;
    r->pos_host = malloc((size_t)r->cp * r->L * sizeof(int32_t));
    r->pos = zalloc(ops, (size_t)r->cp * r->L * sizeof(int32_t));
    for (int j = 0; j < 2; j++) {
        r->kv[j] = zalloc(ops, r->n_kv * sizeof(float));
        r->dacc[j] = zalloc(ops, r->n_kv * sizeof(float));
    }
    r->dinc = zalloc(ops, r->n_kv * sizeof(float));
    r->pout = zalloc(ops, rows * OC * sizeof(float));
    r->plse = zalloc(ops, rows * sh->NH * sizeof(float));
    if (!r->pos_host || !r->pos || !r->kv[0] || !r->kv[1] || !r->dacc[0] || !r->dacc[1] || !r->dinc || !r->pout ||
        !r->plse) {
        cp_ring_destroy(r);
        return status_set(STATUS_FAIL, err, errlen,
                          "cp ring: out of memory for the ring's buffers (%zu floats a block)", r->n_kv);
    }
    for (int q = 0; q < r->cp; q++)
        cp_local_positions(r->cp, sh->T, q, r->pos_host + (size_t)q * r->L);
    ops->from_host(ops->ctx, r->pos, r->pos_host, (size_t)r->cp * r->L * sizeof(int32_t));
    *out = r;
    return STATUS_OK;
}

/* ---- messages --------------------------------------------------------------------- */

/* Prefixes the comm layer's message, already in err, with where it happened. */
static status_t fail_at(const cp_ring_t *r, int step, const char *what, int peer, char *err, size_t errlen)
{
    char msg[COMM_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", err ? err : "");
    cp_step_t s;
    const char *kind =
        step < r->cp && cp_ring_step(r->cp, r->sh.T, r->rank, step, &s) == 0 ? cp_step_kind_name(s.kind) : "final";
    return status_set(STATUS_FAIL, err, errlen, "cp ring rank %d/%d, step %d (%s): %s rank %d: %.400s", r->rank, r->cp,
                      step, kind, what, peer, msg);
}

static int right(const cp_ring_t *r) { return (r->rank + 1) % r->cp; }
static int left(const cp_ring_t *r) { return (r->rank + r->cp - 1) % r->cp; }

/* The send of `send` to rank + 1 and the receive of `recv` from rank - 1,
 * n_kv floats each: even ranks post the send first, odd ranks the receive
 * (see cp_ring.h). */
static status_t post_pair(cp_ring_t *r, int step, int tag, const float *send, comm_req_t *sreq, float *recv,
                          comm_req_t *rreq, cp_ring_stats_t *st, char *err, size_t errlen)
{
    comm_t *c = r->comm;
    const char *what = tag == CP_TAG_KV ? "the K,V block" : "the K,V gradient";
    char swhat[48], rwhat[48];
    snprintf(swhat, sizeof swhat, "send of %s to", what);
    snprintf(rwhat, sizeof rwhat, "receive of %s from", what);
    for (int k = 0; k < 2; k++) {
        if ((k == 0) == (r->rank % 2 == 0)) {
            if (c->ops->isend(c, send, r->n_kv, COMM_FP32, right(r), tag, sreq, err, errlen) != STATUS_OK)
                return fail_at(r, step, swhat, right(r), err, errlen);
            if (st) {
                st->bytes_sent += (long long)(r->n_kv * sizeof(float));
                st->messages++;
            }
        } else if (c->ops->irecv(c, recv, r->n_kv, COMM_FP32, left(r), tag, rreq, err, errlen) != STATUS_OK) {
            return fail_at(r, step, rwhat, left(r), err, errlen);
        }
    }
    return STATUS_OK;
}

/* Waits for q, the time added to *acc. */
static status_t ring_wait(cp_ring_t *r, comm_req_t *q, int step, const char *what, int peer, double *acc, char *err,
                          size_t errlen)
{
    double t0 = trace_now();
    status_t rc = r->comm->ops->wait(q, err, errlen);
    *acc += trace_now() - t0;
    return rc == STATUS_OK ? STATUS_OK : fail_at(r, step, what, peer, err, errlen);
}

/* The step's block of the attention ops and the K,V block's positions. */
static att_block_t step_block(const cp_ring_t *r, int step, const int32_t **kpos)
{
    cp_step_t s;
    cp_ring_step(r->cp, r->sh.T, r->rank, step, &s); /* in range: step < cp */
    *kpos = r->pos + (size_t)s.src * r->L;
    return (att_block_t){.B = r->sh.B,
                         .NH = r->sh.NH,
                         .NKV = r->sh.NKV,
                         .HS = r->sh.HS,
                         .Tq = r->L,
                         .q0 = s.q0,
                         .nq = s.nq,
                         .Tk = r->L,
                         .k0 = s.k0,
                         .nk = s.nk,
                         .causal = s.causal};
}

/* Waits for the step's K,V exchange: the next block is in, the sent
 * buffer free. */
static status_t wait_kv(cp_ring_t *r, int step, double *acc, char *err, size_t errlen)
{
    CHECK(ring_wait(r, &r->kv_recv, step, "wait for the K,V block from", left(r), acc, err, errlen));
    return ring_wait(r, &r->kv_send, step, "wait for the send of the K,V block to", right(r), acc, err, errlen);
}

/* ---- forward ---------------------------------------------------------------------- */

status_t cp_ring_forward(cp_ring_t *r, float *out, float *lse, const float *qkv, const int32_t *qdoc,
                         cp_ring_stats_t *st, char *err, size_t errlen)
{
    const ops_t *o = r->ops;
    const cp_ring_shape_t *s = &r->sh;
    const int32_t *qpos = r->pos + (size_t)r->rank * r->L, *kpos;
    double waited = 0.0, t0 = trace_now();
    o->attention_kv_pack(o->ctx, r->kv[0], qkv, s->B * r->L, s->NH, s->NKV, s->HS);
    for (int i = 0; i < r->cp; i++) {
        const int cur = i % 2, last = i == r->cp - 1;
        if (!last)
            CHECK(post_pair(r, i, CP_TAG_KV, r->kv[cur], &r->kv_send, r->kv[cur ^ 1], &r->kv_recv, st, err, errlen));
        att_block_t k = step_block(r, i, &kpos);
        o->attention_block_fwd(o->ctx, i ? r->pout : out, i ? r->plse : lse, qkv, r->kv[cur], qpos, kpos, qdoc, &k);
        if (i)
            o->attention_merge(o->ctx, out, lse, r->pout, r->plse, &k);
        if (!last) {
            o->sync(o->ctx); /* running ops are compute, not waiting */
            CHECK(wait_kv(r, i, &waited, err, errlen));
        }
    }
    if (st) {
        st->wait_fwd_s += waited;
        st->ring_fwd_s += trace_now() - t0;
    }
    return STATUS_OK;
}

/* ---- backward --------------------------------------------------------------------- */

/* Step i of the backward (see cp_ring.h): the block's dq into dqkv, its
 * dk, dv into dacc[i % 2] plus the earlier ranks' shares, sent on. */
static status_t backward_step(cp_ring_t *r, int i, float *dqkv, const float *dout, const float *qkv, const float *out,
                              const float *lse, const int32_t *qdoc, double *waited, cp_ring_stats_t *st, char *err,
                              size_t errlen)
{
    const ops_t *o = r->ops;
    const int cur = i % 2, last = i == r->cp - 1;
    const int32_t *qpos = r->pos + (size_t)r->rank * r->L, *kpos;
    if (!last)
        CHECK(post_pair(r, i, CP_TAG_KV, r->kv[cur], &r->kv_send, r->kv[cur ^ 1], &r->kv_recv, st, err, errlen));
    /* dacc[cur] was sent at step i-2: long received, its buffer reusable */
    CHECK(ring_wait(r, &r->d_send[cur], i, "wait for the send of the K,V gradient to", right(r), waited, err, errlen));
    o->zero(o->ctx, r->dacc[cur], r->n_kv * sizeof(float));
    att_block_t k = step_block(r, i, &kpos);
    o->attention_block_bwd(o->ctx, dqkv, r->dacc[cur], dout, qkv, r->kv[cur], out, lse, qpos, kpos, qdoc, &k);
    if (r->cp == 1)
        return STATUS_OK;
    o->sync(o->ctx);
    if (i > 0) { /* the shares of ranks src .. r-1, sent by r-1 at its step i-1 */
        CHECK(ring_wait(r, &r->d_recv, i, "wait for the K,V gradient from", left(r), waited, err, errlen));
        o->add(o->ctx, r->dacc[cur], r->dacc[cur], r->dinc, r->n_kv);
    }
    CHECK(post_pair(r, i, CP_TAG_DKV, r->dacc[cur], &r->d_send[cur], r->dinc, &r->d_recv, st, err, errlen));
    if (!last)
        CHECK(wait_kv(r, i, waited, err, errlen));
    return STATUS_OK;
}

status_t cp_ring_backward(cp_ring_t *r, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, const int32_t *qdoc, cp_ring_stats_t *st, char *err, size_t errlen)
{
    const ops_t *o = r->ops;
    const cp_ring_shape_t *s = &r->sh;
    const int N = s->B * r->L;
    double waited = 0.0, t0 = trace_now();
    o->zero(o->ctx, dqkv, (size_t)N * (s->NH + 2 * s->NKV) * s->HS * sizeof(float));
    o->attention_kv_pack(o->ctx, r->kv[0], qkv, N, s->NH, s->NKV, s->HS);
    for (int i = 0; i < r->cp; i++)
        CHECK(backward_step(r, i, dqkv, dout, qkv, out, lse, qdoc, &waited, st, err, errlen));
    const float *mine = r->dacc[0]; /* cp 1: the only block's gradient */
    if (r->cp > 1) {                /* this rank's block, from r-1 after the last step */
        o->sync(o->ctx);
        CHECK(ring_wait(r, &r->d_recv, r->cp, "wait for this rank's K,V gradient from", left(r), &waited, err, errlen));
        for (int j = 0; j < 2; j++)
            CHECK(ring_wait(r, &r->d_send[j], r->cp, "wait for the send of the K,V gradient to", right(r), &waited, err,
                            errlen));
        mine = r->dinc;
    }
    o->attention_kv_unpack(o->ctx, dqkv, mine, N, s->NH, s->NKV, s->HS, 0);
    if (st) {
        st->wait_bwd_s += waited;
        st->ring_bwd_s += trace_now() - t0;
    }
    return STATUS_OK;
}
