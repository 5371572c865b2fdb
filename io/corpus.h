/* TEMPORARY placeholder */
#ifndef DTRAIN_CORPUS_H
#define DTRAIN_CORPUS_H
#endif
