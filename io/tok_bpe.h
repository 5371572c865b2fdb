/* TEMPORARY placeholder while the BPE core is written (helper A). */
#ifndef DTRAIN_TOK_BPE_H
#define DTRAIN_TOK_BPE_H
#include "tokenizer.h"
#endif
