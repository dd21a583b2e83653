/* dataloader.c — reading and validating llm.c token files (uint16 or uint32 tokens); slicing sequences out of
 * them. */
#include "train/dataloader.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "models/fileio.h"

static int32_t le32(const unsigned char *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

/* The bytes of one token for a header's magic and version: 2, 4, or 0 for neither format (*why says what). */
static int token_nbytes(int32_t magic, int32_t version, const char **why) {
    if (magic == MOE_TOKEN_FILE_MAGIC) return version == MOE_TOKEN_FILE_VERSION ? 2 : (*why = "version", 0);
    if (magic == MOE_TOKEN_FILE_MAGIC_U32) return version == MOE_TOKEN_FILE_VERSION_U32 ? 4 : (*why = "version", 0);
    return *why = "magic", 0;
}

moe_status moe_token_file_load(const char *path, int vocab_size, int seq_len, moe_token_file *out) {
    memset(out, 0, sizeof *out);
    FILE *f;
    MOE_TRY(moe_file_open_regular(path, &f));
    unsigned char header[MOE_TOKEN_FILE_HEADER_INTS * 4];
    size_t got = fread(header, 1, sizeof header, f);
    const long long file_nbytes = moe_file_size(f);
    moe_status st = MOE_OK;
    long n = le32(header + 8);
    const char *why = "";
    const int width = got == sizeof header ? token_nbytes(le32(header), le32(header + 4), &why) : 0;
    if (got != sizeof header)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: truncated: %ld bytes, shorter than the %ld-byte header", path, (long)got,
                      (long)sizeof header);
    else if (!width && !strcmp(why, "magic"))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: wrong magic %ld (expected %d for uint16 tokens or %d for uint32): not an "
                      "llm.c token file", path, (long)le32(header), MOE_TOKEN_FILE_MAGIC, MOE_TOKEN_FILE_MAGIC_U32);
    else if (!width)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: unsupported version %ld for magic %ld (expected %d)", path,
                      (long)le32(header + 4), (long)le32(header),
                      le32(header) == MOE_TOKEN_FILE_MAGIC ? MOE_TOKEN_FILE_VERSION : MOE_TOKEN_FILE_VERSION_U32);
    else if (n < 0 || file_nbytes != (long long)sizeof header + width * (long long)n)
        st = moe_fail(MOE_ERR_BAD_FILE,
                      "%s: the header announces %ld tokens but the file holds %lld bytes of %s tokens (truncated or "
                      "padded)", path, n, file_nbytes - (long long)sizeof header, width == 2 ? "uint16" : "uint32");
    else if (n < seq_len + 1)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: only %ld tokens, fewer than one sequence of %d + 1", path, n, seq_len);
    unsigned char *raw = st == MOE_OK ? malloc((size_t)n * width + 1) : NULL;
    out->tokens = st == MOE_OK ? malloc((size_t)n * sizeof(int) + 1) : NULL;
    if (st == MOE_OK && (!raw || !out->tokens)) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && (fseek(f, sizeof header, SEEK_SET) != 0 || fread(raw, width, (size_t)n, f) != (size_t)n))
        st = moe_fail(MOE_ERR_IO, "%s: read error in the %ld tokens", path, n);
    for (long i = 0; st == MOE_OK && i < n; i++) {
        const unsigned char *b = raw + (size_t)i * width;
        const uint32_t token = width == 2 ? (uint32_t)(b[0] | b[1] << 8) : (uint32_t)le32(b);
        if (token >= (uint32_t)vocab_size)
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: token %lu at position %ld is outside the vocabulary (size %d): check "
                          "--vocab", path, (unsigned long)token, i, vocab_size);
        else out->tokens[i] = (int)token;
    }
    free(raw);
    fclose(f);
    if (st != MOE_OK) {
        moe_token_file_free(out);
        return st;
    }
    out->num_tokens = n;
    return MOE_OK;
}

void moe_token_file_free(moe_token_file *f) {
    free(f->tokens);
    memset(f, 0, sizeof *f);
}

/* tokens: width 2 (unsigned short) or 4 (uint32_t) bytes each, written little-endian after the header. */
static moe_status write_tokens(const char *path, const void *tokens, int width, long num_tokens) {
    unsigned char header[MOE_TOKEN_FILE_HEADER_INTS * 4] = {0};
    const int32_t fields[3] = {width == 2 ? MOE_TOKEN_FILE_MAGIC : MOE_TOKEN_FILE_MAGIC_U32,
                               width == 2 ? MOE_TOKEN_FILE_VERSION : MOE_TOKEN_FILE_VERSION_U32, (int32_t)num_tokens};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) header[4 * i + b] = (unsigned char)((uint32_t)fields[i] >> (8 * b));
    FILE *f = fopen(path, "wb");
    if (!f) return moe_fail(MOE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
    for (long i = 0; ok && i < num_tokens; i++) {
        const uint32_t t = width == 2 ? ((const unsigned short *)tokens)[i] : ((const uint32_t *)tokens)[i];
        const unsigned char b[4] = {(unsigned char)t, (unsigned char)(t >> 8), (unsigned char)(t >> 16),
                                    (unsigned char)(t >> 24)};
        ok = fwrite(b, 1, (size_t)width, f) == (size_t)width;
    }
    ok = fclose(f) == 0 && ok;
    return ok ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: write failed", path);
}

moe_status moe_token_file_write(const char *path, const unsigned short *tokens, long num_tokens) {
    return write_tokens(path, tokens, 2, num_tokens);
}

moe_status moe_token_file_write_u32(const char *path, const uint32_t *tokens, long num_tokens) {
    return write_tokens(path, tokens, 4, num_tokens);
}

void moe_token_file_sequences(const moe_token_file *f, int seq_len, long first_seq, int num_seqs, int *inputs,
                              int *targets) {
    const long windows = (f->num_tokens - 1) / seq_len; /* windows of S+1 tokens starting at multiples of S */
    for (int s = 0; s < num_seqs; s++) {
        const long window = (first_seq + s) % windows; /* a window index is never negative: wrap from the end */
        const long start = (window < 0 ? window + windows : window) * seq_len;
        for (int i = 0; i < seq_len; i++) {
            inputs[(size_t)s * seq_len + i] = f->tokens[start + i];
            targets[(size_t)s * seq_len + i] = f->tokens[start + i + 1];
        }
    }
}
