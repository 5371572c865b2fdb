/* dtrain-plot: the curves of one or several runs from their --metrics files.
 *
 *   dtrain-plot METRICS.jsonl... -o curves.png [--size WxH] [--title STR]
 *
 * A 2x2 page: training loss (lines) with validation loss (points), learning
 * rate, tokens/s and gradient norm against the step, one colour per file,
 * labelled by the file name, so runs at several layouts can be compared.
 * Each file is read with Jansson, one JSON object per line as dtrain writes
 * them (src/train/metrics.c: "step" and any of "loss", "val_loss", "lr",
 * "grad_norm", "tokens_per_s"; other keys ignored); the series go to
 * temporary files beside a gnuplot script, and gnuplot draws the page into
 * OUT.tmp, which is renamed to OUT once gnuplot has exited 0 without a word
 * on stdout or stderr (any warning, e.g. an empty range, counts as a
 * failure). A C program rather than a shell script because the metrics are
 * JSON: Jansson parses them (nested "mem_peak", escapes) where awk would
 * match text.
 *
 * dtrain writes a non-finite value as null (missing); files of an older
 * dtrain have nan or inf there (%.9g), which is not JSON: those tokens are
 * read as missing values too, so a diverged run still plots.
 *
 * Exit status: 0; 2 for a bad command line or input (a file missing,
 * without records or with a line that is not a metrics record, an -o
 * path whose directory cannot be made or written); 1 when gnuplot fails
 * or a write fails part way. One line on stderr. */
#define _POSIX_C_SOURCE 200809L /* getline, mkdtemp, posix_spawn, strcasecmp */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/fsutil.h"
#include "io/publish.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

#define PROG "dtrain-plot"
#define ERRLEN 1024
#define MAX_PIXELS 20000

extern char **environ;

enum { BAD_INPUT = 2, FAILED = 1 };

