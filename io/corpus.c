/* TEMPORARY placeholder */
#include "corpus.h"
int corpus_placeholder_(void);
int corpus_placeholder_(void) { return 0; }
