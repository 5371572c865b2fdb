// TEMPORARY placeholder (helper B)
#include <cstdio>
extern "C" {
#include "tokenizer.h"
int tok_spm_open(tokenizer_t *tk, const char *model, int add_eos, char *err, size_t errlen)
{ (void)tk; (void)add_eos; snprintf(err, errlen, "spm (%s): not built yet", model); return -1; }
}
