/* companions.c — a checkpoint's tokenizer, generation and token-id companions (checkpoint/companions.h). */
#include "checkpoint/companions.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fail.h"
#include "models/fileio.h"

static const char *const kFiles[] = {"tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
                                     "tokenizer.model",    "vocab.json",            "merges.txt",
                                     "added_tokens.json",  "chat_template.jinja",   "generation_config.json"};
static const char *const kTokenIds[] = {"bos_token_id", "eos_token_id", "pad_token_id"};

/* src to dst, whole, fsynced; MOE_ERR_IO naming the one that failed */
static moe_status copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    moe_status st = in && out ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: cannot %s: %s", in ? dst : src,
                                                  in ? "write" : "read", strerror(errno));
    char buf[1 << 16];
    for (size_t n; st == MOE_OK && (n = fread(buf, 1, sizeof buf, in)) > 0;)
        if (fwrite(buf, 1, n, out) != n) st = moe_fail(MOE_ERR_IO, "%s: cannot write: %s", dst, strerror(errno));
    if (st == MOE_OK && ferror(in)) st = moe_fail(MOE_ERR_IO, "%s: cannot read: %s", src, strerror(errno));
    if (out && fclose(out) != 0 && st == MOE_OK)
        st = moe_fail(MOE_ERR_IO, "%s: cannot write: %s", dst, strerror(errno));
    if (in) fclose(in);
    if (st == MOE_OK && moe_fsync_path(dst) != 0)
        st = moe_fail(MOE_ERR_IO, "%s: fsync failed: %s", dst, strerror(errno));
    return st;
}

moe_status moe__checkpoint_carry_companions(const char *from, const char *dir, json_t *config) {
    if (!from) return MOE_OK;
    moe_status st = MOE_OK;
    for (size_t i = 0; i < sizeof kFiles / sizeof *kFiles && st == MOE_OK; i++) {
        char *src = moe_path_join(from, kFiles[i]), *dst = moe_path_join(dir, kFiles[i]);
        struct stat sb;
        if (!src || !dst) st = MOE_ERR_OUT_OF_MEMORY;
        else if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode)) st = copy_file(src, dst);
        free(src), free(dst);
    }
    char *path = moe_path_join(from, "config.json");
    json_t *source = path ? json_load_file(path, 0, NULL) : NULL; /* read and checked when the run started */
    for (size_t i = 0; i < sizeof kTokenIds / sizeof *kTokenIds && st == MOE_OK && json_is_object(source); i++) {
        json_t *id = json_object_get(source, kTokenIds[i]);
        if (id && !json_object_get(config, kTokenIds[i])) json_object_set(config, kTokenIds[i], id);
    }
    json_decref(source);
    free(path);
    return st;
}
