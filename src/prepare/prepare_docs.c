/* The document loop of dtrain-prepare.
 *
 * Every rank walks the same document stream (reading is cheap next to
 * tokenizing); each document belongs to one rank (see deal_t), which alone
 * tokenizes it (and, for JSONL, alone parses its line). Documents are dealt
 * in rounds of round_docs: after each round the ranks sum the token counts
 * of the round's documents, so every rank knows where each document lands
 * in its split's stream, and each writes its own documents there. Memory
 * per rank is bounded by one round's share of tokens. */
#include "src/prepare/prepare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Document d's split: validation for every d where floor(d F) steps up,
 * so the validation documents are spread evenly through the corpus and
 * exactly floor(N F) of N are chosen, whatever the number of ranks. */
static prep_split_t split_of(uint64_t d, double f)
{
    return (uint64_t)((double)(d + 1) * f) > (uint64_t)((double)d * f) ? PREP_VAL : PREP_TRAIN;
}

/* Who tokenizes which document. Consecutive documents go to one rank in
 * runs of at least `quantum` bytes of input, the runs round the ranks in
 * turn: a rank's documents are then mostly neighbours in the outputs and
 * go out in one write per run and split (one write per document cost
 * more than a fifth of the tokenizing time on GPT-2). A round ends after
 * DEAL_CYCLES full turns, when every rank has had as many runs (the ranks
 * wait for each other at the end of a round, so the turns must not stop
 * part way), or at round_docs documents or PREP_ROUND_BYTES of input,
 * whichever comes first. The quantum comes from the previous round's
 * bytes per document, sized so that the turns end a round a little before
 * either bound does. Large rounds keep the writes few (a rank writes once
 * per run and split) and the waits at the rounds' ends few. The first round has no quantum:
 * every document is a run, dealt one at a time, as are documents longer
 * than the quantum (whole files), which keeps a few large documents
 * spread over the ranks. Every rank sees the same sizes and makes the
 * same deal; the outputs do not depend on it. */
#define DEAL_CYCLES 16
#define DEAL_FILL 0.875 /* of a round's bound that the turns are sized for */

typedef struct deal {
    int owner;        /* rank of the current run */
    uint64_t run;     /* input bytes in the current run */
    uint64_t quantum; /* a run ends once it holds this many bytes */
    uint64_t runs;    /* runs completed in this round */
    uint64_t round;   /* input bytes dealt in this round */
} deal_t;

/* The round's turns are complete: every rank had DEAL_CYCLES runs. */
static int deal_round_done(const deal_t *d, int nranks) { return d->runs == (uint64_t)nranks * DEAL_CYCLES; }

/* The owner's run takes a document of `span` input bytes. */
static void deal_advance(deal_t *d, int nranks, size_t span)
{
    d->run += span;
    d->round += span;
    if (d->run >= d->quantum) {
        d->owner = (d->owner + 1) % nranks;
        d->run = 0;
        d->runs++;
    }
}

/* The round's input bounds are reached. */
static int deal_round_full(const deal_t *d, int64_t n_docs, size_t round_docs)
{
    return (size_t)n_docs >= round_docs || d->round >= PREP_ROUND_BYTES;
}

/* The next quantum from this round's n_docs documents: the turns fill
 * DEAL_FILL of round_docs documents of this round's mean size, or of
 * PREP_ROUND_BYTES when that is less. */
static void deal_end_round(deal_t *d, int nranks, int64_t n_docs, size_t round_docs)
{
    double bytes = (double)d->round / (double)(n_docs > 0 ? n_docs : 1) * (double)round_docs;
    if (bytes > (double)PREP_ROUND_BYTES)
        bytes = (double)PREP_ROUND_BYTES;
    if (n_docs > 0)
        d->quantum = (uint64_t)(DEAL_FILL * bytes / ((double)nranks * DEAL_CYCLES));
    d->runs = 0;
    d->round = 0;
}

/* One round's documents owned by this rank: their ids back to back. */
typedef struct round_buf {
    tok_ids_t ids;
    uint64_t *doc; /* global document index of each owned document */
    size_t *first; /* its first id in ids */
    size_t n, cap;
} round_buf_t;

static int round_push(round_buf_t *b, uint64_t d)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        uint64_t *doc = realloc(b->doc, cap * sizeof *doc);
        if (doc)
            b->doc = doc;
        size_t *first = realloc(b->first, cap * sizeof *first);
        if (first)
            b->first = first;
        if (!doc || !first)
            return -1;
        b->cap = cap;
    }
    b->doc[b->n] = d;
    b->first[b->n] = b->ids.n;
    b->n++;
    return 0;
}

