#include "src/ckpt/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/h5store.h"
#include "mpi/agree.h"
#include "src/ckpt/param_io.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#define LATEST "latest"

static int fsync_path(const char *path, int flags)
{
    int fd = open(path, flags);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    if (close(fd) != 0)
        rc = -1;
    return rc;
}

/* DIR/latest <- name, atomically (temporary file, fsync, rename, fsync DIR). */
static int write_latest(const char *dir, const char *name, char *err, size_t errlen)
{
    char tmp[4096], final[4096];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, LATEST);
    snprintf(final, sizeof final, "%s/%s", dir, LATEST);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    int bad = fprintf(f, "%s\n", name) < 0;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, final) != 0 || fsync_path(dir, O_RDONLY | O_DIRECTORY) != 0) {
        snprintf(err, errlen, "cannot update %s: %s", final, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Removes all but the newest `keep` step_*.h5 in dir (never `current`). */
static void prune(const char *dir, int keep, int current)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    int *steps = NULL, n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s;
        char tail;
        if (sscanf(e->d_name, "step_%d.h5%c", &s, &tail) != 1 || strlen(e->d_name) != 16)
            continue;
        if (n == cap) {
            int *p = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *p);
            if (!p)
                break;
            steps = p;
        }
        steps[n++] = s;
    }
    closedir(d);
    /* the keep newest: count those at or above each one */
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++)
            newer += steps[j] > steps[i];
        if (newer >= keep && steps[i] != current) {
            char path[4096];
            snprintf(path, sizeof path, "%s/step_%08d.h5", dir, steps[i]);
            unlink(path);
        }
    }
    free(steps);
}

void ckpt_remove_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s;
        char tail[8] = "";
        /* h5store_write's temporary of step_<s>.h5 is .step_<s>.h5.tmp */
        if (sscanf(e->d_name, ".step_%d.h5.%7s", &s, tail) == 2 && strcmp(tail, "tmp") == 0) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

/* attrs[*na] plus data_datasets and data_drawn_<i> (each dataset's samples
 * drawn, src/data/data.h) in new memory with room for `spare` more; *na
 * updated. The keys live in a block after the array, freed with it. */
static h5store_attr_t *data_attrs(const h5store_attr_t *attrs, int *na, const ckpt_meta_t *meta, int spare)
{
    const int n = meta->n_data, base = *na;
    const size_t key = 24;
    h5store_attr_t *all = malloc((size_t)(base + 1 + n + spare) * sizeof *all + (size_t)n * key);
    if (!all)
        return NULL;
    char *keys = (char *)(all + base + 1 + n + spare);
    memcpy(all, attrs, (size_t)base * sizeof *all);
    all[base] = (h5store_attr_t){.key = "data_datasets", .type = H5STORE_INT, .i = n};
    for (int i = 0; i < n; i++) {
        snprintf(keys + (size_t)i * key, key, "data_drawn_%d", i);
        all[base + 1 + i] =
            (h5store_attr_t){.key = keys + (size_t)i * key, .type = H5STORE_INT, .i = meta->data_drawn[i]};
    }
    *na = base + 1 + n;
    return all;
}

/* The data positions data_attrs wrote; none in a checkpoint of an older
 * dtrain (n_data 0). */
static int read_data_attrs(h5store_t *h, ckpt_meta_t *meta, char *err, size_t errlen)
{
    int64_t n = 0, v;
    if (!h5store_has_attr(h, "data_datasets"))
        return 0;
    if (h5store_get_int(h, "data_datasets", &n, err, errlen) != 0)
        return -1;
    if (n < 0 || n > CKPT_DATA_MAX) {
        snprintf(err, errlen, "checkpoint attribute data_datasets = %lld is out of range 0 .. %d", (long long)n,
                 CKPT_DATA_MAX);
        return -1;
    }
    for (int i = 0; i < (int)n; i++) {
        char key[24];
        snprintf(key, sizeof key, "data_drawn_%d", i);
        if (h5store_get_int(h, key, &v, err, errlen) != 0)
            return -1;
        meta->data_drawn[i] = v;
    }
    meta->n_data = (int)n;
    return 0;
}

