/* fuzz_token_file.c — fuzzes the llm.c token-file reader (train/dataloader.c: moe_token_data_open, then
 * moe_token_data_sequences) with the
 * vocabulary and sequence length of fuzz/make_corpus.sh's tiny runs (64, 8), with (65536, 1) and with a vocabulary
 * past uint16 (2^20, 1). An accepted file must be what train/dataloader.h describes, checked here on the bytes:
 * magic and version of one of the two formats, a size of exactly header + N tokens of that format's width, at least
 * one sequence; sequences read from it (in order, wrapping, and shuffled) must hold its windows' tokens, and a read
 * must fail exactly when a window holds a token outside the vocabulary. A refusal must name the file.
 * Seeds: train.bin and val.bin made by moe-text-to-tokens (fuzz/corpus/token_file/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_token_file -max_total_time=60 /tmp/new fuzz/corpus/token_file   (longer, by hand)
 *   build-fuzz/fuzz/fuzz_token_file FILE                  (one input: reproduce a finding) */
#include <stdlib.h>

#include "core/fail.h"
#include "fuzz/fuzz_util.h"
#include "train/data_order.h"
#include "train/dataloader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

static long le32(const uint8_t *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

static void check_accepted(const char *path, const uint8_t *data, size_t nbytes, int vocab, int seq_len,
                           moe_token_data *d) {
    const size_t header = 4 * MOE_TOKEN_FILE_HEADER_INTS;
    const int u16 = nbytes >= header && le32(data) == MOE_TOKEN_FILE_MAGIC && le32(data + 4) == MOE_TOKEN_FILE_VERSION,
              u32 = nbytes >= header && le32(data) == MOE_TOKEN_FILE_MAGIC_U32 &&
                    le32(data + 4) == MOE_TOKEN_FILE_VERSION_U32;
    const size_t width = u32 ? 4 : 2;
    const moe_token_shard s = moe_token_data_shard(d, 0);
    if (!(u16 || u32) || moe_token_data_num_shards(d) != 1 || le32(data + 8) != s.num_tokens ||
        nbytes != header + width * (size_t)s.num_tokens || s.num_tokens < seq_len + 1 || s.width != (int)width ||
        s.num_windows != (s.num_tokens - 1) / seq_len || moe_token_data_num_windows(d) != s.num_windows)
        fuzz_invalid("%s: accepted %lld tokens from %zu bytes", path, (long long)s.num_tokens, nbytes);
    /* three sequences from the start, three that wrap around the end, and three shuffled: each holds its window's
     * bytes, or the read names the file and a token outside the vocabulary */
    int *inputs = malloc(3 * (size_t)seq_len * sizeof(int)), *targets = malloc(3 * (size_t)seq_len * sizeof(int));
    if (!inputs || !targets) abort();
    const int64_t M = s.num_windows, firsts[3] = {0, M > 3 ? M - 1 : 0, 7 * M};
    for (int k = 0; k < 3; k++) {
        const moe_data_order order = {k == 2, 12345};
        moe_failure_clear();
        const moe_status st = moe_token_data_sequences(d, order, firsts[k], 3, inputs, targets);
        fuzz_check_failure(st, path);
        int bad = 0; /* does any of the windows hold a token >= vocab? */
        for (int q = 0; q < 3; q++) {
            const int64_t w = moe_data_window(order.shuffle, order.seed, M, firsts[k] + q);
            for (int i = 0; i <= seq_len; i++) {
                const uint8_t *b = data + header + width * (size_t)(w * seq_len + i);
                const long long want = u32 ? (long long)(uint32_t)le32(b) : (long long)(b[0] | b[1] << 8);
                bad |= want >= vocab;
                if (st == MOE_OK && ((i < seq_len && inputs[q * seq_len + i] != want) ||
                                     (i > 0 && targets[q * seq_len + i - 1] != want)))
                    fuzz_invalid("%s: window %lld token %d read as %d, the file has %lld", path, (long long)w, i,
                                 i < seq_len ? inputs[q * seq_len + i] : targets[q * seq_len + i - 1], want);
            }
        }
        if ((st != MOE_OK) != bad)
            fuzz_invalid("%s: the read %s, but %s token is outside the vocabulary %d", path,
                         st == MOE_OK ? "succeeded" : "failed", bad ? "a" : "no", vocab);
    }
    free(inputs), free(targets);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = fuzz_temp_path("tokens.bin");
    fuzz_write_file(path, data, nbytes);
    static const int shapes[3][2] = {{64, 8}, {65536, 1}, {1 << 20, 1}}; /* vocabulary, sequence length */
    for (int s = 0; s < 3; s++) {
        moe_token_data *d;
        moe_failure_clear();
        moe_status st = moe_token_data_open(path, shapes[s][0], shapes[s][1], &d);
        fuzz_check_failure(st, path);
        if (st != MOE_OK) continue;
        check_accepted(path, data, nbytes, shapes[s][0], shapes[s][1], d);
        moe_token_data_close(d);
    }
    return 0;
}