/* the plotted columns of a data file, after the step (column 1) */
enum { C_LOSS, C_VAL, C_LR, C_NORM, C_TOKS, NCOL };
static const char *const KEYS[NCOL] = {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s"};

typedef struct col {
    long n; /* finite values */
    double xmin, xmax, ymin, ymax;
} col_t;

typedef struct run {
    const char *path; /* as given: the key's label */
    char *dat;        /* the series, in the temporary directory */
    long records;
    col_t col[NCOL];
} run_t;

typedef struct plot_opts {
    char **files;
    int nfiles;
    const char *out, *title;
    int width, height;
    int svg;
} plot_opts_t;

typedef struct plot {
    plot_opts_t o;
    run_t *runs;
    char tmpdir[4096];
    char script[4200], log[4200];
    char *tmpout; /* OUT.tmp, beside OUT */
} plot_t;

typedef enum { PARSE_OK = 0, PARSE_EXIT_OK, PARSE_ERROR } parse_status_t;

static void usage(FILE *f)
{
    fprintf(f, "Usage: " PROG " METRICS.jsonl... -o FILE [--size WxH] [--title STR]\n"
               "Draws the curves of one or several dtrain runs from their --metrics files with gnuplot:\n"
               "training loss with validation loss (points), learning rate, tokens/s and gradient norm\n"
               "against the step, on a 2x2 page; one colour per file, labelled by the file name.\n"
               "\n"
               "  -o, --output FILE  the image to write (atomically): FILE.png (PNG, cairo) or FILE.svg\n"
               "  --size WxH         image size in pixels (default 1200x800)\n"
               "  --title STR        a title above the four plots\n"
               "  -h, --help         show this help and exit\n"
               "  --version          show the version and exit\n"
               "\n"
               "Exit status: 0; 2 for a bad command line or input (a missing file, a file without\n"
               "records, a line that is not a metrics record, an -o path that cannot be written);\n"
               "1 when gnuplot fails or reports anything. See dtrain-plot(1).\n");
}

/* ---- command line ---- */

static int parse_size(const char *v, plot_opts_t *o, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long w = strtol(v, &end, 10), h = 0;
    int ok = end != v && (*end == 'x' || *end == 'X') && isdigit((unsigned char)end[1]);
    if (ok) {
        const char *hs = end + 1;
        h = strtol(hs, &end, 10);
        ok = *end == '\0' && errno == 0 && w >= 16 && h >= 16 && w <= MAX_PIXELS && h <= MAX_PIXELS;
    }
    if (!ok) {
        seterr(err, errlen, "--size '%s': give WIDTHxHEIGHT in pixels, each 16 to %d (e.g. 1200x800)", v, MAX_PIXELS);
        return -1;
    }
    o->width = (int)w;
    o->height = (int)h;
    return 0;
}

static int check_output(plot_opts_t *o, char *err, size_t errlen)
{
    size_t n = strlen(o->out);
    if (n > 4 && strcasecmp(o->out + n - 4, ".svg") == 0)
        o->svg = 1;
    else if (!(n > 4 && strcasecmp(o->out + n - 4, ".png") == 0)) {
        seterr(err, errlen, "-o '%s': the image's name ends in .png or .svg (e.g. -o curves.png)", o->out);
        return -1;
    }
    return 0;
}

static parse_status_t parse_args(int argc, char **argv, plot_opts_t *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->width = 1200;
    o->height = 800;
    o->files = calloc((size_t)argc, sizeof *o->files);
    if (!o->files) {
        seterr(err, errlen, "out of memory");
        return PARSE_ERROR;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t n = a[0] == '-' && a[1] == '-' && eq ? (size_t)(eq - a) : strlen(a);
#define IS(name) (n == strlen(name) && strncmp(a, name, n) == 0)
        if (IS("-h") || IS("--help")) {
            usage(stdout);
            return PARSE_EXIT_OK;
        } else if (IS("--version")) {
            printf(PROG " (dtrain) %s\n", PACKAGE_VERSION);
            return PARSE_EXIT_OK;
        } else if (IS("-o") || IS("--output") || IS("--size") || IS("--title")) {
            const char *v = a[n] == '=' ? a + n + 1 : i + 1 < argc ? argv[++i] : NULL;
            if (!v || (!*v && !IS("--title"))) {
                seterr(err, errlen, "option '%.*s' needs a value (see " PROG " --help)", (int)n, a);
                return PARSE_ERROR;
            }
            if (IS("--size") && parse_size(v, o, err, errlen) != 0)
                return PARSE_ERROR;
            if (IS("--title"))
                o->title = v;
            if (IS("-o") || IS("--output"))
                o->out = v;
        } else if (a[0] == '-' && a[1]) {
            seterr(err, errlen, "unknown option '%s': allowed are -o, --output, --size, --title, --help, --version", a);
            return PARSE_ERROR;
        } else {
            o->files[o->nfiles++] = argv[i];
        }
#undef IS
    }
    if (o->nfiles == 0 || !o->out) {
        seterr(err, errlen,
               "%s: " PROG " METRICS.jsonl... -o curves.png (the files dtrain --metrics wrote; "
               "see --help)",
               o->nfiles == 0 ? "no metrics file given" : "no output image given (-o FILE)");
        return PARSE_ERROR;
    }
    return check_output(o, err, errlen) == 0 ? PARSE_OK : PARSE_ERROR;
}

/* ---- reading the metrics ---- */

/* Copies line to out, each nan, -nan, inf or -inf outside a string turned
 * into null (dtrain's %.9g of a non-finite value). out holds 2 * strlen(line) + 8. */
static void nonfinite_to_null(const char *line, char *out)
{
    int in_str = 0;
    while (*line) {
        char c = *line;
        if (in_str) {
            *out++ = *line++;
            if (c == '\\' && *line)
                *out++ = *line++;
            else if (c == '"')
                in_str = 0;
            continue;
        }
        const char *p = line + (c == '-');
        if ((strncasecmp(p, "nan", 3) == 0 || strncasecmp(p, "inf", 3) == 0) && !isalnum((unsigned char)p[3])) {
            memcpy(out, "null", 4);
            out += 4;
            line = p + 3;
            continue;
        }
        in_str = c == '"';
        *out++ = *line++;
    }
    *out = '\0';
}

static void col_add(col_t *c, double x, double y)
{
    if (c->n == 0 || x < c->xmin)
        c->xmin = x;
    if (c->n == 0 || x > c->xmax)
        c->xmax = x;
    if (c->n == 0 || y < c->ymin)
        c->ymin = y;
    if (c->n == 0 || y > c->ymax)
        c->ymax = y;
    c->n++;
}

/* One record as a data row "step v1 ... v5" ('?' for a missing value).
 * Returns 0, BAD_INPUT with the line's problem in err, or FAILED. */
static int parse_record(run_t *r, long lineno, const char *text, FILE *dat, char *err, size_t errlen)
{
    json_error_t je;
    json_t *obj = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    json_t *step = obj ? json_object_get(obj, "step") : NULL;
    if (!obj || !json_is_object(obj) || !json_is_integer(step) || json_integer_value(step) < 0) {
        const char *why = !obj                   ? "not JSON: "
                          : !json_is_object(obj) ? "not a JSON object"
                                                 : "no non-negative integer \"step\"";
        seterr(err, errlen,
               "%s:%ld: %s%s: " PROG " reads the files dtrain --metrics writes, one JSON object "
               "with a \"step\" a line",
               r->path, lineno, why, !obj ? je.text : "");
        json_decref(obj);
        return BAD_INPUT;
    }
    double x = (double)json_integer_value(step);
    int rc = fprintf(dat, "%.17g", x) < 0;
    for (int k = 0; k < NCOL; k++) {
        json_t *v = json_object_get(obj, KEYS[k]);
        double y = json_is_number(v) ? json_number_value(v) : NAN;
        if (v && !json_is_number(v) && !json_is_null(v)) {
            seterr(err, errlen, "%s:%ld: \"%s\" is not a number: " PROG " reads the files dtrain --metrics writes",
                   r->path, lineno, KEYS[k]);
            json_decref(obj);
            return BAD_INPUT;
        }
        if (isfinite(y))
            col_add(&r->col[k], x, y);
        rc |= (isfinite(y) ? fprintf(dat, " %.17g", y) : fprintf(dat, " ?")) < 0;
    }
    rc |= fprintf(dat, "\n") < 0;
    json_decref(obj);
    r->records++;
    if (rc)
        seterr(err, errlen, "cannot write '%s': %s: check free space in the temporary directory", r->dat,
               strerror(errno));
    return rc ? FAILED : 0;
}

/* Reads r->path into r->dat. Returns 0, BAD_INPUT or FAILED with err set. */
static int read_run(run_t *r, char *err, size_t errlen)
{
    FILE *in = fopen(r->path, "r");
    if (!in) {
        seterr(err, errlen, "cannot open '%s': %s: give the file dtrain --metrics wrote", r->path, strerror(errno));
        return BAD_INPUT;
    }
    FILE *dat = fopen(r->dat, "w");
    if (!dat) {
        seterr(err, errlen, "cannot create '%s': %s: set TMPDIR to a writable directory", r->dat, strerror(errno));
        fclose(in);
        return FAILED;
    }
    char *line = NULL, *fixed = NULL;
    size_t cap = 0, fixed_cap = 0;
    long lineno = 0;
    int rc = 0;
    for (ssize_t len; rc == 0 && (len = getline(&line, &cap, in)) >= 0;) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len)
            continue;
        if (2 * (size_t)len + 8 > fixed_cap) {
            free(fixed);
            fixed_cap = 2 * (size_t)len + 8;
            if (!(fixed = malloc(fixed_cap))) {
                seterr(err, errlen, "%s:%ld: out of memory for a %zd-byte line", r->path, lineno, len);
                rc = FAILED;
                break;
            }
        }
        nonfinite_to_null(line, fixed);
        rc = parse_record(r, lineno, fixed, dat, err, errlen);
        if (rc == BAD_INPUT && line[len - 1] != '\n') {
            /* no newline and no record: the run stopped while writing its
             * last line (dtrain of this version writes whole lines) */
            fprintf(stderr, PROG ": note: %s:%ld: skipped a torn last line (%zd bytes, no newline)\n", r->path, lineno,
                    len);
            err[0] = '\0';
            rc = 0;
        }
    }
    if (rc == 0 && ferror(in)) {
        seterr(err, errlen, "cannot read '%s': %s", r->path, strerror(errno));
        rc = BAD_INPUT;
    }
    if (rc == 0 && r->records == 0) {
        seterr(err, errlen, "'%s' has no records: give a --metrics file of a run that did at least one step", r->path);
        rc = BAD_INPUT;
    }
    free(line);
    free(fixed);
    fclose(in);
    if (fclose(dat) != 0 && rc == 0) {
        seterr(err, errlen, "cannot write '%s': %s: check free space in the temporary directory", r->dat,
               strerror(errno));
        rc = FAILED;
    }
    return rc;
}

