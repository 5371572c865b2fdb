/* TEMPORARY placeholder */
#include "megatron.h"
int megatron_placeholder_(void);
int megatron_placeholder_(void) { return 0; }
