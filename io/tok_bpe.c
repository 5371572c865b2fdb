/* TEMPORARY placeholder (helper A) */
#include "tok_bpe.h"
int tok_bpe_placeholder_(void);
int tok_bpe_placeholder_(void) { return 0; }
