/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
 * ext4 and Btrfs: the checksum h5store keeps for every written shard.
 * Check value: crc32c("123456789") = 0xE3069283.
 *
 * Software slicing-by-8 (about 1.5-2 GB/s per core); on x86-64 CPUs with
 * SSE4.2 the crc32 instruction is used instead, chosen at run time, on
 * three interleaved streams of CRC32C_LANE bytes whose CRCs are then
 * combined (one stream waits on the instruction's 3-cycle latency: 6.2
 * GB/s on the dev VM from cache; three keep it busy: 17 GB/s, so memory
 * bandwidth becomes the limit). All give identical results. No global state: the tables live in a crc32c_t the caller
 * initialises once. */
#ifndef DTRAIN_CRC32C_H
#define DTRAIN_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#define CRC32C_LANE 8192 /* bytes per stream of the 3-way hardware path */

typedef struct crc32c {
    uint32_t t[8][256];     /* slicing-by-8 tables */
    uint32_t shift[4][256]; /* CRC register -> register after CRC32C_LANE zero bytes */
    int hw;                 /* 1: use the SSE4.2 instruction */
} crc32c_t;

/* Build the tables; hw = 1 when the CPU has SSE4.2 and allow_hw != 0. */
void crc32c_init(crc32c_t *c, int allow_hw);

/* Extend `crc` (0 to start) over n bytes: crc32c(a||b) ==
 * crc32c_update(crc32c_update(0, a), b), so data may arrive in pieces. */
uint32_t crc32c_update(const crc32c_t *c, uint32_t crc, const void *data, size_t n);

#endif
