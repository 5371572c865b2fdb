#include "src/train.h"

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
#include "src/backend.h"
#include "mpi/clock.h"
#include "src/docmask.h"
#include "src/flops.h"
#include "io/fsutil.h"
#include "src/mem.h"
#include "src/ops_cpu.h"
#include "src/ckpt.h"
#include "src/ckpt_async.h"
#include "mpi/agree.h"
#include "io/h5store.h"
#include "src/hf_import.h"
#include "src/param_io.h"
#include "src/metrics.h"
#include "mpi/replica.h"
#include "src/sample.h"
#include "io/tok_sidecar.h"

/* The parameters from a full flat host copy [table.numel]: the model's
 * buffer, and what the strategy holds beside it (ZeRO-3: this rank's
 * pieces of the blocks). */
static int params_from_host(trainer_t *tr, const float *host)
{
    model_params_from_host(&tr->model, host);
    return tr->sync.ops->params_from_host(&tr->sync, host);
}

/* The reverse: a full flat host copy. Under ZeRO-3 the blocks are gathered
 * from the pieces: collective over the shard group. */
static int params_to_host(trainer_t *tr, float *host)
{
    model_params_to_host(&tr->model, host);
    return tr->sync.ops->params_to_host(&tr->sync, host);
}

/* --init-from: this rank's slices of the file's tensors into host (see
 * src/hf_import.h); rank 0 reports what the ranks read and held. */
static int import_params(trainer_t *tr, float *host, char *err, size_t errlen)
{
    init_from_report_t rep = {0};
    int rc = host ? init_from_load(tr->opt->init_from, &tr->cfg, &tr->model.table, host, &rep, err, errlen) : -1;
    /* [0] MiB read, [1] resident growth MiB, [2] local MiB, [3] largest tensor MiB, [4] staging MiB,
     * [5] seconds (the slowest rank's: the import is done when it is) */
    double most[6] = {rep.bytes_read / 1048576.0,     rep.rss_growth_kb / 1024.0,   rep.local_bytes / 1048576.0,
                      rep.largest_tensor / 1048576.0, rep.staging_peak / 1048576.0, rep.seconds};
    if (tr->world->ops->allreduce(tr->world, most, 6, COMM_FP64, COMM_MAX) != 0 && rc == 0) {
        snprintf(err, errlen, "--init-from: the all-reduce of the import report failed: %s", tr->world->err);
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
static int init_params(trainer_t *tr, uint64_t seed, char *err, size_t errlen)
{
    const model_t *m = &tr->model;
    float *host = malloc(m->table.numel * sizeof *host + 1);
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
    if (rc == 0 && params_from_host(tr, host) != 0) {
        snprintf(err, errlen, "out of memory for the parameters");
        rc = -1;
    }
    free(host);
    return rc;
}

/* Output files are written at the end of the run: refuse at start a path
 * whose directory cannot take them. Empty path: nothing to check. */
static int check_writable_dir(const char *opt, const char *path, char *err, size_t errlen)
{
    if (!path[0])
        return 0;
    char dir[OPT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "%s %s: cannot write into directory %s: %s", opt, path, dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Rank 0's part: the missing directories of an output path, as mkdir -p
 * makes them (is_dir: PATH is itself a directory, else its parent). */
static int make_out_dirs(const char *opt, const char *path, int is_dir, char *err, size_t errlen)
{
    char failed[OPT_PATH_MAX];
    if (!path[0] ||
        (is_dir ? fs_mkdir_p(path, failed, sizeof failed) : fs_mkdir_parent(path, failed, sizeof failed)) == 0)
        return 0;
    snprintf(err, errlen, "%s %s: cannot create directory %s: %s", opt, path, failed, strerror(errno));
    return -1;
}

/* The output paths (--ckpt-dir, --metrics, --trace, --save-params): rank 0
 * makes their missing directories as mkdir -p does (a shared file system
 * shows them to every rank), then every rank checks it can write where it
 * will; --ckpt-dir must be a writable directory (checked before the run,
 * not at its first checkpoint). One verdict on every rank. Collective. */
static int prepare_out_paths(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const char *dir = o->ckpt_dir;
    int rank0 = tr->env->world_rank == 0, rc = 0;
    if (rank0)
        rc = make_out_dirs("--ckpt-dir", dir, 1, err, errlen) ||
                     make_out_dirs("--metrics", o->metrics, 0, err, errlen) ||
                     make_out_dirs("--trace", o->trace, 0, err, errlen) ||
                     make_out_dirs("--save-params", o->save_params, 0, err, errlen)
                 ? -1
                 : 0;
    if (agree(tr->world, rc, err, errlen) != 0)
        return -1;
    rc = check_writable_dir("--trace", o->trace, err, errlen) != 0 ||
                 check_writable_dir("--save-params", o->save_params, err, errlen) != 0
             ? -1
             : 0;
    if (rc == 0 && rank0 && dir[0] && access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "--ckpt-dir %s: not a writable directory: %s", dir, strerror(errno));
        rc = -1;
    }
    if (agree(tr->world, rc, err, errlen) != 0)
        return -1;
    if (rank0 && dir[0])
        ckpt_remove_stale(dir);
    return 0;
}

/* The MFU peak: every rank probes sgemm at the same time, on the threads it
 * trains with (ranks sharing cores slow each other as in training), and
 * the peak per rank is the mean of theirs. Collective. */
static int probe_peak(trainer_t *tr, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    comm_t *w = tr->world;
    flops_probe_t p;
    if (g->world_size > 1 && w->ops->barrier(w) != 0)
        return status_set(STATUS_FAIL, err, errlen, "the barrier before the sgemm probe failed: %s", w->err);
    double v[2] = {flops_probe(&p, FLOPS_PROBE_BUDGET_S) == 0 ? p.gflops : 0.0, 0.0};
    v[1] = v[0] > 0 ? 0.0 : 1.0;
    if (g->world_size > 1 && w->ops->allreduce(w, v, 2, COMM_FP64, COMM_SUM) != 0)
        return status_set(STATUS_FAIL, err, errlen, "the all-reduce of the sgemm probe failed: %s", w->err);
    /* a failed probe (out of memory) leaves MFU at 0 */
    tr->peak_gflops = v[1] > 0 ? 0.0 : v[0] / g->world_size;
    int off = flops_probe_describe(&p, tr->peak_how, sizeof tr->peak_how);
    if (g->world_size > 1 && off > 0 && (size_t)off < sizeof tr->peak_how)
        snprintf(tr->peak_how + off, sizeof tr->peak_how - (size_t)off, "; mean of %d ranks probing at once",
                 g->world_size);
    return 0;
}

static void free_state(trainer_t *tr)
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
static int moments_to_host(trainer_t *tr, float *hm, float *hv)
{
    dpsync_t *s = &tr->sync;
    return s->ops->state_to_host(s, tr->optim.m, hm) != 0 || s->ops->state_to_host(s, tr->optim.v, hv) != 0 ? -1 : 0;
}

/* The reverse, after a checkpoint was read: each rank keeps its pieces. */
static void moments_from_host(trainer_t *tr, const float *hm, const float *hv)
{
    tr->sync.ops->state_from_host(&tr->sync, hm, tr->optim.m);
    tr->sync.ops->state_from_host(&tr->sync, hv, tr->optim.v);
}

/* Each dataset's position after `step` steps' batches (a rollback's
 * skipped batches included): the samples of it the blend drew (a checkpoint's record; the order itself is a function of the
 * global sample index). */
static void data_meta(const trainer_t *tr, int step, ckpt_meta_t *meta)
{
    const int gb = tr->opt->micro_batch * tr->accum * tr->grid->dp_size;
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
        rc = ckpt_load(tr->world, path, &tr->cfg, &m->table, hp, hm, hv, meta, err, errlen);
        *load_s = now_s() - t0;
    }
    if (rc == 0) {
        if (params_from_host(tr, hp) != 0) {
            snprintf(err, errlen, "out of memory for loading %s", path);
            rc = -1;
        }
        moments_from_host(tr, hm, hv);
    }
    return agree(tr->world, rc, err, errlen);
}

/* --resume: loads the checkpoint it names into the model and optimizer and
 * sets the step to continue from. Collective. */
static int trainer_resume(trainer_t *tr, char *err, size_t errlen)
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
    if (rc == 0) {
        tr->optim.t = meta.adam_t;
        tr->start_step = meta.step;
        data_resume_note(tr, &meta);
        tr->steps_done = meta.step;
        tr->spike.data_skip = meta.data_skip;
        if (tr->env->world_rank == 0) {
            printf("resume: %s, step %d, %lld tokens, written at %s; read and verified in %.2f s\n", path, meta.step,
                   meta.tokens, meta.layout, load_s);
            const int gb = o->global_batch ? o->global_batch : o->micro_batch * tr->grid->dp_size;
            if (meta.seed != o->seed || meta.global_batch != gb || meta.seq_len != o->seq_len)
                printf("resume: note: the checkpoint's run had seed %lld, global batch %d, seq len %d; this run "
                       "has %lld, %d, %d, so its data order differs from an uninterrupted run\n",
                       meta.seed, meta.global_batch, meta.seq_len, (long long)o->seed, gb, o->seq_len);
        }
    }
    return rc;
}

/* The parameters and AdamW moments as full flat host buffers
 * [table.numel] (on the writer, DP rank 0, every element). Collective. */
static int state_to_host(trainer_t *tr, float *hp, float *hm, float *hv, char *err, size_t errlen)
{
    int rc = 0;
    /* a replica that writes nothing and gathers for no one copies nothing:
     * its copy would only take memory bandwidth from the writer's */
    const int idle = tr->grid->dp_rank != 0 && !tr->sync.ops->shards;
    /* else collective over the shard group: every rank reaches it */
    if (!idle && (params_to_host(tr, hp) != 0 || moments_to_host(tr, hm, hv) != 0)) {
        snprintf(err, errlen, "checkpoint: gathering the sharded parameters or AdamW moments failed: %s",
                 tr->sync.err[0] ? tr->sync.err : "out of memory");
        rc = -1;
    }
    return agree(tr->world, rc, err, errlen);
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
                        .global_batch = o->micro_batch * tr->accum * g->dp_size,
                        .lr = o->lr,
                        .min_lr = o->min_lr,
                        .warmup = o->warmup,
                        .steps = o->steps,
                        .tokenizer = tr->data_tokenizer,
                        .tokenizer_sha256 = tr->data_tokenizer_sha256};
    meta.tokens = (long long)step * meta.global_batch * o->seq_len;
    meta.data_skip = tr->spike.data_skip;
    lr_schedule_record(&tr->sched, meta.lr_schedule, sizeof meta.lr_schedule, &meta.decay_steps, meta.decay_shape,
                       sizeof meta.decay_shape);
    data_meta(tr, step + tr->spike.data_skip, &meta);
    snprintf(meta.layout, sizeof meta.layout, "tp %d pp %d dp %d zero %d", g->tp_size, g->pp_size, g->dp_size,
             tr->sync.ops->zero);
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
        rc = ckpt_save(tr->world, o->ckpt_dir, o->keep, &tr->cfg, &m->table, hp, hm, hv, g->dp_rank == 0, g->tp_size,
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

/* --ckpt-async: waits for the previous write, copies the state into the
 * writer's host buffers and starts the write; the checkpoint counts as
 * the last one at once (a failed write ends the run). Collective. */
static int save_async(trainer_t *tr, int step, char *err, size_t errlen)
{
    ckpt_async_t *a = tr->ckpt_async;
    const grid_t *g = tr->grid;
    const double t0 = now_s();
    if (ckpt_async_wait(a, err, errlen) != 0 ||
        state_to_host(tr, ckpt_async_buffer(a, 0), ckpt_async_buffer(a, 1), ckpt_async_buffer(a, 2), err, errlen) != 0)
        return -1;
    const ckpt_async_job_t job = {.dir = tr->opt->ckpt_dir,
                                  .keep = tr->opt->keep,
                                  .cfg = &tr->cfg,
                                  .t = &tr->model.table,
                                  .writer = g->dp_rank == 0,
                                  .tp_size = g->tp_size,
                                  .tp_rank = g->tp_rank,
                                  .meta = ckpt_meta_at(tr, step)};
    if (agree(tr->world, ckpt_async_start(a, &job, err, errlen), err, errlen) != 0)
        return -1;
    snprintf(tr->last_ckpt, sizeof tr->last_ckpt, "%s/step_%08d.h5", tr->opt->ckpt_dir, step);
    tr->last_ckpt_step = step;
    if (tr->env->world_rank == 0)
        printf("checkpoint: step %d copied to host in %.1f ms, writing %s in the background\n", step,
               1e3 * (now_s() - t0), tr->last_ckpt);
    return 0;
}

/* A checkpoint of `step` completed steps, written now or in the
 * background (--ckpt-async); the time it held training up goes to the
 * next step record. Collective. */
static int trainer_save(trainer_t *tr, int step, char *err, size_t errlen)
{
    const double t0 = now_s();
    int rc = tr->ckpt_async ? save_async(tr, step, err, errlen) : save_sync(tr, step, err, errlen);
    tr->ckpt_stall_s += now_s() - t0;
    return rc;
}

/* --ckpt-async: waits for the write in flight (before a stop, the end of
 * the run, any other HDF5 use); at a step boundary (poll) only collects
 * one that every rank has finished. Collective; 0 without --ckpt-async. */
static int ckpt_wait(trainer_t *tr, int poll, char *err, size_t errlen)
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
static int setup_ckpt_async(trainer_t *tr, char *err, size_t errlen)
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
static int trainer_save_params(trainer_t *tr, char *err, size_t errlen)
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
        if (params_to_host(tr, host) != 0) {
            snprintf(err, errlen, "--save-params: gathering the sharded parameters failed: %s", tr->sync.err);
            rc = -1;
        }
    }
    rc = agree(tr->world, rc, err, errlen);
    if (rc == 0) {
        char layout[64];
        snprintf(layout, sizeof layout, "tp %d pp %d dp %d zero %d", g->tp_size, g->pp_size, g->dp_size,
                 tr->sync.ops->zero);
        h5store_attr_t attrs[PARAM_IO_MODEL_ATTRS + 6];
        int na = param_io_model_attrs(&tr->cfg, attrs);
        attrs[na++] = (h5store_attr_t){.key = "content", .type = H5STORE_STR, .s = "params"};
        attrs[na++] = (h5store_attr_t){.key = "dtrain_version", .type = H5STORE_STR, .s = PACKAGE_VERSION};
        attrs[na++] = (h5store_attr_t){.key = "layout", .type = H5STORE_STR, .s = layout};
        attrs[na++] = (h5store_attr_t){.key = "step", .type = H5STORE_INT, .i = tr->steps_done};
        na += param_io_tokenizer_attrs(tr->data_tokenizer, tr->data_tokenizer_sha256, attrs + na);
        const param_io_group_t group = {"params", host};
        rc = param_io_write(tr->world, o->save_params, &tr->cfg, &m->table, &group, 1, g->dp_rank == 0, g->tp_size,
                            g->tp_rank, attrs, na, err, errlen);
    }
    free(host);
    if (rc == 0 && tr->env->world_rank == 0)
        printf("parameters written to %s\n", o->save_params);
    return rc;
}