/* ---- the gnuplot script ---- */

/* s then suffix as one gnuplot single-quoted string ('' for ', control
 * characters as spaces) */
static void put_str2(FILE *f, const char *s, const char *suffix)
{
    const char *part[2] = {s, suffix};
    fputc('\'', f);
    for (int i = 0; i < 2; i++)
        for (const char *t = part[i]; *t; t++) {
            if (*t == '\'')
                fputs("''", f);
            else
                fputc((unsigned char)*t < 0x20 ? ' ' : *t, f);
        }
    fputc('\'', f);
}

static void put_str(FILE *f, const char *s) { put_str2(f, s, ""); }

/* Explicit ranges where autoscaling would be empty (one step, a constant
 * value): gnuplot warns about those, and any warning fails the plot. */
static void set_ranges(FILE *gp, const run_t *runs, int nruns, const int *cols, int ncols)
{
    col_t all = {0};
    for (int i = 0; i < nruns; i++)
        for (int c = 0; c < ncols; c++) {
            const col_t *k = &runs[i].col[cols[c]];
            if (k->n) {
                col_add(&all, k->xmin, k->ymin);
                col_add(&all, k->xmax, k->ymax);
            }
        }
    if (all.n == 0) {
        fprintf(gp, "set xrange [0:1]\nset yrange [0:1]\nset label 1 'no values in these files' at graph 0.5,0.5 "
                    "center\n");
        return;
    }
    if (all.xmin == all.xmax)
        fprintf(gp, "set xrange [%.17g:%.17g]\n", all.xmin - 1, all.xmax + 1);
    else
        fprintf(gp, "set autoscale x\n");
    double d = all.ymin == 0 ? 1 : 0.05 * fabs(all.ymin);
    if (all.ymin == all.ymax)
        fprintf(gp, "set yrange [%.17g:%.17g]\n", all.ymin - d, all.ymax + d);
    else
        fprintf(gp, "set autoscale y\n");
}

