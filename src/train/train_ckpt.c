/* The trainer's checkpoint and parameter I/O: host copies of the state,
 * --resume, --init-from, checkpoints written now or in the background
 * (--ckpt-async), --save-params and the spike guard's rollback. */
#include "src/train/train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "base/mem.h"
#include "io/fsutil.h"
#include "io/h5store.h"
#include "io/tok_sidecar.h"
#include "mpi/agree.h"
#include "mpi/clock.h"
#include "mpi/replica.h"
#include "src/backend/backend.h"
#include "src/backend/ops_cpu.h"
#include "src/ckpt/ckpt.h"
#include "src/ckpt/ckpt_async.h"
#include "src/ckpt/param_io.h"
#include "src/convert/hf_import.h"
#include "src/model/docmask.h"
#include "src/model/flops.h"
#include "src/train/metrics.h"
#include "src/train/sample.h"
#include "src/train/train_internal.h"

/* The parameters from a full flat host copy [table.numel]: the model's
 * buffer, and what the strategy holds beside it (ZeRO-3: this rank's
 * pieces of the blocks). */
static int params_from_host(trainer_t *tr, const float *host, char *err, size_t errlen)
{
    if (host == tr->model.params) /* filled in place (model_params_in_place) */
        model_params_written(&tr->model);
    else
        model_params_from_host(&tr->model, host);
    if (tr->sync.ops->params_from_host(&tr->sync, host, err, errlen) != 0)
        return -1;
    adamw_offload_pull(&tr->optim, tr->sync.view.params); /* --offload: the host master copy */
    return 0;
}

/* The reverse: a full flat host copy. Under ZeRO-3 the blocks are gathered
 * from the pieces: collective over the shard group. */
int params_to_host(trainer_t *tr, float *host, char *err, size_t errlen)
{
    model_params_to_host(&tr->model, host);
    return tr->sync.ops->params_to_host(&tr->sync, host, err, errlen);
}

/* --init-from: this rank's slices of the file's tensors into host (see
 * src/convert/hf_import.h); rank 0 reports what the ranks read and held. */
static int import_params(trainer_t *tr, float *host, char *err, size_t errlen)
{
    init_from_report_t rep = {0};
    const int fresh = host != tr->model.params; /* not the resident parameters themselves */
    char cerr[COMM_ERR_MAX];
    /* from a common start, so that the time reported is the import's: a
     * rank that started early counted its peers' start-up, run on the same
     * cores, as its own import (4 ranks on 2 cores reported 0.15-0.20 s,
     * each run's slowest rank; 0.16 s from a common start) */
    int rc = host ? 0 : -1;
    if (tr->world->ops->barrier(tr->world, cerr, sizeof cerr) != STATUS_OK && rc == 0) {
        snprintf(err, errlen, "--init-from: the barrier before the import failed: %s", cerr);
        rc = -1;
    }
    if (rc == 0)
        rc = init_from_load(tr->opt->init_from, &tr->cfg, &tr->model.table, host, fresh, &rep, err, errlen);
    /* [0] MiB read, [1] resident growth MiB, [2] local MiB, [3] largest tensor MiB, [4] staging MiB,
     * [5] seconds (the slowest rank's: the import is done when it is) */
    double most[6] = {rep.bytes_read / 1048576.0,     rep.rss_growth_kb / 1024.0,   rep.local_bytes / 1048576.0,
                      rep.largest_tensor / 1048576.0, rep.staging_peak / 1048576.0, rep.seconds};
    if (tr->world->ops->allreduce(tr->world, most, 6, COMM_FP64, COMM_MAX, cerr, sizeof cerr) != STATUS_OK && rc == 0) {
        snprintf(err, errlen, "--init-from: the all-reduce of the import report failed: %s", cerr);
        rc = -1;
    }
    if (tr->env->world_rank == 0 && rc == 0)
        printf("init-from: %s (%s, %d file(s), %s) in %.2f s; per rank at most: %.2f MiB read (its slices), "
               "resident memory grew %.2f MiB for %.2f MiB of local tensors (largest %.2f MiB), staging %.3f MiB\n",
               tr->opt->init_from, rep.kind == INIT_FROM_LLMC ? "llm.c" : "Hugging Face", rep.n_files, rep.dtypes,
               most[5], most[0], most[1], most[2], most[3], most[4]);
    return rc;
}

