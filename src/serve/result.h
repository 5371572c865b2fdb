/* What a request's computation gives back to rank 0, by prompt: the
 * echoed prompt's scores and the generated tokens with theirs. No MPI,
 * no model: response.c and the fuzz harness use it alone. */
#ifndef DTRAIN_SERVE_RESULT_H
#define DTRAIN_SERVE_RESULT_H

#include <stdint.h>

#include "src/serve/request.h"

/* k = max(logprobs, 0) alternatives per position. */
typedef struct serve_out {
    int k;
    double *plp;               /* [total] with echo and logprobs: log p of prompt token j after the ones before (j = 0: NAN) */
    int32_t *ptop_id;          /* [total * k] the k most likely tokens in place of prompt token j (j = 0: none) */
    double *ptop_lp;           /* [total * k] */
    int *gen_n;                /* [n] tokens generated for prompt i */
    int32_t *gen;              /* [n * max_tokens] */
    double *glp;               /* [n * max_tokens] log p of each generated token (with logprobs) */
    int32_t *gtop_id;          /* [n * max_tokens * k] */
    double *gtop_lp;           /* [n * max_tokens * k] */
    long *stop_at;             /* [n] the completion's text ends at this byte (a stop sequence began there), else -1 */
} serve_out_t;

/* Sized for r (zeroed counts, no stop); 0, or -1 out of memory. */
int serve_out_alloc(serve_out_t *o, const serve_req_t *r);
void serve_out_free(serve_out_t *o);

#endif
