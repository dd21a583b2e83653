/* fuzz_safetensors_index.c — fuzzes the parser of a sharded model's index (checkpoint/safetensors_shards.c:
 * moe_safetensors_index_parse), model.safetensors.index.json as transformers writes it. An accepted index must be
 * what safetensors_shards.h describes, checked here on its own parse: one JSON object without duplicate keys, a
 * non-empty "weight_map" of tensor names (shorter than MOE_SAFETENSORS_MAX_NAME) to plain file names ending in
 * .safetensors (no '/', not starting with '.'), "metadata" absent or an object, the shard list exactly the
 * distinct file names, and every tensor's shard found by moe_safetensors_index_shard. A refusal must name the file.
 * Seeds: the index of a --save-shard-size save (fuzz/make_corpus.sh; fuzz/corpus/safetensors_index/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_safetensors_index FILE           (one input: reproduce a finding) */
#include <jansson.h>
#include <string.h>

#include "core/fail.h"
#include "fuzz/fuzz_util.h"
#include "checkpoint/safetensors_shards.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

static int plain_shard_name(const char *s) {
    const size_t n = strlen(s);
    return n > 12 && !strchr(s, '/') && s[0] != '.' && !strcmp(s + n - 12, ".safetensors");
}

static void check_accepted(const char *path, const uint8_t *data, size_t nbytes, const moe_safetensors_index *idx) {
    json_error_t err;
    json_t *root = json_loadb((const char *)data, nbytes, JSON_REJECT_DUPLICATES, &err);
    json_t *map = json_object_get(root, "weight_map"), *meta = json_object_get(root, "metadata");
    if (!json_is_object(root) || !json_is_object(map) || !json_object_size(map) || (meta && !json_is_object(meta)))
        fuzz_invalid("%s: accepted an index without a weight_map object, or with duplicate keys", path);
    const char *name;
    json_t *value;
    int distinct = 0;
    json_object_foreach(map, name, value) {
        const char *shard = json_string_value(value), *found = moe_safetensors_index_shard(idx, name);
        if (!shard || !plain_shard_name(shard) || strlen(name) >= MOE_SAFETENSORS_MAX_NAME)
            fuzz_invalid("%s: accepted tensor %.60s in shard %.60s", path, name, shard ? shard : "(not a string)");
        if (!found || strcmp(found, shard)) fuzz_invalid("%s: tensor %.60s found in %.60s", path, name, found);
        int listed = 0;
        for (int i = 0; i < idx->num_shards; i++) listed += !strcmp(idx->shards[i], shard);
        if (listed != 1) fuzz_invalid("%s: shard %.60s listed %d times", path, shard, listed);
        int first = 1;
        const char *other;
        json_t *v;
        json_object_foreach(map, other, v) {
            if (other == name) break;
            if (!strcmp(json_string_value(v), shard)) first = 0;
        }
        distinct += first;
    }
    if (distinct != idx->num_shards) fuzz_invalid("%s: %d shards listed, %d distinct", path, idx->num_shards, distinct);
    json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = "fuzz/model.safetensors.index.json";
    moe_safetensors_index idx;
    moe_failure_clear();
    moe_status st = moe_safetensors_index_parse(path, (const char *)data, nbytes, &idx);
    fuzz_check_failure(st, path);
    if (st != MOE_OK) return 0;
    check_accepted(path, data, nbytes, &idx);
    moe_safetensors_index_free(&idx);
    return 0;
}