/* The tokens of one document: the tokenizer's start token, the text, and
 * its end token, or for the byte kind the text and "\n\n" when the text
 * does not end a line (so documents never run together). */
static int tokenize_doc(prep_run_t *r, const corpus_doc_t *doc, tok_ids_t *out, char *err, size_t errlen)
{
    tokenizer_t *tk = r->tk;
    if (tk->doc_start != TOK_NO_ID && tok_ids_push(out, tk->doc_start) != 0)
        goto oom;
    if (tokenizer_encode(tk, doc->text, doc->len, out, err, errlen) != 0)
        return -1;
    if (tk->doc_sep && (doc->len == 0 || doc->text[doc->len - 1] != '\n') &&
        tokenizer_encode(tk, tk->doc_sep, strlen(tk->doc_sep), out, err, errlen) != 0)
        return -1;
    if (tk->doc_end != TOK_NO_ID && tok_ids_push(out, tk->doc_end) != 0)
        goto oom;
    r->text_bytes += doc->len;
    return 0;
oom:
    prep_err(err, errlen, "out of memory tokenizing document %llu", (unsigned long long)doc->index);
    return -1;
}

/* Prefix an error with where the document came from. */
static void doc_error(const prep_run_t *r, corpus_t *c, const corpus_doc_t *doc, const char *why, char *msg, size_t len)
{
    prep_err(msg, len, "%s, document %llu (line %llu): %s", r->o->inputs[doc->file], (unsigned long long)doc->index,
             (unsigned long long)corpus_doc_line(c, doc), why);
}

/* Keep and tokenize a document this rank owns. */
static int own_doc(prep_run_t *r, round_buf_t *b, const corpus_doc_t *doc, char *err, size_t errlen)
{
    if (round_push(b, doc->index) != 0) {
        prep_err(err, errlen, "out of memory holding a round of documents: lower --round-docs");
        return -1;
    }
    return tokenize_doc(r, doc, &b->ids, err, errlen);
}

/* Read a round of documents (see deal_t), tokenizing this rank's. Returns the
 * number of documents read (all ranks read the same), or -1 with *err_key
 * the document index where it failed (UINT64_MAX when the failure is not
 * tied to a document). A rank that fails on a document of its own (a
 * malformed JSONL line, a tokenizer error) keeps reading the round, owning
 * nothing more, up to the same document as the others: with mapped inputs
 * reading on may mean a window exchange (prepare_split.c), which every rank
 * must join before the round's errors are agreed. */
static int64_t read_round(prep_run_t *r, corpus_t *c, deal_t *deal, round_buf_t *b, int *at_end, uint64_t *err_key,
                          char *msg, size_t msglen)
{
    int64_t got = 0;
    int failed = 0;
    char err[PREP_ERRLEN];
    while (!deal_round_full(deal, got, r->o->round_docs) && !deal_round_done(deal, r->nranks)) {
        corpus_doc_t doc;
        int mine = !failed && deal->owner == r->rank;
        int rc = corpus_next(c, mine, &doc, err, sizeof err);
        if (rc == 0) {
            *at_end = 1;
            break;
        }
        if (rc < 0 && corpus_skip(c) != 0) {
            /* the reading stopped, at the same document on every rank
             * (streamed inputs are read whole by each; a mapped window's
             * failure is shared), or with no collective ahead (streamed) */
            if (!failed) {
                *err_key = r->n_docs + (uint64_t)got;
                prep_err(msg, msglen, "%s", err);
            }
            return -1;
        }
        if (!failed && rc < 0) {
            *err_key = doc.index;
            prep_err(msg, msglen, "%s", err);
            failed = 1;
        } else if (mine && own_doc(r, b, &doc, err, sizeof err) != 0) {
            *err_key = doc.index;
            doc_error(r, c, &doc, err, msg, msglen);
            failed = 1;
        }
        deal_advance(deal, r->nranks, doc.span);
        got++;
    }
    deal_end_round(deal, r->nranks, got, r->o->round_docs);
    return failed ? -1 : got;
}

/* Sum the round's per-document token counts over the ranks: counts[i] of
 * document n_docs + i, from its owner. */
static void round_counts(const prep_run_t *r, const round_buf_t *b, int64_t n, int64_t *counts)
{
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (size_t k = 0; k < b->n; k++) {
        size_t end = k + 1 < b->n ? b->first[k + 1] : b->ids.n;
        counts[b->doc[k] - r->n_docs] = (int64_t)(end - b->first[k]);
    }
    prep_mpi_check(MPI_Allreduce(MPI_IN_PLACE, counts, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD),
                   "MPI_Allreduce(document token counts)");
}