/* One of the four plots: for each run with values in cols[c], its series. */
static void panel(FILE *gp, const plot_t *p, const char *title, const int *cols, int ncols, int key)
{
    fprintf(gp, "set title ");
    put_str(gp, title);
    fprintf(gp, "\n%s\nunset label 1\n", key ? "set key top right" : "unset key");
    set_ranges(gp, p->runs, p->o.nfiles, cols, ncols);
    const char *sep = "plot ";
    for (int i = 0; i < p->o.nfiles; i++)
        for (int c = 0; c < ncols; c++) {
            const run_t *r = &p->runs[i];
            int k = cols[c];
            if (!r->col[k].n)
                continue;
            fprintf(gp, "%s", sep);
            put_str(gp, r->dat);
            /* validation: points; a one-point line would draw nothing. Dash
             * and point type by run too: the curves of layouts that agree lie
             * on top of each other (filled circle in open circle, ...). */
            static const int pt[] = {7, 6, 5, 4, 9, 8};
            fprintf(gp, " using 1:%d with ", k + 2);
            if (k == C_VAL || r->col[k].n == 1)
                fprintf(gp, "%s pt %d", k == C_VAL ? "points ps 1.2" : "linespoints", pt[i % 6]);
            else
                fprintf(gp, "lines lw 1.5");
            fprintf(gp, " lc %d dt %d title ", i + 1, i % 5 + 1);
            put_str2(gp, r->path, k == C_VAL ? " (validation)" : "");
            sep = ", \\\n     ";
        }
    fprintf(gp, "%s\n", *sep == 'p' ? "plot NaN notitle" : "");
}

