/* TEMPORARY placeholder */
#include "tok_sidecar.h"
int tok_sidecar_placeholder_(void);
int tok_sidecar_placeholder_(void) { return 0; }