int ckpt_save(comm_t *world, const char *dir, int keep, const model_config_t *cfg, const param_table_t *t,
              float *params, float *m, float *v, int writer, int tp_size, int tp_rank, const ckpt_meta_t *meta,
              char *path_out, size_t path_len, char *err, size_t errlen)
{
    char name[32];
    snprintf(name, sizeof name, "step_%08d.h5", meta->step);
    snprintf(path_out, path_len, "%s/%s", dir, name);
    h5store_attr_t attrs[PARAM_IO_MODEL_ATTRS + 23];
    int na = param_io_model_attrs(cfg, attrs);
    attrs[na++] = (h5store_attr_t){.key = "content", .type = H5STORE_STR, .s = "checkpoint"};
    attrs[na++] = (h5store_attr_t){.key = "format_version", .type = H5STORE_INT, .i = CKPT_FORMAT_VERSION};
    attrs[na++] = (h5store_attr_t){.key = "dtrain_version", .type = H5STORE_STR, .s = PACKAGE_VERSION};
    attrs[na++] = (h5store_attr_t){.key = "layout", .type = H5STORE_STR, .s = meta->layout};
    attrs[na++] = (h5store_attr_t){.key = "step", .type = H5STORE_INT, .i = meta->step};
    attrs[na++] = (h5store_attr_t){.key = "tokens", .type = H5STORE_INT, .i = meta->tokens};
    attrs[na++] = (h5store_attr_t){.key = "adam_t", .type = H5STORE_INT, .i = meta->adam_t};
    attrs[na++] = (h5store_attr_t){.key = "seed", .type = H5STORE_INT, .i = meta->seed};
    attrs[na++] = (h5store_attr_t){.key = "global_batch", .type = H5STORE_INT, .i = meta->global_batch};
    attrs[na++] = (h5store_attr_t){.key = "seq_len", .type = H5STORE_INT, .i = meta->seq_len};
    attrs[na++] = (h5store_attr_t){.key = "lr", .type = H5STORE_DOUBLE, .d = meta->lr};
    attrs[na++] = (h5store_attr_t){.key = "min_lr", .type = H5STORE_DOUBLE, .d = meta->min_lr};
    attrs[na++] = (h5store_attr_t){.key = "warmup", .type = H5STORE_INT, .i = meta->warmup};
    attrs[na++] = (h5store_attr_t){.key = "steps", .type = H5STORE_INT, .i = meta->steps};
    attrs[na++] = (h5store_attr_t){.key = "lr_schedule", .type = H5STORE_STR, .s = meta->lr_schedule};
    attrs[na++] = (h5store_attr_t){.key = "decay_steps", .type = H5STORE_INT, .i = meta->decay_steps};
    attrs[na++] = (h5store_attr_t){.key = "decay_shape", .type = H5STORE_STR, .s = meta->decay_shape};
    attrs[na++] = (h5store_attr_t){.key = "data_skip", .type = H5STORE_INT, .i = meta->data_skip};
    if (meta->spike_state[0])
        attrs[na++] = (h5store_attr_t){.key = "spike_state", .type = H5STORE_STR, .s = meta->spike_state};
    na += param_io_tokenizer_attrs(meta->tokenizer, meta->tokenizer_sha256, attrs + na);
    h5store_attr_t *all = data_attrs(attrs, &na, meta, cfg->n_layer);
    char *bias_text = NULL;
    const int nb = all ? param_io_moe_bias_attrs(cfg, meta->moe_bias, all + na, &bias_text) : -1;
    if (nb < 0) {
        free(all);
        snprintf(err, errlen, "out of memory for the checkpoint's attributes");
        return -1; /* every rank allocates the same: every rank fails */
    }
    na += nb;
    const param_io_group_t groups[3] = {{"params", params}, {"optim/m", m}, {"optim/v", v}};
    int wrc = param_io_write(world, path_out, cfg, t, groups, 3, writer, tp_size, tp_rank, all, na, err, errlen);
    free(all);
    free(bias_text);
    if (wrc != 0)
        return -1;
    /* the file is complete and durable: only now does `latest` move */
    int rc = 0;
    if (world->rank == 0) {
        rc = write_latest(dir, name, err, errlen);
        if (rc == 0 && keep > 0)
            prune(dir, keep, meta->step);
    }
    /* only rank 0 wrote `latest`: its verdict is everyone's */
    return agree(world, rc, err, errlen);
}

/* The newest step_NNNNNNNN.h5 in dir below step `below`, into path; 0 when
 * there is none. */