/* --resume wins over --init-from when it finds a checkpoint: a requeued
 * fine-tuning job continues from its last checkpoint instead of starting
 * again from the imported weights. Collective. */
static int resume_will_load(trainer_t *tr)
{
    char path[OPT_PATH_MAX + 64], e[256];
    const run_options_t *o = tr->opt;
    if (!o->resume[0])
        return 0;
    /* an error here is reported by trainer_resume: do not import then either */
    if (ckpt_resolve(tr->world, o->resume, o->ckpt_dir, path, sizeof path, e, sizeof e) != 0)
        return 1;
    if (path[0] && tr->env->world_rank == 0)
        printf("init-from: --resume found %s: continuing from it, not from %s\n", path, o->init_from);
    return path[0] != '\0';
}

/* Parameters from --init-from, or from the counter-based initializer
 * (every layout and stage starts from the same logical values). Collective:
 * every rank fails alike, with one line in err. */
int init_params(trainer_t *tr, uint64_t seed, char *err, size_t errlen)
{
    model_t *m = &tr->model;
    /* in place where the parameters are host memory: the import then
     * faults in no memory of its own (gpt2-124m: 0.17 s of page faults,
     * half its time on tmpfs) and nothing is copied after it */
    float *in_place = model_params_in_place(m);
    float *host = in_place ? in_place : malloc(m->table.numel * sizeof *host + 1);
    int rc = host ? 0 : -1;
    if (!host)
        snprintf(err, errlen, "out of memory for the parameters (%zu floats)", m->table.numel);
    if (tr->opt->init_from[0] && !resume_will_load(tr)) {
        if (import_params(tr, host, err, errlen) != 0)
            rc = -1;
    } else if (host) {
        param_table_init(&m->table, host, seed);
    }
    rc = agree(tr->world, rc, err, errlen);
    char cerr[COMM_ERR_MAX];
    if (rc == 0 && params_from_host(tr, host, cerr, sizeof cerr) != 0) {
        snprintf(err, errlen, "setting the parameters failed: %s", cerr);
        rc = -1;
    }
    if (!in_place)
        free(host);
    return rc;
}

void free_state(trainer_t *tr)
{
    free(tr->host_p);
    free(tr->host_m);
    free(tr->host_v);
    tr->host_p = tr->host_m = tr->host_v = NULL;
}

/* Host copies of parameters and moments for checkpoint I/O (the CPU
 * backend's memory is host memory, but the ops table does not promise it).
 * Made once and kept for the run: allocating and faulting in three fresh
 * buffers at every save cost more than writing the file (gpt2-124m on the
 * dev VM: ~6 s a save against ~4 s for the file). */
static int host_state(trainer_t *tr, float **p, float **m, float **v)
{
    if (!tr->host_p) {
        const size_t bytes = tr->model.table.numel * sizeof(float) + 1;
        tr->host_p = malloc(bytes);
        tr->host_m = malloc(bytes);
        tr->host_v = malloc(bytes);
        if (!tr->host_p || !tr->host_m || !tr->host_v)
            free_state(tr);
    }
    *p = tr->host_p;
    *m = tr->host_m;
    *v = tr->host_v;
    return tr->host_p ? 0 : -1;
}

/* The moments as full flat host buffers [table.numel] (what a checkpoint
 * holds) from the optimizer's, which are indexed as the strategy's view:
 * under ZeRO each rank's pieces, gathered over the shard group so that
 * the writer (DP rank 0) holds every element. Collective over the shard
 * group. */