/* The data-parallel strategy over the model's buffers: the tensors'
 * offsets, the stage's block each belongs to (ZeRO's units) and whether
 * it counts in the gradient norm here (each logical parameter once: a
 * TP-split tensor's slices on every TP rank, a replicated one on TP rank 0
 * only, GPT-2's tied head copy never). gdt: --grad-reduce-dtype. */
static int setup_sync(trainer_t *tr, const dpsync_ops_t *kind, comm_dtype_t gdt, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const model_t *m = &tr->model;
    const param_table_t *t = &m->table;
    const grid_t *g = tr->grid;
    const ddp_mode_t mode = tr->run->ddp_mode;
    size_t *start = malloc(((size_t)t->n + 1) * sizeof *start);
    int *block = malloc(((size_t)t->n + 1) * sizeof *block);
    unsigned char *norm = malloc((size_t)t->n + 1);
    int rc = start && block && norm ? 0 : -1;
    for (int i = 0; rc == 0 && i < t->n; i++) {
        const param_desc_t *d = &t->p[i];
        start[i] = d->offset;
        block[i] = d->layer >= 0 && d->layer < tr->cfg.n_layer ? d->layer - m->lay.part.layer_begin : -1;
        norm[i] = !(d->tied_copy || (d->tp_split == TP_SPLIT_NONE && g->tp_rank != 0));
    }
    if (rc == 0) {
        start[t->n] = t->numel;
        const dpsync_config_t c = {.ops = m->ops,
                                   .dp = g->dp,
                                   .shard = g->shard,
                                   .replica = g->replica,
                                   .params = m->params,
                                   .grads = m->grads,
                                   .n = t->numel,
                                   .n_tensors = t->n,
                                   .tensor_start = start,
                                   .tensor_block = block,
                                   .tensor_norm = norm,
                                   .mode = mode,
                                   .bucket_bytes = (size_t)(o->bucket_mb * 1048576.0),
                                   .dtype = gdt,
                                   .mem = mem_process_tracker()};
        if ((rc = dpsync_create(&tr->sync, kind, &c)) != 0)
            snprintf(err, errlen, "%s", tr->sync.err);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(start);
    free(block);
    free(norm);
    tr->model.hook = tr->sync.hook;
    return rc;
}

/* ---- the data's tokenizer: vocabulary check, prompt, sample text ------------------------ */

/* "a, b, c": the presets whose vocabulary holds n tokens (the fix the
 * vocabulary errors name). */
static void presets_with_vocab(int n, char *out, size_t outlen)
{
    out[0] = '\0';
    for (const model_preset_t *p = model_presets(); p->name; p++)
        if (p->cfg.vocab_size >= n)
            snprintf(out + strlen(out), outlen - strlen(out), "%s%s", out[0] ? ", " : "", p->name);
    if (!out[0])
        snprintf(out, outlen, "none has");
}

/* The sidecar dtrain-prepare wrote beside the files pattern matches: 1
 * with it in s and its path in path, 0 when there is none, -1 on error.
 * The data's vocabulary must fit the model's (the token check of
 * tokens_open would catch it too, but could not say why). */
static int check_data_sidecar(const char *pattern, int vocab, tok_sidecar_t *s, char *path, size_t pathlen, char *err,
                              size_t errlen)
{
    int rc = tok_sidecar_find_glob(pattern, path, pathlen);
    if (rc == 1)
        return 0;
    if (rc < 0) {
        snprintf(err, errlen, "data %s: the path of its tokenizer sidecar is too long", pattern);
        return -1;
    }
    if (tok_sidecar_read(path, s, err, errlen) != 0)
        return -1;
    if (s->vocab_size > vocab) {
        char names[256];
        presets_with_vocab(s->vocab_size, names, sizeof names);
        snprintf(err, errlen,
                 "data %s was made with tokenizer %s (vocabulary %d) but the model's vocabulary is "
                 "%d: use --vocab-size >= %d or a model preset with one that large (%s)",
                 pattern, s->kind, s->vocab_size, vocab, s->vocab_size, names);
        return -1;
    }
    return 1;
}

/* --tokenizer: an explicit spec; auto: the training data's sidecar, else
 * byte for a 256-token model; none (or auto otherwise): no tokenizer.
 * auto opens nothing when no sample is asked for, so a run on data whose
 * vocabulary file is elsewhere needs it only to print text. */
static int open_tokenizer(trainer_t *tr, const tok_sidecar_t *sc, const char *sc_path, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    char why[768];
    if (strcmp(o->tokenizer, "none") == 0 || (strcmp(o->tokenizer, "auto") == 0 && o->sample_tokens == 0))
        return 0;
    if (strcmp(o->tokenizer, "auto") != 0) {
        if (tokenizer_open(&tr->tokenizer, o->tokenizer, 0, why, sizeof why) != 0) {
            snprintf(err, errlen, "--tokenizer %s: %s", o->tokenizer, why);
            return -1;
        }
        snprintf(tr->tokenizer_from, sizeof tr->tokenizer_from, "--tokenizer");
    } else if (sc) {
        if (tok_sidecar_open_tokenizer(sc, sc_path, &tr->tokenizer, err, errlen) != 0)
            return -1;
        snprintf(tr->tokenizer_from, sizeof tr->tokenizer_from, "the data's sidecar %s", sc_path);
    } else if (tr->cfg.vocab_size == 256) {
        if (tokenizer_open(&tr->tokenizer, "byte", 0, err, errlen) != 0)
            return -1;
        snprintf(tr->tokenizer_from, sizeof tr->tokenizer_from, "a 256-token vocabulary; no data sidecar");
    }
    return 0;
}

/* The sample's first tokens: the tokenizer's document start (a sample
 * begins a document), then the encoded --prompt; without a tokenizer, or
 * when both are empty, token 0. */
static int encode_prompt(trainer_t *tr, char *err, size_t errlen)
{
    tokenizer_t *tk = tr->tokenizer;
    tok_ids_t *ids = &tr->prompt_ids;
    const char *p = tr->opt->prompt;
    char why[512];
    if (tk && tk->doc_start != TOK_NO_ID && tok_ids_push(ids, tk->doc_start) != 0) {
        snprintf(err, errlen, "out of memory encoding --prompt");
        return -1;
    }
    if (tk && tokenizer_encode(tk, p, strlen(p), ids, why, sizeof why) != 0) {
        snprintf(err, errlen, "--prompt '%.64s': %s", p, why);
        return -1;
    }
    if (ids->n == 0 && tok_ids_push(ids, 0) != 0) {
        snprintf(err, errlen, "out of memory encoding --prompt");
        return -1;
    }
    return 0;
}

/* --doc-mask: the document boundary tokens the training data's sidecar
 * names (validation data is split by the same tokens). Data that records
 * none cannot be masked: an error rather than a mask that does nothing. */
static int setup_doc_mask(trainer_t *tr, const tok_sidecar_t *sc, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const tokens_format_t fmt = tr->run->data_format;
    tr->doc_start = tr->doc_end = -1;
    if (!o->doc_mask)
        return 0;
    const int indexed = data_spec_indexed(o->data, fmt) && (o->val_every == 0 || data_spec_indexed(o->val_data, fmt));
    if (!indexed && (!sc || (sc->doc_start == TOK_NO_ID && sc->doc_end == TOK_NO_ID))) {
        snprintf(err, errlen,
                 "--doc-mask: data %s records no document boundary (%s): prepare it with a tokenizer "
                 "that has a document start or end token, or drop --doc-mask",
                 tr->opt->data,
                 sc ? "its tokenizer sidecar names no doc_start or doc_end token" : "it has no tokenizer sidecar");
        return -1;
    }
    if (sc) {
        tr->doc_start = sc->doc_start == TOK_NO_ID ? -1 : sc->doc_start;
        tr->doc_end = sc->doc_end == TOK_NO_ID ? -1 : sc->doc_end;
    }
    return 0;
}

/* Before any data is read: the data's sidecars (training and validation)
 * against the model's vocabulary, the sample's tokenizer and prompt. The
 * same files and options on every rank give the same outcome on each. */
static int setup_tokenizer(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const int vocab = tr->cfg.vocab_size;
    tok_sidecar_t sc, vsc;
    char path[OPT_PATH_MAX + 64], vpath[OPT_PATH_MAX + 64], first[OPT_PATH_MAX + 8], vfirst[OPT_PATH_MAX + 8];
    const tokens_format_t fmt = tr->run->data_format;
    data_sidecar_path(o->data, fmt, first, sizeof first); /* a blend: its first dataset's */
    data_sidecar_path(o->val_data, fmt, vfirst, sizeof vfirst);
    int has = check_data_sidecar(first, vocab, &sc, path, sizeof path, err, errlen);
    if (has < 0 ||
        (o->val_every > 0 && check_data_sidecar(vfirst, vocab, &vsc, vpath, sizeof vpath, err, errlen) < 0) ||
        open_tokenizer(tr, has ? &sc : NULL, path, err, errlen) != 0 ||
        setup_doc_mask(tr, has ? &sc : NULL, err, errlen) != 0)
        return -1;
    if (tr->tokenizer || has) {
        snprintf(tr->data_tokenizer, sizeof tr->data_tokenizer, "%s", tr->tokenizer ? tr->tokenizer->spec : sc.spec);
        snprintf(tr->data_tokenizer_sha256, sizeof tr->data_tokenizer_sha256, "%s",
                 tr->tokenizer ? tr->tokenizer->vocab_sha256 : sc.vocab_sha256);
    }
    if (tr->tokenizer && tr->tokenizer->vocab_size > vocab) {
        char names[256];
        presets_with_vocab(tr->tokenizer->vocab_size, names, sizeof names);
        snprintf(err, errlen,
                 "--tokenizer %s has vocabulary %d but the model's vocabulary is %d: use --vocab-size "
                 ">= %d, a model preset with one that large (%s), or another --tokenizer",
                 o->tokenizer, tr->tokenizer->vocab_size, vocab, tr->tokenizer->vocab_size, names);
        return -1;
    }
    return encode_prompt(tr, err, errlen);
}

/* --straggler-every's host names and the test-only delay (collective),
 * and on rank 0 the --tensorboard writer: DIR made with its parents. */
static int setup_observe(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    if (straggler_setup(&tr->strag, tr->world, o->straggler_every, err, errlen) != 0)
        return -1;
    if (!o->tensorboard[0] || tr->env->world_rank != 0)
        return 0;
    char host[64] = "", why[512];
    if (gethostname(host, sizeof host) != 0 || !host[0])
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        *p = *p == '/' ? '_' : *p; /* part of the event file's name */
    if (tfevents_open(o->tensorboard, host, (long)getpid(), tfevents_now(), &tr->tb, why, sizeof why) != 0) {
        snprintf(err, errlen, "--tensorboard %s: %s", o->tensorboard, why);
        return -1;
    }
    return 0;
}

/* The training and validation data (src/data.h). Megatron files are
 * mapped, not read: their tokens are checked against the vocabulary here,
 * each rank checking its share, and the ranks agree on the verdict. */
static int open_data(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const run_config_t *run = tr->run;
    const int vocab = tr->cfg.vocab_size;
    const tokens_format_t fmt = run->data_format;
    int rc = 0;
    if (data_open(&tr->train, o->data, fmt, vocab, run->seq_len, 1, (uint64_t)o->seed, err, errlen) != 0)
        rc = -1;
    else if (o->val_every > 0 && data_open(&tr->val, o->val_data, fmt, vocab, run->seq_len, 0, 0, err, errlen) != 0)
        rc = -1;
    tr->has_val = rc == 0 && o->val_every > 0;
    const int share = tr->grid->world_rank, shares = tr->grid->world_size;
    if (rc == 0 && (data_check_vocab(&tr->train, vocab, share, shares, err, errlen) != 0 ||
                    (tr->has_val && data_check_vocab(&tr->val, vocab, share, shares, err, errlen) != 0)))
        rc = -1;
    if (agree(tr->world, rc, err, errlen) != 0)
        return -1;
    data_set_doc_tokens(&tr->train, tr->doc_start, tr->doc_end);
    if (tr->has_val)
        data_set_doc_tokens(&tr->val, tr->doc_start, tr->doc_end);
    return 0;
}

/* The run's data: the vocabulary checks, the sample's tokenizer and the
 * training and validation loaders. */
static int setup_data(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    if (o->top_k > tr->cfg.vocab_size) {
        snprintf(err, errlen, "--top-k %d exceeds the vocabulary (%d)", o->top_k, tr->cfg.vocab_size);
        return -1;
    }
    if (setup_tokenizer(tr, err, errlen) != 0)
        return -1;
    return open_data(tr, err, errlen);
}

/* This rank's part of the model: its stage's layers (the resolved split),
 * its tensor-parallel slice, the slots its schedule keeps in flight. */
static model_layout_t stage_layout(const trainer_t *tr, const grid_t *grid, const dpsync_ops_t *kind)
{
    const run_config_t *run = tr->run;
    model_layout_t lay = model_layout_single(&tr->cfg);
    lay.part.tp_size = grid->tp_size;
    lay.part.tp_rank = grid->tp_rank;
    lay.part.layer_begin = run_config_stage_begin(run, grid->pp_rank);
    lay.part.layer_end = lay.part.layer_begin + run->stage_layers[grid->pp_rank];
    lay.part.has_embed = grid->pp_rank == 0;
    lay.part.has_head = grid->pp_rank == grid->pp_size - 1;
    lay.sequence_parallel = run->sequence_parallel;
    lay.doc_mask = tr->opt->doc_mask;
    lay.n_slots = pipe_slots(run->pp_kind, grid->pp_size, grid->pp_rank, run->accum);
    /* the strategy's kind decides what the model keeps of the blocks */
    lay.lent_block_grads = kind->lends_block_grads;
    lay.lent_block_params = kind->lends_block_params;
    lay.recompute = run->recompute;
    return lay;
}

/* The backend and the communicators: collective (shard groups, NCCL
 * bootstrap), so every rank enters it only when none has failed. */
static int setup_backend(trainer_t *tr, const dpsync_ops_t *kind, char *err, size_t errlen)
{
    const run_config_t *run = tr->run;
    grid_t *grid = tr->grid;
    CHECK(agree(tr->world, backend_open(&tr->backend, run->device, tr->env->local_rank, err, errlen), err, errlen));
    if (run->hybrid_shard && kind->shards && grid_create_shard_group(grid, run->hybrid_shard) != 0) {
        snprintf(err, errlen, "%s", grid->err);
        return -1;
    }
    CHECK(agree(tr->world,
                backend_comm_open(&tr->backend, run->comm, grid, &tr->net, tr->opt->comm_timeout, err, errlen), err,
                errlen));
    /* from here on the step loop's groups: NCCL twins under --comm nccl */
    tr->grid = &tr->net;
    return 0;
}

/* The model, its ZeRO sharding, its initial (or imported) parameters and
 * the optimizer, plus the per-tensor tables of the norm and the tied
 * embedding. */
static int setup_model(trainer_t *tr, model_layout_t lay, const dpsync_ops_t *kind, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const run_config_t *run = tr->run;
    const grid_t *grid = tr->grid;
    lay.tp = grid->tp;
    lay.bf16 = backend_bf16(&tr->backend, run->dtype);
    if (lay.bf16 && (!tr->backend.ops->matmul_fwd_bf16 || !tr->backend.ops->matmul_bwd_bf16)) {
        snprintf(err, errlen, "--dtype bf16: the %s backend has no bf16 GEMM; use --dtype fp32", tr->backend.ops->name);
        return -1;
    }
    if (model_create(&tr->model, &tr->cfg, tr->backend.ops, &lay, run->micro_batch, run->seq_len, err, errlen) != 0)
        return -1;
    if (setup_sync(tr, kind, run->grad_dtype, err, errlen) != 0)
        return -1;
    if (init_params(tr, (uint64_t)o->seed, err, errlen) != 0)
        return -1;
    if (adamw_create(&tr->optim, tr->model.ops, &tr->model.table, &tr->sync.view, o->beta1, o->beta2, o->adam_eps,
                     o->weight_decay, o->grad_clip) != 0) {
        snprintf(err, errlen, "out of memory for the optimizer state (%zu parameters)", tr->model.table.numel);
        return -1;
    }
    const param_table_t *t = &tr->model.table;
    /* GPT-2's tied embedding, when the first and last stage differ: the
     * first stage's wte and the last stage's copy, summed over the
     * embedding group */
    tr->tied = -1;
    if (tr->cfg.arch == ARCH_GPT2 && grid->pp_size > 1 && grid->embed)
        tr->tied = param_table_find(t, "wte");
    return 0;
}

/* --trace and --comm-timeout: every group of the grid reports its calls. */
static int setup_watch(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const grid_t *grid = tr->grid;
    comm_t *groups[GRID_MAX_GROUPS];
    const int ng = grid_groups(grid, groups, NULL);
    if (o->trace[0]) {
        char label[96];
        snprintf(label, sizeof label, "rank %d (tp %d pp %d dp %d)", grid->world_rank, grid->tp_rank, grid->pp_rank,
                 grid->dp_rank);
        if (!(tr->trace = trace_create(grid->world_rank, label, 0))) {
            snprintf(err, errlen, "out of memory for --trace");
            return -1;
        }
        for (int i = 0; i < ng; i++)
            groups[i]->trace = tr->trace;
        tr->model.trace = tr->trace;
    }
    if (o->comm_timeout > 0 && grid->world_size > 1) {
        char who[160], host[64] = "?";
        if (gethostname(host, sizeof host) != 0)
            snprintf(host, sizeof host, "?");
        host[sizeof host - 1] = '\0';
        snprintf(who, sizeof who, "rank %d (tp %d pp %d dp %d, host %s)", grid->world_rank, grid->tp_rank,
                 grid->pp_rank, grid->dp_rank, host);
        if (!(tr->watch = watchdog_start(o->comm_timeout, who, err, errlen)))
            return -1;
        for (int i = 0; i < ng; i++)
            groups[i]->watch = tr->watch;
        tr->world->watch = tr->watch; /* the agreements' world (MPI also under --comm nccl) */
    }
    return 0;
}

/* What the step loop needs beyond the model: the host batch, the FLOPs
 * and peak of MFU, the trace, the watchdog and the metrics file. */
static int setup_step(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const run_config_t *run = tr->run;
    size_t n = (size_t)run->micro_batch * (size_t)run->seq_len;
    tr->tok = malloc(n * sizeof *tr->tok);
    tr->tgt = malloc(n * sizeof *tr->tgt);
    tr->pos = o->doc_mask ? malloc(n * sizeof *tr->pos) : NULL;
    if (!tr->tok || !tr->tgt || (o->doc_mask && !tr->pos)) {
        snprintf(err, errlen, "out of memory for the batch");
        return -1;
    }
    tr->flops_token = flops_per_token(&tr->cfg, run->seq_len);
    if (o->peak_gflops > 0) {
        tr->peak_gflops = o->peak_gflops;
        snprintf(tr->peak_how, sizeof tr->peak_how, "--peak-gflops");
    } else if (probe_peak(tr, err, errlen) != 0) {
        return -1;
    }
    if (setup_watch(tr, err, errlen) != 0 || setup_observe(tr, err, errlen) != 0)
        return -1;
    if (o->metrics[0] && tr->env->world_rank == 0) {
        tr->metrics = fopen(o->metrics, "w");
        if (!tr->metrics) {
            snprintf(err, errlen, "--metrics %s: cannot create: %s", o->metrics, strerror(errno));
            return -1;
        }
    }
    return 0;
}

int trainer_setup(trainer_t *tr, const run_config_t *run, const launch_env_t *env, grid_t *grid, char *err,
                  size_t errlen)
{
    memset(tr, 0, sizeof *tr);
    tr->run = run;
    tr->opt = run->opt;
    tr->env = env;
    tr->grid = grid;
    tr->world = grid->world;
    tr->last_ckpt_step = -1;
    tr->threads = ops_cpu_threads(run->opt->threads);
    tr->cfg = run->model;
    tr->accum = run->accum;
    tr->pp_kind = run->pp_kind;
    tr->sched = run->sched;
    if (spike_init(&tr->spike, run->opt->spike_z, run->opt->spike_window, run->opt->spike_max, err, errlen) != 0)
        return -1;
    const dpsync_ops_t *kind = dpsync_pick(run->zero_stage);
    if (!kind) {
        snprintf(err, errlen, "internal error: no data-parallel strategy for ZeRO stage %d", run->zero_stage);
        return -1;
    }
    if (setup_data(tr, err, errlen) != 0)
        return -1;
    const model_layout_t lay = stage_layout(tr, grid, kind);
    if (setup_backend(tr, kind, err, errlen) != 0 || setup_model(tr, lay, kind, err, errlen) != 0 ||
        prepare_out_paths(tr, err, errlen) != 0)
        return -1;
    if (tr->opt->resume[0] && trainer_resume(tr, err, errlen) != 0)
        return -1;
    if (tr->opt->ckpt_async && setup_ckpt_async(tr, err, errlen) != 0)
        return -1;
    return setup_step(tr, err, errlen);
}

void trainer_banner(const trainer_t *tr, FILE *out)
{
    const model_config_t *c = &tr->cfg;
    const run_options_t *o = tr->opt;
    char buf[32];

    const grid_t *g = tr->grid;
    int rank0 = tr->env->world_rank == 0;
    if (rank0)
        fprintf(out, "dtrain %s | %d rank%s: tp %d x pp %d x dp %d | %d thread%s per rank | ddp %s\n", PACKAGE_VERSION,
                g->world_size, g->world_size == 1 ? "" : "s", g->tp_size, g->pp_size, g->dp_size, tr->threads,
                tr->threads == 1 ? "" : "s", ddp_mode_names[tr->run->ddp_mode]);
    launch_describe(tr->env, out);
    if (grid_print(g, out) != 0 && rank0)
        fprintf(out, "grid: %s\n", g->err);
    if (!rank0)
        return;
    if (g->tp_size > 1)
        fprintf(out,
                "tensor parallel: %d ranks, %d heads, %d KV heads, FFN %d and %d vocabulary rows (of %lld "
                "padded) per rank%s\n",
                g->tp_size, c->n_head / g->tp_size, c->n_kv_head / g->tp_size, c->d_ff / g->tp_size, tr->model.v_rows,
                (long long)param_padded_vocab(c->vocab_size, g->tp_size),
                o->sequence_parallel ? ", sequence parallel" : "");
    if (g->pp_size > 1) {
        const int *layers = tr->run->stage_layers;
        fprintf(out, "pipeline: %d stages, %s schedule over %d microbatches, layers", g->pp_size,
                pipe_kind_name(tr->pp_kind), tr->accum);
        for (int s = 0, l0 = 0; s < g->pp_size; l0 += layers[s], s++)
            fprintf(out, "%s %d-%d", s ? " |" : "", l0, l0 + layers[s] - 1);
        fprintf(out, "\n");
    }
    tr->sync.ops->banner(&tr->sync, out, ddp_mode_names[tr->run->ddp_mode], comm_dtype_names[tr->run->grad_dtype]);
    fprintf(out, "model %s (%s): L=%d C=%d heads=%d kv_heads=%d ffn=%d vocab=%d | %zu parameters\n", o->model,
            model_arch_name(c->arch), c->n_layer, c->d_model, c->n_head, c->n_kv_head, c->d_ff, c->vocab_size,
            model_params_total(c));
    fprintf(out, "batch: micro %d x seq %d, %d microbatch%s per step x dp %d = %d tokens per step\n", o->micro_batch,
            o->seq_len, tr->accum, tr->accum == 1 ? "" : "es", tr->grid->dp_size,
            o->micro_batch * o->seq_len * tr->accum * tr->grid->dp_size);
    char dd[2048];
    data_describe(&tr->train, dd, sizeof dd);
    fprintf(out, "data: train %s", dd);
    if (tr->has_val) {
        data_describe(&tr->val, dd, sizeof dd);
        fprintf(out, "; val %s", dd);
    }
    fprintf(out, "\n");
    if (tr->tokenizer)
        fprintf(out, "tokenizer: %s (from %s)\n", tr->tokenizer->spec, tr->tokenizer_from);
    fprintf(out, "memory per rank:");
    for (int k = 0; k < MEM_N_CATEGORIES; k++) {
        metrics_format_bytes(buf, sizeof buf, (double)mem_bytes((mem_category_t)k));
        fprintf(out, " %s %s%s", mem_category_name((mem_category_t)k), buf, k + 1 < MEM_N_CATEGORIES ? "," : "\n");
    }
    fprintf(out, "compute: %.1f GFLOP per step, peak %.1f GFLOP/s per rank (%s)\n",
            tr->flops_token * o->micro_batch * o->seq_len * tr->accum * tr->grid->dp_size * 1e-9, tr->peak_gflops,
            tr->peak_how);
    char sched[160];
    lr_schedule_describe(&tr->sched, sched, sizeof sched);
    fprintf(out, "lr schedule: %s\n", sched);
    fprintf(out, "backend: %s\n", tr->backend.desc);
    fprintf(out, "communication: %s\n", tr->backend.comm_desc);
    if (tr->model.lay.bf16)
        fprintf(out, "precision: bf16 matmuls (operands rounded to bf16, fp32 sums; bf16 weight copy and matmul-only "
                     "activations); fp32 master weights, gradients, AdamW state and other activations\n");
    else
        fprintf(out, "precision: fp32\n");
    fprintf(out, "configuration:\n");
    options_print(o, out);
    fflush(out);
}

/* Pipeline tags of the forward-only passes (validation, sampling); the
 * training schedule's messages are pipe_run's own. */
#define TAG_EVAL 7001

/* --doc-mask: the document positions of a b x t batch of tokens (in
 * tr->pos), which every stage computes from the tokens it draws; NULL
 * without --doc-mask. */
static const int32_t *batch_positions(trainer_t *tr, const int32_t *tok, int b, int t)
{
    if (!tr->opt->doc_mask)
        return NULL;
    docmask_positions(tok, b, t, tr->doc_start, tr->doc_end, tr->pos);
    return tr->pos;
}

/* Forward-only pass of one microbatch through the pipeline, in slot 0:
 * stage s receives from s-1, computes, sends to s+1. Returns the loss on
 * the last stage (0 elsewhere); NAN on failure. Collective over PP (and TP). */
static float pipeline_eval(trainer_t *tr, const int32_t *tok, const int32_t *pos, const int32_t *tgt, int b, int t)
{
    model_t *m = &tr->model;
    const grid_t *g = tr->grid;
    const size_t n = model_stage_floats(m, b, t);
    if (g->pp_rank > 0 && g->pp->ops->recv(g->pp, model_stage_input(m, 0), n, COMM_FP32, g->pp_rank - 1, TAG_EVAL) != 0)
        return NAN;
    float loss = model_forward(m, 0, tok, pos, tgt, b, t, 0.0f);
    if (m->failed)
        return NAN;
    if (g->pp_rank < g->pp_size - 1 &&
        g->pp->ops->send(g->pp, model_stage_output(m, 0), n, COMM_FP32, g->pp_rank + 1, TAG_EVAL) != 0)
        return NAN;
    return loss;
}

double trainer_val_loss(trainer_t *tr)
{
    const int B = tr->opt->micro_batch, T = tr->opt->seq_len;
    const grid_t *g = tr->grid;
    /* microbatch i is evaluated by DP rank i % dp; the per-microbatch means
     * (from the last stage; 0 on the others) are summed over PP, gathered
     * over DP and added in microbatch order, so the value does not depend
     * on the layout beyond fp32 noise. Under ZeRO-3 every forward gathers
     * the blocks' parameters over the data-parallel group, so every DP rank
     * runs the same number of forwards: where val_batches is not a
     * multiple of dp, the ranks past the last microbatch evaluate
     * microbatch 0 again and drop the result (skipping it left the others
     * in that all-gather: a hang). After each round the ranks agree
     * whether any forward failed (NaN: a failed collective or a non-finite
     * loss); if one did they all stop together, since a rank whose
     * communicator failed skips the collectives its peers would wait in. */
    const int nb = tr->opt->val_batches;
    const int rounds = (nb + g->dp_size - 1) / g->dp_size;
    float *means = calloc((size_t)nb, sizeof *means);
    if (!means)
        return NAN; /* every rank allocates the same few bytes: out of memory here is out of memory everywhere */
    int failed = 0;
    for (int r = 0; r < rounds && !failed; r++) {
        const int i = r * g->dp_size + g->dp_rank;
        if (i < nb || tr->sync.ops->collective_forward) {
            const uint64_t src = i < nb ? (uint64_t)i : 0;
            int32_t *pos = tr->opt->doc_mask ? tr->pos : NULL;
            for (int b = 0; b < B; b++)
                data_sample(&tr->val, src * B + b, tr->tok + (size_t)b * T, tr->tgt + (size_t)b * T,
                            pos ? pos + (size_t)b * T : NULL);
            float v = pipeline_eval(tr, tr->tok, pos, tr->tgt, B, T);
            failed = isnan(v);
            if (i < nb)
                means[i] = v;
        }
        if (g->world_size > 1 && tr->world->ops->allreduce(tr->world, &failed, 1, COMM_INT32, COMM_MAX) != 0)
            failed = 1;
    }
    if (failed || (g->pp_size > 1 && g->pp->ops->allreduce(g->pp, means, (size_t)nb, COMM_FP32, COMM_SUM) != 0) ||
        (g->dp_size > 1 && g->dp->ops->allreduce(g->dp, means, (size_t)nb, COMM_FP32, COMM_SUM) != 0)) {
        free(means);
        return NAN;
    }
    double sum = 0.0;
    for (int i = 0; i < nb; i++)
        sum += means[i];
    free(means);
    return sum / nb;
}

double trainer_grad_norm(trainer_t *tr)
{
    const grid_t *g = tr->grid;
    /* Each logical parameter counts once (setup_sync's norm flags); the
     * strategy knows which of its gradients this rank's sum of squares
     * covers: whole tensors where gradients are DP-averaged, so identical
     * on every replica; ZeRO-2/3's pieces, which its norm group adds up.
     * The fixed-order sum in double gives the same value on every rank;
     * one sumsq call for all tensors: one wait for the backend, not one
     * per tensor. */
    double local = dpsync_grad_sumsq(&tr->sync);
    comm_t *over_dp = tr->sync.norm_group;
    if (g->tp_size > 1 || g->pp_size > 1 || over_dp) {
        /* the communicator carries fp32: ~1e-7 relative, ample for clipping */
        float part = (float)local;
        if ((g->tp_size > 1 && g->tp->ops->allreduce(g->tp, &part, 1, COMM_FP32, COMM_SUM) != 0) ||
            (g->pp_size > 1 && g->pp->ops->allreduce(g->pp, &part, 1, COMM_FP32, COMM_SUM) != 0) ||
            (over_dp && over_dp->ops->allreduce(over_dp, &part, 1, COMM_FP32, COMM_SUM) != 0))
            return NAN;
        local = part;
    }
    return sqrt(local);
}

int trainer_check_replicas(trainer_t *tr, int step, char *err, size_t errlen)
{
    int bad = -1;
    /* the hashes are host loops, so on a host copy (the backend's memory
     * need not be host-readable); under ZeRO-3 that copy is the gathered
     * whole, as the blocks are held as pieces */
    const param_table_t *t = &tr->model.table;
    float *host = malloc(t->numel * sizeof *host + 1);
    size_t *start = malloc(((size_t)t->n + 1) * sizeof *start);
    if (!host || !start || params_to_host(tr, host) != 0) {
        snprintf(err, errlen, "replica check: %s", host && start ? tr->sync.err : "out of memory");
        free(host);
        free(start);
        return -1;
    }
    for (int i = 0; i < t->n; i++)
        start[i] = t->p[i].offset;
    start[t->n] = t->numel;
    int rc = replica_check(tr->grid->dp, host, start, t->n, &bad);
    free(host);
    free(start);
    if (rc < 0) {
        snprintf(err, errlen, "replica check: %s", tr->grid->dp->err);
        return -1;
    }
    if (rc > 0) {
        snprintf(err, errlen, "data-parallel replicas diverged %s %d: tensor %s differs between ranks of the dp group",
                 step ? "after step" : "at", step, tr->model.table.p[bad].name);
        return -1;
    }
    return 0;
}

/* sample_generate's model: the window through the pipeline, the last
 * stage's logits row gathered over TP and broadcast over PP, so every rank
 * holds it and picks the same token. */
static int sample_logits(void *ctx, const int32_t *window, int t, int row, float *logits)
{
    trainer_t *tr = ctx;
    model_t *m = &tr->model;
    const grid_t *g = tr->grid;
    if (isnan(pipeline_eval(tr, window, batch_positions(tr, window, 1, t), NULL, 1, t)))
        return -1;
    if (g->pp_rank == g->pp_size - 1 && model_logits_row(m, 0, row, logits) != 0)
        return -1;
    if (g->pp_size > 1 &&
        g->pp->ops->broadcast(g->pp, logits, (size_t)tr->cfg.vocab_size, COMM_FP32, g->pp_size - 1) != 0)
        return -1;
    return 0;
}

/* ids as text: runs of the tokenizer's ids decoded together (a character
 * may span tokens), an id beyond its vocabulary (a model's padded rows)
 * as "[token N]". */
static int print_decoded(tokenizer_t *tk, const int32_t *ids, int n, FILE *out)
{
    tok_bytes_t text = {0};
    char why[256], mark[32];
    int rc = 0;
    for (int i = 0; i < n && rc == 0;) {
        int j = i;
        while (j < n && ids[j] >= 0 && ids[j] < tk->vocab_size)
            j++;
        if (j > i)
            rc = tokenizer_decode(tk, ids + i, (size_t)(j - i), &text, why, sizeof why);
        if (j < n && rc == 0) {
            int k = snprintf(mark, sizeof mark, "[token %d]", (int)ids[j++]);
            rc = tok_bytes_append(&text, mark, (size_t)k);
        }
        i = j;
    }
    if (rc == 0 && text.n > 0)
        fwrite(text.data, 1, text.n, out);
    free(text.data);
    return rc;
}

/* Collective over the whole grid: every rank generates (TP and PP ranks
 * together, DP replicas redundantly) from the same prompt ids, world rank
 * 0 prints. */
static int print_sample(trainer_t *tr, FILE *out)
{
    const run_options_t *o = tr->opt;
    const tok_ids_t *p = &tr->prompt_ids;
    tokenizer_t *tk = tr->tokenizer;
    int32_t *seq = malloc((p->n + (size_t)o->sample_tokens) * sizeof *seq);
    if (!seq)
        return -1;
    const int quantum = o->sequence_parallel ? tr->grid->tp_size : 1;
    int n = sample_generate(sample_logits, tr, tr->cfg.vocab_size, o->seq_len, quantum, p->id, (int)p->n,
                            o->sample_tokens, o->temperature, o->top_k, (uint64_t)o->seed, seq);
    if (n < 0 || tr->env->world_rank != 0) {
        free(seq);
        return n < 0 ? -1 : 0;
    }
    int rc = 0;
    if (tk) {
        fprintf(out, "sample (temperature %g, top-k %d):\n", o->temperature, o->top_k);
        /* the document start the sample began with is not its text */
        const int skip = tk->doc_start != TOK_NO_ID && seq[0] == tk->doc_start;
        rc = print_decoded(tk, seq + skip, n - skip, out);
        fputc('\n', out);
    } else {
        fprintf(out, "sample token ids (no tokenizer for vocabulary %d, see --tokenizer; started from token 0):\n",
                tr->cfg.vocab_size);
        for (int i = 0; i < n; i++)
            fprintf(out, "%d%c", seq[i], i + 1 < n ? ' ' : '\n');
    }
    fflush(out);
    free(seq);
    return rc;
}

/* ---- one step over the pipeline schedule ---------------------------------------------- */

static int stage_forward(void *ctx, int micro, int slot)
{
    trainer_t *tr = ctx;
    const run_options_t *o = tr->opt;
    const grid_t *g = tr->grid;
    model_t *m = &tr->model;
    /* the first stage needs the tokens, the last the targets: the batch is
     * a pure function of (step, micro, dp rank), so each stage draws it */
    const int64_t batch = tr->cur_step + tr->spike.data_skip; /* past the batches a rollback skipped */
    const double t_data = tr->trace ? trace_now() : 0.0;
    int32_t *pos = o->doc_mask ? tr->pos : NULL; /* from the data: a Megatron index or the boundary tokens */
    data_batch(&tr->train, batch, micro, tr->accum, g->dp_rank, g->dp_size, o->micro_batch, tr->tok, tr->tgt, pos);
    trace_span(tr->trace, TRACE_COMPUTE, "data", t_data, tr->trace ? trace_now() : 0.0, NULL);
    m->trace_micro = micro;
    if (pos) { /* the attention this step computes, for its MFU */
        tr->doc_sq += docmask_square_sum(pos, (size_t)o->micro_batch * o->seq_len);
        tr->doc_tok += (double)o->micro_batch * o->seq_len;
    }
    float loss = model_forward(m, slot, tr->tok, pos, tr->tgt, o->micro_batch, o->seq_len,
                               spike_test_dloss(&tr->spike, batch, micro, g->dp_rank, 1.0f / (float)tr->accum));
    if (m->failed) {
        snprintf(tr->step_err, sizeof tr->step_err, "%s", m->err);
        return -1;
    }
    tr->loss_sum += spike_test_loss(&tr->spike, batch, micro, g->dp_rank, loss);
    return 0;
}

/* The strategy says whether this backward adds to the gradients and is
 * the step's last (model_backward's flags), and communicates through the
 * model's hook during it where it needs to. */
static int stage_backward(void *ctx, int micro, int slot)
{
    trainer_t *tr = ctx;
    model_t *m = &tr->model;
    dpsync_t *s = &tr->sync;
    int accum, last;
    s->ops->backward_begin(s, tr->bwd_done, tr->accum, &accum, &last);
    m->trace_micro = micro;
    int rc = model_backward(m, slot, accum, last);
    tr->bwd_done++;
    if (dpsync_backward_end(s) != 0) {
        snprintf(tr->step_err, sizeof tr->step_err, "%s", s->err);
        return -1;
    }
    if (rc != 0)
        snprintf(tr->step_err, sizeof tr->step_err, "%s", m->err);
    return rc;
}

static float *stage_input(void *ctx, int slot) { return model_stage_input(&((trainer_t *)ctx)->model, slot); }
static float *stage_output(void *ctx, int slot) { return model_stage_output(&((trainer_t *)ctx)->model, slot); }
static float *stage_grad(void *ctx) { return model_stage_grad(&((trainer_t *)ctx)->model); }

/* Forward and backward of the step's microbatches (the pipeline schedule
 * when pp > 1), then the gradient reductions: DP average, and the tied
 * embedding's sum over the first and last stage. Returns 0 or -1. */
static int step_gradients(trainer_t *tr, int step, double *bubble_s, char *err, size_t errlen)
{
    model_t *m = &tr->model;
    const grid_t *g = tr->grid;
    tr->cur_step = step;
    tr->bwd_done = 0;
    tr->sync.ops->step_begin(&tr->sync);
    tr->loss_sum = 0.0;
    tr->step_err[0] = '\0';
    *bubble_s = 0.0;
    if (g->pp_size == 1) {
        for (int micro = 0; micro < tr->accum; micro++)
            if (stage_forward(tr, micro, 0) != 0 || stage_backward(tr, micro, 0) != 0) {
                snprintf(err, errlen, "step %d: %s", step + 1, tr->step_err);
                return -1;
            }
    } else {
        const pipe_stage_ops_t ops = {.forward = stage_forward,
                                      .backward = stage_backward,
                                      .input = stage_input,
                                      .output = stage_output,
                                      .grad = stage_grad,
                                      .n = model_stage_floats(m, tr->opt->micro_batch, tr->opt->seq_len),
                                      .mem = m->ops};
        pipe_stats_t st = {0};
        if (pipe_run(g->pp, tr->pp_kind, tr->accum, &ops, tr, &st) != 0) {
            snprintf(err, errlen, "step %d: pipeline: %s", step + 1, tr->step_err[0] ? tr->step_err : g->pp->err);
            return -1;
        }
        *bubble_s = st.wait_s;
    }
    if (tr->sync.ops->grads_finish(&tr->sync) != 0) {
        snprintf(err, errlen, "step %d: %s", step + 1, tr->sync.err);
        return -1;
    }
    if (tr->tied >= 0) {
        /* wte and its copy, as this rank holds their gradients (the same
         * elements of both: ZeRO-2/3's pieces of one-tensor units coincide) */
        const param_desc_t *d = &m->table.p[tr->tied];
        size_t n;
        float *buf = tr->sync.ops->tensor_grads(&tr->sync, d->offset, d->numel, &n);
        m->ops->sync(m->ops->ctx); /* running kernels are compute, not communication */
        double t0 = now_s();
        if (g->embed->ops->allreduce(g->embed, buf, n, COMM_FP32, COMM_SUM) != 0) {
            snprintf(err, errlen, "step %d: tied embedding all-reduce failed: %s", step + 1, g->embed->err);
            return -1;
        }
        tr->embed_comm_s = now_s() - t0;
    }
    return 0;
}

/* --trace: every rank's spans into one file. Collective. */
static int write_trace(trainer_t *tr, char *err, size_t errlen)
{
    MPI_Comm world = MPI_COMM_WORLD;
    if (trace_write_merged(tr->trace, &world, tr->opt->trace, err, errlen) != 0)
        return -1;
    if (tr->env->world_rank == 0)
        printf("trace: %zu spans on rank 0 written to %s (open in ui.perfetto.dev)\n", trace_count(tr->trace),
               tr->opt->trace);
    return 0;
}

/* At the boundary after `step` completed steps: did SIGUSR1 or SIGTERM
 * reach any rank? A signal reaches the ranks at different moments (srun
 * and mpirun forward it one by one), so all ranks decide together on the
 * maximum of their flags; one all-reduce of one int per step. If so, writes
 * the checkpoint of `step` (unless this boundary just wrote it), says why
 * it stops and sets stopped_by. Collective. */
static int stop_requested(trainer_t *tr, int step, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    int32_t sig = launch_stop_signal();
    if (tr->grid->world_size > 1 && tr->world->ops->allreduce(tr->world, &sig, 1, COMM_INT32, COMM_MAX) != 0) {
        snprintf(err, errlen, "step %d: the all-reduce of the stop signal failed: %s", step, tr->world->err);
        return -1;
    }
    if (sig == 0)
        return 0;
    const char *name = sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "a signal";
    if ((o->ckpt_dir[0] && tr->last_ckpt_step != step && trainer_save(tr, step, err, errlen) != 0) ||
        ckpt_wait(tr, 0, err, errlen) != 0)
        return -1;
    if (tr->env->world_rank == 0) {
        if (o->ckpt_dir[0])
            printf("stopping at step %d: %s received, checkpoint %s written; requeue to continue (--resume auto)\n",
                   step, name, tr->last_ckpt);
        else
            printf("stopping at step %d: %s received; nothing saved (no --ckpt-dir), so a rerun starts again "
                   "from step 0\n",
                   step, name);
        fflush(stdout);
    }
    tr->stopped_by = sig;
    return 0;
}

/* Model FLOPs per token of the step just run: with --doc-mask the
 * attention its documents needed (this rank's microbatches: the other
 * data-parallel ranks' documents differ but not their expected lengths),
 * else the configuration's. */
static double step_flops_token(trainer_t *tr)
{
    if (!tr->opt->doc_mask || tr->doc_tok <= 0)
        return tr->flops_token;
    double f = flops_per_token(&tr->cfg, tr->doc_sq / tr->doc_tok);
    tr->doc_sq = tr->doc_tok = 0.0;
    return f;
}

/* A --tensorboard write failed with err: the option's name before it. -1. */
static int tensorboard_failed(trainer_t *tr, char *err, size_t errlen)
{
    char why[512];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "--tensorboard %s: %s", tr->opt->tensorboard, why);
    return -1;
}

