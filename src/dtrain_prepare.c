/* dtrain-prepare: text corpora -> token files (llm.c shards or a Megatron
 * indexed dataset) with a tokenizer sidecar, on any number of MPI ranks.
 * See prepare.h for the layout of the work and doc/data.md for the files.
 *
 * Runs as a singleton without a launcher (a build step, a login node) or
 * under mpirun/srun; the output is byte-identical at any rank count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/prepare/prepare.h"

#include "io/fsutil.h"
#include "mpi/clock.h"
#include "src/cli/optable.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

/* Usage errors: one line on stderr from rank 0, exit 2 on every rank
 * (every rank parses the same arguments, so all of them get here). */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3), noreturn))
#endif
static void
die_usage(int rank, const char *fmt, ...)
{
    if (rank == 0) {
        char msg[PREP_ERRLEN + 256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        /* the option table's errors name --help already */
        fprintf(stderr, PREP_PROG ": %s%s\n", msg, strstr(msg, "--help") ? "" : " (see " PREP_PROG " --help)");
    }
    MPI_Finalize();
    exit(PREP_EXIT_USAGE);
}

#if defined(__GNUC__)
__attribute__((noreturn))
#endif
static void
finish_exit(int status)
{
    fflush(stdout);
    fflush(stderr);
    MPI_Finalize();
    exit(status);
}

const char *const prep_format_names[] = {[PREP_FORMAT_LLMC] = "llmc", [PREP_FORMAT_MEGATRON] = "megatron", NULL};

/* The options that shape a corpus's token files, which --eval-mc refuses
 * (given[i] is set when corpus_only[i] is on the command line). */
static const char *const corpus_only[] = {"eos",    "input-format", "jsonl-field",  "doc-separator",
                                          "format", "val-fraction", "shard-tokens", "round-docs"};
#define N_CORPUS_ONLY (int)(sizeof corpus_only / sizeof *corpus_only)

/* What the table fills: the options, and the two that are resolved once
 * the inputs are known. */
typedef struct prep_args {
    prep_opts_t o;
    const char *input_format, *sep;
    int given[N_CORPUS_ONLY];
} prep_args_t;

static int fraction_arg(const char *s, void *dst, void *field, char *err, size_t errlen)
{
    char *end;
    (void)dst;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0.0 || v >= 1.0) {
        snprintf(err, errlen, "--val-fraction '%s' is not allowed: give a number F with 0 <= F < 1", s);
        return -1;
    }
    *(double *)field = v;
    return 0;
}

