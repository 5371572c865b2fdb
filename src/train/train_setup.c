/* trainer_setup and everything it calls: data, tokenizer, document mask,
 * backend, model, data-parallel strategy, watchdog and trace, the step's
 * buffers, the MFU peak and the output paths. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "src/train/train.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
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

/* --threads 0: OpenMP's own choice when OMP_NUM_THREADS is set, else this
 * node's cores shared by the ranks on it (at most the cores this rank may
 * run on). Every rank taking every core oversubscribes them, and OpenMP's
 * spinning threads then stall one another (mpirun -np 4 on 2 cores ran 20x
 * slower); torchrun sets OMP_NUM_THREADS=1 for the same reason. */
int trainer_default_threads(int requested, const launch_env_t *env)
{
    const char *omp = getenv("OMP_NUM_THREADS");
    if (requested > 0 || (omp && *omp) || env->local_size <= 1)
        return requested;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t mask;
    long mine = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : online;
    long share = online > 0 ? online / env->local_size : 1;
    if (share > mine)
        share = mine;
    return share > 0 ? (int)share : 1;
}

/* Output files are written at the end of the run: refuse at start a path
 * whose directory cannot take them. Empty path: nothing to check. */
static int check_writable_dir(const char *opt, const char *path, char *err, size_t errlen)
{
    if (!path[0])
        return 0;
    char dir[OPT_PATH_MAX];
    if (fs_probe_parent(path, dir, sizeof dir) != 0) {
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
                     make_out_dirs("--save-params", o->save_params, 0, err, errlen) ||
                     make_out_dirs("--eval-mc-dump", o->eval_mc_dump, 0, err, errlen)
                 ? -1
                 : 0;
    if (agree(tr->world, rc, err, errlen) != 0)
        return -1;
    rc = check_writable_dir("--trace", o->trace, err, errlen) != 0 ||
                 check_writable_dir("--save-params", o->save_params, err, errlen) != 0
             ? -1
             : 0;
    if (rc == 0 && rank0 && dir[0] && fs_probe_dir(dir) != 0) {
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
    char cerr[COMM_ERR_MAX];
    if (g->world_size > 1 && w->ops->barrier(w, cerr, sizeof cerr) != STATUS_OK)
        return status_set(STATUS_FAIL, err, errlen, "the barrier before the sgemm probe failed: %s", cerr);
    double v[2] = {flops_probe(&p, FLOPS_PROBE_BUDGET_S) == 0 ? p.gflops : 0.0, 0.0};
    v[1] = v[0] > 0 ? 0.0 : 1.0;
    if (g->world_size > 1 && w->ops->allreduce(w, v, 2, COMM_FP64, COMM_SUM, cerr, sizeof cerr) != STATUS_OK)
        return status_set(STATUS_FAIL, err, errlen, "the all-reduce of the sgemm probe failed: %s", cerr);
    /* a failed probe (out of memory) leaves MFU at 0 */
    tr->peak_gflops = v[1] > 0 ? 0.0 : v[0] / g->world_size;
    int off = flops_probe_describe(&p, tr->peak_how, sizeof tr->peak_how);
    if (g->world_size > 1 && off > 0 && (size_t)off < sizeof tr->peak_how)
        snprintf(tr->peak_how + off, sizeof tr->peak_how - (size_t)off, "; mean of %d ranks probing at once",
                 g->world_size);
    return 0;
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
    unsigned char *expert = malloc((size_t)t->n + 1);
    int rc = start && block && norm && expert ? 0 : -1;
    for (int i = 0; rc == 0 && i < t->n; i++) {
        const param_desc_t *d = &t->p[i];
        start[i] = d->offset;
        block[i] = d->layer >= 0 && d->layer < tr->cfg.n_layer ? param_layout_local(&m->lay.part, d->layer) : -1;
        norm[i] = !(d->tied_copy || (d->tp_split == TP_SPLIT_NONE && !d->ep_spans_tp && g->tp_rank != 0));
        expert[i] = (unsigned char)d->expert;
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
                                   .tensor_expert = g->edp ? expert : NULL,
                                   .edp = g->edp,
                                   .ep = g->ep,
                                   .eshard = g->eshard,
                                   .mode = mode,
                                   .bucket_bytes = (size_t)(o->bucket_mb * 1048576.0),
                                   .dtype = gdt,
                                   .keep_block_grads = m->lay.split_backward,
                                   .mem = mem_process_tracker()};
        rc = dpsync_create(&tr->sync, kind, &c, err, errlen);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(start);
    free(block);
    free(norm);
    free(expert);
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

/* The training and validation data (src/data/data.h). Megatron files are
 * mapped, not read: their tokens are checked against the vocabulary here,
 * each rank checking its share, and the ranks agree on the verdict. */
static int open_data(trainer_t *tr, char *err, size_t errlen)
{
    const run_options_t *o = tr->opt;
    const run_config_t *run = tr->run;
    const int vocab = tr->cfg.vocab_size;
    const tokens_format_t fmt = run->data_format;
    int rc = 0;
    char e[1024];
    if (data_open(&tr->train, o->data, fmt, vocab, run->seq_len, 1, (uint64_t)o->seed, e, sizeof e) != 0) {
        snprintf(err, errlen, "--data: %s", e);
        rc = -1;
    } else if (o->val_every > 0 && data_open(&tr->val, o->val_data, fmt, vocab, run->seq_len, 0, 0, e, sizeof e) != 0) {
        /* which option: the loader's messages name only the path */
        snprintf(err, errlen, "--val-data: %s", e);
        rc = -1;
    }
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
    /* --ep: the EP group is run->ep consecutive DP ranks, or with --etp 1
     * ranks of the TP x DP plane (grid_create_ep_groups) */
    lay.part.ep_size = run->ep;
    lay.part.ep_rank = run_config_ep_spans_tp(run) ? (grid->tp_rank + grid->tp_size * grid->dp_rank) % run->ep
                                                   : grid->dp_rank % run->ep;
    lay.part.etp = run->etp;
    run_config_stage_runs(run, grid->pp_rank, &lay.part.n_runs, lay.part.run_begin, lay.part.run_end);
    lay.part.has_embed = grid->pp_rank == 0;
    lay.part.has_head = grid->pp_rank == grid->pp_size - 1;
    lay.sequence_parallel = run->sequence_parallel;
    lay.doc_mask = tr->opt->doc_mask;
    const pipe_shape_t shape = run_config_pipe_shape(run);
    lay.n_slots = pipe_stage_slots(&shape, grid->pp_rank);
    /* the strategy's kind decides what the model keeps of the blocks */
    lay.split_backward = run->pp_kind == PIPE_ZBH1;
    /* a split backward keeps every gradient (dpsync_config_t's
     * keep_block_grads); the parameters may still be lent, since B reads
     * them and W does not */
    lay.lent_block_grads = kind->lends_block_grads && !lay.split_backward;
    lay.lent_block_params = kind->lends_block_params;
    lay.recompute = run->recompute;
    lay.logits_chunk = run->logits_chunk;
    return lay;
}

/* The backend and the communicators: collective (shard groups, NCCL
 * bootstrap), so every rank enters it only when none has failed. */
static int setup_backend(trainer_t *tr, const dpsync_ops_t *kind, char *err, size_t errlen)
{
    const run_config_t *run = tr->run;
    grid_t *grid = tr->grid;
    CHECK(agree(tr->world, backend_open(&tr->backend, run->device, run->dtype, tr->env->local_rank, err, errlen), err,
                errlen));
    if (tr->opt->cuda_graphs)
        CHECK(agree(tr->world, backend_use_graphs(&tr->backend, err, errlen), err, errlen));
    if (run->hybrid_shard && kind->shards)
        CHECK(grid_create_shard_group(grid, run->hybrid_shard, err, errlen));
    if (run->cp > 1)
        CHECK(grid_create_cp_group(grid, run->cp, err, errlen));
    if (run->ep > 1 || run_config_ep_spans_tp(run))
        CHECK(grid_create_ep_groups(grid, run->ep, run_config_ep_spans_tp(run), err, errlen));
    /* check_ep: ep divides the shard group (x tp with --etp 1) */
    const int spans = run_config_ep_spans_tp(run);
    if (run->hybrid_shard && kind->shards && (run->ep > 1 || spans))
        CHECK(grid_create_expert_shard(grid, run->hybrid_shard * (spans ? run->tp : 1) / run->ep, spans, err, errlen));
    CHECK(agree(tr->world,
                backend_comm_open(&tr->backend, run->comm, grid, &tr->net, tr->opt->comm_timeout, err, errlen), err,
                errlen));
    /* from here on the step loop's groups: NCCL twins under --comm nccl */
    tr->grid = &tr->net;
    return 0;
}

/* Bytes of host memory available to this process's node: /proc/meminfo's
 * MemAvailable, capped by the cgroup's memory.max less memory.current
 * where one limits the job (a SLURM allocation). 0: unknown. */
static double host_mem_available(void)
{
    double avail = 0, max = 0, cur = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
                avail = (double)kb * 1024.0;
        fclose(f);
    }
    f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        if (fscanf(f, "%lf", &max) != 1)
            max = 0;
        fclose(f);
    }
    f = fopen("/sys/fs/cgroup/memory.current", "r");
    if (f) {
        if (fscanf(f, "%lf", &cur) != 1)
            cur = 0;
        fclose(f);
    }
    if (max > 0 && (avail == 0 || max - cur < avail))
        avail = max > cur ? max - cur : 0;
    return avail;
}

/* --offload: the gradients' copies to the host begin as the strategy
 * tells each bucket or unit final, during the backward; the tied
 * embedding's (pp > 1) wait for its sum over the stages. */
static int setup_offload_copies(trainer_t *tr, char *err, size_t errlen)
{
    tr->tied_lo = tr->tied_hi = 0;
    if (tr->tied >= 0) {
        const param_desc_t *d = &tr->model.table.p[tr->tied];
        size_t n;
        const float *g = tr->sync.ops->tensor_grads(&tr->sync, d->offset, d->numel, &n);
        tr->tied_lo = (size_t)(g - tr->sync.view.grads);
        tr->tied_hi = tr->tied_lo + n;
    }
    char cerr[COMM_ERR_MAX];
    if (dpsync_on_final(&tr->sync, trainer_grads_final, tr, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "--offload optimizer: %s", cerr);
        return -1;
    }
    return 0;
}

/* --offload optimizer, before any state is allocated: this rank's share
 * of its node's available host memory must hold the offloaded part of
 * its optimizer elements (about the stage's parameters, over the shard
 * group under ZeRO), or the run is refused in one line on every rank. */
static int check_offload_memory(trainer_t *tr, const model_layout_t *lay, char *err, size_t errlen)
{
    const run_config_t *run = tr->run;
    param_table_t t;
    int rc = param_table_build(&t, &tr->cfg, &lay->part, err, errlen);
    if (rc == 0) {
        const size_t n = run->zero_stage ? (t.numel + (size_t)run->shard - 1) / (size_t)run->shard : t.numel;
        /* under params_host the fp32 weights too, as the master copy */
        const double need =
            (double)adamw_offload_bytes(adamw_offload_count(n, run->offload_fraction), lay->bf16, lay->params_host) +
            (lay->params_host ? (double)t.numel * sizeof(float) : 0.0);
        param_table_free(&t);
        const double avail = host_mem_available(), gib = 1073741824.0;
        const int ranks = tr->env->local_size > 0 ? tr->env->local_size : 1;
        if (avail > 0 && need > avail / ranks) {
            const int w = lay->params_host; /* what needs the memory, and what frees some */
            snprintf(err, errlen,
                     "--offload optimizer: rank %d needs %.2f GiB of host memory for its optimizer state%s, but its "
                     "node has %.2f GiB available for %d rank%s (%.2f GiB each): %s, or run fewer ranks per node",
                     tr->env->world_rank, need / gib,
                     w ? " and its fp32 weights (under --dtype bf16 with the whole state offloaded they are the host's "
                         "master copy)"
                       : "",
                     avail / gib, ranks, ranks == 1 ? "" : "s", avail / ranks / gib,
                     w ? "lower --offload-fraction below 1 (the fp32 weights then stay on the device), shard them with "
                         "--zero 3"
                       : "lower --offload-fraction, shard the state over more ranks (--zero 1 or more)");
            rc = -1;
        }
    }
    return agree(tr->world, rc, err, errlen);
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
    lay.ep = grid->ep;
    lay.cp = grid->cp;
    lay.cp_size = grid->cp_size;
    lay.cp_rank = grid->cp_rank;
    lay.bf16 = backend_bf16(&tr->backend);
    if (lay.bf16 && (!tr->backend.ops->matmul_fwd_bf16 || !tr->backend.ops->matmul_bwd_bf16)) {
        snprintf(err, errlen, "--dtype bf16: the %s backend has no bf16 GEMM; use --dtype fp32", tr->backend.ops->name);
        return -1;
    }
    lay.tp_bf16 = run->tp_dtype == COMM_BF16 && run->tp > 1;
    lay.tp_overlap = run->tp_overlap && run->tp > 1;
    if (run->tp_dtype == COMM_BF16 && !lay.bf16) {
        snprintf(err, errlen,
                 "--tp-comm-dtype bf16 sends the activations' bf16 copies and needs --dtype bf16 (this run computes "
                 "in fp32): add --dtype bf16, or drop --tp-comm-dtype");
        return -1;
    }
    lay.params_host = run_config_weights_on_host(run, lay.bf16);
    if (run->offload_fraction > 0 && check_offload_memory(tr, &lay, err, errlen) != 0)
        return -1;
    /* --cp: the model holds T/cp rows of each sequence */
    if (model_create(&tr->model, &tr->cfg, tr->backend.ops, &lay, run->micro_batch, run->seq_len / run->cp, err,
                     errlen) != 0)
        return -1;
    const size_t nb = model_moe_has_bias(&tr->cfg) ? 2 * (size_t)tr->cfg.n_layer * tr->cfg.moe.experts : 0;
    if (nb && !(tr->moe_bias = calloc(nb, sizeof *tr->moe_bias))) {
        snprintf(err, errlen, "out of memory for the expert bias of %d layers", tr->cfg.n_layer);
        return -1;
    }
    if (setup_sync(tr, kind, run->grad_dtype, err, errlen) != 0)
        return -1;
    if (init_params(tr, (uint64_t)o->seed, err, errlen) != 0)
        return -1;
    /* --offload optimizer: the first --offload-fraction of this rank's
     * optimizer elements in host memory, staging the bf16 copy when the
     * update writes it (a view of every parameter) */
    const dpsync_optim_view_t *v = &tr->sync.view;
    const size_t n_host = adamw_offload_count(v->n, run->offload_fraction);
    const int host_bf16 = n_host && tr->model.params16 != NULL && v->whole;
    int rc = adamw_create(&tr->optim, tr->model.ops, &tr->model.table, v, o->beta1, o->beta2, o->adam_eps,
                          o->weight_decay, o->grad_clip, n_host, host_bf16, tr->model.lay.params_host);
    if (rc != 0)
        snprintf(err, errlen, "out of memory for the optimizer state (%zu parameters%s)", tr->model.table.numel,
                 n_host ? ", part of it in host memory" : "");
    if (rc != 0)
        return -1;
    const param_table_t *t = &tr->model.table;
    /* GPT-2's tied embedding, when the first and last stage differ: the
     * first stage's wte and the last stage's copy, summed over the
     * embedding group */
    tr->tied = -1;
    if (model_head_tied(&tr->cfg) && grid->pp_size > 1 && grid->embed)
        tr->tied = param_table_find(t, model_embed_name(&tr->cfg));
    return n_host ? setup_offload_copies(tr, err, errlen) : 0;
}

/* The watchdog's on-fire function: one line for the job, the first, and
 * the ranks that no longer answer in it. */
static int claim_line(void *lost, char *silent, size_t len) { return lostpeer_claim_line(lost, silent, len); }

/* Without the lost-peer report: rank 0 says why, once; no rank asks. */
static void lostpeer_off(trainer_t *tr, int rank, const char *why)
{
    if (tr->grid->world_rank == 0)
        fprintf(stderr,
                "dtrain: warning: ranks lost with their node will not be named when the launcher ends the job "
                "(its own line names the node; --comm-timeout still names a peer that hangs): rank %d: %s\n",
                rank, why);
    lostpeer_close(tr->lost);
    tr->lost = NULL;
}

/* The lost-peer report (mpi/lostpeer.h), with the watchdog: every rank's
 * UDP addresses and the start-up check, each agreed, so that the report is
 * on on every rank or on none. Its failure is no error: the run goes on
 * without it, and rank 0 says so. hosts: every rank's, hostlen bytes each.
 * Collective over the world. */
static int setup_lostpeer(trainer_t *tr, const char *who, const char *hosts, int hostlen, char *err, size_t errlen)
{
    const int world = tr->grid->world_size;
    char msg[AGREE_MSG_MAX] = "", cerr[COMM_ERR_MAX];
    lostpeer_addr_t mine;
    int first = -1;
    tr->lost = lostpeer_open(tr->grid->world_rank, world, who, &mine, msg, sizeof msg);
    if (agree_rank(tr->world, tr->lost ? 0 : STATUS_FAIL, msg, sizeof msg, &first) != STATUS_OK) {
        lostpeer_off(tr, first, msg);
        return 0;
    }
    lostpeer_addr_t *all = malloc((size_t)world * sizeof *all);
    if (!all) {
        snprintf(err, errlen, "out of memory for %d ranks' addresses", world);
        return -1;
    }
    if (tr->world->ops->allgather(tr->world, &mine, all, sizeof mine, COMM_BYTE, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "the all-gather of the ranks' UDP addresses failed: %s", cerr);
        free(all);
        return -1;
    }
    lostpeer_set_context(tr->lost, watchdog_describe_wait, tr->watch);
    int bad = lostpeer_start(tr->lost, all, hosts, hostlen, msg, sizeof msg) != 0 ||
              lostpeer_check(tr->lost, msg, sizeof msg) != 0;
    free(all);
    if (agree_rank(tr->world, bad ? STATUS_FAIL : 0, msg, sizeof msg, &first) != STATUS_OK) {
        lostpeer_off(tr, first, msg);
        return 0;
    }
    watchdog_on_fire(tr->watch, claim_line, tr->lost);
    launch_notify_term(lostpeer_term_fd(tr->lost));
    return 0;
}

/* Tells the watchdog every rank's host and each group's members by world
 * rank, so that its abort line names the peer that stopped answering and
 * the machine it runs on, and sets up the lost-peer report, whose line
 * names them too (who: this rank, for it). Collective over the world and
 * each group. */
static int watch_names(trainer_t *tr, const char *who, comm_t **groups, int ng, char *err, size_t errlen)
{
    enum { HOSTLEN = 64 };
    const int world = tr->grid->world_size;
    char me[HOSTLEN] = "", cerr[COMM_ERR_MAX];
    snprintf(me, sizeof me, "%.63s", tr->env->host); /* a longer name is cut: the line still says enough */
    char *hosts = malloc((size_t)world * HOSTLEN);
    int32_t *ranks = malloc((size_t)world * sizeof *ranks);
    int rc = hosts && ranks ? 0 : -1;
    if (rc != 0)
        snprintf(err, errlen, "out of memory for the --comm-timeout host table");
    if (rc == 0 &&
        tr->world->ops->allgather(tr->world, me, hosts, HOSTLEN, COMM_BYTE, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "--comm-timeout: the all-gather of the host names failed: %s", cerr);
        rc = -1;
    }
    if (rc == 0 && watchdog_set_hosts(tr->watch, hosts, HOSTLEN, world) != 0) {
        snprintf(err, errlen, "out of memory for the --comm-timeout host table");
        rc = -1;
    }
    const int32_t mine = tr->grid->world_rank;
    for (int i = 0; i < ng && rc == 0; i++) {
        comm_t *c = groups[i];
        if (c->ops->allgather(c, &mine, ranks, 1, COMM_INT32, cerr, sizeof cerr) != STATUS_OK) {
            snprintf(err, errlen, "--comm-timeout: the all-gather of group %s's ranks failed: %s", c->name, cerr);
            rc = -1;
        } else if (watchdog_add_group(tr->watch, c->name, c->size, ranks) != 0) {
            snprintf(err, errlen, "out of memory for the --comm-timeout group table");
            rc = -1;
        }
    }
    if (rc == 0 && setup_lostpeer(tr, who, hosts, HOSTLEN, err, errlen) != 0)
        rc = -1;
    free(ranks);
    free(hosts);
    return rc;
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
        if (!(tr->watch = watchdog_start(o->comm_timeout, who, err, errlen)) ||
            watch_names(tr, who, groups, ng, err, errlen) != 0)
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
    if (run->cp > 1) {
        tr->ltok = malloc(n / run->cp * sizeof *tr->ltok);
        tr->ltgt = malloc(n / run->cp * sizeof *tr->ltgt);
        tr->lpos = malloc(n / run->cp * sizeof *tr->lpos);
    }
    if (!tr->tok || !tr->tgt || (o->doc_mask && !tr->pos) || (run->cp > 1 && (!tr->ltok || !tr->ltgt || !tr->lpos))) {
        snprintf(err, errlen, "out of memory for the batch");
        return -1;
    }
    if (o->eval_mc[0] && mc_eval_open(&tr->mc, o->eval_mc, tr->cfg.vocab_size, run->seq_len, o->eval_mc_dump,
                                      tr->env->world_rank == 0, err, errlen) != 0)
        return -1;
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
        /* unbuffered: each record is appended whole by one write (metrics.h) */
        if (setvbuf(tr->metrics, NULL, _IONBF, 0) != 0) {
            snprintf(err, errlen, "--metrics %s: cannot make it unbuffered", o->metrics);
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
    tr->threads = ops_cpu_threads(trainer_default_threads(run->opt->threads, env));
    tr->cfg = run->model;
    tr->accum = run->accum;
    tr->pp_kind = run->pp_kind;
    tr->sched = run->sched;
    if (spike_init(&tr->spike, run->opt->spike_z, run->opt->spike_window, run->opt->spike_max, err, errlen) != 0)
        return -1;
    tr->spike.max_rollbacks = run->opt->spike_rollbacks;
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