/* The run's end (also by a stop signal), after everything collective: the
 * --tensorboard file closed, its last bytes written. rc: the run's status
 * so far, returned unless it is 0 and the close fails. */
static int close_tensorboard(trainer_t *tr, int rc, char *err, size_t errlen)
{
    if (rc != 0 || !tr->tb)
        return rc; /* a failed run's file: trainer_teardown closes it */
    tfevents_t *w = tr->tb;
    tr->tb = NULL;
    return tfevents_close(w, err, errlen) != 0 ? tensorboard_failed(tr, err, errlen) : 0;
}

/* The untrained model's validation loss: the baseline the run improves on. */
static int baseline_val(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    double v = trainer_val_loss(tr);
    if (tr->env->world_rank != 0)
        return 0;
    printf("step %*d/%d | val %.6f\n", o->steps >= 10000 ? 6 : 4, 0, o->steps, v);
    if (tr->metrics && fprintf(tr->metrics, "{\"step\": 0, \"val_loss\": %.9g}\n", v) < 0) {
        snprintf(err, errlen, "--metrics %s: write failed: %s", o->metrics, strerror(errno));
        return -1;
    }
    const tfevents_scalar_t v0 = {"val/loss", v};
    if (tr->tb && tfevents_scalars(tr->tb, 0, tfevents_now(), &v0, 1, err, errlen) != 0)
        return tensorboard_failed(tr, err, errlen);
    return 0;
}