/* A count from 1 to INT32_MAX (the llm.c header stores it as an int32). */
static int count_arg(const char *name, const char *s, size_t *out, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    unsigned long long v = *s == '-' || *s == '+' || *s == '\0' ? 0 : strtoull(s, &end, 10);
    if (v == 0 || errno != 0 || *end != '\0' || v > (unsigned long long)INT32_MAX) {
        snprintf(err, errlen, "--%s '%s' is not allowed: give an integer from 1 to %d", name, s, (int)INT32_MAX);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static int shard_arg(const char *s, void *dst, void *field, char *err, size_t errlen)
{
    (void)dst;
    return count_arg("shard-tokens", s, field, err, errlen);
}

static int round_arg(const char *s, void *dst, void *field, char *err, size_t errlen)
{
    (void)dst;
    return count_arg("round-docs", s, field, err, errlen);
}

static int out_arg(const char *s, void *dst, void *field, char *err, size_t errlen)
{
    (void)dst;
    if (!*s) {
        snprintf(err, errlen, "--out needs a non-empty PREFIX");
        return -1;
    }
    *(const char **)field = s;
    return 0;
}

static int field_arg(const char *s, void *dst, void *field, char *err, size_t errlen)
{
    (void)dst;
    if (!*s) {
        snprintf(err, errlen, "--jsonl-field needs a field name");
        return -1;
    }
    *(const char **)field = s;
    return 0;
}

static int eval_mc_arg(const char *s, void *dst, void *field, char *err, size_t errlen)
{
    (void)dst;
    if (!*s) {
        snprintf(err, errlen, "--eval-mc needs the JSONL FILE of examples");
        return -1;
    }
    *(const char **)field = s;
    return 0;
}

static const char *const input_format_names[] = {"auto", "text", "jsonl", NULL};

#define F(field) offsetof(prep_args_t, field)
#define GIVEN(i) (offsetof(prep_args_t, given) + (i) * sizeof(int) + 1)
/* clang-format off: one option a line, as --help lists them */
static const opt_def_t opt_defs[] = {
    {"out", OPT_ARG, F(o.out), 0, NULL, 0, 0, NULL,
     "output path prefix (missing directories are made);\n"
     "with --eval-mc, the file to write",
     "PREFIX", out_arg, 0},
    {"tokenizer", OPT_STR, F(o.tokenizer), 0, "byte", 0, 0, NULL,
     "byte (default) | gpt2[:DIR] | tiktoken:FILE[:ENCODING]\n| spm:MODEL | hf:PATH  (ENCODING: r50k_base,\n"
     "cl100k_base, o200k_base, llama3; default: FILE's\nbase name. PATH: a byte-level BPE tokenizer.json,\n"
     "its directory, or NAME of tokenizers/hf/NAME:\nllama3_1, qwen3, deepseek_v3)",
     "SPEC", NULL, 0},
    {"eos", OPT_FLAG, F(o.add_eos), 0, "0", 0, 1, NULL, "spm: an EOS token after each document too", NULL, NULL,
     GIVEN(0)},
    {"input-format", OPT_STR, F(input_format), 0, "auto", 0, 0, input_format_names,
     "auto (default: jsonl for *.jsonl[.gz|.zst], else\ntext) | text | jsonl", "FMT", NULL, GIVEN(1)},
    {"jsonl-field", OPT_ARG, F(o.corpus.jsonl_field), 0, "text", 0, 0, NULL,
     "JSONL: the string field holding the text (default text)", "NAME", field_arg, GIVEN(2)},
    {"doc-separator", OPT_STR, F(sep), 0, NULL, 0, 0, NULL,
     "text: split files into documents at STR (C escapes,\ne.g. '\\n\\n\\n'); default: one document per file", "STR",
     NULL, GIVEN(3)},
    {"format", OPT_ENUM, F(o.format), 0, "llmc", 0, 0, prep_format_names,
     "llmc (default): PREFIX_train_NNNNNN.bin, PREFIX_val_...\nmegatron: PREFIX_train.bin/.idx, PREFIX_val.bin/.idx",
     "FMT", NULL, GIVEN(4)},
    {"val-fraction", OPT_ARG, F(o.val_fraction), 0, "0.1", 0, 0, NULL,
     "fraction of documents for validation, 0 <= F < 1\n(default 0.1; every document where floor(d F) steps up)", "F",
     fraction_arg, GIVEN(5)},
    {"shard-tokens", OPT_ARG, F(o.shard_tokens), 0, "100000000", 0, 0, NULL,
     "llmc: at most N tokens per shard, shards balanced\n(default 100000000)", "N", shard_arg, GIVEN(6)},
    {"round-docs", OPT_ARG, F(o.round_docs), 0, "65536", 0, 0, NULL,
     "at most N documents dealt to the ranks per round,\n"
     "which also ends at 32 MiB of input (default 65536;\nbounds memory)",
     "N", round_arg, GIVEN(7)},
    {"eval-mc", OPT_ARG, F(o.eval_mc), 0, NULL, 0, 0, NULL,
     "write one multiple-choice eval file (llm.c's HellaSwag\nformat) to --out from FILE, a JSONL of\n"
     "{\"context\", \"endings\": [...], \"label\"}; no other FILEs",
     "FILE", eval_mc_arg, 0},
    {"eval-mc-space", OPT_INT, F(o.eval_mc_space), 0, "1", 0, 1, NULL,
     "--eval-mc: 1 (default) encodes each ending as\n\" \" + ending, as llm.c does for GPT-2; 0 as given\n"
     "(SentencePiece marks word starts itself)",
     "0|1", NULL, 0},
};
/* clang-format on */
#undef GIVEN
#undef F
static const opt_table_t opt_table = {
    .prog = PREP_PROG, .defs = opt_defs, .n = sizeof opt_defs / sizeof opt_defs[0], .positional = 1};

static void usage(FILE *f)
{
    fprintf(f, "Usage: " PREP_PROG " --out PREFIX [options] FILE...\n"
               "       mpirun -np N " PREP_PROG " --out PREFIX [options] FILE...\n"
               "       " PREP_PROG " --eval-mc FILE.jsonl --out FILE.bin [--tokenizer SPEC]\n"
               "Tokenize text FILEs into token files for dtrain, llm.c and Megatron-LM.\n"
               "\n");
    opt_print_help(&opt_table, f, 21, 0);
    fprintf(f, "\n"
               "Inputs may be gzip- or zstd-compressed (recognised by content). Beside the\n"
               "outputs, PREFIX.tokenizer.json names the tokenizer for dtrain.\n"
               "See dtrain-prepare(1) and doc/data.md.\n");
}

/* jsonl when every input's name says so, text when none does. */
static void resolve_input_format(int rank, const char *arg, prep_opts_t *o)
{
    if (strcmp(arg, "text") == 0 || strcmp(arg, "jsonl") == 0) {
        o->corpus.format = strcmp(arg, "jsonl") == 0 ? CORPUS_JSONL : CORPUS_TEXT;
        return;
    }
    static const char *const jsonl_ext[] = {".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd"};
    int n_jsonl = 0;
    for (int i = 0; i < o->n_inputs; i++) {
        size_t len = strlen(o->inputs[i]);
        for (size_t k = 0; k < sizeof jsonl_ext / sizeof *jsonl_ext; k++) {
            size_t el = strlen(jsonl_ext[k]);
            if (len >= el && strcmp(o->inputs[i] + len - el, jsonl_ext[k]) == 0) {
                n_jsonl++;
                break;
            }
        }
    }
    if (n_jsonl != 0 && n_jsonl != o->n_inputs)
        die_usage(rank, "%d of the %d inputs are named *.jsonl: give --input-format text or jsonl for all of them",
                  n_jsonl, o->n_inputs);
    o->corpus.format = n_jsonl ? CORPUS_JSONL : CORPUS_TEXT;
}

static void set_separator(int rank, const char *arg, prep_opts_t *o)
{
    char err[PREP_ERRLEN];
    size_t len = 0;
    if (corpus_unescape(arg, o->separator, sizeof o->separator, &len, err, sizeof err) != 0)
        die_usage(rank, "--doc-separator '%s': %s", arg, err);
    if (len == 0)
        die_usage(rank, "--doc-separator needs at least one byte (e.g. '\\n\\n\\n')");
    o->corpus.separator = o->separator;
    o->corpus.separator_len = len;
}

/* --eval-mc writes one file from one JSONL: the corpus options and FILEs
 * have no meaning there, and are refused rather than ignored. */
static void check_eval_mc_args(int rank, const prep_args_t *a, int n_pos)
{
    if (a->o.out == NULL)
        die_usage(rank, "--eval-mc needs --out FILE, the eval file to write");
    if (n_pos > 0)
        die_usage(rank, "--eval-mc reads only its own FILE: drop the other input files (or run twice)");
    for (int i = 0; i < N_CORPUS_ONLY; i++)
        if (a->given[i])
            die_usage(rank, "--%s shapes corpus token files: --eval-mc does not take it", corpus_only[i]);
}

static void parse_args(int rank, int argc, char **argv, prep_opts_t *o)
{
    prep_args_t a;
    char err[PREP_ERRLEN];
    int first = argc;
    memset(&a, 0, sizeof a);
    if (opt_answer_help(argc, argv, rank == 0, usage, PREP_PROG " (dtrain) " PACKAGE_VERSION))
        finish_exit(0);
    if (opt_defaults(&opt_table, &a, err, sizeof err) != 0 ||
        opt_parse_argv(&opt_table, argc, argv, &a, NULL, NULL, &first, err, sizeof err) != 0)
        die_usage(rank, "%s", err);
    *o = a.o;
    if (o->eval_mc) {
        check_eval_mc_args(rank, &a, argc - first);
        return;
    }
    if (o->out == NULL)
        die_usage(rank, "--out PREFIX is required");
    if (first >= argc)
        die_usage(rank, "no input FILE given: name one or more text or JSONL files");
    o->inputs = argv + first;
    o->n_inputs = argc - first;
    resolve_input_format(rank, a.input_format, o);
    if (a.sep && o->corpus.format == CORPUS_JSONL)
        die_usage(rank, "--doc-separator is for text inputs: in JSONL every line is a document");
    if (a.sep)
        set_separator(rank, a.sep, o);
    if (!a.sep && o->corpus.format == CORPUS_TEXT && o->n_inputs == 1 && o->val_fraction > 0.0) {
        /* one text file is one document, and a validation split needs
         * several: as nanoGPT's and llm.c's users expect, the file is split,
         * here at its paragraphs */
        set_separator(rank, "\\n\\n", o);
        if (rank == 0)
            printf(PREP_PROG ": note: one text file and no --doc-separator: its paragraphs (text between blank "
                             "lines) are the documents, so that --val-fraction %g has some for validation "
                             "(--doc-separator chooses another split)\n",
                   o->val_fraction);
    }
}

/* Check every input before writing anything, so a typo in the last file
 * name does not leave work half done. */
static int check_inputs(const prep_opts_t *o, char *err, size_t errlen)
{
    for (int i = 0; i < o->n_inputs; i++) {
        const char *p = o->inputs[i];
        struct stat st;
        if (stat(p, &st) != 0 || access(p, R_OK) != 0) {
            prep_err(err, errlen, "cannot read input '%s': %s: check the file name", p, strerror(errno));
            return -1;
        }
        if (S_ISDIR(st.st_mode)) {
            prep_err(err, errlen, "input '%s' is a directory: name the files in it", p);
            return -1;
        }
    }
    return 0;
}

/* mkdir -p of the directory part of --out (rank 0, before any file). */
static int make_out_dir(const char *prefix, char *err, size_t errlen)
{
    char failed[PREP_PATH_MAX];
    if (fs_mkdir_parent(prefix, failed, sizeof failed) != 0) {
        prep_err(err, errlen, "--out '%s': cannot create directory '%s': %s", prefix, failed, strerror(errno));
        return -1;
    }
    if (fs_probe_parent(prefix, failed, sizeof failed) != 0) {
        prep_err(err, errlen, "--out '%s': cannot write into directory '%s': %s", prefix, failed, strerror(errno));
        return -1;
    }
    return 0;
}

void prep_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void prep_mpi_check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    fprintf(stderr, PREP_PROG ": %s failed: %s\n", what, s);
    MPI_Abort(MPI_COMM_WORLD, PREP_EXIT_IO);
}

int prep_agree(const prep_run_t *r, int failed, uint64_t key, const char *msg)
{
    uint64_t mine = failed ? key : UINT64_MAX, first = UINT64_MAX;
    prep_mpi_check(MPI_Allreduce(&mine, &first, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce(error)");
    int any = 0;
    prep_mpi_check(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD), "MPI_Allreduce(error)");
    if (!any)
        return 0;
    /* the lowest rank holding the first key says why */
    int who = failed && mine == first ? r->rank : r->nranks, speaker = 0;
    prep_mpi_check(MPI_Allreduce(&who, &speaker, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce(error)");
    if (r->rank == speaker) {
        fprintf(stderr, PREP_PROG ": %s\n", msg && *msg ? msg : "unknown error");
        fflush(stderr);
    }
    return 1;
}

/* Input bytes and wall time: the figure bench/tokenize.sh reports. */
static void print_summary(const prep_run_t *r)
{
    uint64_t bytes = 0;
    prep_mpi_check(MPI_Reduce(&r->text_bytes, &bytes, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD),
                   "MPI_Reduce(bytes)");
    if (r->rank != 0)
        return;
    double s = now_s() - r->t_start;
    const prep_stream_t *t = &r->stream[PREP_TRAIN], *v = &r->stream[PREP_VAL];
    printf("%llu documents (train %llu, val %llu), %llu + %llu tokens, %.1f MB of text in %.2f s: %.2f MB/s, "
           "%.2f MB/s per rank (%d)\n",
           (unsigned long long)r->n_docs, (unsigned long long)t->n_docs, (unsigned long long)v->n_docs,
           (unsigned long long)t->n_tokens, (unsigned long long)v->n_tokens, (double)bytes / 1e6, s,
           (double)bytes / 1e6 / s, (double)bytes / 1e6 / s / r->nranks, r->nranks);
}

/* --eval-mc: the tokenizer and the output's directory checked on rank 0,
 * which then does the work (prepare_mc.c). */
static int run_eval_mc(prep_run_t *r)
{
    char err[PREP_ERRLEN] = "";
    struct stat st;
    int failed = 0;
    if (r->rank == 0 && stat(r->o->out, &st) == 0 && S_ISDIR(st.st_mode)) {
        prep_err(err, sizeof err, "--out '%s' is a directory: name the eval file to write", r->o->out);
        failed = 1;
    }
    failed = failed || (r->rank == 0 && (tokenizer_open(&r->tk, r->o->tokenizer, 0, err, sizeof err) != 0 ||
                                         make_out_dir(r->o->out, err, sizeof err) != 0));
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_USAGE;
    return prep_eval_mc(r);
}

static int run(prep_run_t *r)
{
    if (r->o->eval_mc)
        return run_eval_mc(r);
    char err[PREP_ERRLEN] = "";
    int failed = check_inputs(r->o, err, sizeof err) != 0;
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_USAGE;
    failed = tokenizer_open(&r->tk, r->o->tokenizer, r->o->add_eos, err, sizeof err) != 0;
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_USAGE;
    /* an output path that cannot be made or opened is the command line's
     * to fix (exit 2), found before any work; a write that fails later is
     * the machine's (exit 1) */
    failed = r->rank == 0 && make_out_dir(r->o->out, err, sizeof err) != 0;
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_USAGE;
    failed = prep_streams_open(r, err, sizeof err) != 0;
    int status = prep_agree(r, failed, (uint64_t)r->rank, err) ? PREP_EXIT_USAGE : 0;
    if (status == 0)
        status = prep_documents(r);
    if (status == 0)
        status = prep_streams_finish(r);
    if (status != 0)
        prep_streams_abandon(r);
    else
        print_summary(r);
    return status;
}

int main(int argc, char **argv)
{
    int provided, rank = 0, nranks = 1;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, PREP_PROG ": MPI_Init failed: cannot start (check the MPI installation)\n");
        return PREP_EXIT_IO;
    }
    prep_mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    prep_mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &nranks), "MPI_Comm_size");
    prep_opts_t o;
    parse_args(rank, argc, argv, &o);
    prep_run_t r = {.o = &o, .rank = rank, .nranks = nranks, .t_start = now_s()};
    int status = run(&r);
    prep_streams_free(&r);
    tokenizer_close(r.tk);
    if (fflush(stdout) != 0 && status == 0) {
        fprintf(stderr, PREP_PROG ": cannot write to standard output: %s\n", strerror(errno));
        status = PREP_EXIT_IO;
    }
    finish_exit(status);
}
