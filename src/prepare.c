/* dtrain-prepare: turn text files into llm.c token shards.
 *
 * A serial tool, deliberately free of MPI so it runs on a login node or in
 * a build step without a launcher. Each input file is tokenized on its own
 * and its last --val-fraction of tokens goes to the validation split, so
 * validation samples every book instead of only the last one given. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

#define PROG "dtrain-prepare"
#define EXIT_USAGE 2
#define DEFAULT_VAL_FRACTION 0.1
#define DEFAULT_SHARD_TOKENS 100000000UL
/* %06d names sort correctly only up to this index. */
#define MAX_SHARD_INDEX 999999
#define BYTE_VOCAB 256
#define ERRLEN 1024

typedef struct prepare_opts {
    const char *out;         /* output prefix */
    double val_fraction;     /* 0 <= f < 1 */
    size_t shard_tokens;     /* max tokens per output shard */
    char *const *inputs;     /* text files, in the order given */
    int n_inputs;
} prepare_opts_t;

/* Tokens of one split on their way to disk: filled from every input file,
 * written out each time a shard's worth has accumulated, so memory stays
 * bounded by one shard however large the corpus. */
typedef struct shard_out {
    const char *prefix;
    const char *split; /* "train" or "val" */
    int32_t *buf;
    size_t fill, cap, limit;
    int index;    /* next shard number */
    size_t total; /* tokens written or buffered so far */
} shard_out_t;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: " PROG " --out PREFIX [--tokenizer byte] "
            "[--val-fraction F]\n"
            "                      [--shard-tokens N] FILE...\n"
            "Tokenize text FILEs into llm.c uint16 token shards\n"
            "PREFIX_train_NNNNNN.bin and PREFIX_val_NNNNNN.bin.\n"
            "\n"
            "  --out PREFIX        output path prefix (its directory must "
            "exist)\n"
            "  --tokenizer NAME    only 'byte' (token = byte value, vocab "
            "256)\n"
            "  --val-fraction F    last fraction of each file kept for "
            "validation,\n"
            "                      0 <= F < 1 (default %.1f; 0 writes no val "
            "shard)\n"
            "  --shard-tokens N    at most N tokens per shard (default %lu)\n"
            "  -h, --help          show this help and exit\n"
            "  --version           show the version and exit\n"
            "\n"
            "See dtrain-prepare(1) and doc/data.md.\n",
            DEFAULT_VAL_FRACTION, DEFAULT_SHARD_TOKENS);
}

/* Usage errors are one line on stderr and exit 2, the getopt convention. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2), noreturn))
#endif
static void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(PROG ": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see " PROG " --help)\n", stderr);
    va_end(ap);
    exit(EXIT_USAGE);
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

static void parse_args(int argc, char **argv, prepare_opts_t *o)
{
    enum { OPT_OUT = 256, OPT_TOKENIZER, OPT_VAL, OPT_SHARD, OPT_VERSION };
    static const struct option longopts[] = {
        {"out", required_argument, NULL, OPT_OUT},
        {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
        {"val-fraction", required_argument, NULL, OPT_VAL},
        {"shard-tokens", required_argument, NULL, OPT_SHARD},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    static const char allowed[] = "--out, --tokenizer, --val-fraction, "
                                  "--shard-tokens, --help, --version";

    o->out = NULL;
    o->val_fraction = DEFAULT_VAL_FRACTION;
    o->shard_tokens = DEFAULT_SHARD_TOKENS;

    /* We print our own one-line messages instead of getopt's. */
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, ":h", longopts, NULL);
        if (c == -1)
            break;
        switch (c) {
        case OPT_OUT:
            if (optarg[0] == '\0')
                die_usage("--out needs a non-empty PREFIX");
            o->out = optarg;
            break;
        case OPT_TOKENIZER:
            if (strcmp(optarg, "byte") != 0)
                die_usage("--tokenizer '%s' is not supported: only 'byte' is "
                          "allowed (GPT-2 BPE is not implemented yet)",
                          optarg);
            break;
        case OPT_VAL:
            if (parse_fraction(optarg, &o->val_fraction) != 0)
                die_usage("--val-fraction '%s' is not allowed: give a number "
                          "F with 0 <= F < 1",
                          optarg);
            break;
        case OPT_SHARD:
            if (parse_count(optarg, &o->shard_tokens) != 0)
                die_usage("--shard-tokens '%s' is not allowed: give an "
                          "integer from 1 to %d",
                          optarg, (int)INT32_MAX);
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case OPT_VERSION:
            printf(PROG " (dtrain) %s\n", PACKAGE_VERSION);
            exit(0);
        case ':':
            die_usage("option '%s' needs a value", argv[optind - 1]);
        default:
            die_usage("unknown option '%s': allowed are %s",
                      argv[optind - 1], allowed);
        }
    }
    if (o->out == NULL)
        die_usage("--out PREFIX is required");
    if (optind >= argc)
        die_usage("no input FILE given: name one or more text files");
    o->inputs = argv + optind;
    o->n_inputs = argc - optind;
}