/* The step's loss, the mean over the global batch: the last stage's
 * microbatch means, summed over PP (others add 0) and DP. 0 or -1. */
static int step_loss(trainer_t *tr, double *loss)
{
    const grid_t *g = tr->grid;
    float lf = g->pp_rank == g->pp_size - 1 ? (float)(tr->loss_sum / tr->accum) : 0.0f;
    if ((g->pp_size > 1 && g->pp->ops->allreduce(g->pp, &lf, 1, COMM_FP32, COMM_SUM) != 0) ||
        (g->dp_size > 1 && g->dp->ops->allreduce(g->dp, &lf, 1, COMM_FP32, COMM_SUM) != 0))
        return -1;
    *loss = (double)lf / g->dp_size;
    return 0;
}

/* The optimizer step on the strategy's view of this rank's state, then
 * the strategy gathers what the update changed elsewhere. */
static int update_params(trainer_t *tr, int step, double lr, double norm, char *err, size_t errlen)
{
    model_t *m = &tr->model;
    const dpsync_optim_view_t *v = &tr->sync.view;
    double t_opt = tr->trace ? trace_now() : 0.0;
    /* a view of every parameter keeps the bf16 weights current in the
     * same pass; otherwise the gather writes params, and the bf16 weights
     * are recast once per step */
    adamw_step(&tr->optim, v->params, v->whole ? m->params16 : NULL, v->grads, lr, adamw_clip_scale(&tr->optim, norm));
    if (tr->trace)
        m->ops->sync(m->ops->ctx); /* the span measures the kernels (see model.c span_end) */
    trace_span(tr->trace, TRACE_COMPUTE, "optimizer", t_opt, tr->trace ? trace_now() : 0.0, NULL);
    if (!v->whole)
        model_params_written(m);
    if (tr->sync.ops->after_update(&tr->sync) != 0) {
        snprintf(err, errlen, "step %d: %s", step + 1, tr->sync.err);
        return -1;
    }
    return 0;
}