static int newest_below(const char *dir, int below, char *path, size_t path_len)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s;
        char tail;
        if (sscanf(e->d_name, "step_%d.h5%c", &s, &tail) == 1 && strlen(e->d_name) == 16 && s < below && s > best)
            best = s;
    }
    closedir(d);
    if (best < 0)
        return 0;
    snprintf(path, path_len, "%s/step_%08d.h5", dir, best);
    return 1;
}

int ckpt_older(comm_t *world, const char *dir, const char *newer, char *path, size_t path_len, char *err, size_t errlen)
{
    int found = 0, step;
    const char *base = strrchr(newer, '/');
    base = base ? base + 1 : newer;
    if (world->rank == 0)
        found = newest_below(dir, sscanf(base, "step_%d.h5", &step) == 1 ? step : 0, path, path_len);
    int32_t v = found;
    char cerr[COMM_ERR_MAX];
    if (world->ops->broadcast(world, &v, 1, COMM_INT32, 0, cerr, sizeof cerr) != STATUS_OK ||
        (v && world->ops->broadcast(world, path, path_len, COMM_BYTE, 0, cerr, sizeof cerr) != STATUS_OK)) {
        snprintf(err, errlen, "broadcasting the older checkpoint's path failed: %s", cerr);
        return -1;
    }
    return v;
}

