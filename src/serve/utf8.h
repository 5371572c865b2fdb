/* Model output as JSON text: token bytes are not always UTF-8 (a byte-level
 * tokenizer's token may hold part of a character), and a JSON string must
 * be. */
#ifndef DTRAIN_SERVE_UTF8_H
#define DTRAIN_SERVE_UTF8_H

#include <stddef.h>

#include "io/tokenizer.h"

/* Appends s[0..n) to out as UTF-8, each maximal ill-formed subpart
 * replaced by U+FFFD (Unicode's "substitution of maximal subparts", as
 * Python's bytes.decode(errors="replace") does). at, when not NULL, gets
 * [n + 1] entries: at[i] = the characters written before the one byte i
 * belongs to (at[n]: all of them), the character offsets of byte
 * positions. Returns 0, or -1 out of memory. */
int utf8_lossy(const unsigned char *s, size_t n, tok_bytes_t *out, size_t *at);

/* 1 when s[0..n) is well-formed UTF-8 without NUL. */
int utf8_valid(const unsigned char *s, size_t n);

#endif