/* --spike-max skipped steps in a row, the last 0-based `step`: back to the
 * last checkpoint (this job's, else the one it resumed from), reading on
 * from the batch after the skipped ones. Collective. */
static int spike_rollback(trainer_t *tr, int step, char *err, size_t errlen)
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
    spike_reset(sp);
    sp->rolled_back = 1;
    return 0;
}

/* The spike guard's verdict on the step (src/spike.h): go on, or skip the
 * update (the strategy's gather still runs, of unchanged parameters, so
 * every strategy ends the step as after an update), or roll back. */
static int guard_step(trainer_t *tr, int step, double loss, double norm, spike_action_t *act, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    const spike_ctx_t c = {.world = tr->world,
                           .world_rank = g->world_rank,
                           .tp_rank = g->tp_rank,
                           .pp_rank = g->pp_rank,
                           .dp_rank = g->dp_rank,
                           .sync = &tr->sync,
                           .table = &tr->model.table};
    if (spike_check(&tr->spike, &c, step + 1, tr->opt->steps, loss, norm, act, err, errlen) != 0)
        return -1;
    if (*act == SPIKE_ROLLBACK)
        return spike_rollback(tr, step, err, errlen);
    if (*act == SPIKE_SKIP && tr->sync.ops->after_update(&tr->sync) != 0) {
        snprintf(err, errlen, "step %d: %s", step + 1, tr->sync.err);
        return -1;
    }
    return 0;
}