static int moments_to_host(trainer_t *tr, float *hm, float *hv, char *err, size_t errlen)
{
    dpsync_t *s = &tr->sync;
    float *host[2] = {hm, hv};
    for (int k = 0; k < 2; k++) {
        float *x = adamw_moment_get(&tr->optim, k); /* --offload: a whole copy in backend memory */
        int rc = x ? 0 : -1;
        if (!x)
            snprintf(err, errlen, "out of memory for the optimizer moments");
        else if (s->ops->state_to_host(s, x, host[k], err, errlen) != 0)
            rc = -1;
        adamw_moment_put(&tr->optim, k, x, 0);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* The reverse, after a checkpoint was read: each rank keeps its pieces. */
static int moments_from_host(trainer_t *tr, const float *hm, const float *hv)
{
    const float *host[2] = {hm, hv};
    for (int k = 0; k < 2; k++) {
        float *x = adamw_moment_get(&tr->optim, k);
        if (!x)
            return -1;
        tr->sync.ops->state_from_host(&tr->sync, host[k], x);
        adamw_moment_put(&tr->optim, k, x, 1);
    }
    return 0;
}

/* Each dataset's position after `step` steps' batches (a rollback's
 * skipped batches included): the samples of it the blend drew (a checkpoint's record; the order itself is a function of the
 * global sample index). */
static void data_meta(const trainer_t *tr, int step, ckpt_meta_t *meta)
{
    const int gb = tr->opt->micro_batch * tr->accum * grid_data_size(tr->grid);
    uint64_t count[CKPT_DATA_MAX];
    meta->n_data = tr->train.n_parts <= CKPT_DATA_MAX ? tr->train.n_parts : 0;
    if (meta->n_data == 0)
        return;
    data_counts(&tr->train, (uint64_t)step * (uint64_t)gb, count);
    for (int i = 0; i < meta->n_data; i++)
        meta->data_drawn[i] = (long long)count[i];
}

/* --resume: the checkpoint's dataset positions against this run's order
 * (a different blend, global batch or seed gives another): a note when
 * they differ; the run continues in its own order. */
static void data_resume_note(trainer_t *tr, const ckpt_meta_t *meta)
{
    ckpt_meta_t mine = {0};
    if (meta->n_data == 0 || tr->env->world_rank != 0)
        return;
    data_meta(tr, meta->step + meta->data_skip, &mine);
    int same = mine.n_data == meta->n_data;
    for (int i = 0; same && i < mine.n_data; i++)
        same = mine.data_drawn[i] == meta->data_drawn[i];
    if (!same)
        printf("resume: note: the checkpoint drew %lld samples of its first of %d datasets; this run's data order "
               "draws %lld of %d: the data (or its blend) differs from the checkpoint's run\n",
               meta->data_drawn[0], meta->n_data, mine.data_drawn[0], mine.n_data);
}

/* Reads the checkpoint at path into the model and the optimizer's moments
 * (its run state into *meta, rank 0's read time into *load_s): --resume
 * and a rollback after loss spikes. Collective. */
static int load_state(trainer_t *tr, const char *path, ckpt_meta_t *meta, double *load_s, char *err, size_t errlen)
{
    model_t *m = &tr->model;
    float *hp, *hm, *hv;
    int rc = host_state(tr, &hp, &hm, &hv);
    if (rc != 0)
        snprintf(err, errlen, "out of memory for loading %s", path);
    rc = agree(tr->world, rc, err, errlen);
    if (rc == 0) {
        /* padding rows are not in the file: start them from the buffers' zeros */
        const size_t bytes = m->table.numel * sizeof(float);
        memset(hp, 0, bytes);
        memset(hm, 0, bytes);
        memset(hv, 0, bytes);
        /* ckpt_load ends in a collective close: rank 0's time is the job's */
        const double t0 = now_s();
        meta->moe_bias = tr->moe_bias;
        rc = ckpt_load(tr->world, path, &tr->cfg, &m->table, hp, hm, hv, meta, err, errlen);
        *load_s = now_s() - t0;
        if (rc == 0 && tr->moe_bias)
            model_moe_bias_set(m, tr->moe_bias);
    }
    if (rc == 0) {
        char cerr[COMM_ERR_MAX];
        if (params_from_host(tr, hp, cerr, sizeof cerr) != 0) {
            snprintf(err, errlen, "setting the parameters loaded from %s failed: %s", path, cerr);
            rc = -1;
        }
        if (rc == 0 && moments_from_host(tr, hm, hv) != 0) {
            snprintf(err, errlen, "out of memory for the optimizer moments loaded from %s", path);
            rc = -1;
        }
    }
    return agree(tr->world, rc, err, errlen);
}

_Static_assert(CKPT_SPIKE_STATE_MAX >= SPIKE_STATE_LEN, "a checkpoint holds the spike guard's state");

/* The loss-spike guard's window and run of skips from a checkpoint, so
 * the run decides as the one that wrote it would have; a checkpoint
 * older than the record: an empty window (on --resume, one note). Every
 * rank parses the same text: the same verdict without talking. */
static int restore_spike(trainer_t *tr, const ckpt_meta_t *meta, const char *path, int resume, char *err, size_t errlen)
{
    spike_t *sp = &tr->spike;
    char why[160];
    if (!meta->spike_state[0]) {
        spike_reset(sp);
        if (resume && tr->env->world_rank == 0 && sp->max > 0 && sp->z > 0 && sp->window > 0)
            printf("resume: note: %s has no loss-spike window (written before checkpoints recorded it): the "
                   "--spike-z window starts empty\n",
                   path);
        return 0;
    }
    if (spike_state_parse(sp, meta->spike_state, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s; resume from another checkpoint", path, why);
        return -1;
    }
    return 0;
}

/* --resume auto when the newest checkpoint (path) did not load (err says
 * why): a requeued job goes on from the newest older one that loads and
 * verifies, said loudly, rather than stopping for good; path becomes it.
 * With none, the first failure stands. Collective. */
static int resume_older(trainer_t *tr, char *path, size_t path_len, ckpt_meta_t *meta, double *load_s, char *err,
                        size_t errlen)
{
    char first[1024], why[1024], tried[OPT_PATH_MAX + 64], older[OPT_PATH_MAX + 64], e[1024];
    snprintf(first, sizeof first, "%s", err);
    snprintf(why, sizeof why, "%s", err);
    snprintf(tried, sizeof tried, "%s", path);
    for (;;) {
        int found = ckpt_older(tr->world, tr->opt->ckpt_dir, tried, older, sizeof older, e, sizeof e);
        if (found < 0) {
            snprintf(err, errlen, "%s", e);
            return -1;
        }
        if (found == 0) {
            snprintf(err, errlen, "%s", first);
            return -1;
        }
        if (tr->env->world_rank == 0)
            fprintf(stderr, "dtrain: warning: --resume auto: %s does not load (%s); trying %s\n", tried, why, older);
        if (load_state(tr, older, meta, load_s, e, sizeof e) == 0) {
            if (tr->env->world_rank == 0)
                fprintf(stderr,
                        "dtrain: warning: --resume auto: continuing from %s, not from the newest checkpoint %s, "
                        "which does not load: %s\n",
                        older, path, first);
            snprintf(path, path_len, "%s", older);
            return 0;
        }
        snprintf(why, sizeof why, "%s", e);
        snprintf(tried, sizeof tried, "%s", older);
    }
}

/* --resume: loads the checkpoint it names into the model and optimizer and
 * sets the step to continue from. Collective. */
int trainer_resume(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    char path[OPT_PATH_MAX + 64];
    if (ckpt_resolve(tr->world, o->resume, o->ckpt_dir, path, sizeof path, err, errlen) != 0)
        return -1;
    if (!path[0]) {
        if (tr->env->world_rank == 0)
            printf("resume: no checkpoint in %s yet, starting from step 0\n", o->ckpt_dir);
        return 0;
    }
    ckpt_meta_t meta;
    double load_s = 0.0;
    int rc = load_state(tr, path, &meta, &load_s, err, errlen);
    if (rc != 0 && strcmp(o->resume, "auto") == 0)
        rc = resume_older(tr, path, sizeof path, &meta, &load_s, err, errlen);
    if (rc == 0) {
        tr->optim.t = meta.adam_t;
        tr->start_step = meta.step;
        data_resume_note(tr, &meta);
        tr->steps_done = meta.step;
        tr->spike.data_skip = meta.data_skip;
        rc = restore_spike(tr, &meta, path, 1, err, errlen);
    }
    if (rc == 0) {
        if (tr->env->world_rank == 0) {
            printf("resume: %s, step %d, %lld tokens, written at %s; read and verified in %.2f s\n", path, meta.step,
                   meta.tokens, meta.layout, load_s);
            const int gb = o->global_batch ? o->global_batch : o->micro_batch * grid_data_size(tr->grid);
            if (meta.seed != o->seed || meta.global_batch != gb || meta.seq_len != o->seq_len)
                printf("resume: note: the checkpoint's run had seed %lld, global batch %d, seq len %d; this run "
                       "has %lld, %d, %d, so its data order differs from an uninterrupted run\n",
                       meta.seed, meta.global_batch, meta.seq_len, (long long)o->seed, gb, o->seq_len);
        }
    }
    return rc;
}

/* What this rank writes of a checkpoint (param_io_write): DP rank 0 the
 * dense tensors, expert-DP rank 0 its experts' slices (without --ep the
 * same rank). */
static int ckpt_writer(const grid_t *g)
{
    return (g->dp_rank == 0 ? PARAM_IO_WRITE_DENSE : 0) | (g->edp_rank == 0 ? PARAM_IO_WRITE_EXPERTS : 0);
}

/* The parameters and AdamW moments as full flat host buffers
 * [table.numel] (on the writers, every element). Collective. */
static int state_to_host(trainer_t *tr, float *hp, float *hm, float *hv, char *err, size_t errlen)
{
    int rc = 0;
    /* a replica that writes nothing and gathers for no one copies nothing:
     * its copy would only take memory bandwidth from the writer's */
    const int idle = !ckpt_writer(tr->grid) && !tr->sync.ops->shards;
    /* else collective over the shard group: every rank reaches it */
    char cerr[COMM_ERR_MAX] = "";
    if (!idle &&
        (params_to_host(tr, hp, cerr, sizeof cerr) != 0 || moments_to_host(tr, hm, hv, cerr, sizeof cerr) != 0)) {
        snprintf(err, errlen, "checkpoint: gathering the sharded parameters or AdamW moments failed: %s",
                 cerr[0] ? cerr : "out of memory");
        rc = -1;
    }
    return agree(tr->world, rc, err, errlen);
}

/* The layout a file records ("tp 2 pp 1 dp 2 zero 1", " cp N" appended
 * under --cp), for a person reading it. */
static void layout_text(const grid_t *g, int zero, char *out, size_t n)
{
    int k = snprintf(out, n, "tp %d pp %d dp %d zero %d", g->tp_size, g->pp_size, grid_data_size(g), zero);
    if (g->cp_size > 1 && k > 0 && (size_t)k < n)
        snprintf(out + k, n - (size_t)k, " cp %d", g->cp_size);
}

/* The run state a checkpoint of `step` completed steps records. */
static ckpt_meta_t ckpt_meta_at(const trainer_t *tr, int step)
{
    const run_options_t *o = tr->opt;
    const grid_t *g = tr->grid;
    ckpt_meta_t meta = {.step = step,
                        .adam_t = tr->optim.t,
                        .seed = o->seed,
                        .seq_len = o->seq_len,
                        .global_batch = o->micro_batch * tr->accum * grid_data_size(g),
                        .lr = o->lr,
                        .min_lr = o->min_lr,
                        .warmup = o->warmup,
                        .steps = o->steps,
                        .tokenizer = tr->data_tokenizer,
                        .tokenizer_sha256 = tr->data_tokenizer_sha256};
    meta.tokens = (long long)step * meta.global_batch * o->seq_len;
    meta.data_skip = tr->spike.data_skip;
    meta.moe_bias = tr->moe_bias;
    spike_state_format(&tr->spike, meta.spike_state, sizeof meta.spike_state);
    lr_schedule_record(&tr->sched, meta.lr_schedule, sizeof meta.lr_schedule, &meta.decay_steps, meta.decay_shape,
                       sizeof meta.decay_shape);
    data_meta(tr, step + tr->spike.data_skip, &meta);
    layout_text(g, tr->sync.ops->zero, meta.layout, sizeof meta.layout);
    return meta;
}

/* Writes the checkpoint of `step` completed steps. Collective. */
static int save_sync(trainer_t *tr, int step, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const grid_t *g = tr->grid;
    model_t *m = &tr->model;
    float *hp, *hm, *hv;
    int rc = host_state(tr, &hp, &hm, &hv);
    if (rc != 0)
        snprintf(err, errlen, "out of memory for a checkpoint");
    rc = agree(tr->world, rc, err, errlen);
    if (rc == 0)
        rc = state_to_host(tr, hp, hm, hv, err, errlen);
    if (rc == 0) {
        const ckpt_meta_t meta = ckpt_meta_at(tr, step);
        char path[OPT_PATH_MAX + 64];
        double t0 = now_s();
        rc = ckpt_save(tr->world, o->ckpt_dir, o->keep, &tr->cfg, &m->table, hp, hm, hv, ckpt_writer(g), g->tp_size,
                       g->tp_rank, &meta, path, sizeof path, err, errlen);
        if (rc == 0) {
            snprintf(tr->last_ckpt, sizeof tr->last_ckpt, "%s", path);
            tr->last_ckpt_step = step;
        }
        if (rc == 0 && tr->env->world_rank == 0)
            printf("checkpoint: %s (step %d) in %.2f s\n", path, step, now_s() - t0);
    }
    return rc;
}

/* --ckpt-async: the copies state_to_host would make, made while the next
 * step computes: by the writer from host memory (a host_readable backend: into
 * job->copy), or begun here on the backend's side stream (its
 * to_host_begin: CUDA, the deferred CPU table) into the writer's pinned
 * buffers (job->device_copy). 0 when they cannot be: the state is sharded
 * (ZeRO: its gather is collective over the shard group, which only the
 * main thread uses), or the backend has neither. Otherwise state_to_host
 * is three local copies (the replicated strategy: no parameters beside
 * the model's buffer, moments of view.n == the model's numel), and a
 * replica that is not DP rank 0 copies nothing. What the next step does
 * before its update leaves their sources unchanged: the forward and
 * backward (every micro batch of an accumulation, every stage) read the
 * fp32 parameters and write activations, gradients and the bf16 copy
 * (params16, not copied); only adamw_step writes parameters and moments,
 * and update_params waits for the copies first (ckpt_copy_wait); a
 * rollback, a stop and the end wait for the whole write. */
static int overlap_copies(trainer_t *tr, ckpt_async_t *a, ckpt_async_job_t *job)
{
    const model_t *m = &tr->model;
    const dpsync_t *s = &tr->sync;
    const int device = m->ops->to_host_begin && m->ops->to_host_end;
    if (s->ops->shards || (!device && !m->ops->host_readable) || m->lay.lent_block_params || s->n != m->table.numel ||
        tr->optim.host.n) /* --offload: moments in two places */
        return 0;
    job->n_copy = 0;
    if (!ckpt_writer(tr->grid))
        return 1;
    const float *src[3] = {m->params, tr->optim.m, tr->optim.v};
    for (int i = 0; i < 3; i++) {
        if (device)
            m->ops->to_host_begin(m->ops->ctx, ckpt_async_buffer(a, i), src[i], m->table.numel * sizeof(float));
        else
            job->copy[job->n_copy++] = (ckpt_async_copy_t){.buf = i, .off = 0, .n = m->table.numel, .src = src[i]};
    }
    job->device_copy = device;
    return 1;
}

/* --ckpt-async: waits for the previous write, copies the state into the
 * writer's host buffers (or has the writer copy it while the next step
 * computes: overlap_copies) and starts the write; the checkpoint counts as
 * the last one at once (a failed write ends the run). Collective. */
static int save_async(trainer_t *tr, int step, char *err, size_t errlen)
{
    ckpt_async_t *a = tr->ckpt_async;
    const grid_t *g = tr->grid;
    const double t0 = now_s();
    if (ckpt_async_wait(a, err, errlen) != 0)
        return -1;
    ckpt_async_job_t job = {.dir = tr->opt->ckpt_dir,
                            .keep = tr->opt->keep,
                            .cfg = &tr->cfg,
                            .t = &tr->model.table,
                            .writer = ckpt_writer(g),
                            .tp_size = g->tp_size,
                            .tp_rank = g->tp_rank,
                            .meta = ckpt_meta_at(tr, step)};
    if (tr->moe_bias) { /* the next step moves the bias while the writer formats it */
        const size_t nb = (size_t)tr->cfg.n_layer * tr->cfg.moe.experts;
        memcpy(tr->moe_bias + nb, tr->moe_bias, nb * sizeof *tr->moe_bias);
        job.meta.moe_bias = tr->moe_bias + nb;
    }
    /* the same answer on every rank: the strategy and the backend are the run's */
    const int overlap = overlap_copies(tr, a, &job);
    if (!overlap &&
        state_to_host(tr, ckpt_async_buffer(a, 0), ckpt_async_buffer(a, 1), ckpt_async_buffer(a, 2), err, errlen) != 0)
        return -1;
    if (agree(tr->world, ckpt_async_start(a, &job, err, errlen), err, errlen) != 0)
        return -1;
    snprintf(tr->last_ckpt, sizeof tr->last_ckpt, "%s/step_%08d.h5", tr->opt->ckpt_dir, step);
    tr->last_ckpt_step = step;
    if (tr->env->world_rank == 0)
        printf("checkpoint: step %d %s in %.1f ms, writing %s in the background\n", step,
               overlap ? "handed to the writer (the state is copied during the next step)" : "copied to host",
               1e3 * (now_s() - t0), tr->last_ckpt);
    return 0;
}

/* Before the optimizer update (or anything else that writes the
 * parameters or moments): the writer has copied them, or the device
 * copies are done (overlap_copies). The wait is stall: it goes to
 * ckpt_stall_ms (and, inside the step, to its time too). */
void ckpt_copy_wait(trainer_t *tr) { tr->ckpt_stall_s += ckpt_async_copied(tr->ckpt_async); }

/* A checkpoint of `step` completed steps, written now or in the
 * background (--ckpt-async); the time it held training up goes to the
 * next step record. Collective. */
int trainer_save(trainer_t *tr, int step, char *err, size_t errlen)
{
    const double t0 = now_s();
    int rc = tr->ckpt_async ? save_async(tr, step, err, errlen) : save_sync(tr, step, err, errlen);
    tr->ckpt_stall_s += now_s() - t0;
    if (rc == 0)
        tr->spike.rollbacks = 0; /* --spike-rollbacks counts those to the newest checkpoint */
    return rc;
}

/* --ckpt-async: waits for the write in flight (before a stop, the end of
 * the run, any other HDF5 use); at a step boundary (poll) only collects
 * one that every rank has finished. Collective; 0 without --ckpt-async. */
int ckpt_wait(trainer_t *tr, int poll, char *err, size_t errlen)
{
    if (!ckpt_async_busy(tr->ckpt_async))
        return 0;
    const double t0 = now_s();
    int rc = poll ? ckpt_async_poll(tr->ckpt_async, err, errlen) : ckpt_async_wait(tr->ckpt_async, err, errlen);
    tr->ckpt_stall_s += now_s() - t0;
    return rc;
}

/* --ckpt-async's writer, after a resume (whose host copies it replaces).
 * Collective; agreed. */
int setup_ckpt_async(trainer_t *tr, char *err, size_t errlen)
{
    int rc = 0;
    free_state(tr);
    if (!tr->env->thread_multiple)
        rc = status_set(STATUS_INPUT, err, errlen,
                        "--ckpt-async: this MPI library does not provide "
                        "MPI_THREAD_MULTIPLE, which the background writer needs; checkpoint without it");
    else if (!(tr->ckpt_async = ckpt_async_create(tr->model.ops, tr->world, tr->model.table.numel, err, errlen)))
        rc = -1;
    return agree(tr->world, rc, err, errlen);
}

/* --save-params: the parameters alone, as logical tensors. Collective. */
int trainer_save_params(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const grid_t *g = tr->grid;
    model_t *m = &tr->model;
    float *host = malloc(m->table.numel * sizeof *host + 1);
    int rc = host ? 0 : -1;
    if (!host)
        snprintf(err, errlen, "--save-params: out of memory");
    rc = agree(tr->world, rc, err, errlen);
    if (rc == 0) {
        char cerr[COMM_ERR_MAX];
        if (params_to_host(tr, host, cerr, sizeof cerr) != 0) {
            snprintf(err, errlen, "--save-params: gathering the sharded parameters failed: %s", cerr);
            rc = -1;
        }
    }
    rc = agree(tr->world, rc, err, errlen);
    if (rc == 0) {
        char layout[64];
        layout_text(g, tr->sync.ops->zero, layout, sizeof layout);
        h5store_attr_t *attrs = malloc((PARAM_IO_MODEL_ATTRS + 6 + (size_t)tr->cfg.n_layer) * sizeof *attrs);
        char *bias_text = NULL;
        int na = attrs ? param_io_model_attrs(&tr->cfg, attrs) : 0;
        const int nb = attrs ? param_io_moe_bias_attrs(&tr->cfg, tr->moe_bias, attrs + na, &bias_text) : -1;
        rc = nb < 0 ? -1 : 0; /* every rank allocates alike */
        if (rc != 0)
            snprintf(err, errlen, "--save-params: out of memory for the attributes");
        if (rc == 0) {
            na += nb;
            attrs[na++] = (h5store_attr_t){.key = "content", .type = H5STORE_STR, .s = "params"};
            attrs[na++] = (h5store_attr_t){.key = "dtrain_version", .type = H5STORE_STR, .s = PACKAGE_VERSION};
            attrs[na++] = (h5store_attr_t){.key = "layout", .type = H5STORE_STR, .s = layout};
            attrs[na++] = (h5store_attr_t){.key = "step", .type = H5STORE_INT, .i = tr->steps_done};
            na += param_io_tokenizer_attrs(tr->data_tokenizer, tr->data_tokenizer_sha256, attrs + na);
            const param_io_group_t group = {"params", host};
            rc = param_io_write(tr->world, o->save_params, &tr->cfg, &m->table, &group, 1, ckpt_writer(g),
                                g->tp_size, g->tp_rank, attrs, na, err, errlen);
        }
        free(attrs);
        free(bias_text);
    }
    free(host);
    if (rc == 0 && tr->env->world_rank == 0)
        printf("parameters written to %s\n", o->save_params);
    return rc;
}

/* --spike-max skipped steps in a row, the last 0-based `step`: back to the
 * last checkpoint (this job's, else the one it resumed from), reading on
 * from the batch after the skipped ones. Collective. */
int spike_rollback(trainer_t *tr, int step, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    spike_t *sp = &tr->spike;
    char path[OPT_PATH_MAX + 64] = "";
    if (tr->last_ckpt_step >= 0)
        snprintf(path, sizeof path, "%s", tr->last_ckpt);
    else if (tr->start_step > 0 && ckpt_resolve(tr->world, o->resume, o->ckpt_dir, path, sizeof path, err, errlen))
        return -1;
    if (!path[0]) {
        snprintf(err, errlen,
                 "spike: %d steps skipped in a row (steps %d-%d) and no checkpoint to go back to: "
                 "stopping (--ckpt-dir DIR --ckpt-every N keep one)",
                 sp->in_row, sp->first_skipped, step + 1);
        return -1;
    }
    const long long next = step + sp->data_skip + 1; /* the first batch after the skipped ones */
    if (sp->rollbacks >= sp->max_rollbacks) {
        snprintf(err, errlen,
                 "spike: %d steps skipped in a row (steps %d-%d) after %d rollback%s to %s with no newer checkpoint "
                 "(--spike-rollbacks %d): stopping; the loss keeps spiking past the skipped data (batch %lld on): "
                 "lower --lr or raise --warmup and resume, or raise --spike-rollbacks",
                 sp->in_row, sp->first_skipped, step + 1, sp->rollbacks, sp->rollbacks == 1 ? "" : "s", path,
                 sp->max_rollbacks, next + 1);
        return -1;
    }
    ckpt_meta_t meta;
    double load_s;
    /* the checkpoint may still be in the background writer's hands; HDF5 is one thread's at a time */
    if (ckpt_wait(tr, 0, err, errlen) != 0 || load_state(tr, path, &meta, &load_s, err, errlen) != 0)
        return -1;
    if (tr->env->world_rank == 0) {
        printf("spike: %d steps skipped in a row (steps %d-%d): back to %s (step %d), continuing on the data after "
               "the skipped batches (step %d reads batch %lld)\n",
               sp->in_row, sp->first_skipped, step + 1, path, meta.step, meta.step + 1, next + 1);
        fflush(stdout);
    }
    tr->optim.t = meta.adam_t;
    tr->steps_done = meta.step;
    sp->data_skip = next - meta.step;
    /* the window as at the checkpoint (a resume's), the run of skips
     * begun anew: the data it came from is left behind */
    if (restore_spike(tr, &meta, path, 0, err, errlen) != 0)
        return -1;
    sp->in_row = 0;
    sp->rollbacks++;
    sp->rolled_back = 1;
    return 0;
}
