/* dreshard: rewrite a dtrain checkpoint or parameter file with the chunking
 * another parallel layout writes, export it as another framework's model,
 * or show what a file holds.
 *
 *   mpirun -np M dreshard --in A.h5 --out B.h5 --tp T --pp P --dp D [--params-only] [--force]
 *   mpirun -np M dreshard --in A.h5 --to-hf DIR [--dtype fp32|bf16|fp16] [--tokenizer auto|none|SPEC]
 *   mpirun -np M dreshard --in A.h5 --to-llmc FILE [--dtype fp32|bf16]
 *   mpirun -np M dreshard --info FILE
 *
 * The file holds logical tensors (doc/format.md), so resharding moves no
 * element: it changes each dataset's chunk shape to the target's TP slice
 * and the checksum records to one per slice, exactly what dtrain itself
 * writes at that layout. Any number of ranks M works: the target's slices
 * are dealt out to the ranks by size, each rank reads its slices from the
 * input (any layout wrote it) and writes them into the output through the
 * same collective, atomic h5store_write that dtrain's checkpoints use. The
 * exports (src/convert/export.h) deal out the target's tensors the same way.
 *
 * Exit status: 0; 2 when the command line or the input is wrong (unknown
 * option, missing, unreadable or damaged input, a target layout that does
 * not fit the model, an output that exists), as for dtrain, whose --resume
 * of a damaged checkpoint also exits 2; 1 when writing the output fails
 * (disk full, I/O error, out of memory). One line from rank 0 either way. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/fsutil.h"
#include "io/h5store.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "mpi/agree.h"
#include "mpi/clock.h"
#include "mpi/launch.h"
#include "src/ckpt/ckpt.h"
#include "src/ckpt/param_io.h"
#include "src/cli/optable.h"
#include "src/convert/deal.h"
#include "src/convert/export.h"
#include "src/train/options.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

#define PROG "dreshard"
#define ERRLEN 1024
#define MAX_TP 4096 /* the ranges dtrain's --tp, --pp and --dp accept */
#define MAX_PP 4096
#define MAX_DP (1 << 20)

typedef struct reshard_opts {
    const char *in, *out, *info;
    int tp, pp, dp, zero;
    int params_only, force;
    const char *to_hf, *to_llmc; /* an export instead of --out */
    export_dtype_t dtype;
    const char *tokenizer; /* --to-hf: auto | none | SPEC */
    uint64_t max_shard_bytes;
    int export_given;  /* --dtype, --tokenizer or --max-shard-size seen */
    int hf_only_given; /* --tokenizer or --max-shard-size seen */
    int layout_given;  /* --tp, --pp, --dp or --zero seen */
    int dtype_given;
} reshard_opts_t;

typedef enum { PARSE_OK = 0, PARSE_EXIT_OK, PARSE_ERROR } parse_status_t;

/* One target slice: written by one rank, so it is one checksum record. */
typedef struct tile {
    int tensor;
    int64_t start[2], count[2];
    int64_t bytes;
    int owner; /* rank */
} tile_t;

/* SIZE: bytes, optionally with a decimal (KB, MB, GB) or binary (KiB,
 * MiB, GiB) suffix, as Hugging Face's max_shard_size takes it. */
static int parse_bytes(const char *v, void *dst, void *field, char *err, size_t errlen)
{
    uint64_t *out = field;
    (void)dst;
    static const struct {
        const char *s;
        uint64_t m;
    } units[] = {{"", 1},       {"B", 1},         {"KB", 1000},       {"MB", 1000000}, {"GB", 1000000000},
                 {"KiB", 1024}, {"MiB", 1048576}, {"GiB", 1073741824}};
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!errno && end != v && v[0] != '-')
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strcmp(end, units[i].s) == 0 && x >= 1 && x <= UINT64_MAX / units[i].m) {
                *out = x * units[i].m;
                return 0;
            }
    snprintf(err, errlen,
             "--max-shard-size '%s': a positive number of bytes, optionally with KB, MB, GB, KiB, "
             "MiB or GiB (e.g. 5GB)",
             v);
    return -1;
}

/* The paths: never empty. */
static int path_arg(const char *name, const char *what, const char *v, void *field, char *err, size_t errlen)
{
    if (!*v) {
        snprintf(err, errlen, "option '--%s' needs a non-empty %s", name, what);
        return -1;
    }
    *(const char **)field = v;
    return 0;
}
#define PATH_ARG(fn, name, what)                                                                                       \
    static int fn(const char *v, void *dst, void *field, char *err, size_t errlen)                                     \
    {                                                                                                                  \
        (void)dst;                                                                                                     \
        return path_arg(name, what, v, field, err, errlen);                                                            \
    }
PATH_ARG(in_arg, "in", "FILE")
PATH_ARG(out_arg, "out", "FILE")
PATH_ARG(info_arg, "info", "FILE")
PATH_ARG(to_hf_arg, "to-hf", "DIR")
PATH_ARG(to_llmc_arg, "to-llmc", "FILE")

