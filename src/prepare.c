/* dtrain-prepare: text corpora -> token files (llm.c shards or a Megatron
 * indexed dataset) with a tokenizer sidecar, on any number of MPI ranks.
 * See prepare.h for the layout of the work and doc/data.md for the files.
 *
 * Runs as a singleton without a launcher (a build step, a login node) or
 * under mpirun/srun; the output is byte-identical at any rank count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/prepare.h"

#include "mpi/clock.h"
#include "src/fsutil.h"

#include <errno.h>
#include <getopt.h>
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

#define DEFAULT_VAL_FRACTION 0.1
#define DEFAULT_SHARD_TOKENS 100000000UL
#define DEFAULT_ROUND_DOCS 4096UL

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: " PREP_PROG " --out PREFIX [options] FILE...\n"
            "       mpirun -np N " PREP_PROG " --out PREFIX [options] FILE...\n"
            "Tokenize text FILEs into token files for dtrain, llm.c and Megatron-LM.\n"
            "\n"
            "  --out PREFIX          output path prefix (missing directories are made)\n"
            "  --tokenizer SPEC      byte (default) | gpt2[:DIR] | tiktoken:FILE[:ENCODING]\n"
            "                        | spm:MODEL  (ENCODING: r50k_base, cl100k_base,\n"
            "                        o200k_base, llama3; default: FILE's base name)\n"
            "  --eos                 spm: an EOS token after each document too\n"
            "  --input-format FMT    auto (default: jsonl for *.jsonl[.gz|.zst], else\n"
            "                        text) | text | jsonl\n"
            "  --jsonl-field NAME    JSONL: the string field holding the text (default text)\n"
            "  --doc-separator STR   text: split files into documents at STR (C escapes,\n"
            "                        e.g. '\\n\\n\\n'); default: one document per file\n"
            "  --format FMT          llmc (default): PREFIX_train_NNNNNN.bin, PREFIX_val_...\n"
            "                        megatron: PREFIX_train.bin/.idx, PREFIX_val.bin/.idx\n"
            "  --val-fraction F      fraction of documents for validation, 0 <= F < 1\n"
            "                        (default %.1f; every document where floor(d F) steps up)\n"
            "  --shard-tokens N      llmc: at most N tokens per shard, shards balanced\n"
            "                        (default %lu)\n"
            "  --round-docs N        at most N documents dealt to the ranks per round\n"
            "                        (default %lu; bounds memory)\n"
            "  -h, --help            show this help and exit\n"
            "  --version             show the version and exit\n"
            "\n"
            "Inputs may be gzip- or zstd-compressed (recognised by content). Beside the\n"
            "outputs, PREFIX.tokenizer.json names the tokenizer for dtrain.\n"
            "See dtrain-prepare(1) and doc/data.md.\n",
            DEFAULT_VAL_FRACTION, DEFAULT_SHARD_TOKENS, DEFAULT_ROUND_DOCS);
}

/* Usage errors: one line on stderr from rank 0, exit 2 on every rank
 * (every rank parses the same arguments, so all of them get here). */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3), noreturn))
#endif
static void die_usage(int rank, const char *fmt, ...)
{
    if (rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        fputs(PREP_PROG ": ", stderr);
        vfprintf(stderr, fmt, ap);
        fputs(" (see " PREP_PROG " --help)\n", stderr);
        va_end(ap);
    }
    MPI_Finalize();
    exit(PREP_EXIT_USAGE);
}

#if defined(__GNUC__)
__attribute__((noreturn))
#endif
static void finish_exit(int status)
{
    fflush(stdout);
    fflush(stderr);
    MPI_Finalize();
    exit(status);
}

static int parse_fraction(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0.0 ||
        v >= 1.0)
        return -1;
    *out = v;
    return 0;
}

