#include "src/train/eval_mc.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/train/forward.h"
#include "src/train/train_internal.h"

/* The metrics key of path: its base name less the last extension, other
 * characters than [A-Za-z0-9_.-] as '_' (JSON keys and TensorBoard tags). */
static void file_key(const char *path, char *key, size_t len)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t n = dot && dot > base ? (size_t)(dot - base) : strlen(base);
    n = n < len - 1 ? n : len - 1;
    for (size_t i = 0; i < n; i++) {
        const char ch = base[i];
        const int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                       ch == '.' || ch == '-';
        key[i] = ok ? ch : '_';
    }
    key[n] = '\0';
}

/* The examples of f fit a model of vocab tokens and seq_len positions. */
static int check_fits(const mc_file_t *m, int vocab, int seq_len, char *err, size_t errlen)
{
    if (m->f.max_token >= vocab) {
        snprintf(err, errlen,
                 "--eval-mc %s: token %d is outside the model's vocabulary of %d: prepare the file with "
                 "the tokenizer of the training data",
                 m->path, m->f.max_token, vocab);
        return -1;
    }
    for (int e = 0; e < m->f.n; e++) {
        const evalmc_example_t *x = &m->f.ex[e];
        int longest = 0;
        for (int c = 0; c < x->n_comp; c++)
            longest = x->comp_len[c] > longest ? x->comp_len[c] : longest;
        if (x->ctx_len < 1 || longest > seq_len) {
            snprintf(err, errlen, "--eval-mc %s: example %d: %s", m->path, e,
                     x->ctx_len < 1 ? "no context tokens: its first completion token has nothing to follow"
                                    : "a completion longer than --seq-len: raise --seq-len or drop the example");
            return -1;
        }
    }
    return 0;
}

/* One file: read, checked, and its row table. */
static int open_file(mc_file_t *m, const char *path, size_t len, int vocab, int seq_len, char *err, size_t errlen)
{
    if (len >= sizeof m->path) {
        snprintf(err, errlen, "--eval-mc: a file name is longer than %zu characters", sizeof m->path - 1);
        return -1;
    }
    memcpy(m->path, path, len);
    m->path[len] = '\0';
    file_key(m->path, m->name, sizeof m->name);
    char why[1024];
    if (evalmc_load(&m->f, m->path, why, sizeof why) != 0) {
        snprintf(err, errlen, "--eval-mc: %s", why);
        return -1;
    }
    if (check_fits(m, vocab, seq_len, err, errlen) != 0)
        return -1;
    m->row0 = malloc(((size_t)m->f.n + 1) * sizeof *m->row0);
    if (!m->row0) {
        snprintf(err, errlen, "--eval-mc %s: out of memory", m->path);
        return -1;
    }
    m->row0[0] = 0;
    for (int e = 0; e < m->f.n; e++)
        m->row0[e + 1] = m->row0[e] + m->f.ex[e].n_comp;
    m->sum = calloc((size_t)m->row0[m->f.n], sizeof *m->sum);
    if (!m->sum) {
        snprintf(err, errlen, "--eval-mc %s: out of memory", m->path);
        return -1;
    }
    return 0;
}

int mc_eval_open(mc_eval_t *ev, const char *list, int vocab, int seq_len, const char *dump, int write_dump, char *err,
                 size_t errlen)
{
    memset(ev, 0, sizeof *ev);
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (ev->n == METRICS_MC_MAX) {
            snprintf(err, errlen, "--eval-mc: at most %d files", METRICS_MC_MAX);
            return -1;
        }
        if (open_file(&ev->file[ev->n++], p, len, vocab, seq_len, err, errlen) != 0)
            return -1;
        p = comma ? comma + 1 : p + len;
    }
    for (int i = 0; i < ev->n; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(ev->file[i].name, ev->file[j].name) == 0) {
                snprintf(err, errlen, "--eval-mc: %s and %s share the name '%s' in the metrics: rename one",
                         ev->file[j].path, ev->file[i].path, ev->file[i].name);
                return -1;
            }
    if (write_dump && dump[0] && !(ev->dump = fopen(dump, "a"))) {
        snprintf(err, errlen, "--eval-mc-dump %s: cannot open for appending: %s", dump, strerror(errno));
        return -1;
    }
    return 0;
}

