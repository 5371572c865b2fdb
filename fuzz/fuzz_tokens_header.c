/* libFuzzer harness: llm.c token shard headers (io/tokens.c), untrusted
 * files users download or copy.
 *
 * Sources: io/tokens.c (no MPI, no other library).
 *
 * Input: 1 flag byte, 8 bytes of file size, then file bytes.
 *   - tokens_check_header(first 1024 bytes zero-padded, file size): the
 *     pure check; on success the size must be exactly header + count x
 *     width.
 *   - flag bit 0: the same bytes as a whole file in memory (memfd), read
 *     by tokens_open through its real path (header read, size check,
 *     widening, vocabulary check), as llm.c shards or (bit 1) headerless
 *     raw uint16, with a vocabulary size from the flag's high bits. */
#define _GNU_SOURCE /* memfd_create */
#include "io/tokens.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HDR_BYTES (TOKENS_HEADER_INTS * 4)

static void check_pure(const uint8_t *data, size_t size, uint64_t file_size)
{
    uint8_t hdr[HDR_BYTES];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, data, size < sizeof hdr ? size : sizeof hdr);
    int width = 0;
    size_t count = 0;
    char err[512];
    err[0] = '\0';
    if (tokens_check_header(hdr, file_size, "fuzz.bin", &width, &count, err, sizeof err) == 0) {
        if ((width != 2 && width != 4) || count == 0 ||
            file_size != (uint64_t)HDR_BYTES + (uint64_t)count * (uint64_t)width)
            abort();
    } else if (err[0] == '\0' || strchr(err, '\n') != NULL) {
        abort();
    }
}

/* The whole reader on an in-memory file named /proc/self/fd/N. */
static void check_file(const uint8_t *data, size_t size, uint8_t flag)
{
    int fd = memfd_create("fuzz_tokens", MFD_CLOEXEC);
    if (fd < 0)
        return;
    if (size == 0 || write(fd, data, size) == (ssize_t)size) {
        char path[64], err[512];
        err[0] = '\0';
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        tokens_format_t fmt = (flag & 2) ? TOKENS_FORMAT_RAW_U16 : TOKENS_FORMAT_LLMC;
        int vocab = (flag >> 2) == 63 ? 0 : 1 + (flag >> 2) * 1000;
        token_set_t set;
        if (tokens_open(&set, path, fmt, vocab, err, sizeof err) == 0) {
            for (size_t i = 0; i < set.shard[0].n; i++)
                if (set.shard[0].tok[i] < 0 || set.shard[0].tok[i] >= vocab)
                    abort();
            tokens_close(&set);
        } else if (err[0] == '\0' || strchr(err, '\n') != NULL) {
            abort();
        }
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 9)
        return 0;
    uint8_t flag = data[0];
    uint64_t file_size;
    memcpy(&file_size, data + 1, 8);
    data += 9;
    size -= 9;
    check_pure(data, size, file_size);
    check_pure(data, size, (uint64_t)size);
    if (flag & 1)
        check_file(data, size, flag);
    return 0;
}
