/* FUZZ-ONLY stub, never linked into dtrain: io/tokenizer.c dispatches
 * "spm:MODEL" to tok_spm_open, which lives in io/tok_spm.cc (C++,
 * SentencePiece). The harnesses are C built with clang's libFuzzer and
 * fuzz the GPT-2/tiktoken/JSONL parsers, not SentencePiece's own model
 * parser, so they link this instead of the C++ library. */
#include "io/tokenizer.h"

#include <stdio.h>

int tok_spm_open(tokenizer_t *tk, const char *model, int add_eos, char *err, size_t errlen)
{
    (void)tk;
    (void)add_eos;
    snprintf(err, errlen, "SentencePiece '%s' is not built into the fuzzers", model);
    return -1;
}
