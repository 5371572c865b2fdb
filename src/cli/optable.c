#include "src/cli/optable.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const opt_def_t *opt_find(const opt_table_t *t, const char *name, size_t len)
{
    for (int i = 0; i < t->n; i++)
        if (strlen(t->defs[i].name) == len && strncmp(t->defs[i].name, name, len) == 0)
            return &t->defs[i];
    return NULL;
}

const char *opt_allowed(const opt_def_t *d, const char *sep, char *buf, size_t len)
{
    buf[0] = '\0';
    for (const char *const *c = d->names; c && *c; c++)
        if (**c) /* "" (unset) is allowed but not worth listing */
            snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? sep : "", *c);
    return buf;
}

/* The index of value in d->names, or -1 with the error in err. */
static int find_name(const opt_def_t *d, const char *value, const char *where, char *err, size_t errlen)
{
    for (int k = 0; d->names && d->names[k]; k++)
        if (strcmp(d->names[k], value) == 0)
            return k;
    char allowed[256];
    snprintf(err, errlen, "%s--%s '%s': allowed values are %s", where, d->name, value,
             opt_allowed(d, "|", allowed, sizeof allowed));
    return -1;
}

static int set_integer(const opt_def_t *d, void *field, const char *value, const char *where, char *err, size_t errlen)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end != '\0') {
        snprintf(err, errlen, "%s--%s '%s': not an integer", where, d->name, value);
        return -1;
    }
    if ((double)v < d->min || (double)v > d->max) {
        snprintf(err, errlen, "%s--%s %s: out of range (%.0f to %.0f)", where, d->name, value, d->min, d->max);
        return -1;
    }
    if (d->kind == OPT_INT)
        *(int *)field = (int)v;
    else if (d->kind == OPT_LONG)
        *(long *)field = (long)v;
    else
        *(long long *)field = v;
    return 0;
}

static int set_real(const opt_def_t *d, void *field, const char *value, const char *where, char *err, size_t errlen)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end != '\0' || !isfinite(v)) {
        snprintf(err, errlen, "%s--%s '%s': not a number", where, d->name, value);
        return -1;
    }
    if (v < d->min || v > d->max) {
        snprintf(err, errlen, "%s--%s %s: out of range (%g to %g)", where, d->name, value, d->min, d->max);
        return -1;
    }
    *(double *)field = v;
    return 0;
}

static int set_string(const opt_def_t *d, void *field, const char *value, const char *where, char *err, size_t errlen)
{
    if (d->names && *value && find_name(d, value, where, err, errlen) < 0)
        return -1;
    if (d->size == 0) {
        *(const char **)field = value;
        return 0;
    }
    if (strlen(value) >= d->size) {
        snprintf(err, errlen, "%s--%s: value longer than %zu characters", where, d->name, d->size - 1);
        return -1;
    }
    memcpy(field, value, strlen(value) + 1);
    return 0;
}

int opt_set(const opt_def_t *d, void *dst, const char *value, const char *where, char *err, size_t errlen)
{
    void *field = (char *)dst + d->offset;
    int rc = 0;
    switch (d->kind) {
    case OPT_FLAG:
        if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0) {
            snprintf(err, errlen, "%s--%s '%s': a flag takes 0 or 1", where, d->name, value);
            return -1;
        }
        *(int *)field = value[0] == '1';
        break;
    case OPT_INT:
    case OPT_LONG:
    case OPT_LLONG: rc = set_integer(d, field, value, where, err, errlen); break;
    case OPT_REAL: rc = set_real(d, field, value, where, err, errlen); break;
    case OPT_ENUM: {
        const int k = find_name(d, value, where, err, errlen);
        if (k < 0)
            return -1;
        *(int *)field = k;
        break;
    }
    case OPT_ARG: rc = d->parse(value, dst, field, err, errlen); break;
    case OPT_STR:
    default: rc = set_string(d, field, value, where, err, errlen); break;
    }
    if (rc == 0 && d->given)
        *(int *)((char *)dst + d->given - 1) = 1;
    return rc;
}

int opt_defaults(const opt_table_t *t, void *dst, char *err, size_t errlen)
{
    for (int i = 0; i < t->n; i++) {
        if (!t->defs[i].def)
            continue;
        opt_def_t quiet = t->defs[i]; /* a default does not count as given */
        quiet.given = 0;
        if (opt_set(&quiet, dst, quiet.def, "default ", err, errlen) != 0)
            return -1;
    }
    return 0;
}

int opt_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        if (strcmp(argv[i], "--version") == 0)
            return 2;
    }
    return 0;
}

int opt_answer_help(int argc, char **argv, int print, void (*usage)(FILE *), const char *version)
{
    const int help = opt_wants_help(argc, argv);
    if (help == 1 && print)
        usage(stdout);
    if (help == 2 && print)
        printf("%s\n", version);
    return help != 0;
}

