/* checksum.c — CRC-32C by slicing-by-8 tables (reflected polynomial 0x82f63b78), built once. */
#include "checkpoint/checksum.h"

#include <pthread.h>

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int b = 0; b < 8; b++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
}

uint32_t moe_crc32c(uint32_t crc, const void *data, size_t nbytes) {
    pthread_once(&table_once, build_table);
    const unsigned char *p = data;
    crc = ~crc;
    for (; nbytes >= 8; p += 8, nbytes -= 8) {
        /* eight bytes at once: each byte's contribution through its own table (little-endian order) */
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
              table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
    }
    for (; nbytes; p++, nbytes--) crc = (crc >> 8) ^ table[0][(crc ^ *p) & 0xff];
    return ~crc;
}