static int zero_arg(const char *v, void *dst, void *field, char *err, size_t errlen)
{
    if (strlen(v) != 1 || v[0] < '0' || v[0] > '3') {
        snprintf(err, errlen, "--zero '%s': the ZeRO stage is 0, 1, 2 or 3", v);
        return -1;
    }
    *(int *)field = v[0] - '0';
    ((reshard_opts_t *)dst)->layout_given = 1;
    return 0;
}

static int tokenizer_arg(const char *v, void *dst, void *field, char *err, size_t errlen)
{
    reshard_opts_t *o = dst;
    if (!*v) {
        snprintf(err, errlen, "--tokenizer needs auto, none or a tokenizer spec");
        return -1;
    }
    *(const char **)field = v;
    o->export_given = o->hf_only_given = 1;
    return 0;
}

static int shard_size_arg(const char *v, void *dst, void *field, char *err, size_t errlen)
{
    reshard_opts_t *o = dst;
    if (parse_bytes(v, dst, field, err, errlen) != 0)
        return -1;
    o->export_given = o->hf_only_given = 1;
    return 0;
}

#define F(field) offsetof(reshard_opts_t, field)
#define LAYOUT (F(layout_given) + 1)
/* clang-format off: one option a line, as --help lists them */
static const opt_def_t opt_defs[] = {
    {"in", OPT_ARG, F(in), 0, NULL, 0, 0, NULL, "the file to read (checkpoint or parameter file)", "FILE", in_arg, 0},
    {"out", OPT_ARG, F(out), 0, NULL, 0, 0, NULL, "the file to write (atomically); must not exist, and never the input",
     "FILE", out_arg, 0},
    {"tp", OPT_INT, F(tp), 0, "1", 1, MAX_TP, NULL,
     "target tensor-parallel size (default 1): must divide the heads, KV heads, FFN", "T", NULL, LAYOUT},
    {"pp", OPT_INT, F(pp), 0, "1", 1, MAX_PP, NULL, "target pipeline-parallel size (default 1): at most the layers",
     "P", NULL, LAYOUT},
    {"dp", OPT_INT, F(dp), 0, "1", 1, MAX_DP, NULL, "target data-parallel size (default 1)", "D", NULL, LAYOUT},
    {"zero", OPT_ARG, F(zero), 0, NULL, 0, 0, NULL,
     "target ZeRO stage 0-3 (default 0); recorded in the layout attribute: the\n"
     "moments are logical tensors, so every stage reads the same file",
     "S", zero_arg, 0},
    {"params-only", OPT_FLAG, F(params_only), 0, "0", 0, 1, NULL,
     "write only params/* as a parameter file (content = params)", NULL, NULL, 0},
    {"force", OPT_FLAG, F(force), 0, "0", 0, 1, NULL,
     "replace the output if it exists (the old one stays until the new one is complete)", NULL, NULL, 0},
    {"to-hf", OPT_ARG, F(to_hf), 0, NULL, 0, 0, NULL,
     "export the parameters as a Hugging Face model directory (safetensors shards,\n"
     "config.json, generation_config.json, tokenizer files), atomically",
     "DIR", to_hf_arg, 0},
    {"to-llmc", OPT_ARG, F(to_llmc), 0, NULL, 0, 0, NULL,
     "export a GPT-2 model as llm.c's model file (version 3 fp32, 5 bf16)", "FILE", to_llmc_arg, 0},
    {"dtype", OPT_ENUM, F(dtype), 0, "fp32", 0, 0, export_dtype_names,
     "exported tensors' type: fp32 (default, exact), bf16 or fp16 (--to-hf only);\nrounded to nearest even", "D", NULL,
     F(dtype_given) + 1},
    {"tokenizer", OPT_ARG, F(tokenizer), 0, NULL, 0, 0, NULL,
     "--to-hf: auto (default: the data tokenizer the input records), none, or a\n"
     "dtrain --tokenizer spec (gpt2, tiktoken and spm get Hugging Face files; hf its own tokenizer.json back)",
     "T", tokenizer_arg, 0},
    {"max-shard-size", OPT_ARG, F(max_shard_bytes), 0, NULL, 0, 0, NULL,
     "--to-hf: safetensors shard size, bytes with an optional KB, MB, GB,\n"
     "KiB, MiB or GiB (default 5GB, as Hugging Face's)",
     "SIZE", shard_size_arg, 0},
    {"info", OPT_ARG, F(info), 0, NULL, 0, 0, NULL,
     "print the attributes, every tensor with its shape and chunks, and verify\nevery checksum", "FILE", info_arg, 0},
};
/* clang-format on */
#undef LAYOUT
#undef F
static const opt_table_t opt_table = {.prog = PROG, .defs = opt_defs, .n = sizeof opt_defs / sizeof opt_defs[0]};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: mpirun -np M " PROG " --in FILE --out FILE [--tp T] [--pp P] [--dp D] [--zero S]\n"
            "       [--params-only] [--force]\n"
            "       mpirun -np M " PROG " --in FILE --to-hf DIR [--dtype fp32|bf16|fp16] [--tokenizer auto|none|SPEC]\n"
            "       [--max-shard-size SIZE] [--force]\n"
            "       mpirun -np M " PROG " --in FILE --to-llmc FILE [--dtype fp32|bf16] [--force]\n"
            "       mpirun -np M " PROG " --info FILE\n"
            "Rewrites a dtrain checkpoint or --save-params file with the chunking the target layout\n"
            "(tensor x pipeline x data parallel) writes, verifying every checksum of the input and\n"
            "writing fresh ones; the tensors are copied bit for bit. Or exports its parameters as a\n"
            "Hugging Face model or an llm.c model file. Any number of ranks M.\n"
            "\n");
    opt_print_help(&opt_table, f, 15, 0);
    fprintf(f, "\n"
               "Exit status: 0; 2 for a bad command line or input (including a damaged input file);\n"
               "1 when writing the output fails. See dreshard(1).\n");
}

