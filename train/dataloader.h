/* dataloader.h — llm.c token files and the global batch, each rank reading its own slice.
 *
 * File formats (llm.c's, dev/data/data_common.py): a header of 256 little-endian int32 — [0] magic, [1] version,
 * [2] number of tokens N — then N little-endian tokens:
 *   magic 20240520, version 1: uint16 tokens (GPT-2's; vocabularies up to 65536)
 *   magic 20240801, version 7: uint32 tokens (llm.c's Llama 3 files; any vocabulary, --vocab up to 2^31 - 1)
 * Sequences are windows of S+1 tokens starting at multiples of S (inputs = the first S, targets = the last S),
 * tiling the file in order and wrapping.
 * Micro-batch number b of the run holds global sequences b*B .. b*B+B-1; rank r of W reads the B/W of
 * them starting at r*B/W. The global batch is therefore the same for every world size and ep. */
#ifndef MOE_TRAIN_DATALOADER_H
#define MOE_TRAIN_DATALOADER_H

#include <stddef.h>
#include <stdint.h>

#include "moe/moe.h"

enum {
    MOE_TOKEN_FILE_MAGIC = 20240520, MOE_TOKEN_FILE_VERSION = 1,       /* uint16 tokens */
    MOE_TOKEN_FILE_MAGIC_U32 = 20240801, MOE_TOKEN_FILE_VERSION_U32 = 7, /* uint32 tokens */
    MOE_TOKEN_FILE_HEADER_INTS = 256
};

typedef struct {
    int *tokens;       /* [num_tokens] */
    long num_tokens;
} moe_token_file;

/* Reads and validates a whole token file: magic and version (either format), size = header + N tokens' bytes
 * exactly, every token < vocab_size, at least seq_len + 1 tokens. On failure writes a sentence naming the file and
 * the problem into message and returns MOE_ERR_IO or MOE_ERR_BAD_FILE. */
moe_status moe_token_file_load(const char *path, int vocab_size, int seq_len, moe_token_file *out);
void moe_token_file_free(moe_token_file *f);

/* Writes a token file (used by the data preparation tool and by tests): uint16 tokens, or uint32 ones. */
moe_status moe_token_file_write(const char *path, const unsigned short *tokens, long num_tokens);
moe_status moe_token_file_write_u32(const char *path, const uint32_t *tokens, long num_tokens);

/* inputs/targets [num_seqs * S] for global sequences first_seq .. first_seq + num_seqs - 1. */
void moe_token_file_sequences(const moe_token_file *f, int seq_len, long first_seq, int num_seqs, int *inputs,
                              int *targets);

#endif
