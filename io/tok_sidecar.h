/* TEMPORARY placeholder */
#ifndef DTRAIN_TOK_SIDECAR_H
#define DTRAIN_TOK_SIDECAR_H
#endif