/* The combinations: --info alone; --to-hf or --to-llmc with --in and the
 * export options; else --in and --out with the layout options. */
static int check_combination(const reshard_opts_t *o, int layout_given, char *err, size_t errlen)
{
    const int exporting = o->to_hf || o->to_llmc;
    if (o->info) {
        if (o->in || o->out || exporting || layout_given || o->params_only || o->force || o->export_given) {
            snprintf(err, errlen,
                     "--info FILE only prints a file: give it alone, without --in, --out, --tp, "
                     "--pp, --dp, --zero, --params-only or --force");
            return -1;
        }
        return 0;
    }
    if (o->to_hf && o->to_llmc) {
        snprintf(err, errlen, "--to-hf and --to-llmc: give one export per command");
        return -1;
    }
    if (exporting && (o->out || layout_given || o->params_only)) {
        snprintf(err, errlen,
                 "%s exports the parameters alone, at no layout: leave out --out, --tp, --pp, --dp, "
                 "--zero and --params-only",
                 o->to_hf ? "--to-hf" : "--to-llmc");
        return -1;
    }
    if (!exporting && o->export_given) {
        snprintf(err, errlen, "--dtype, --tokenizer and --max-shard-size belong to --to-hf / --to-llmc");
        return -1;
    }
    if (o->to_llmc && o->hf_only_given) {
        snprintf(err, errlen,
                 "--to-llmc: llm.c model files hold one tensor file and no tokenizer: leave out "
                 "--tokenizer and --max-shard-size");
        return -1;
    }
    if (!o->in || (!exporting && !o->out)) {
        snprintf(err, errlen,
                 "%s: give --in FILE and --out FILE, --to-hf DIR or --to-llmc FILE (or --info FILE; "
                 "see " PROG " --help)",
                 !o->in && !o->out && !exporting ? "nothing to do"
                 : !o->in                        ? "no --in FILE"
                                                 : "no --out FILE");
        return -1;
    }
    return 0;
}

/* Every rank parses the same arguments, so all reach the same verdict. */
static parse_status_t parse_args(int argc, char **argv, reshard_opts_t *o, int print, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->tokenizer = "auto";
    o->max_shard_bytes = ST_DEFAULT_SHARD_BYTES;
    if (opt_answer_help(argc, argv, print, usage, PROG " (dtrain) " PACKAGE_VERSION))
        return PARSE_EXIT_OK;
    if (opt_defaults(&opt_table, o, err, errlen) != 0 ||
        opt_parse_argv(&opt_table, argc, argv, o, NULL, NULL, NULL, err, errlen) != 0)
        return PARSE_ERROR;
    o->export_given |= o->dtype_given;
    if (o->to_llmc && o->dtype == EXPORT_F16) {
        snprintf(err, errlen, "--dtype fp16: llm.c model files are fp32 (version 3) or bf16 (version 5)");
        return PARSE_ERROR;
    }
    return check_combination(o, o->layout_given, err, errlen) == 0 ? PARSE_OK : PARSE_ERROR;
}

/* Rank 0's checks of the two paths, before any file is opened: the input
 * is a readable file; the output is not the input, does not exist (unless
 * --force) and its directory, made as mkdir -p does when missing, takes
 * new files. */
static int check_input(const char *in, struct stat *in_st, char *err, size_t errlen)
{
    if (stat(in, in_st) != 0 || access(in, R_OK) != 0) {
        snprintf(err, errlen, "--in %s: %s", in, strerror(errno));
        return -1;
    }
    if (S_ISDIR(in_st->st_mode)) {
        snprintf(err, errlen, "--in %s is a directory: name a checkpoint or parameter file (%s/step_NNNNNNNN.h5)", in,
                 in);
        return -1;
    }
    if (!S_ISREG(in_st->st_mode)) {
        snprintf(err, errlen, "--in %s: not a regular file", in);
        return -1;
    }
    return 0;
}

