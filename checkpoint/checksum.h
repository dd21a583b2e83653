/* checksum.h — CRC-32C (Castagnoli, the polynomial of iSCSI and ext4), for checkpoint tensors: what a
 * checkpoint stores beside every tensor so that a load can name the tensor whose bytes changed. */
#ifndef MOE_CHECKPOINT_CHECKSUM_H
#define MOE_CHECKPOINT_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* crc of `nbytes` bytes continuing from `crc` (start with 0). crc32c("123456789") = 0xe3069283. */
uint32_t moe_crc32c(uint32_t crc, const void *data, size_t nbytes);

#endif