void mc_eval_close(mc_eval_t *ev)
{
    for (int i = 0; i < ev->n; i++) {
        evalmc_free(&ev->file[i].f);
        free(ev->file[i].row0);
        free(ev->file[i].sum);
    }
    if (ev->dump)
        fclose(ev->dump);
    memset(ev, 0, sizeof *ev);
}

void mc_row(const evalmc_example_t *x, int c, int t, int32_t *tok, int32_t *tgt)
{
    /* the row is context then completion, L tokens; its inputs are the
     * first L-1, its targets the last L-1; keep the last t of them */
    const int L = x->ctx_len + x->comp_len[c], start = L - 1 > t ? L - 1 - t : 0, n = L - 1 - start;
#define AT(i) ((i) < x->ctx_len ? x->ctx[(i)] : x->comp[c][(i)-x->ctx_len])
    for (int i = 0; i < t; i++) {
        tok[i] = i < n ? AT(start + i) : 0;
        tgt[i] = i < n && start + i + 1 >= x->ctx_len ? AT(start + i + 1) : -1;
    }
#undef AT
}

/* Fills the batch's b rows from the cursor (example *e, completion *c of
 * this data rank's share: the CP ranks of a DP rank share it), padding
 * rows where it has run out; row_of[b]: the file's row, or -1. */
static void fill_batch(trainer_t *tr, const mc_file_t *m, int *e, int *c, int *row_of)
{
    const int B = tr->run->micro_batch, T = tr->run->seq_len, dp = grid_data_size(tr->grid);
    for (int b = 0; b < B; b++) {
        int32_t *tok = tr->tok + (size_t)b * T, *tgt = tr->tgt + (size_t)b * T;
        if (*e >= m->f.n) {
            memset(tok, 0, (size_t)T * sizeof *tok);
            for (int i = 0; i < T; i++)
                tgt[i] = -1;
            row_of[b] = -1;
            continue;
        }
        mc_row(&m->f.ex[*e], *c, T, tok, tgt);
        row_of[b] = m->row0[*e] + *c;
        if (++*c == m->f.ex[*e].n_comp) {
            *c = 0;
            *e += dp;
        }
    }
}

/* The forwards of one file's rows on this rank; the last stage sums each
 * row's scored losses (in double, in position order; under --cp this
 * rank's chunks' part, which the DP x CP sum completes) into m->sum.
 * Every rank runs `rounds` forwards; after each, the world agrees whether
 * one failed (as trainer_val_loss does). */
static int run_rows(trainer_t *tr, mc_file_t *m, int rounds, char *why, size_t whylen)
{
    const grid_t *g = tr->grid;
    const int B = tr->run->micro_batch, T = tr->run->seq_len, last = g->pp_rank == g->pp_size - 1;
    float *loss = malloc((size_t)B * T * sizeof *loss);
    int *row_of = malloc((size_t)B * sizeof *row_of);
    int failed = !loss || !row_of, e = grid_data_rank(g), c = 0;
    if (failed)
        snprintf(why, whylen, "out of memory");
    for (int r = 0; r < rounds && !failed; r++) {
        fill_batch(tr, m, &e, &c, row_of);
        float v = 0.0f;
        const int32_t *tok = tr->tok, *tgt = tr->tgt, *pos = NULL;
        int t = T;
        trainer_cp_view(tr, &tok, &pos, &tgt, B, &t);
        failed = forward_pipeline(&tr->model, g, tok, pos, tgt, B, t, &v, why, whylen) != STATUS_OK;
        if (!failed && last) {
            model_token_losses(&tr->model, 0, loss, B * t);
            for (int b = 0; b < B; b++) {
                double s = 0.0;
                for (int i = 0; i < t && row_of[b] >= 0; i++)
                    s += tgt[(size_t)b * t + i] >= 0 ? (double)loss[(size_t)b * t + i] : 0.0;
                if (row_of[b] >= 0)
                    m->sum[row_of[b]] = s;
            }
        }
        if (g->world_size > 1 &&
            tr->world->ops->allreduce(tr->world, &failed, 1, COMM_INT32, COMM_MAX, why, whylen) != 0)
            failed = 1;
    }
    free(loss);
    free(row_of);
    return failed ? -1 : 0;
}

