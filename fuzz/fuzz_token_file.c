/* fuzz_token_file.c — fuzzes the llm.c token-file loader (train/dataloader.c: moe_token_file_load) with the
 * vocabulary and sequence length of fuzz/make_corpus.sh's tiny runs (64, 8), with (65536, 1) and with a vocabulary
 * past uint16 (2^20, 1). An accepted file must be what train/dataloader.h describes, checked here on the bytes:
 * magic and version of one of the two formats, a size of exactly header + N tokens of that format's width, at least
 * one sequence, and every token loaded equal to its bytes and inside the vocabulary; sequences cut from it must
 * hold its tokens. A refusal must name the file.
 * Seeds: train.bin and val.bin made by moe-text-to-tokens (fuzz/corpus/token_file/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_token_file -max_total_time=60 /tmp/new fuzz/corpus/token_file   (longer, by hand)
 *   build-fuzz/fuzz/fuzz_token_file FILE                  (one input: reproduce a finding) */
#include <stdlib.h>

#include "core/fail.h"
#include "fuzz/fuzz_util.h"
#include "train/dataloader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

static long le32(const uint8_t *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

static void check_accepted(const char *path, const uint8_t *data, size_t nbytes, int vocab, int seq_len,
                           const moe_token_file *f) {
    const size_t header = 4 * MOE_TOKEN_FILE_HEADER_INTS;
    const int u16 = nbytes >= header && le32(data) == MOE_TOKEN_FILE_MAGIC && le32(data + 4) == MOE_TOKEN_FILE_VERSION,
              u32 = nbytes >= header && le32(data) == MOE_TOKEN_FILE_MAGIC_U32 &&
                    le32(data + 4) == MOE_TOKEN_FILE_VERSION_U32;
    const size_t width = u32 ? 4 : 2;
    if (!(u16 || u32) || le32(data + 8) != f->num_tokens || nbytes != header + width * (size_t)f->num_tokens ||
        f->num_tokens < seq_len + 1)
        fuzz_invalid("%s: accepted %ld tokens from %zu bytes", path, f->num_tokens, nbytes);
    for (long i = 0; i < f->num_tokens; i++) {
        const uint8_t *b = data + header + width * i;
        long long want = u32 ? (long long)(uint32_t)le32(b) : (long long)(b[0] | b[1] << 8);
        if (f->tokens[i] != want || want >= vocab)
            fuzz_invalid("%s: token %ld loaded as %d, the file has %lld (vocabulary %d)", path, i, f->tokens[i], want,
                         vocab);
    }
    /* three sequences from the start, and three from before it (the loader wraps around) */
    int *inputs = malloc(3 * (size_t)seq_len * sizeof(int)), *targets = malloc(3 * (size_t)seq_len * sizeof(int));
    if (!inputs || !targets) abort();
    for (long first = -3; first <= 0; first += 3) {
        moe_token_file_sequences(f, seq_len, first, 3, inputs, targets);
        for (int i = 0; i < 3 * seq_len; i++)
            if (inputs[i] < 0 || inputs[i] >= vocab || targets[i] < 0 || targets[i] >= vocab)
                fuzz_invalid("%s: a sequence holds token %d", path, inputs[i] < 0 || inputs[i] >= vocab ? inputs[i]
                                                                                                   : targets[i]);
    }
    free(inputs), free(targets);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = fuzz_temp_path("tokens.bin");
    fuzz_write_file(path, data, nbytes);
    static const int shapes[3][2] = {{64, 8}, {65536, 1}, {1 << 20, 1}}; /* vocabulary, sequence length */
    for (int s = 0; s < 3; s++) {
        moe_token_file f;
        moe_failure_clear();
        moe_status st = moe_token_file_load(path, shapes[s][0], shapes[s][1], &f);
        fuzz_check_failure(st, path);
        if (st != MOE_OK) continue;
        check_accepted(path, data, nbytes, shapes[s][0], shapes[s][1], &f);
        moe_token_file_free(&f);
    }
    return 0;
}
