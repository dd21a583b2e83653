/* text_to_tokens.c — moe-text-to-tokens: a text file -> byte-level llm.c token files (vocab 256).
 *   moe-text-to-tokens INPUT.txt TRAIN.bin VAL.bin [VAL_FRACTION]
 * The first (1 - VAL_FRACTION) of the bytes (default 0.9) become the training file, the rest the
 * validation file; each byte is one token. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "models/fileio.h"
#include "train/dataloader.h"

static const char kUsage[] =
    "usage: moe-text-to-tokens INPUT.txt TRAIN.bin VAL.bin [VAL_FRACTION]\n"
    "Byte-level tokens: every byte of the text is one token (moe-train --vocab 256). The first (1 - VAL_FRACTION) of\n"
    "the bytes (default 0.9) become TRAIN.bin, the rest VAL.bin (llm.c token files). For a BPE vocabulary, and for\n"
    "shards, use scripts/prepare_data.py (docs/DATA.md).\n";

int main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return fputs(kUsage, stdout), 0;
    if (argc < 4 || argc > 5) {
        fputs(kUsage, stderr);
        return 2;
    }
    double val_fraction = 0.1;
    if (argc == 5) {
        char *end;
        val_fraction = strtod(argv[4], &end);
        if (*end || end == argv[4] || !(val_fraction > 0 && val_fraction < 1)) {
            fprintf(stderr, "moe-text-to-tokens: VAL_FRACTION must be a number in (0, 1), got '%s'\n", argv[4]);
            return 2;
        }
    }
    /* each output is truncated when written: one of them the input, or both one file, lost the data (a probe) */
    if (moe_same_file(argv[2], argv[3]) || moe_same_file(argv[1], argv[2]) || moe_same_file(argv[1], argv[3])) {
        fprintf(stderr, "moe-text-to-tokens: INPUT.txt, TRAIN.bin and VAL.bin must be three files (%s, %s, %s): an "
                        "output written over another file loses it\n", argv[1], argv[2], argv[3]);
        return 2;
    }
    /* an output that is a directory fails its rename, and TRAIN.bin's came first (a probe: VAL.bin a directory left
     * TRAIN.bin replaced, exit 1); the rename would replace a device (/dev/null) or a link with a file (a probe,
     * 2026-12-07: as root it did): refused before anything is written */
    for (int i = 2; i <= 3; i++) {
        struct stat sb;
        if (lstat(argv[i], &sb) == 0 && !S_ISREG(sb.st_mode)) {
            fprintf(stderr, "moe-text-to-tokens: %s is %s, not a token file to write (the tokens go to a new file "
                            "renamed into its place)\n", argv[i], S_ISDIR(sb.st_mode) ? "a directory" :
                            S_ISLNK(sb.st_mode) ? "a link" : "a device, pipe or socket");
            return 2;
        }
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        fprintf(stderr, "moe-text-to-tokens: cannot open %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    size_t cap = 1 << 20, n = 0, got;
    unsigned short *tokens = malloc(cap * sizeof *tokens);
    unsigned char buf[1 << 16];
    while (tokens && (got = fread(buf, 1, sizeof buf, f)) > 0) {
        if (n + got > cap) {
            unsigned short *grown = realloc(tokens, (cap *= 2) * sizeof *tokens);
            if (!grown) free(tokens);
            tokens = grown;
        }
        for (size_t i = 0; tokens && i < got; i++) tokens[n++] = buf[i];
    }
    int read_error = ferror(f);
    fclose(f);
    if (!tokens || read_error) {
        fprintf(stderr, "moe-text-to-tokens: %s: %s\n", argv[1], tokens ? "read error" : "out of memory");
        free(tokens);
        return 1;
    }
    long num_val = (long)(n * val_fraction), num_train = (long)n - num_val;
    if (num_val < 2 || num_train < 2) {
        fprintf(stderr, "moe-text-to-tokens: %s has %zu bytes: VAL_FRACTION %g leaves %ld for TRAIN.bin and %ld for "
                        "VAL.bin, and each needs at least 2\n", argv[1], n, val_fraction, num_train, num_val);
        free(tokens);
        return 1;
    }
    /* both written under temporary names beside them, then renamed: a failure leaves whatever TRAIN.bin and VAL.bin
     * were (before, TRAIN.bin was rewritten before VAL.bin could fail, and the old pair was lost: a probe) */
    char *tmp[2] = {NULL, NULL};
    moe_status st = MOE_OK;
    for (int i = 0; i < 2 && st == MOE_OK; i++) {
        const size_t len = strlen(argv[2 + i]) + 32;
        if (!(tmp[i] = malloc(len))) st = MOE_ERR_OUT_OF_MEMORY;
        else snprintf(tmp[i], len, "%s.tmp-%ld", argv[2 + i], (long)getpid());
    }
    if (st == MOE_OK) st = moe_token_file_write(tmp[0], tokens, num_train);
    if (st == MOE_OK) st = moe_token_file_write(tmp[1], tokens + num_train, num_val);
    for (int i = 0; i < 2 && st == MOE_OK; i++)
        if (rename(tmp[i], argv[2 + i]) != 0)
            st = moe_fail(MOE_ERR_IO, "%s: cannot rename %s to it: %s", argv[2 + i], tmp[i], strerror(errno));
    for (int i = 0; i < 2; i++) {
        if (st != MOE_OK && tmp[i]) unlink(tmp[i]);
        free(tmp[i]);
    }
    if (st != MOE_OK) {
        fprintf(stderr, "moe-text-to-tokens: %s\n", moe_failure_message(st));
        free(tokens);
        return 1;
    }
    printf("moe-text-to-tokens: %s: %zu bytes -> %s (%ld tokens), %s (%ld tokens)\n", argv[1], n, argv[2], num_train,
           argv[3], num_val);
    free(tokens);
    return 0;
}
