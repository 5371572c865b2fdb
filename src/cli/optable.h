/* Option tables: the one way dtrain and its tools (dtrain-prepare,
 * dreshard, dtrain-bench-comm, dtrain-bench-gemm) read their arguments.
 * A tool describes each option once, {name, type, default, help, allowed
 * values or enum name table, destination}, and the table drives the
 * command line (`--name value` or `--name=value`; a bare `--flag` is 1),
 * the defaults, --help and the one-line errors, so the help's allowed
 * values and the parse error's come from the same place.
 *
 * Errors, one line each (the caller prefixes the program and exits 2):
 *   unknown option '--x' (PROG --help lists them)
 *   --name needs a value
 *   --name 'v': not an integer | not a number | a flag takes 0 or 1
 *   --name v: out of range (LO to HI)
 *   --name 'v': allowed values are a|b|c
 * An OPT_ARG option's parse function words its own. */
#ifndef DTRAIN_OPTABLE_H
#define DTRAIN_OPTABLE_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    OPT_INT,   /* int, min..max */
    OPT_LONG,  /* long, min..max */
    OPT_LLONG, /* long long, min..max */
    OPT_REAL,  /* double, min..max, finite */
    OPT_FLAG,  /* int 0/1; on the command line a bare `--name` is 1 */
    OPT_STR,   /* size > 0: a char[size] copy; size 0: a const char * to the text (argv or the default) */
    OPT_ENUM,  /* an enum (int-sized): the index of the value in names */
    OPT_ARG    /* parse(value, field) converts and checks it */
} opt_kind_t;

/* OPT_ARG: converts value into field (inside dst, the whole options
 * struct, for a parse that depends on or fills other options). */
typedef int (*opt_parse_fn)(const char *value, void *dst, void *field, char *err, size_t errlen);

typedef struct opt_def {
    const char *name; /* long option without "--"; also dtrain's config-file key */
    opt_kind_t kind;
    size_t offset;   /* of the destination field in the options struct */
    size_t size;     /* OPT_STR (and OPT_ARG, for printing): the buffer's size (0: a pointer) */
    const char *def; /* default, parsed like user input (NULL: the field is left as it is) */
    double min, max; /* numeric range, inclusive */
    /* OPT_ENUM: the enum's name table, indexed by value, NULL-terminated
     * (it sits beside the enum, in the owner's header); OPT_STR: the
     * allowed values (NULL = any). "" is allowed but never listed. */
    const char *const *names;
    const char *help;    /* may hold '\n': continuation lines are indented under the first */
    const char *metavar; /* --help's placeholder (NULL: N, X, NAME or STR by kind; "" for flags) */
    opt_parse_fn parse;  /* OPT_ARG */
    size_t given;        /* offset+1 of an int set to 1 when the option is given (0 = none) */
} opt_def_t;

typedef struct opt_table {
    const char *prog; /* in "unknown option ... (PROG --help lists them)" */
    const opt_def_t *defs;
    int n;
    int positional; /* arguments without "--" are allowed (returned by opt_parse_argv) */
} opt_table_t;

/* The option called name[0..len). NULL when there is none. */
const opt_def_t *opt_find(const opt_table_t *t, const char *name, size_t len);

/* Sets one option of dst from value; where ("" or "FILE:LINE: ") starts
 * the error. Returns 0, or -1 with one line in err. */
int opt_set(const opt_def_t *d, void *dst, const char *value, const char *where, char *err, size_t errlen);

/* Every option of dst to its default. Returns 0, or -1 (a table bug). */
int opt_defaults(const opt_table_t *t, void *dst, char *err, size_t errlen);

/* 1 when argv holds --help (or -h), 2 for --version, else 0: these win
 * wherever they are. */
int opt_wants_help(int argc, char **argv);

/* Every program's answer to them: when argv holds --help or --version,
 * prints (where print is set) usage(stdout) or the line version ("dreshard
 * (dtrain) 0.1.0") and returns 1, the program being done (exit 0); else 0. */
int opt_answer_help(int argc, char **argv, int print, void (*usage)(FILE *), const char *version);

/* Parses argv[1..] into dst (defaults already set). Positional arguments
 * (when the table allows them) are moved, in order, to the end of argv;
 * *first_pos is the index of the first (argc when none). only, when not
 * NULL, restricts this pass to that option (dtrain's --config first) and
 * skip to every other one. Returns 0 or -1 with one line in err. */
int opt_parse_argv(const opt_table_t *t, int argc, char **argv, void *dst, const char *only, const char *skip,
                   int *first_pos, char *err, size_t errlen);

/* The allowed values of an OPT_ENUM or OPT_STR option as "a|b|c" (sep
 * between them) into buf. */
const char *opt_allowed(const opt_def_t *d, const char *sep, char *buf, size_t len);

/* --help rows: "  --name META" padded to width, then the help, its
 * continuation lines indented as far; with_default appends " [default]".
 * Ends with the -h/--help and --version rows every tool answers. */
void opt_print_help(const opt_table_t *t, FILE *out, int width, int with_default);

/* Every option as "  name = value" lines (enums by name). */
void opt_print_values(const opt_table_t *t, const void *src, FILE *out);

#endif