/* The forwards every rank runs for m: the most batches any DP rank's
 * share of the rows fills. */
static int mc_rounds(const mc_file_t *m, int dp, int B)
{
    int most = 0;
    for (int r = 0; r < dp; r++) {
        int rows = 0;
        for (int e = r; e < m->f.n; e += dp)
            rows += m->f.ex[e].n_comp;
        most = rows > most ? rows : most;
    }
    return (most + B - 1) / B;
}

/* Example e's picks: the lowest summed loss (*by_sum) and the lowest mean
 * per token (*by_mean), the first on a tie (numpy's argmin). */
static void pick(const mc_file_t *m, int e, int *by_sum, int *by_mean)
{
    const evalmc_example_t *x = &m->f.ex[e];
    const double *s = m->sum + m->row0[e];
    *by_sum = *by_mean = 0;
    for (int c = 1; c < x->n_comp; c++) {
        if (s[c] < s[*by_sum])
            *by_sum = c;
        if (s[c] / x->comp_len[c] < s[*by_mean] / x->comp_len[*by_mean])
            *by_mean = c;
    }
}

/* Rank 0: every example's scores at this step, one JSON line each. */
static void dump_file(FILE *f, const mc_file_t *m, int step)
{
    for (int e = 0; e < m->f.n; e++) {
        const evalmc_example_t *x = &m->f.ex[e];
        const double *s = m->sum + m->row0[e];
        int ps, pm;
        pick(m, e, &ps, &pm);
        fprintf(f, "{\"step\": %d, \"file\": \"%s\", \"example\": %d, \"label\": %d, \"sum\": [", step, m->name, e,
                x->label);
        for (int c = 0; c < x->n_comp; c++)
            fprintf(f, "%s%.9g", c ? ", " : "", s[c]);
        fprintf(f, "], \"mean\": [");
        for (int c = 0; c < x->n_comp; c++)
            fprintf(f, "%s%.9g", c ? ", " : "", s[c] / x->comp_len[c]);
        fprintf(f, "], \"pred_sum\": %d, \"pred_mean\": %d}\n", ps, pm);
    }
    fflush(f);
}

int trainer_eval_mc(trainer_t *tr, step_record_t *r, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    mc_eval_t *ev = &tr->mc;
    for (int i = 0; i < ev->n; i++) {
        mc_file_t *m = &ev->file[i];
        const int rows = m->row0[m->f.n];
        char why[512] = "";
        memset(m->sum, 0, (size_t)rows * sizeof *m->sum);
        /* each row's sum from its DP rank's last stage, zeros elsewhere */
        if (run_rows(tr, m, mc_rounds(m, grid_data_size(g), tr->run->micro_batch), why, sizeof why) != 0 ||
            (g->pp_size > 1 &&
             g->pp->ops->allreduce(g->pp, m->sum, (size_t)rows, COMM_FP64, COMM_SUM, why, sizeof why) != 0) ||
            (g->dp_size > 1 &&
             g->dp->ops->allreduce(g->dp, m->sum, (size_t)rows, COMM_FP64, COMM_SUM, why, sizeof why) != 0)) {
            snprintf(err, errlen, "--eval-mc %s: %s", m->path, why[0] ? why : "a forward or its collectives failed");
            return -1;
        }
        int right_sum = 0, right_mean = 0;
        for (int e = 0; e < m->f.n; e++) {
            int ps, pm;
            pick(m, e, &ps, &pm);
            right_sum += ps == m->f.ex[e].label;
            right_mean += pm == m->f.ex[e].label;
        }
        r->mc[i].name = m->name;
        r->mc[i].acc = (double)right_sum / m->f.n;
        r->mc[i].acc_norm = (double)right_mean / m->f.n;
        r->mc[i].examples = m->f.n;
        if (ev->dump)
            dump_file(ev->dump, m, r->step);
    }
    r->n_mc = ev->n;
    return 0;
}
