/* CRC-32C: slicing-by-8 tables, plus the SSE4.2 crc32 instruction on
 * x86-64 when the CPU has it. See crc32c.h. */
#include "crc32c.h"

#include <string.h>

#define POLY 0x82F63B78u /* Castagnoli, bit-reflected */

void crc32c_init(crc32c_t *c, int allow_hw)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t r = i;
        for (int k = 0; k < 8; k++)
            r = (r >> 1) ^ (POLY & (0u - (r & 1u)));
        c->t[0][i] = r;
    }
    /* t[k][i]: the CRC of byte i followed by k zero bytes */
    for (int k = 1; k < 8; k++)
        for (int i = 0; i < 256; i++)
            c->t[k][i] = (c->t[k - 1][i] >> 8) ^ c->t[0][c->t[k - 1][i] & 0xff];
    c->hw = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (allow_hw) {
        __builtin_cpu_init();
        c->hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
#else
    (void)allow_hw;
#endif
}

static uint32_t crc_sw(const crc32c_t *c, uint32_t crc, const unsigned char *p, size_t n)
{
    /* bytes up to 8-byte alignment, then 8 at a time (little-endian load) */
    while (n > 0 && ((uintptr_t)p & 7u) != 0) {
        crc = (crc >> 8) ^ c->t[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = c->t[7][w & 0xff] ^ c->t[6][(w >> 8) & 0xff] ^ c->t[5][(w >> 16) & 0xff] ^
              c->t[4][(w >> 24) & 0xff] ^ c->t[3][(w >> 32) & 0xff] ^ c->t[2][(w >> 40) & 0xff] ^
              c->t[1][(w >> 48) & 0xff] ^ c->t[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        crc = (crc >> 8) ^ c->t[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c64 = crc;
    while (n > 0 && ((uintptr_t)p & 7u) != 0) {
        c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
    return (uint32_t)c64;
}
#endif

uint32_t crc32c_update(const crc32c_t *c, uint32_t crc, const void *data, size_t n)
{
    /* the standard pre- and post-inversion, so updates chain */
    crc = ~crc;
#if defined(__x86_64__) && defined(__GNUC__)
    if (c->hw)
        return ~crc_hw(crc, data, n);
#endif
    return ~crc_sw(c, crc, data, n);
}