static int parse_count(const char *s, size_t *out)
{
    char *end;
    if (*s == '-' || *s == '+' || *s == '\0')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    /* The llm.c header stores the count as an int32. */
    if (errno != 0 || *end != '\0' || v == 0 || v > (unsigned long long)INT32_MAX)
        return -1;
    *out = (size_t)v;
    return 0;
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

static void parse_args(int rank, int argc, char **argv, prep_opts_t *o)
{
    enum { OPT_OUT = 256, OPT_TOKENIZER, OPT_EOS, OPT_INPUT, OPT_FIELD, OPT_SEP, OPT_FORMAT, OPT_VAL, OPT_SHARD,
           OPT_ROUND, OPT_VERSION };
    static const struct option longopts[] = {
        {"out", required_argument, NULL, OPT_OUT},
        {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
        {"eos", no_argument, NULL, OPT_EOS},
        {"input-format", required_argument, NULL, OPT_INPUT},
        {"jsonl-field", required_argument, NULL, OPT_FIELD},
        {"doc-separator", required_argument, NULL, OPT_SEP},
        {"format", required_argument, NULL, OPT_FORMAT},
        {"val-fraction", required_argument, NULL, OPT_VAL},
        {"shard-tokens", required_argument, NULL, OPT_SHARD},
        {"round-docs", required_argument, NULL, OPT_ROUND},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    static const char allowed[] = "--out, --tokenizer, --eos, --input-format, --jsonl-field, --doc-separator, "
                                  "--format, --val-fraction, --shard-tokens, --round-docs, --help, --version";
    const char *input_format = "auto", *sep = NULL;
    memset(o, 0, sizeof *o);
    o->tokenizer = "byte";
    o->corpus.jsonl_field = "text";
    o->val_fraction = DEFAULT_VAL_FRACTION;
    o->shard_tokens = DEFAULT_SHARD_TOKENS;
    o->round_docs = DEFAULT_ROUND_DOCS;

    opterr = 0; /* our own one-line messages instead of getopt's */
    for (;;) {
        int c = getopt_long(argc, argv, ":h", longopts, NULL);
        if (c == -1)
            break;
        switch (c) {
        case OPT_OUT:
            if (optarg[0] == '\0')
                die_usage(rank, "--out needs a non-empty PREFIX");
            o->out = optarg;
            break;
        case OPT_TOKENIZER:
            o->tokenizer = optarg;
            break;
        case OPT_EOS:
            o->add_eos = 1;
            break;
        case OPT_INPUT:
            if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "text") != 0 && strcmp(optarg, "jsonl") != 0)
                die_usage(rank, "--input-format '%s' is not allowed: auto, text or jsonl", optarg);
            input_format = optarg;
            break;
        case OPT_FIELD:
            if (optarg[0] == '\0')
                die_usage(rank, "--jsonl-field needs a field name");
            o->corpus.jsonl_field = optarg;
            break;
        case OPT_SEP:
            sep = optarg;
            break;
        case OPT_FORMAT:
            if (strcmp(optarg, "llmc") != 0 && strcmp(optarg, "megatron") != 0)
                die_usage(rank, "--format '%s' is not allowed: llmc or megatron", optarg);
            o->format = strcmp(optarg, "megatron") == 0 ? PREP_FORMAT_MEGATRON : PREP_FORMAT_LLMC;
            break;
        case OPT_VAL:
            if (parse_fraction(optarg, &o->val_fraction) != 0)
                die_usage(rank, "--val-fraction '%s' is not allowed: give a number F with 0 <= F < 1", optarg);
            break;
        case OPT_SHARD:
            if (parse_count(optarg, &o->shard_tokens) != 0)
                die_usage(rank, "--shard-tokens '%s' is not allowed: give an integer from 1 to %d", optarg,
                          (int)INT32_MAX);
            break;
        case OPT_ROUND:
            if (parse_count(optarg, &o->round_docs) != 0)
                die_usage(rank, "--round-docs '%s' is not allowed: give an integer from 1 to %d", optarg,
                          (int)INT32_MAX);
            break;
        case 'h':
            if (rank == 0)
                usage(stdout);
            finish_exit(0);
        case OPT_VERSION:
            if (rank == 0)
                printf(PREP_PROG " (dtrain) %s\n", PACKAGE_VERSION);
            finish_exit(0);
        case ':':
            die_usage(rank, "option '%s' needs a value", argv[optind - 1]);
        default:
            die_usage(rank, "unknown option '%s': allowed are %s", argv[optind - 1], allowed);
        }
    }
    if (o->out == NULL)
        die_usage(rank, "--out PREFIX is required");
    if (optind >= argc)
        die_usage(rank, "no input FILE given: name one or more text or JSONL files");
    o->inputs = argv + optind;
    o->n_inputs = argc - optind;
    resolve_input_format(rank, input_format, o);
    if (sep && o->corpus.format == CORPUS_JSONL)
        die_usage(rank, "--doc-separator is for text inputs: in JSONL every line is a document");
    if (sep)
        set_separator(rank, sep, o);
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
    if (fs_mkdir_parent(prefix, failed, sizeof failed) == 0)
        return 0;
    prep_err(err, errlen, "--out '%s': cannot create directory '%s': %s", prefix, failed, strerror(errno));
    return -1;
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

static int run(prep_run_t *r)
{
    char err[PREP_ERRLEN] = "";
    int failed = check_inputs(r->o, err, sizeof err) != 0;
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_USAGE;
    failed = tokenizer_open(&r->tk, r->o->tokenizer, r->o->add_eos, err, sizeof err) != 0;
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_USAGE;
    failed = r->rank == 0 && make_out_dir(r->o->out, err, sizeof err) != 0;
    if (prep_agree(r, failed, 0, err))
        return PREP_EXIT_IO;
    failed = prep_streams_open(r, err, sizeof err) != 0;
    int status = prep_agree(r, failed, (uint64_t)r->rank, err) ? PREP_EXIT_IO : 0;
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
