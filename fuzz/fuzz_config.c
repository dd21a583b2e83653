/* fuzz_config.c — fuzzes the check of a checkpoint's config.json against the flags (checkpoint/config.c:
 * moe__checkpoint_check_config), for both of fuzz/make_corpus.sh's tiny runs. An accepted config.json must
 * describe that model, checked here field by field on its own parse: the shapes, rope_theta and rms_norm_eps
 * (absent: 1e6 and 1e-5, MixtralConfig's defaults),
 * hidden_act, sliding_window, tie_word_embeddings, and moe_train's score_func and moe_every when present; a
 * refusal must name the file.
 * Seeds: config.json of fuzz/make_corpus.sh's checkpoints (fuzz/corpus/config/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_config -max_total_time=60 /tmp/new fuzz/corpus/config   (longer, by hand)
 *   build-fuzz/fuzz/fuzz_config FILE                      (one input: reproduce a finding) */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/fail.h"
#include "fuzz/fuzz_util.h"
#include "checkpoint/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

/* v (absent: transformers' MixtralConfig default) is want */
static int close_to(json_t *v, double want, double absent) {
    return v ? json_is_number(v) && fabs(json_number_value(v) - want) <= 1e-6 * want
             : fabs(absent - want) <= 1e-6 * want;
}

/* config.json accepted for model c: what it must say. */
static void check_accepted(const char *path, const uint8_t *data, size_t nbytes, const moe_model_config *c) {
    json_error_t err;
    json_t *j = json_loadb((const char *)data, nbytes, 0, &err);
    if (!json_is_object(j)) fuzz_invalid("%s: accepted, but not a JSON object (%s)", path, err.text);
    const struct { const char *key; long want; } ints[] = {
        {"vocab_size", c->vocab_size}, {"hidden_size", c->d_model}, {"intermediate_size", c->d_ff},
        {"num_hidden_layers", c->num_layers}, {"num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads}, {"num_local_experts", c->moe.num_experts},
        {"num_experts_per_tok", c->moe.top_k},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        json_t *v = json_object_get(j, ints[i].key);
        if (!json_is_integer(v) || json_integer_value(v) != ints[i].want)
            fuzz_invalid("%s: accepted with %s not the integer %ld", path, ints[i].key, ints[i].want);
    }
    json_t *theta = json_object_get(j, "rope_theta"); /* or transformers 5's place for it */
    if (!theta) theta = json_object_get(json_object_get(j, "rope_parameters"), "rope_theta");
    if (!close_to(theta, c->rope_theta, 1e6) ||
        !close_to(json_object_get(j, "rms_norm_eps"), c->norm_eps, 1e-5))
        fuzz_invalid("%s: accepted with another rope_theta or rms_norm_eps", path);
    json_t *tie = json_object_get(j, "tie_word_embeddings"), *act = json_object_get(j, "hidden_act"),
           *window = json_object_get(j, "sliding_window"), *moe = json_object_get(j, "moe_train");
    const int tie_value = json_is_boolean(tie)   ? json_is_true(tie)
                          : json_is_integer(tie) ? (int)json_integer_value(tie)
                                                 : -1;
    if (tie && tie_value != c->tie_embeddings) /* true/false, or 0/1 as moe-train's early files wrote flags */
        fuzz_invalid("%s: accepted with another tie_word_embeddings", path);
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        fuzz_invalid("%s: accepted with hidden_act other than silu", path);
    const int qwen = c->family == MOE_MODEL_FAMILY_QWEN3_MOE || c->family == MOE_MODEL_FAMILY_QWEN2_MOE;
    if (window && !json_is_null(window) &&
        (!json_is_integer(window) || !qwen || json_is_true(json_object_get(j, "use_sliding_window"))))
        fuzz_invalid("%s: accepted with a sliding window in use", path);
    /* moe_train: written by moe-train; absent in Mixtral's own config.json (then: softmax, every layer MoE) */
    json_t *score = json_object_get(moe, "score_func"), *every = json_object_get(moe, "moe_every");
    const char *want_score = c->moe.score_func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax";
    if (moe && !json_is_object(moe)) fuzz_invalid("%s: accepted with moe_train not an object", path);
    if (score && (!json_is_string(score) || strcmp(json_string_value(score), want_score)))
        fuzz_invalid("%s: accepted with moe_train.score_func not \"%s\"", path, want_score);
    if (every ? !json_is_integer(every) || json_integer_value(every) != c->moe_every : c->moe_every != 1)
        fuzz_invalid("%s: accepted with moe_train.moe_every not %d", path, c->moe_every);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = fuzz_temp_path("config.json");
    fuzz_write_file(path, data, nbytes);
    for (int r = 0; r < FUZZ_TINY_RUNS; r++) {
        const moe_model_config *c = &fuzz_tiny_run(r)->model;
        moe_failure_clear();
        moe_status st = moe__checkpoint_check_config(fuzz_temp_dir(), c, 1);
        if (st == MOE_OK) check_accepted(path, data, nbytes, c);
        fuzz_check_failure(st, path);
    }
    return 0;
}