/* A step's seconds on this rank: the whole step, its exposed
 * communication (blocked in the DP strategy's waits, TP collectives, the
 * tied-embedding sum) and the pipeline bubble (blocked waiting for a
 * neighbour stage). */
typedef struct step_times {
    double dt, comm, bubble;
} step_times_t;

/* One optimizer step: gradients, loss, norm, update. Fills r's step,
 * loss, lr, norm and rate, and *t. */
static int train_step(trainer_t *tr, int step, step_record_t *r, step_times_t *t, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    model_t *m = &tr->model;
    double t0 = now_s();
    straggler_test_delay(&tr->strag); /* DTRAIN_TEST_SLOW_RANK: tests only */
    double lr = lr_at(&tr->sched, step);
    m->tp_comm_s = 0.0;
    tr->embed_comm_s = 0.0;
    if (step_gradients(tr, step, &t->bubble, err, errlen) != 0)
        return -1;
    double loss;
    if (step_loss(tr, &loss) != 0) {
        snprintf(err, errlen, "step %d: loss all-reduce failed", step + 1);
        return -1;
    }
    double norm = trainer_grad_norm(tr);
    spike_action_t act;
    if (guard_step(tr, step, loss, norm, &act, err, errlen) != 0)
        return -1;
    if (act == SPIKE_ROLLBACK) { /* the loop goes on from the checkpoint (tr->spike.rolled_back) */
        *t = (step_times_t){0};
        return 0;
    }
    if (act == SPIKE_GO && update_params(tr, step, lr, norm, err, errlen) != 0)
        return -1;
    m->ops->sync(m->ops->ctx); /* the step's time covers its kernels (the optimizer's run ahead of the host) */
    const double dt = now_s() - t0, tokens_step = (double)o->micro_batch * o->seq_len * tr->accum * tr->grid->dp_size;
    tr->steps_done = step + 1;
    *r = (step_record_t){.step = step + 1,
                         .steps = o->steps,
                         .loss = loss,
                         .val_loss = NAN,
                         .lr = lr,
                         .grad_norm = norm,
                         .ms = 1e3 * dt,
                         .tokens_per_s = tokens_step / dt};
    t->dt = dt;
    t->comm = tr->sync.ops->comm_s(&tr->sync) + m->tp_comm_s + tr->embed_comm_s;
    return 0;
}