/* Rank 0 keeps every document's length for the Megatron index. */
static int record_doc_len(prep_stream_t *st, int64_t len)
{
    if (st->n_docs == st->doc_cap) {
        size_t cap = st->doc_cap ? 2 * st->doc_cap : 4096;
        int32_t *p = realloc(st->doc_len, cap * sizeof *p);
        if (!p)
            return -1;
        st->doc_len = p;
        st->doc_cap = cap;
    }
    st->doc_len[st->n_docs] = (int32_t)len;
    return 0;
}

/* Place the round's documents: global offsets from the counts, this rank's
 * documents written there. 0 or -1 with msg. */
static int place_round(prep_run_t *r, const round_buf_t *b, int64_t n, const int64_t *counts, char *msg, size_t msglen)
{
    uint64_t at[PREP_N_SPLITS] = {r->stream[PREP_TRAIN].n_tokens, r->stream[PREP_VAL].n_tokens};
    size_t k = 0;
    int keep_lens = r->rank == 0 && r->o->format == PREP_FORMAT_MEGATRON;
    for (int64_t i = 0; i < n; i++) {
        uint64_t d = r->n_docs + (uint64_t)i;
        prep_stream_t *st = &r->stream[split_of(d, r->o->val_fraction)];
        if (counts[i] > INT32_MAX) {
            prep_err(msg, msglen, "document %llu has %lld tokens, more than a token file's int32 length field holds",
                     (unsigned long long)d, (long long)counts[i]);
            return -1;
        }
        if (k < b->n && b->doc[k] == d) {
            size_t end = k + 1 < b->n ? b->first[k + 1] : b->ids.n;
            if (prep_stream_write(st, at[st->split], b->ids.id + b->first[k], end - b->first[k], msg, msglen) != 0)
                return -1;
            k++;
        }
        if (keep_lens && counts[i] > 0 && record_doc_len(st, counts[i]) != 0) {
            prep_err(msg, msglen, "out of memory recording document lengths");
            return -1;
        }
        at[st->split] += (uint64_t)counts[i];
        st->n_docs += counts[i] > 0;
        st->n_tokens = at[st->split];
    }
    /* the round's tokens are all on their way before its errors are agreed */
    for (int s = 0; s < PREP_N_SPLITS; s++)
        if (prep_stream_flush(&r->stream[s], msg, msglen) != 0)
            return -1;
    return 0;
}

static void round_free(round_buf_t *b)
{
    free(b->ids.id);
    free(b->doc);
    free(b->first);
}

int prep_documents(prep_run_t *r)
{
    const prep_opts_t *o = r->o;
    char msg[PREP_ERRLEN] = "";
    corpus_t *c = NULL;
    prep_window_t *win = NULL;
    int failed = corpus_open(&c, o->inputs, o->n_inputs, &o->corpus, msg, sizeof msg) != 0;
    if (prep_agree(r, failed, 0, msg))
        return PREP_EXIT_USAGE;
    failed = prep_window_attach(r, c, &win, msg, sizeof msg) < 0;
    if (prep_agree(r, failed, 0, msg)) {
        corpus_close(c);
        return PREP_EXIT_USAGE;
    }
    int64_t *counts = malloc(o->round_docs * sizeof *counts);
    round_buf_t b = {0};
    deal_t deal = {0};
    int status = 0, at_end = 0;
    failed = counts == NULL;
    if (prep_agree(r, failed, 0, "out of memory for the document round buffers")) {
        status = PREP_EXIT_IO;
        goto out;
    }
    while (!at_end) {
        uint64_t key = UINT64_MAX;
        b.n = 0;
        b.ids.n = 0;
        int64_t n = read_round(r, c, &deal, &b, &at_end, &key, msg, sizeof msg);
        if (prep_agree(r, n < 0, key, msg)) {
            status = PREP_EXIT_USAGE;
            break;
        }
        round_counts(r, &b, n, counts);
        failed = place_round(r, &b, n, counts, msg, sizeof msg) != 0;
        if (prep_agree(r, failed, r->rank, msg)) {
            status = PREP_EXIT_IO;
            break;
        }
        for (int s = 0; s < PREP_N_SPLITS; s++)
            prep_stream_writeback(&r->stream[s]);
        r->n_docs += (uint64_t)n;
    }
out:
    round_free(&b);
    free(counts);
    corpus_close(c);
    prep_window_free(win);
    return status;
}