static int check_paths(const reshard_opts_t *o, char *err, size_t errlen)
{
    struct stat in_st, out_st;
    if (check_input(o->in, &in_st, err, errlen) != 0)
        return -1;
    if (stat(o->out, &out_st) == 0) {
        if (out_st.st_dev == in_st.st_dev && out_st.st_ino == in_st.st_ino) {
            snprintf(err, errlen,
                     "--out %s is the input file: write to another path (" PROG " never rewrites "
                     "its input in place)",
                     o->out);
            return -1;
        }
        if (S_ISDIR(out_st.st_mode)) {
            snprintf(err, errlen, "--out %s is a directory: name the file to write", o->out);
            return -1;
        }
        if (!o->force) {
            snprintf(err, errlen,
                     "--out %s exists: remove it, choose another path, or pass --force to replace "
                     "it",
                     o->out);
            return -1;
        }
    } else if (errno != ENOENT) {
        snprintf(err, errlen, "--out %s: %s", o->out, strerror(errno));
        return -1;
    }
    char dir[PATH_MAX];
    if (fs_mkdir_parent(o->out, dir, sizeof dir) != 0) { /* mkdir -p of the missing directories */
        snprintf(err, errlen, "--out %s: cannot create directory %.512s: %s", o->out, dir, strerror(errno));
        return -1;
    }
    if (fs_probe_parent(o->out, dir, sizeof dir) != 0) {
        snprintf(err, errlen, "--out %s: cannot write into directory %.512s: %s", o->out, dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* The tensor groups a file of this content holds. */
static int content_groups(h5store_t *h, const char *path, param_io_group_t *groups, int *n_groups, char *content,
                          size_t content_len, char *err, size_t errlen)
{
    if (h5store_get_str(h, "content", content, content_len, err, errlen) != 0)
        return -1;
    groups[0] = (param_io_group_t){"params", NULL};
    groups[1] = (param_io_group_t){"optim/m", NULL};
    groups[2] = (param_io_group_t){"optim/v", NULL};
    if (strcmp(content, "params") == 0) {
        *n_groups = 1;
        return 0;
    }
    if (strcmp(content, "checkpoint") != 0) {
        snprintf(err, errlen,
                 "%s holds content '%s': " PROG " reads dtrain checkpoints and parameter files "
                 "(content checkpoint or params)",
                 path, content);
        return -1;
    }
    int64_t version = 0;
    if (h5store_get_int(h, "format_version", &version, err, errlen) != 0)
        return -1;
    if (version != CKPT_FORMAT_VERSION) {
        snprintf(err, errlen, "%s: unknown checkpoint format version %lld (this " PROG " reads version %d)", path,
                 (long long)version, CKPT_FORMAT_VERSION);
        return -1;
    }
    *n_groups = 3;
    return 0;
}

/* The file's catalog is exactly the model's tensors, in their shapes:
 * nothing missing, and nothing the output would silently drop. */
static int check_catalog(h5store_t *h, const char *path, const h5store_tensor_t *want, int n_want, const char *content,
                         char *err, size_t errlen)
{
    for (int i = 0; i < n_want; i++) {
        const h5store_tensor_t *got = h5store_find(h, want[i].name);
        if (!got) {
            snprintf(err, errlen, "tensor %s: not in %s", want[i].name, path);
            return -1;
        }
        if (got->ndim != want[i].ndim || got->shape[0] != want[i].shape[0] || got->shape[1] != want[i].shape[1]) {
            snprintf(err, errlen,
                     "tensor %s: shape [%" PRId64 ",%" PRId64 "] in %s, the model's is [%" PRId64 ",%" PRId64 "]",
                     want[i].name, got->shape[0], got->shape[1], path, want[i].shape[0], want[i].shape[1]);
            return -1;
        }
    }
    const h5store_tensor_t *all;
    int n = h5store_list(h, &all);
    if (n != n_want) {
        for (int i = 0; i < n; i++) {
            int known = 0;
            for (int j = 0; j < n_want && !known; j++)
                known = strcmp(all[i].name, want[j].name) == 0;
            if (!known) {
                snprintf(err, errlen,
                         "%s: tensor %s is not part of the model's %s file, and " PROG
                         " would drop it: remove it or copy it separately",
                         path, all[i].name, content);
                return -1;
            }
        }
    }
    return 0;
}

/* What the open input holds: its content and groups, its model, and its
 * tensors (every group's, as param_io_tensors lists them), checked to be
 * exactly the model's. The attributes and catalog are the same on every
 * rank, so every rank reaches the same verdict (the caller agrees anyway,
 * for the message). */
static int read_input(h5store_t *h, const char *path, model_config_t *cfg, param_io_group_t *groups, int *n_groups,
                      char *content, size_t content_len, h5store_tensor_t **t, int *nt, char *err, size_t errlen)
{
    if (content_groups(h, path, groups, n_groups, content, content_len, err, errlen) != 0 ||
        param_io_read_model(h, cfg, path, err, errlen) != 0 ||
        param_io_tensors(cfg, groups, *n_groups, 1, t, nt, err, errlen) != 0)
        return -1;
    return check_catalog(h, path, *t, *nt, content, err, errlen);
}

/* The target's slices of every tensor (chunk-shaped tiles, the last one
 * clipped: what dtrain writes at that layout), dealt out largest first to
 * the least loaded rank. The same plan on every rank. */
static int plan_tiles(const h5store_tensor_t *t, int nt, int nranks, tile_t **out, int *n_out, char *err, size_t errlen)
{
    int n = 0, cap = 0;
    tile_t *tiles = NULL;
    for (int i = 0; i < nt; i++) {
        const int64_t c0 = t[i].chunk[0] > 0 ? t[i].chunk[0] : t[i].shape[0];
        const int64_t c1 = t[i].chunk[1] > 0 ? t[i].chunk[1] : t[i].shape[1];
        for (int64_t r = 0; r < t[i].shape[0]; r += c0)
            for (int64_t c = 0; c < t[i].shape[1]; c += c1) {
                if (n == cap) {
                    cap = cap ? 2 * cap : 256;
                    tile_t *p = realloc(tiles, (size_t)cap * sizeof *p);
                    if (!p) {
                        free(tiles);
                        snprintf(err, errlen, "out of memory for the plan");
                        return -1;
                    }
                    tiles = p;
                }
                tile_t *x = &tiles[n++];
                x->tensor = i;
                x->start[0] = r;
                x->start[1] = c;
                x->count[0] = t[i].shape[0] - r < c0 ? t[i].shape[0] - r : c0;
                x->count[1] = t[i].shape[1] - c < c1 ? t[i].shape[1] - c : c1;
                x->bytes = x->count[0] * x->count[1] * (int64_t)sizeof(float);
            }
    }
    int64_t *bytes = malloc((size_t)(n > 0 ? n : 1) * sizeof *bytes);
    int *owner = malloc((size_t)(n > 0 ? n : 1) * sizeof *owner);
    for (int i = 0; bytes && i < n; i++)
        bytes[i] = tiles[i].bytes;
    const int rc = bytes && owner ? deal_by_size(bytes, n, nranks, owner) : -1;
    for (int i = 0; rc == 0 && i < n; i++)
        tiles[i].owner = owner[i];
    free(bytes);
    free(owner);
    if (rc != 0) {
        free(tiles);
        snprintf(err, errlen, "out of memory for the plan");
        return -1;
    }
    *out = tiles;
    *n_out = n;
    return 0;
}

static double mib(int64_t bytes) { return (double)bytes / 1048576.0; }

/* The target file: its tensors and attributes, the plan's slices and this
 * rank's share of them, packed into buf. */
typedef struct out_plan {
    h5store_tensor_t *t;
    int nt;
    h5store_attr_t *attrs; /* its strings are the input's or the caller's layout */
    int na;
    tile_t *tiles;
    int ntiles;
    h5store_shard_t *shards; /* this rank's */
    int ns;
    float *buf;
} out_plan_t;

static void out_plan_free(out_plan_t *p)
{
    free(p->buf);
    free(p->shards);
    free(p->tiles);
    free(p->attrs);
    free(p->t);
}

/* The target's attributes: the input's, with the new layout (added when the
 * input has none) and, with --params-only, content "params". */
static int out_attrs(const h5store_attr_t *attrs, int na, int params_only, const char *layout, out_plan_t *p, char *err,
                     size_t errlen)
{
    if (!(p->attrs = calloc((size_t)na + 2, sizeof *p->attrs))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n = 0, has_layout = 0;
    for (int i = 0; i < na; i++) {
        p->attrs[n] = attrs[i];
        if (strcmp(attrs[i].key, "layout") == 0) {
            p->attrs[n] = (h5store_attr_t){.key = "layout", .type = H5STORE_STR, .s = layout};
            has_layout = 1;
        } else if (params_only && strcmp(attrs[i].key, "content") == 0) {
            p->attrs[n] = (h5store_attr_t){.key = "content", .type = H5STORE_STR, .s = "params"};
        }
        n++;
    }
    if (!has_layout)
        p->attrs[n++] = (h5store_attr_t){.key = "layout", .type = H5STORE_STR, .s = layout};
    p->na = n;
    return 0;
}

/* This rank's slices of the plan, in plan order, one after another in buf. */
static int my_slices(int rank, out_plan_t *p, char *err, size_t errlen)
{
    int64_t my_bytes = 0;
    for (int i = 0; i < p->ntiles; i++)
        if (p->tiles[i].owner == rank) {
            p->ns++;
            my_bytes += p->tiles[i].bytes;
        }
    p->shards = calloc((size_t)p->ns + 1, sizeof *p->shards);
    p->buf = malloc((size_t)my_bytes + 1);
    if (!p->shards || !p->buf) {
        snprintf(err, errlen, "rank %d: out of memory for its %.1f MiB of slices (run on more ranks)", rank,
                 mib(my_bytes));
        return -1;
    }
    int k = 0;
    float *b = p->buf;
    for (int i = 0; i < p->ntiles; i++) {
        const tile_t *t = &p->tiles[i];
        if (t->owner != rank)
            continue;
        p->shards[k++] = (h5store_shard_t){
            .tensor = t->tensor, .start = {t->start[0], t->start[1]}, .count = {t->count[0], t->count[1]}, .buf = b};
        b += t->count[0] * t->count[1];
    }
    return 0;
}

/* The output: the target's tensors, chunks, attributes and slices. Local to
 * this rank; the caller agrees on the result. */
static int plan_output(const reshard_opts_t *o, const comm_t *world, const model_config_t *cfg,
                       const param_io_group_t *groups, int n_groups, const h5store_attr_t *attrs, int na,
                       const char *layout, out_plan_t *p, char *err, size_t errlen)
{
    const int out_groups = o->params_only ? 1 : n_groups;
    int rc = param_io_tensors(cfg, groups, out_groups, o->tp, &p->t, &p->nt, err, errlen);
    if (rc == 0)
        rc = out_attrs(attrs, na, o->params_only, layout, p, err, errlen);
    if (rc == 0)
        rc = plan_tiles(p->t, p->nt, world->size, &p->tiles, &p->ntiles, err, errlen);
    if (rc == 0)
        rc = my_slices(world->rank, p, err, errlen);
    return rc;
}

/* Rank 0's one-line summary of a finished resharding. */
static void print_summary(const reshard_opts_t *o, const char *content, int nt_in, int64_t in_shards, int64_t in_bytes,
                          const char *layout, const out_plan_t *p, int nranks,
                          const double t[4] /* verify, read, write, start */)
{
    int64_t out_bytes = 0;
    for (int i = 0; i < p->ntiles; i++)
        out_bytes += p->tiles[i].bytes;
    printf(PROG ": %s (%s, %d tensors, %" PRId64 " shards, %.1f MiB verified in %.2f s) -> %s (%s, %d "
                "tensors, %d slices, %.1f MiB) on %d rank%s: read %.2f s, write %.2f s, total %.2f s\n",
           o->in, content, nt_in, in_shards, mib(in_bytes), t[0], o->out, layout, p->nt, p->ntiles, mib(out_bytes),
           nranks, nranks == 1 ? "" : "s", t[1], t[2], now_s() - t[3]);
}

/* The resharding: every step agreed on by all ranks. A failure is
 * STATUS_INPUT while it is the input's or the command line's (reading,
 * verifying), STATUS_FAIL once it is the machine's (writing). */
static status_t reshard(const reshard_opts_t *o, comm_t *world, char *err, size_t errlen)
{
    char content[64] = "", layout[64];
    model_config_t cfg;
    param_io_group_t groups[3];
    int n_groups = 0, nt_in = 0, na = 0;
    h5store_tensor_t *t_in = NULL;
    h5store_attr_t *attrs = NULL;
    out_plan_t out = {0};
    int64_t in_shards = 0, in_bytes = 0;
    double t[4] = {0, 0, 0, now_s()}; /* verify, read, write, start */
    status_t fail_as = STATUS_INPUT;

    int rc = world->rank == 0 ? check_paths(o, err, errlen) : 0;
    if (agree(world, rc, err, errlen) != 0)
        return STATUS_INPUT;
    h5store_t *h = h5store_open(o->in, MPI_COMM_WORLD, err, errlen);
    if (!h)
        return STATUS_INPUT;
    rc = read_input(h, o->in, &cfg, groups, &n_groups, content, sizeof content, &t_in, &nt_in, err, errlen);
    if (rc == 0)
        rc = options_check_grid(&cfg, o->tp, o->pp, err, errlen);
    if (rc == 0)
        rc = h5store_get_attrs(h, &attrs, &na, err, errlen);
    rc = agree(world, rc, err, errlen);
    double t1 = now_s();
    if (rc == 0)
        rc = h5store_verify(h, &in_shards, &in_bytes, err, errlen);
    t[0] = now_s() - t1;

    snprintf(layout, sizeof layout, "tp %d pp %d dp %d zero %d", o->tp, o->pp, o->dp, o->zero);
    if (rc == 0) {
        fail_as = STATUS_FAIL; /* from here on, failures are the machine's, not the input's */
        rc = plan_output(o, world, &cfg, groups, n_groups, attrs, na, layout, &out, err, errlen);
        rc = agree(world, rc, err, errlen);
        if (rc == 0) {
            /* a read error here is the input's again */
            t1 = now_s();
            rc = h5store_read_shards(h, out.t, out.nt, out.shards, out.ns, err, errlen);
            t[1] = now_s() - t1;
            if (rc != 0)
                fail_as = STATUS_INPUT;
        }
    }
    char cerr[ERRLEN];
    if (h5store_close(h, cerr, sizeof cerr) != 0 && rc == 0) {
        snprintf(err, errlen, "%s", cerr);
        rc = -1;
    }
    if (rc == 0) {
        t1 = now_s();
        rc = h5store_write(o->out, MPI_COMM_WORLD, out.t, out.nt, out.shards, out.ns, out.attrs, out.na, err, errlen);
        t[2] = now_s() - t1;
    }
    if (rc == 0 && world->rank == 0)
        print_summary(o, content, nt_in, in_shards, in_bytes, layout, &out, world->size, t);
    out_plan_free(&out); /* before attrs: its strings are attrs' or on the stack */
    h5store_free_attrs(attrs, na);
    free(t_in);
    return rc == 0 ? STATUS_OK : fail_as;
}

/* A string attribute, or "" when the file has none. */
static int optional_str(h5store_t *h, const char *key, char *out, size_t len, char *err, size_t errlen)
{
    out[0] = '\0';
    return h5store_has_attr(h, key) ? h5store_get_str(h, key, out, len, err, errlen) : 0;
}

/* --to-hf / --to-llmc: the input checked as for resharding, then
 * export_run. STATUS_INPUT for the input and the command line, else
 * export_run's status (or STATUS_FAIL when closing the input fails after
 * a complete export). */
static status_t export_cmd(const reshard_opts_t *o, comm_t *world, char *err, size_t errlen)
{
    const int rank = world->rank, nranks = world->size;
    char content[64] = "", tok[TOK_PATH_MAX], tok_sha[80];
    model_config_t cfg;
    param_io_group_t groups[3];
    int n_groups = 0, n_all = 0, n_params = 0;
    h5store_tensor_t *t_all = NULL, *t_params = NULL;
    struct stat st;
    status_t fail_as = STATUS_INPUT;
    int rc = rank == 0 ? check_input(o->in, &st, err, errlen) : 0;
    if (agree(world, rc, err, errlen) != 0)
        return STATUS_INPUT;
    h5store_t *h = h5store_open(o->in, MPI_COMM_WORLD, err, errlen);
    if (!h)
        return STATUS_INPUT;
    rc = read_input(h, o->in, &cfg, groups, &n_groups, content, sizeof content, &t_all, &n_all, err, errlen);
    if (rc == 0)
        rc = param_io_tensors(&cfg, groups, 1, 1, &t_params, &n_params, err, errlen);
    if (rc == 0)
        rc = optional_str(h, "tokenizer", tok, sizeof tok, err, errlen);
    if (rc == 0)
        rc = optional_str(h, "tokenizer_sha256", tok_sha, sizeof tok_sha, err, errlen);
    rc = agree(world, rc, err, errlen);
    export_report_t rep;
    const export_target_t *tg = o->to_hf ? &export_target_hf : &export_target_llmc;
    char dest[PATH_MAX]; /* "out/" names out: no directory is made for a trailing slash */
    size_t n = (size_t)snprintf(dest, sizeof dest, "%s", o->to_hf ? o->to_hf : o->to_llmc);
    while (n > 1 && n < sizeof dest && dest[n - 1] == '/')
        dest[--n] = '\0';
    if (n >= sizeof dest && rc == 0) {
        snprintf(err, errlen, "%s: the path is longer than PATH_MAX (%d)", o->to_hf ? "--to-hf" : "--to-llmc",
                 PATH_MAX);
        rc = -1;
    }
    /* a test-only knob (test_init_from.sh): small models cut into many tiles */
    const char *tile_env = getenv("DTRAIN_TEST_EXPORT_TILE_BYTES");
    const export_opts_t eo = {.input = o->in,
                              .dest = dest,
                              .dtype = o->dtype,
                              .force = o->force,
                              .tile_bytes = tile_env ? strtoll(tile_env, NULL, 10) : 0,
                              .tokenizer = o->tokenizer,
                              .tok_recorded = tok,
                              .tok_sha256 = tok_sha,
                              .max_shard_bytes = o->max_shard_bytes};
    if (rc == 0) {
        rc = export_run(world, tg, &eo, h, &cfg, t_params, n_params, &rep, err, errlen);
        fail_as = rc != 0 ? status_of(rc) : STATUS_FAIL;
    }
    char cerr[ERRLEN];
    if (h5store_close(h, cerr, sizeof cerr) != 0 && rc == 0) {
        snprintf(err, errlen, "%s", cerr);
        rc = -1;
    }
    if (rc == 0 && rank == 0) {
        int64_t elems = 0;
        for (int i = 0; i < n_params; i++)
            elems += t_params[i].shape[0] * t_params[i].shape[1];
        printf(PROG ": %s (%s, %s, %d tensors, %.1f MiB fp32, every parameter checksum verified) -> %s (%s, %s, %d "
                    "tensors in %d "
                    "tiles) on %d rank%s: read %.2f s, write %.2f s, total %.2f s\n",
               o->in, content, model_arch_name(cfg.arch), n_params, mib(elems * (int64_t)sizeof(float)), eo.dest,
               tg->name, export_dtype_name(o->dtype), rep.n_out, rep.n_tiles, nranks, nranks == 1 ? "" : "s",
               rep.t_read, rep.t_write, rep.t_total);
        if (rep.note[0])
            printf(PROG ": %s\n", rep.note);
    }
    free(t_all);
    free(t_params);
    return rc == 0 ? STATUS_OK : fail_as;
}

/* --info: the attributes, the tensors and the checksum verdict. */
static int info(const char *path, comm_t *world, char *err, size_t errlen)
{
    const int rank = world->rank;
    struct stat st;
    int rc = 0;
    if (rank == 0 && stat(path, &st) != 0) {
        snprintf(err, errlen, "--info %s: %s", path, strerror(errno));
        rc = -1;
    }
    if (agree(world, rc, err, errlen) != 0)
        return -1;
    h5store_t *h = h5store_open(path, MPI_COMM_WORLD, err, errlen);
    if (!h)
        return -1;
    h5store_attr_t *attrs = NULL;
    int na = 0;
    rc = agree(world, h5store_get_attrs(h, &attrs, &na, err, errlen), err, errlen);
    if (rc == 0 && rank == 0) {
        const h5store_tensor_t *t;
        int nt = h5store_list(h, &t);
        printf("file: %s\nattributes: %d\n", path, na);
        for (int i = 0; i < na; i++) {
            if (attrs[i].type == H5STORE_INT)
                printf("  %s = %" PRId64 "\n", attrs[i].key, attrs[i].i);
            else if (attrs[i].type == H5STORE_DOUBLE)
                printf("  %s = %g\n", attrs[i].key, attrs[i].d);
            else
                printf("  %s = %s\n", attrs[i].key, attrs[i].s);
        }
        int64_t elems = 0;
        printf("tensors: %d\n", nt);
        for (int i = 0; i < nt; i++) {
            elems += t[i].shape[0] * t[i].shape[1];
            char shape[48], chunk[64];
            if (t[i].ndim == 1)
                snprintf(shape, sizeof shape, "[%" PRId64 "]", t[i].shape[0]);
            else
                snprintf(shape, sizeof shape, "[%" PRId64 ", %" PRId64 "]", t[i].shape[0], t[i].shape[1]);
            if (t[i].chunk[0] <= 0) {
                snprintf(chunk, sizeof chunk, "contiguous");
            } else {
                const int64_t c1 = t[i].ndim == 2 ? t[i].chunk[1] : 1;
                const int64_t n =
                    ((t[i].shape[0] + t[i].chunk[0] - 1) / t[i].chunk[0]) * ((t[i].shape[1] + c1 - 1) / c1);
                snprintf(chunk, sizeof chunk, "%" PRId64 " chunk%s", n, n == 1 ? "" : "s");
            }
            printf("  %-32s %-14s %s\n", t[i].name, shape, chunk);
        }
        printf("elements: %" PRId64 " (%.1f MiB)\n", elems, mib(elems * (int64_t)sizeof(float)));
        fflush(stdout);
    }
    int64_t shards = 0, bytes = 0;
    if (rc == 0)
        rc = h5store_verify(h, &shards, &bytes, err, errlen);
    if (rc == 0 && rank == 0)
        printf("checksums: verified: %" PRId64 " shards, %.1f MiB\n", shards, mib(bytes));
    char cerr[ERRLEN];
    if (h5store_close(h, cerr, sizeof cerr) != 0 && rc == 0) {
        snprintf(err, errlen, "%s", cerr);
        rc = -1;
    }
    h5store_free_attrs(attrs, na);
    return rc;
}

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    reshard_opts_t o;
    char err[ERRLEN] = "";
    parse_status_t st = parse_args(argc, argv, &o, env.world_rank == 0, err, sizeof err);
    if (st == PARSE_EXIT_OK)
        launch_exit(&env, 0);
    if (st == PARSE_ERROR) {
        if (env.world_rank == 0)
            fprintf(stderr, PROG ": error: %s\n", err);
        launch_exit(&env, 2);
    }
    status_t st_run;
    if (o.info) /* --info reads only: any failure is the input's */
        st_run = info(o.info, env.world, err, sizeof err) != 0 ? STATUS_INPUT : STATUS_OK;
    else if (o.to_hf || o.to_llmc)
        st_run = export_cmd(&o, env.world, err, sizeof err);
    else
        st_run = reshard(&o, env.world, err, sizeof err);
    /* the lowest failing rank's status: every rank exits alike */
    launch_exit(&env, status_exit_code(launch_any_failed(&env, PROG, st_run, err)));
    return 0;
}