static int write_script(const plot_t *p, char *err, size_t errlen)
{
    FILE *gp = fopen(p->script, "w");
    if (!gp) {
        seterr(err, errlen, "cannot create '%s': %s: set TMPDIR to a writable directory", p->script, strerror(errno));
        return FAILED;
    }
    fprintf(gp, "set terminal %s size %d,%d noenhanced background rgb 'white'\nset output ",
            p->o.svg ? "svg" : "pngcairo", p->o.width, p->o.height);
    put_str(gp, p->tmpout);
    fprintf(gp, "\nset datafile missing '?'\nset grid\nset xlabel 'step'\nset format y '%%g'\n"
                "set multiplot layout 2,2");
    if (p->o.title) {
        fprintf(gp, " title ");
        put_str(gp, p->o.title);
    }
    fprintf(gp, "\n");
    static const int loss[] = {C_LOSS, C_VAL}, lr[] = {C_LR}, toks[] = {C_TOKS}, norm[] = {C_NORM};
    panel(gp, p, "loss (lines: training, points: validation)", loss, 2, 1);
    panel(gp, p, "learning rate", lr, 1, 0);
    panel(gp, p, "tokens/s", toks, 1, 0);
    panel(gp, p, "gradient norm", norm, 1, 0);
    fprintf(gp, "unset multiplot\nset output\n");
    if (ferror(gp) | (fclose(gp) != 0)) {
        seterr(err, errlen, "cannot write '%s': %s: check free space in the temporary directory", p->script,
               strerror(errno));
        return FAILED;
    }
    return 0;
}

/* ---- running gnuplot ---- */

/* What gnuplot printed, in one line: its first '"SCRIPT" line N: ...'
 * message (it echoes the command and a caret before an error), else the
 * first non-blank line; "" if none. */
static void gnuplot_said(const char *path, char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '"' && strstr(line, "\" line ")) {
            snprintf(buf, len, "%s", line);
            break;
        }
        if (!buf[0] && strspn(line, " \t") < strlen(line))
            snprintf(buf, len, "%s", line);
    }
    fclose(f);
}

static int run_gnuplot(const plot_t *p, char *err, size_t errlen)
{
    posix_spawn_file_actions_t fa;
    char *argv[] = {"gnuplot", (char *)p->script, NULL};
    pid_t pid;
    int rc = posix_spawn_file_actions_init(&fa);
    rc = rc ? rc : posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    rc = rc ? rc : posix_spawn_file_actions_addopen(&fa, 1, p->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    rc = rc ? rc : posix_spawn_file_actions_adddup2(&fa, 1, 2);
    rc = rc ? rc : posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        seterr(err, errlen, "cannot run gnuplot: %s: install gnuplot-nox (scripts/install-deps.sh)", strerror(rc));
        return FAILED;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            seterr(err, errlen, "waiting for gnuplot: %s", strerror(errno));
            return FAILED;
        }
    char said[512];
    gnuplot_said(p->log, said, sizeof said);
    struct stat st;
    int quiet = stat(p->log, &st) == 0 && st.st_size == 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && quiet)
        return 0;
    seterr(err, errlen, "gnuplot %s%s%s: no image written (gnuplot 5.4 from gnuplot-nox draws these plots)",
           !WIFEXITED(status)    ? "was killed"
           : WEXITSTATUS(status) ? "failed"
                                 : "printed a warning",
           said[0] ? ": " : "", said);
    return FAILED;
}

