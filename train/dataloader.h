/* dataloader.h — a data set of llm.c token files (shards), read a window at a time; the global batch, each rank
 * reading its own slice.
 *
 * File formats (llm.c's, dev/data/data_common.py): a header of 256 little-endian int32 — [0] magic, [1] version,
 * [2] number of tokens N — then N little-endian tokens:
 *   magic 20240520, version 1: uint16 tokens (GPT-2's; vocabularies up to 65536)
 *   magic 20240801, version 7: uint32 tokens (llm.c's Llama 3 files; any vocabulary, --vocab up to 2^31 - 1)
 * A data set (--train-data, --val-data) is a comma-separated list of files and glob patterns (each pattern's
 * matches sorted by name; a pattern matching nothing is an error); the formats may be mixed.
 *
 * Windows: shard i of N_i tokens holds floor((N_i - 1) / S) windows of S+1 tokens starting at multiples of S
 * (inputs = the first S, targets = the last S); a window never crosses shards (as llm.c's loader). The set's
 * windows are numbered across the shards in list order (a prefix sum per shard; a binary search maps a window to
 * its shard). Global sequence n is window n % M of an M-window set, or with shuffle the permuted window of
 * train/data_order.h; with one file and no shuffle that is the file tiled in order and wrapped.
 * Micro-batch number b of the run holds global sequences b*B .. b*B+B-1; rank r of W reads the B/W of
 * them starting at r*B/W. The global batch is therefore the same for every world size, ep, pp and tp.
 *
 * Memory: nothing is read or converted at open beyond each shard's 1 KiB header; each shard is mapped read-only
 * and shared (PROT_READ, MAP_SHARED: page cache, no private copy) and kept open. Tokens are copied out of a shard
 * with pread(2), not by touching the map: a shard truncated while the run reads it then gives a short read and a
 * message naming it, where a load from the map past the new end would be SIGBUS, and checking the size (fstat)
 * before touching the map leaves a window in which the truncation can still come. The map serves read-ahead advice
 * (moe_token_data_advise). A rank's own memory for data is O(its batch) plus O(shards) of bookkeeping.
 * Tokens are checked against the vocabulary as they are read (no scan of the corpus at start): a token >= vocab is
 * an error naming the shard and the token's offset in it. */
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

typedef struct moe_token_data moe_token_data;

/* One shard as the set holds it. */
typedef struct {
    const char *path;      /* as listed, or as its pattern expanded it */
    int width;             /* bytes per token: 2 or 4 */
    int64_t num_tokens;
    int64_t num_windows;   /* floor((num_tokens - 1) / seq_len) */
    int64_t first_window;  /* the set's number of this shard's first window */
    uint64_t hash;         /* of the basename and num_tokens: the shard's identity in a checkpoint */
    uint64_t content;      /* of its first and last 4 KiB: a rewritten or another file of that name and size tells
                            * itself apart at a resume (a probe, 2026-12-07: a resume from another folder, whose
                            * relative --train-data named other tokens of the same count, went on silently) */
} moe_token_shard;

/* Opens the data set `spec` (a file, a glob, or a comma-separated list of them) for windows of seq_len + 1 tokens:
 * every shard's header is checked (a regular file, magic and version of either format, size = header + N tokens'
 * bytes exactly, at least seq_len + 1 tokens). On failure writes a sentence naming the path or pattern and the
 * problem (moe_failure_message) and returns MOE_ERR_IO or MOE_ERR_BAD_FILE; *out is then NULL. */
moe_status moe_token_data_open(const char *spec, int vocab_size, int seq_len, moe_token_data **out);
void moe_token_data_close(moe_token_data *d); /* NULL: nothing */

int moe_token_data_num_shards(const moe_token_data *d);
int64_t moe_token_data_num_windows(const moe_token_data *d);
int moe_token_data_seq_len(const moe_token_data *d);
moe_token_shard moe_token_data_shard(const moe_token_data *d, int i);
/* The list's identity: a hash of the shards' hashes in order, their count and the window count. */
uint64_t moe_token_data_identity(const moe_token_data *d);
/* Window w (0 <= w < num_windows) lies in shard *shard from token *token_offset on. */
void moe_token_data_locate(const moe_token_data *d, int64_t w, int *shard, int64_t *token_offset);

/* The order of a run's sequences (train/data_order.h). */
typedef struct {
    int shuffle;   /* 0: in order, wrapping; 1: a permutation of all windows per epoch */
    uint64_t seed;
} moe_data_order;

/* inputs/targets [num_seqs * S] for global sequences first_seq .. first_seq + num_seqs - 1 (first_seq >= 0).
 * A short read (a shard truncated since it was opened) or a token outside the vocabulary is MOE_ERR_BAD_FILE naming
 * the shard. Thread-safe for distinct buffers (pread only). */
moe_status moe_token_data_sequences(moe_token_data *d, moe_data_order order, int64_t first_seq, int num_seqs,
                                    int *inputs, int *targets);
/* Read-ahead advice (POSIX_MADV_WILLNEED on the map) for those sequences' windows: the kernel starts reading them
 * in; nothing is read here and nothing can fault. */
void moe_token_data_advise(const moe_token_data *d, moe_data_order order, int64_t first_seq, int num_seqs);

/* Writes a token file (used by the data preparation tool and by tests): uint16 tokens, or uint32 ones. */
moe_status moe_token_file_write(const char *path, const unsigned short *tokens, long num_tokens);
moe_status moe_token_file_write_u32(const char *path, const uint32_t *tokens, long num_tokens);

#endif
