/* TEMPORARY placeholder */
#ifndef DTRAIN_MEGATRON_H
#define DTRAIN_MEGATRON_H
#endif
