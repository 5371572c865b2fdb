#include "src/serve/utf8.h"

/* The well-formed sequence a lead byte c starts: its continuation bytes
 * (need) and the range of the first of them; need -1: c starts none. */
static int lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80)
        return 0;
    if (c >= 0xC2 && c <= 0xDF)
        return 1;
    if (c == 0xE0)
        *lo = 0xA0;
    else if (c == 0xED)
        *hi = 0x9F;
    if (c >= 0xE0 && c <= 0xEF)
        return 2;
    if (c == 0xF0)
        *lo = 0x90;
    else if (c == 0xF4)
        *hi = 0x8F;
    if (c >= 0xF0 && c <= 0xF4)
        return 3;
    return -1;
}

/* Bytes of the character at s[i..n): *ok 1 when well-formed, else the
 * length of its maximal ill-formed subpart (at least 1). */
static size_t char_len(const unsigned char *s, size_t n, size_t i, int *ok)
{
    unsigned char lo, hi;
    const int need = lead(s[i], &lo, &hi);
    if (need < 0) {
        *ok = 0;
        return 1;
    }
    size_t j = i + 1;
    for (int k = 0; k < need; k++, j++) {
        if (j >= n || s[j] < lo || s[j] > hi) {
            *ok = 0;
            return j - i;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    *ok = 1;
    return j - i;
}

int utf8_lossy(const unsigned char *s, size_t n, tok_bytes_t *out, size_t *at)
{
    static const unsigned char fffd[3] = {0xEF, 0xBF, 0xBD};
    size_t chars = 0;
    for (size_t i = 0; i < n;) {
        int ok;
        const size_t len = char_len(s, n, i, &ok);
        if (at)
            for (size_t k = 0; k < len; k++)
                at[i + k] = chars;
        if (tok_bytes_append(out, ok ? s + i : fffd, ok ? len : sizeof fffd) != 0)
            return -1;
        chars++;
        i += len;
    }
    if (at)
        at[n] = chars;
    return 0;
}

int utf8_valid(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int ok;
        const size_t len = char_len(s, n, i, &ok);
        if (!ok || s[i] == 0)
            return 0;
        i += len;
    }
    return 1;
}