/* ---- main ---- */

/* The temporary directory and one data file name per run. */
static int setup(plot_t *p, char *err, size_t errlen)
{
    const char *base = getenv("TMPDIR");
    snprintf(p->tmpdir, sizeof p->tmpdir, "%s/" PROG ".XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(p->tmpdir)) {
        seterr(err, errlen, "cannot create a temporary directory '%s': %s: set TMPDIR to a writable directory",
               p->tmpdir, strerror(errno));
        p->tmpdir[0] = '\0';
        return FAILED;
    }
    snprintf(p->script, sizeof p->script, "%s/plot.gp", p->tmpdir);
    snprintf(p->log, sizeof p->log, "%s/gnuplot.out", p->tmpdir);
    size_t n = strlen(p->o.out) + 5, m = strlen(p->tmpdir) + 32;
    p->runs = calloc((size_t)p->o.nfiles, sizeof *p->runs);
    p->tmpout = malloc(n);
    int ok = p->runs && p->tmpout;
    if (ok)
        snprintf(p->tmpout, n, "%s.tmp", p->o.out);
    for (int i = 0; ok && i < p->o.nfiles; i++) {
        p->runs[i].path = p->o.files[i];
        ok = (p->runs[i].dat = malloc(m)) != NULL;
        if (ok)
            snprintf(p->runs[i].dat, m, "%s/run%d.dat", p->tmpdir, i);
    }
    if (!ok) {
        seterr(err, errlen, "out of memory");
        return FAILED;
    }
    return 0;
}

static void cleanup(plot_t *p)
{
    for (int i = 0; p->runs && i < p->o.nfiles; i++) {
        if (p->runs[i].dat)
            unlink(p->runs[i].dat);
        free(p->runs[i].dat);
    }
    if (p->tmpdir[0]) {
        unlink(p->script);
        unlink(p->log);
        rmdir(p->tmpdir);
    }
    free(p->runs);
    free(p->tmpout);
    free(p->o.files);
}

/* gnuplot draws into OUT.tmp; OUT appears only when the image is whole. */
static int draw(plot_t *p, char *err, size_t errlen)
{
    char failed[4096];
    if (fs_mkdir_parent(p->o.out, failed, sizeof failed) != 0) {
        seterr(err, errlen, "-o %s: cannot create directory '%s': %s", p->o.out, failed, strerror(errno));
        return BAD_INPUT;
    }
    /* gnuplot would say only "cannot open file" of its script's line: the
     * image's directory is checked here, where the path and the reason can
     * be named */
    int fd = open(p->tmpout, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        seterr(err, errlen, "-o %s: cannot write %s: %s: choose a directory you can write", p->o.out, p->tmpout,
               strerror(errno));
        return BAD_INPUT;
    }
    close(fd);
    int rc = write_script(p, err, errlen);
    rc = rc ? rc : run_gnuplot(p, err, errlen);
    if (rc == 0 && publish_rename(p->tmpout, p->o.out, err, errlen) != 0)
        rc = FAILED;
    if (rc != 0)
        unlink(p->tmpout);
    return rc;
}

int main(int argc, char **argv)
{
    plot_t p;
    memset(&p, 0, sizeof p);
    char err[ERRLEN] = "";
    parse_status_t st = parse_args(argc, argv, &p.o, err, sizeof err);
    int rc = st == PARSE_OK ? 0 : st == PARSE_EXIT_OK ? -1 : BAD_INPUT;
    rc = rc ? rc : setup(&p, err, sizeof err);
    for (int i = 0; rc == 0 && i < p.o.nfiles; i++)
        rc = read_run(&p.runs[i], err, sizeof err);
    rc = rc ? rc : draw(&p, err, sizeof err);
    cleanup(&p);
    if (rc > 0)
        fprintf(stderr, PROG ": error: %s\n", err);
    return rc < 0 ? 0 : rc;
}
