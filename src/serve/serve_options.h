/* dtrain-serve's command line: one option table (src/cli/optable.h) for
 * the arguments, --help and the one-line errors. */
#ifndef DTRAIN_SERVE_OPTIONS_H
#define DTRAIN_SERVE_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "src/backend/backend.h"

#define SERVE_PATH_MAX 4096

typedef struct serve_opts {
    char init_from[SERVE_PATH_MAX]; /* checkpoint, --save-params file, Hugging Face directory or llm.c file */
    int tp, pp;
    char host[256]; /* the address to listen on */
    int port;       /* 0: any free port (printed) */
    char model_name[256];
    char tokenizer[SERVE_PATH_MAX]; /* auto | SPEC */
    int seq_len;                    /* context length; 0: the model's */
    int batch;                      /* rows per forward */
    long long max_body;             /* bytes of a request body */
    int max_queue;                  /* requests waiting for the model */
    long long seed;                 /* of requests that give none: seed + their number */
    int threads;
    backend_device_t device;
    backend_dtype_t dtype;
} serve_opts_t;

typedef enum { SERVE_OPTS_OK = 0, SERVE_OPTS_EXIT_OK = 1, SERVE_OPTS_ERROR = 2 } serve_opts_status_t;

/* Parses argv into o; --help and --version print to stdout when print is
 * set (rank 0). err: one line on SERVE_OPTS_ERROR. */
serve_opts_status_t serve_opts_parse(serve_opts_t *o, int argc, char **argv, int print, char *err, size_t errlen);

/* Every option as "  name = value" lines (the banner). */
void serve_opts_print(const serve_opts_t *o, FILE *out);

#endif