/* argv[*i] as an option of t with its value (consuming the next argument
 * when it is not attached with '='). NULL with one line in err. */
static const opt_def_t *next_option(const opt_table_t *t, int argc, char **argv, int *i, const char **value, char *err,
                                    size_t errlen)
{
    const char *a = argv[*i], *name = a + 2, *eq = strchr(name, '=');
    const size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const opt_def_t *d = opt_find(t, name, len);
    if (!d) {
        snprintf(err, errlen, "unknown option '%.*s' (%s --help lists them)", (int)len + 2, a, t->prog);
        return NULL;
    }
    *value = eq ? eq + 1 : NULL;
    if (!*value && d->kind == OPT_FLAG)
        *value = "1";
    if (!*value) {
        if (*i + 1 >= argc) {
            snprintf(err, errlen, "--%s needs a value", d->name);
            return NULL;
        }
        *value = argv[++*i];
    }
    return d;
}

int opt_parse_argv(const opt_table_t *t, int argc, char **argv, void *dst, const char *only, const char *skip,
                   int *first_pos, char *err, size_t errlen)
{
    char **pos = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *pos);
    int n_pos = 0, rc = 0;
    if (!pos) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i], *value = NULL;
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            if (!t->positional) {
                snprintf(err, errlen, "unexpected argument '%s': options are --name value (%s --help)", a, t->prog);
                rc = -1;
            }
            pos[n_pos++] = argv[i];
            continue;
        }
        const opt_def_t *d = next_option(t, argc, argv, &i, &value, err, errlen);
        if (!d)
            rc = -1;
        else if ((!only || strcmp(d->name, only) == 0) && (!skip || strcmp(d->name, skip) != 0))
            rc = opt_set(d, dst, value, "", err, errlen);
    }
    if (rc == 0 && first_pos) {
        /* the options first, then the positional arguments in order */
        int k = 1;
        for (int i = 1; i < argc; i++) {
            int is_pos = 0;
            for (int j = 0; j < n_pos; j++)
                is_pos |= argv[i] == pos[j];
            if (!is_pos)
                argv[k++] = argv[i];
        }
        *first_pos = k;
        for (int j = 0; j < n_pos; j++)
            argv[k++] = pos[j];
    }
    free(pos);
    return rc;
}

static const char *metavar(const opt_def_t *d)
{
    if (d->metavar)
        return d->metavar;
    switch (d->kind) {
    case OPT_FLAG: return "";
    case OPT_REAL: return "X";
    case OPT_INT:
    case OPT_LONG:
    case OPT_LLONG: return "N";
    default: return "STR";
    }
}

void opt_print_help(const opt_table_t *t, FILE *out, int width, int with_default)
{
    for (int i = 0; i < t->n; i++) {
        const opt_def_t *d = &t->defs[i];
        char lhs[96];
        snprintf(lhs, sizeof lhs, "--%s%s%s", d->name, *metavar(d) ? " " : "", metavar(d));
        fprintf(out, "  %-*s%s", width, lhs, (int)strlen(lhs) > width ? "  " : " ");
        for (const char *p = d->help;;) {
            const char *nl = strchr(p, '\n');
            fprintf(out, "%.*s", nl ? (int)(nl - p) : (int)strlen(p), p);
            if (!nl)
                break;
            fprintf(out, "\n  %-*s ", width, "");
            p = nl + 1;
        }
        if (with_default)
            fprintf(out, " [%s]", d->def ? d->def : "");
        fprintf(out, "\n");
    }
    /* every tool answers these two before its table is parsed */
    fprintf(out, "  %-*s print this help and exit\n  %-*s print the version and exit\n", width, "-h, --help", width,
            "--version");
}

void opt_print_values(const opt_table_t *t, const void *src, FILE *f)
{
    for (int i = 0; i < t->n; i++) {
        const opt_def_t *d = &t->defs[i];
        const char *field = (const char *)src + d->offset;
        fprintf(f, "  %-14s = ", d->name);
        switch (d->kind) {
        case OPT_INT:
        case OPT_FLAG: fprintf(f, "%d\n", *(const int *)field); break;
        case OPT_LONG: fprintf(f, "%ld\n", *(const long *)field); break;
        case OPT_LLONG: fprintf(f, "%lld\n", *(const long long *)field); break;
        case OPT_REAL: fprintf(f, "%g\n", *(const double *)field); break;
        case OPT_ENUM: fprintf(f, "%s\n", d->names[*(const int *)field]); break;
        case OPT_ARG:
        case OPT_STR:
        default:
            fprintf(f, "%s\n", d->size ? field : *(const char *const *)field ? *(const char *const *)field : "");
            break;
        }
    }
}