/* The step's compute, exposed communication and bubble, max and mean over
 * ranks (a straggler or a slow link shows as max well above mean), the
 * allocator's peaks (max over ranks) and the MFU. Collective. */
static int step_stats(trainer_t *tr, step_record_t *r, const step_times_t *st, char *err, size_t errlen)
{
    const grid_t *g = tr->grid;
    const double dt = st->dt;
    float t[6] = {(float)(dt - st->comm - st->bubble), (float)st->comm, (float)(st->bubble / dt)}, tmax[3];
    memcpy(tmax, t, sizeof tmax);
    memcpy(t + 3, t, sizeof tmax);
    if (g->world_size > 1 && (g->world->ops->allreduce(g->world, tmax, 3, COMM_FP32, COMM_MAX) != 0 ||
                              g->world->ops->allreduce(g->world, t + 3, 3, COMM_FP32, COMM_SUM) != 0)) {
        snprintf(err, errlen, "step %d: timing all-reduce failed: %s", r->step, g->world->err);
        return -1;
    }
    for (int k = 0; k < MEM_N_CATEGORIES; k++)
        r->mem_peak[k] = (long long)mem_peak_bytes((mem_category_t)k);
    r->mem_peak[MEM_N_CATEGORIES] = (long long)mem_total_peak_bytes();
    if (tr->world->ops->allreduce(tr->world, r->mem_peak, MEM_N_CATEGORIES + 1, COMM_INT64, COMM_MAX) != 0) {
        snprintf(err, errlen, "step %d: the all-reduce of the memory peaks failed: %s", r->step, tr->world->err);
        return -1;
    }
    r->compute_ms_max = 1e3 * tmax[0];
    r->comm_ms = 1e3 * tmax[1];
    r->bubble_max = tmax[2];
    r->compute_ms_mean = 1e3 * t[3] / g->world_size;
    r->comm_ms_mean = 1e3 * t[4] / g->world_size;
    r->bubble_mean = t[5] / g->world_size;
    /* MFU never exceeds 100 %: a step faster than the peak shows the peak
     * was wrong (a probe disturbed by a neighbour, a --peak-gflops too
     * low), and the peak becomes that step's rate from then on */
    double rate = step_flops_token(tr) * r->tokens_per_s * 1e-9 / g->world_size;
    if (tr->peak_gflops > 0 && rate > tr->peak_gflops) {
        if (tr->env->world_rank == 0 && !tr->peak_rebased)
            printf("mfu: step %d ran at %.1f GFLOP/s per rank, above the peak of %.1f (%s): that peak is too "
                   "low; MFU is against the fastest step's rate from here on\n",
                   r->step, rate, tr->peak_gflops, tr->opt->peak_gflops > 0 ? "--peak-gflops" : "sgemm probe");
        tr->peak_rebased = 1;
        tr->peak_gflops = rate;
    }
    r->mfu = tr->peak_gflops > 0 ? rate / tr->peak_gflops : 0.0;
    return straggler_step(&tr->strag, tr->world, r->step, dt - st->comm - st->bubble, &r->straggler, err, errlen);
}

