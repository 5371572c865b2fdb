/* TEMPORARY placeholder (helper A) */
#include "tokenizer.h"
#include <stdio.h>
int tok_gpt2_open(tokenizer_t *tk, const char *dir, char *err, size_t errlen)
{ (void)tk; snprintf(err, errlen, "gpt2 (%s): not built yet", dir); return -1; }
