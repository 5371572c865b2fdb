#include "src/data/blend.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The next blank-separated word of *s (advanced past it) in new memory,
 * NULL at the end (or out of memory: *oom set). */
static char *next_word(const char **s, int *oom)
{
    const char *p = *s;
    while (*p && isspace((unsigned char)*p))
        p++;
    const char *q = p;
    while (*q && !isspace((unsigned char)*q))
        q++;
    *s = q;
    if (q == p)
        return NULL;
    char *w = strndup(p, (size_t)(q - p));
    *oom = w == NULL;
    return w;
}

static int is_number(const char *w, double *v)
{
    char *end;
    *v = strtod(w, &end);
    return end != w && *end == '\0';
}

/* "megatron:PATH" -> its format and PATH; a path without a known prefix
 * keeps the default format. */
static const char *strip_format(const char *path, tokens_format_t *fmt)
{
    static const char *const names[] = {"llmc:", "raw-u16:", "megatron:", NULL};
    for (const char *const *n = names; *n; n++)
        if (strncmp(path, *n, strlen(*n)) == 0) {
            char name[16];
            snprintf(name, sizeof name, "%.*s", (int)strlen(*n) - 1, *n);
            tokens_format_parse(name, fmt);
            return path + strlen(*n);
        }
    return path;
}

static int add_part(blend_spec_t *b, double w, const char *path, tokens_format_t fmt, char *err, size_t errlen)
{
    if (b->n == BLEND_MAX_PARTS) {
        snprintf(err, errlen, "data blend: more than %d datasets: merge some of them first", BLEND_MAX_PARTS);
        return -1;
    }
    const char *p = strip_format(path, &fmt);
    if (!*p) {
        snprintf(err, errlen, "data blend: '%s' names no path after its format", path);
        return -1;
    }
    b->weight[b->n] = w;
    b->fmt[b->n] = fmt;
    if (!(b->path[b->n] = strdup(p))) {
        snprintf(err, errlen, "out of memory parsing the data blend");
        return -1;
    }
    b->n++;
    return 0;
}

/* "W PATH W PATH ...": every weight positive and finite, normalised. */
static int parse_pairs(const char *spec, tokens_format_t fmt, blend_spec_t *b, char *err, size_t errlen)
{
    const char *s = spec;
    double sum = 0.0;
    int oom = 0, rc = 0;
    char *w;
    while (rc == 0 && (w = next_word(&s, &oom)) != NULL) {
        double v;
        char *path = next_word(&s, &oom);
        if (!is_number(w, &v) || !isfinite(v) || v <= 0.0) {
            snprintf(err, errlen,
                     "data blend '%s': weight '%s' is not a positive number (the syntax is "
                     "\"W1 PATH1 W2 PATH2 ...\")",
                     spec, w);
            rc = -1;
        } else if (!path) {
            snprintf(err, errlen,
                     "data blend '%s': weight %s has no path after it (the syntax is "
                     "\"W1 PATH1 W2 PATH2 ...\")",
                     spec, w);
            rc = -1;
        } else {
            rc = add_part(b, v, path, fmt, err, errlen);
            sum += v;
        }
        free(w);
        free(path);
    }
    if (rc == 0 && oom) {
        snprintf(err, errlen, "out of memory parsing the data blend");
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < b->n; i++)
        b->weight[i] /= sum;
    return rc;
}

int blend_parse(const char *spec, tokens_format_t fmt, blend_spec_t *b, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    const char *s = spec;
    int oom = 0;
    char *first = next_word(&s, &oom);
    double v;
    const int blend = first && is_number(first, &v);
    free(first);
    int rc = blend ? parse_pairs(spec, fmt, b, err, errlen) : add_part(b, 1.0, spec, fmt, err, errlen);
    if (rc != 0)
        blend_free(b);
    return rc;
}

void blend_free(blend_spec_t *b)
{
    for (int i = 0; i < b->n; i++)
        free(b->path[i]);
    memset(b, 0, sizeof *b);
}

int blend_pick(const double *weight, const uint64_t *count, int n_parts, uint64_t n)
{
    int best = -1, lag = 0;
    double due = 0.0, least = INFINITY;
    for (int i = 0; i < n_parts; i++) {
        const double ahead = (double)count[i] - weight[i] * (double)(n + 1);
        if (ahead < least) {
            least = ahead;
            lag = i;
        }
        if (ahead >= 0.0)
            continue; /* one more now would put it a whole sample ahead */
        const double d = ((double)count[i] + 1.0) / weight[i];
        if (best < 0 || d < due) {
            best = i;
            due = d;
        }
    }
    return best >= 0 ? best : lag; /* rounding can leave none eligible: the most behind */
}