/* After step r->step (of this job's `end`): the replica check and the
 * validation when due, the record printed and written, the checkpoint
 * when due. Collective. */
static int report_step(trainer_t *tr, step_record_t *r, int end, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const int done = r->step;
    if (o->check_replicas > 0 && done % o->check_replicas == 0 && trainer_check_replicas(tr, done, err, errlen) != 0)
        return -1;
    if (tr->has_val && (done % o->val_every == 0 || done == end))
        r->val_loss = trainer_val_loss(tr);
    if (ckpt_wait(tr, 1, err, errlen) != 0)
        return -1;
    r->ckpt_stall_ms = 1e3 * tr->ckpt_stall_s;
    tr->ckpt_stall_s = 0.0;
    if (tr->env->world_rank == 0 && tr->spike.in_row == 0) { /* a skipped step has its spike line instead */
        metrics_eta(&tr->eta, r, o->ckpt_dir[0] ? o->ckpt_every : 0, end);
        metrics_print_step(stdout, r);
        if (tr->metrics && metrics_write_json(tr->metrics, r) != 0) {
            snprintf(err, errlen, "--metrics %s: write failed: %s", o->metrics, strerror(errno));
            return -1;
        }
        if (tr->tb && metrics_write_tfevents(tr->tb, r, tfevents_now(), err, errlen) != 0)
            return tensorboard_failed(tr, err, errlen);
    }
    if (o->ckpt_dir[0] && ((o->ckpt_every > 0 && done % o->ckpt_every == 0) || done == end) &&
        trainer_save(tr, done, err, errlen) != 0)
        return -1;
    return 0;
}

/* After the last step of a run that was not stopped: the summary, the
 * final parameters, the sample and the trace. defer0: the deferred ops'
 * counts after the first step. */
static int finish_run(trainer_t *tr, int end, double t_run, double loss, const long defer0[2], char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    if (tr->env->world_rank == 0) {
        double total = now_s() - t_run;
        const int ran = end > tr->start_step ? end - tr->start_step : 0;
        const double tokens_step = (double)o->micro_batch * o->seq_len * tr->accum * tr->grid->dp_size;
        printf("done: %d steps in %.1f s, final loss %.6f, %.0f tok/s average\n", ran, total, loss,
               ran > 0 ? tokens_step * ran / total : 0.0);
        if (tr->backend.deferred && ran >= 2) {
            /* what a GPU's host would wait on: the cost the asynchronous ops avoid */
            long ops = 0, waits = 0;
            ops_defer_counts(tr->backend.ops, &ops, &waits);
            printf("deferred ops (rank 0, steps %d-%d): %.1f ops and %.1f host waits per step\n", tr->start_step + 2,
                   end, (double)(ops - defer0[0]) / (ran - 1), (double)(waits - defer0[1]) / (ran - 1));
        }
    }
    if (o->save_params[0] && trainer_save_params(tr, err, errlen) != 0)
        return -1;
    if (o->sample_tokens > 0 && print_sample(tr, stdout) != 0) {
        snprintf(err, errlen, "sampling failed: %s", tr->model.failed ? tr->model.err : "out of memory");
        return -1;
    }
    if (tr->trace && write_trace(tr, err, errlen) != 0)
        return -1;
    return 0;
}

int trainer_run(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    double t_run = now_s(), loss = NAN;
    long defer0[2] = {0, 0}; /* DTRAIN_DEFER_OPS counts after the first step */
    if (tr->has_val && tr->start_step == 0 && baseline_val(tr, err, errlen) != 0)
        return -1;
    if (tr->start_step >= o->steps && tr->env->world_rank == 0)
        printf("resume: the checkpoint is at step %d and --steps is %d: nothing left to train\n", tr->start_step,
               o->steps);
    /* --stop-at-step ends this job early; the schedule is still --steps' */
    const int end = o->stop_at_step > 0 && o->stop_at_step < o->steps ? o->stop_at_step : o->steps;
    for (int step = tr->start_step; step < end; step++) {
        step_record_t r;
        step_times_t t;
        if (train_step(tr, step, &r, &t, err, errlen) != 0)
            return -1;
        if (tr->spike.rolled_back) { /* on from the checkpoint's step */
            tr->spike.rolled_back = 0;
            step = tr->steps_done - 1;
            continue;
        }
        if (step_stats(tr, &r, &t, err, errlen) != 0 || report_step(tr, &r, end, err, errlen) != 0)
            return -1;
        loss = r.loss;
        if (tr->backend.deferred && step == tr->start_step)
            ops_defer_counts(tr->backend.ops, &defer0[0], &defer0[1]);
        if (step + 1 < end && stop_requested(tr, step + 1, err, errlen) != 0)
            return -1;
        if (tr->stopped_by)
            break;
    }
    if (ckpt_wait(tr, 0, err, errlen) != 0)
        return -1;
    if (tr->stopped_by) {
        /* the run continues in a later job: no final parameters, no sample */
        return close_tensorboard(tr, tr->trace ? write_trace(tr, err, errlen) : 0, err, errlen);
    }
    return close_tensorboard(tr, finish_run(tr, end, t_run, loss, defer0, err, errlen), err, errlen);
}
void trainer_teardown(trainer_t *tr)
{
    comm_t *groups[GRID_MAX_GROUPS];
    for (int i = 0, n = grid_groups(tr->grid, groups, NULL); i < n; i++) {
        groups[i]->trace = NULL;
        groups[i]->watch = NULL;
    }
    if (tr->world)
        tr->world->watch = NULL;
    trace_destroy(tr->trace);
    watchdog_stop(tr->watch);
    if (tr->metrics && fclose(tr->metrics) != 0)
        fprintf(stderr, "dtrain: warning: closing --metrics %s failed\n", tr->opt->metrics);
    char tb_err[256]; /* a failed run's file: its one line is the run's error, not this close's */
    tfevents_close(tr->tb, tb_err, sizeof tb_err);
    straggler_free(&tr->strag);
    free(tr->tok);
    free(tr->tgt);
    free(tr->pos);
    free_state(tr);
    ckpt_async_destroy(tr->ckpt_async);
    dpsync_destroy(&tr->sync);
    adamw_destroy(&tr->optim);
    if (tr->model.ops)
        model_destroy(&tr->model);
    backend_close(&tr->backend);
    tokenizer_close(tr->tokenizer);
    free(tr->prompt_ids.id);
    spike_free(&tr->spike);
    data_close(&tr->train);
    if (tr->has_val)
        data_close(&tr->val);
    memset(tr, 0, sizeof *tr);
}
