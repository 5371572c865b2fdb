/* Small text-parsing helpers shared by the parsers of src/: the --config
 * file (src/train/options.c), --hw profiles (src/plan/hw.c) and the
 * benchmark tools' arguments (src/dtrain_bench_comm.c,
 * src/dtrain_bench_gemm.c). Each caller words its own error messages;
 * these only say whether the text was well formed. */
#ifndef DTRAIN_STRPARSE_H
#define DTRAIN_STRPARSE_H

/* s without leading spaces and tabs, and with trailing spaces, tabs, '\n'
 * and '\r' cut off (written over with '\0'): a pointer into s. */
char *trim(char *s);

/* s as a base-10 long in lo..hi into *out: 0, or -1 (and *out untouched)
 * when s is empty, has anything after the digits, overflows or is out of
 * range. Leading white space and a sign are accepted, as strtol does. */
int parse_long(const char *s, long lo, long hi, long *out);

#endif