int ckpt_resolve(comm_t *world, const char *resume, const char *dir, char *path, size_t path_len, char *err,
                 size_t errlen)
{
    path[0] = '\0';
    if (strcmp(resume, "auto") != 0) {
        /* the likeliest slip: the checkpoint directory itself */
        struct stat st;
        status_t rc = STATUS_OK;
        if (world->rank == 0 && stat(resume, &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(err, errlen,
                     "--resume %s is a directory: to continue from the newest checkpoint in it, use "
                     "--resume auto --ckpt-dir %s (or name one file, --resume %s/step_NNNNNNNN.h5)",
                     resume, resume, resume);
            rc = STATUS_INPUT;
        } else if (world->rank == 0 && stat(resume, &st) != 0) {
            snprintf(err, errlen,
                     "--resume %s: %s: name a checkpoint file that exists (DIR/step_NNNNNNNN.h5), or use "
                     "--resume auto --ckpt-dir DIR for the newest in DIR",
                     resume, strerror(errno));
            rc = STATUS_INPUT;
        }
        if (agree(world, rc, err, errlen) != 0)
            return -1;
        snprintf(path, path_len, "%s", resume);
        return 0;
    }
    int rc = 0;
    if (world->rank == 0) {
        char latest[4096], name[256] = "";
        snprintf(latest, sizeof latest, "%s/%s", dir, LATEST);
        FILE *f = fopen(latest, "r");
        if (f) {
            if (!fgets(name, sizeof name, f) || !strchr(name, '\n') || name[0] == '\n') {
                snprintf(err, errlen, "%s is damaged (no file name in it); name a checkpoint with --resume FILE",
                         latest);
                rc = -1;
            } else {
                name[strcspn(name, "\n")] = '\0';
                snprintf(path, path_len, "%s/%s", dir, name);
                struct stat st;
                if (stat(path, &st) != 0) {
                    snprintf(err, errlen, "%s names %s, which is missing: %s", latest, path, strerror(errno));
                    rc = -1;
                }
            }
            fclose(f);
        } else if (errno != ENOENT) {
            snprintf(err, errlen, "cannot read %s: %s", latest, strerror(errno));
            rc = -1;
        }
    }
    if (agree(world, rc, err, errlen) != 0)
        return -1;
    char cerr[COMM_ERR_MAX];
    if (world->ops->broadcast(world, path, path_len, COMM_BYTE, 0, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "broadcasting the checkpoint path failed: %s", cerr);
        return -1;
    }
    return 0;
}

/* Reads an int attribute into *v (range-checked to int). */
static int get_int(h5store_t *h, const char *key, int *v, char *err, size_t errlen)
{
    int64_t x;
    if (h5store_get_int(h, key, &x, err, errlen) != 0)
        return -1;
    *v = (int)x;
    return 0;
}

/* The schedule's kind and decay, written since they exist: older
 * checkpoints ran today's only schedule, cosine. */
static int optional_schedule(h5store_t *h, ckpt_meta_t *meta, char *err, size_t errlen)
{
    snprintf(meta->lr_schedule, sizeof meta->lr_schedule, "cosine");
    if (!h5store_has_attr(h, "lr_schedule"))
        return 0;
    return h5store_get_str(h, "lr_schedule", meta->lr_schedule, sizeof meta->lr_schedule, err, errlen) ||
                   get_int(h, "decay_steps", &meta->decay_steps, err, errlen) ||
                   h5store_get_str(h, "decay_shape", meta->decay_shape, sizeof meta->decay_shape, err, errlen)
               ? -1
               : 0;
}

int ckpt_load(comm_t *world, const char *path, const model_config_t *cfg, const param_table_t *t, float *params,
              float *m, float *v, ckpt_meta_t *meta, char *err, size_t errlen)
{
    h5store_t *h = h5store_open(path, MPI_COMM_WORLD, err, errlen);
    if (!h)
        return -1;
    char content[32] = "";
    int64_t version = 0, tokens = 0, seed = 0;
    float *moe_bias = meta->moe_bias;
    memset(meta, 0, sizeof *meta);
    meta->moe_bias = moe_bias;
    /* the attributes are the same on every rank, so every rank reaches the
     * same verdict without talking */
    int rc = h5store_get_str(h, "content", content, sizeof content, err, errlen);
    if (rc == 0 && strcmp(content, "checkpoint") != 0) {
        snprintf(err, errlen,
                 "%s holds %s only, no optimizer state: --resume needs a checkpoint written with "
                 "--ckpt-dir",
                 path, content);
        rc = -1;
    }
    if (rc == 0 && (rc = h5store_get_int(h, "format_version", &version, err, errlen)) == 0 &&
        version != CKPT_FORMAT_VERSION) {
        snprintf(err, errlen, "%s: unknown checkpoint format version %lld (this dtrain reads version %d)", path,
                 (long long)version, CKPT_FORMAT_VERSION);
        rc = -1;
    }
    if (rc == 0)
        rc = param_io_check_model(h, cfg, path, err, errlen);
    if (rc == 0 &&
        (get_int(h, "step", &meta->step, err, errlen) || h5store_get_int(h, "tokens", &tokens, err, errlen) ||
         get_int(h, "adam_t", &meta->adam_t, err, errlen) || h5store_get_int(h, "seed", &seed, err, errlen) ||
         get_int(h, "global_batch", &meta->global_batch, err, errlen) ||
         get_int(h, "seq_len", &meta->seq_len, err, errlen) || h5store_get_double(h, "lr", &meta->lr, err, errlen) ||
         h5store_get_double(h, "min_lr", &meta->min_lr, err, errlen) ||
         get_int(h, "warmup", &meta->warmup, err, errlen) || get_int(h, "steps", &meta->steps, err, errlen) ||
         h5store_get_str(h, "layout", meta->layout, sizeof meta->layout, err, errlen)))
        rc = -1;
    if (rc == 0)
        rc = read_data_attrs(h, meta, err, errlen);
    meta->tokens = tokens;
    meta->seed = seed;
    if (rc == 0 && (rc = optional_schedule(h, meta, err, errlen)) != 0)
        rc = -1;
    int64_t data_skip = 0;
    if (rc == 0 && h5store_has_attr(h, "data_skip") && h5store_get_int(h, "data_skip", &data_skip, err, errlen) != 0)
        rc = -1;
    meta->data_skip = data_skip;
    if (rc == 0 && h5store_has_attr(h, "spike_state") &&
        h5store_get_str(h, "spike_state", meta->spike_state, sizeof meta->spike_state, err, errlen) != 0)
        rc = -1;
    if (rc == 0 && moe_bias)
        rc = param_io_read_moe_bias(h, cfg, moe_bias, path, err, errlen);
    rc = agree(world, rc, err, errlen);
    /* each rank reads its own slices, checking the checksums they cover;
     * whatever no rank's slices covered is then checked too, so every byte
     * of the file is verified, and read once when the slices cover it */
    const param_io_group_t groups[3] = {{"params", params}, {"optim/m", m}, {"optim/v", v}};
    if (rc == 0)
        rc = param_io_read(world, h, cfg, t, groups, 3, err, errlen);
    char cerr[256];
    if (h5store_close(h, cerr, sizeof cerr) != 0 && rc == 0) {
        snprintf(err, errlen, "%s", cerr);
        rc = -1;
    }
    return rc;
}
