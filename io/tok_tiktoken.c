/* TEMPORARY placeholder (helper A) */
#include "tokenizer.h"
#include <stdio.h>
int tok_tiktoken_open(tokenizer_t *tk, const char *file, const char *encoding, char *err, size_t errlen)
{ (void)tk; (void)encoding; snprintf(err, errlen, "tiktoken (%s): not built yet", file); return -1; }
