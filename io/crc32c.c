/* CRC-32C: slicing-by-8 tables, plus the SSE4.2 crc32 instruction on
 * x86-64 when the CPU has it. See crc32c.h. */
#include "io/crc32c.h"

#include <string.h>

#define POLY 0x82F63B78u /* Castagnoli, bit-reflected */

static uint32_t crc_sw(const crc32c_t *c, uint32_t crc, const unsigned char *p, size_t n);

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
    /* Appending L zero bytes is linear in the 32-bit register: tabulate it
     * bytewise from the images of the 32 unit vectors. */
    uint32_t basis[32];
    static const unsigned char zeros[CRC32C_LANE];
    for (int b = 0; b < 32; b++)
        basis[b] = crc_sw(c, 1u << b, zeros, sizeof zeros);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 256; i++) {
            uint32_t v = 0;
            for (int j = 0; j < 8; j++)
                if (i & (1 << j))
                    v ^= basis[8 * k + j];
            c->shift[k][i] = v;
        }
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
        crc = c->t[7][w & 0xff] ^ c->t[6][(w >> 8) & 0xff] ^ c->t[5][(w >> 16) & 0xff] ^ c->t[4][(w >> 24) & 0xff] ^
              c->t[3][(w >> 32) & 0xff] ^ c->t[2][(w >> 40) & 0xff] ^ c->t[1][(w >> 48) & 0xff] ^ c->t[0][w >> 56];
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

static uint32_t shift_lane(const crc32c_t *c, uint32_t v)
{
    return c->shift[0][v & 0xff] ^ c->shift[1][(v >> 8) & 0xff] ^ c->shift[2][(v >> 16) & 0xff] ^ c->shift[3][v >> 24];
}

/* Blocks of three lanes A, B, D: the register is linear in (register,
 * data), so crc(A B D) = shift(shift(crc(A)) ^ crc0(B)) ^ crc0(D), where
 * crc0 starts from 0 and shift appends a lane of zeros. The three crc32
 * chains are independent, so the CPU overlaps them. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw3(const crc32c_t *c, uint32_t crc, const unsigned char *p,
                                                          size_t n)
{
    while (n >= 3 * (size_t)CRC32C_LANE) {
        uint64_t a = crc, b = 0, d = 0;
        for (size_t i = 0; i < CRC32C_LANE; i += 8) {
            uint64_t wa, wb, wd;
            memcpy(&wa, p + i, 8);
            memcpy(&wb, p + CRC32C_LANE + i, 8);
            memcpy(&wd, p + 2 * CRC32C_LANE + i, 8);
            a = __builtin_ia32_crc32di(a, wa);
            b = __builtin_ia32_crc32di(b, wb);
            d = __builtin_ia32_crc32di(d, wd);
        }
        crc = shift_lane(c, shift_lane(c, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
        p += 3 * (size_t)CRC32C_LANE;
        n -= 3 * (size_t)CRC32C_LANE;
    }
    return crc_hw(crc, p, n);
}
#endif

uint32_t crc32c_update(const crc32c_t *c, uint32_t crc, const void *data, size_t n)
{
    /* the standard pre- and post-inversion, so updates chain */
    crc = ~crc;
#if defined(__x86_64__) && defined(__GNUC__)
    if (c->hw)
        return ~crc_hw3(c, crc, data, n);
#endif
    return ~crc_sw(c, crc, data, n);
}