/* Check every input before writing anything, so a typo in the last file
 * name does not leave a half-written set of shards behind. */
static int check_inputs(const prepare_opts_t *o)
{
    for (int i = 0; i < o->n_inputs; i++) {
        const char *p = o->inputs[i];
        struct stat st;
        if (stat(p, &st) != 0) {
            fprintf(stderr,
                    PROG ": cannot read input '%s': %s: check the file "
                    "name\n",
                    p, strerror(errno));
            return -1;
        }
        if (S_ISDIR(st.st_mode)) {
            fprintf(stderr,
                    PROG ": input '%s' is a directory: name the text files "
                    "in it\n",
                    p);
            return -1;
        }
        if (S_ISREG(st.st_mode) && st.st_size == 0) {
            fprintf(stderr,
                    PROG ": input '%s' is empty: remove it from the command "
                    "line\n",
                    p);
            return -1;
        }
        if (access(p, R_OK) != 0) {
            fprintf(stderr, PROG ": cannot read input '%s': %s\n", p,
                    strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Read a whole file, growing the buffer as it goes so pipes and other
 * files without a size work too. Two spare bytes are left for the
 * separator the caller may append. */
static int read_text(const char *path, unsigned char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, PROG ": cannot open input '%s': %s\n", path,
                strerror(errno));
        return -1;
    }
    int rc = -1;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fprintf(stderr, PROG ": cannot stat input '%s': %s\n", path,
                strerror(errno));
        goto out;
    }
    if (S_ISREG(st.st_mode) && (size_t)st.st_size + 3 > cap)
        cap = (size_t)st.st_size + 3;
    buf = malloc(cap);
    if (buf == NULL) {
        fprintf(stderr, PROG ": out of memory reading '%s'\n", path);
        goto out;
    }
    for (;;) {
        if (cap - n < 3) {
            unsigned char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                fprintf(stderr, PROG ": out of memory reading '%s'\n", path);
                goto out;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n - 2);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, PROG ": cannot read input '%s': %s\n", path,
                    strerror(errno));
            goto out;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    rc = 0;
out:
    /* On a read-only descriptor close can only report an earlier error,
     * but report it all the same rather than hand back suspect text. */
    if (close(fd) != 0 && rc == 0) {
        fprintf(stderr, PROG ": cannot close input '%s': %s\n", path,
                strerror(errno));
        rc = -1;
    }
    if (rc != 0) {
        free(buf);
        return -1;
    }
    *data = buf;
    *len = n;
    return 0;
}

static int shard_path(const shard_out_t *s, int index, char *path,
                      size_t pathlen)
{
    int w = snprintf(path, pathlen, "%s_%s_%06d.bin", s->prefix, s->split,
                     index);
    if (w < 0 || (size_t)w >= pathlen) {
        fprintf(stderr, PROG ": --out prefix '%s' is too long\n", s->prefix);
        return -1;
    }
    return 0;
}

static int shard_flush(shard_out_t *s)
{
    if (s->fill == 0)
        return 0;
    if (s->index > MAX_SHARD_INDEX) {
        fprintf(stderr,
                PROG ": more than %d %s shards: raise --shard-tokens\n",
                MAX_SHARD_INDEX + 1, s->split);
        return -1;
    }
    char path[4096], err[ERRLEN];
    if (shard_path(s, s->index, path, sizeof path) != 0)
        return -1;
    if (tokens_write(path, s->buf, s->fill, 2, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return -1;
    }
    printf("%s: %zu tokens\n", path, s->fill);
    s->index++;
    s->fill = 0;
    return 0;
}

/* Byte tokenizer: token id = byte value. */
static int shard_append_bytes(shard_out_t *s, const unsigned char *b, size_t n)
{
    while (n > 0) {
        if (s->fill == s->cap) {
            size_t ncap = s->cap ? s->cap * 2 : 65536;
            if (ncap > s->limit)
                ncap = s->limit;
            int32_t *nb = realloc(s->buf, ncap * sizeof *nb);
            if (nb == NULL) {
                fprintf(stderr,
                        PROG ": out of memory buffering %zu tokens: lower "
                        "--shard-tokens\n",
                        ncap);
                return -1;
            }
            s->buf = nb;
            s->cap = ncap;
        }
        size_t m = s->cap - s->fill;
        if (m > n)
            m = n;
        for (size_t i = 0; i < m; i++)
            s->buf[s->fill + i] = (int32_t)b[i];
        s->fill += m;
        s->total += m;
        b += m;
        n -= m;
        if (s->fill == s->limit && shard_flush(s) != 0)
            return -1;
    }
    return 0;
}

/* Remove shards left by an earlier run that made more of them: readers
 * glob PREFIX_train_*.bin and would otherwise mix old data with new. */
static int remove_stale(const shard_out_t *s)
{
    char path[4096];
    for (int i = s->index; i <= MAX_SHARD_INDEX; i++) {
        if (shard_path(s, i, path, sizeof path) != 0)
            return -1;
        if (unlink(path) != 0) {
            if (errno == ENOENT)
                return 0;
            fprintf(stderr,
                    PROG ": cannot remove stale shard '%s': %s: remove it "
                    "by hand\n",
                    path, strerror(errno));
            return -1;
        }
        printf("%s: removed (stale, from an earlier run)\n", path);
    }
    return 0;
}

static int prepare(const prepare_opts_t *o)
{
    shard_out_t train = {.prefix = o->out, .split = "train",
                         .limit = o->shard_tokens};
    shard_out_t val = {.prefix = o->out, .split = "val",
                       .limit = o->shard_tokens};
    int rc = -1;

    for (int f = 0; f < o->n_inputs; f++) {
        unsigned char *text;
        size_t n;
        if (read_text(o->inputs[f], &text, &n) != 0)
            goto out;
        if (n == 0) {
            fprintf(stderr,
                    PROG ": input '%s' is empty: remove it from the command "
                    "line\n",
                    o->inputs[f]);
            free(text);
            goto out;
        }
        /* Keep books apart: one that stops mid-line would otherwise run
         * straight into the next one's first line. */
        if (text[n - 1] != '\n') {
            text[n++] = '\n';
            text[n++] = '\n';
        }
        /* floor(n * F) in double, the same arithmetic as Python's
         * int(n * F), so tests can predict the split exactly. Every file
         * keeps at least one training token. */
        size_t n_val = (size_t)((double)n * o->val_fraction);
        if (n_val >= n)
            n_val = n - 1;
        size_t n_train = n - n_val;
        int bad = shard_append_bytes(&train, text, n_train) != 0 ||
                  shard_append_bytes(&val, text + n_train, n_val) != 0;
        free(text);
        if (bad)
            goto out;
    }
    if (o->val_fraction > 0.0 && val.total == 0) {
        /* The smallest file size whose split gives one validation token. */
        size_t need = (size_t)(1.0 / o->val_fraction);
        while ((size_t)((double)need * o->val_fraction) < 1)
            need++;
        fprintf(stderr,
                PROG ": the validation split is empty: the inputs are too "
                "small for --val-fraction %g (a file needs at least %zu "
                "bytes to give one validation token)\n",
                o->val_fraction, need);
        goto out;
    }
    if (shard_flush(&train) != 0 || shard_flush(&val) != 0)
        goto out;
    if (remove_stale(&train) != 0 || remove_stale(&val) != 0)
        goto out;
    rc = 0;
out:
    free(train.buf);
    free(val.buf);
    return rc;
}

int main(int argc, char **argv)
{
    prepare_opts_t o;
    parse_args(argc, argv, &o);
    if (check_inputs(&o) != 0)
        return 1;
    if (prepare(&o) != 0)
        return 1;
    if (fflush(stdout) != 0) {
        fprintf(stderr, PROG ": cannot write to standard output: %s\n",
                strerror(errno));
        return 1;
    }
    return 0;
}
