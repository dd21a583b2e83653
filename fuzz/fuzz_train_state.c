/* fuzz_train_state.c — fuzzes what a resume reads from train_state.safetensors (checkpoint/checkpoint.c's
 * load_state): the safetensors container with its moments and biases (checked as fuzz_safetensors does), and
 * the saved step in its metadata (moe__checkpoint_parse_step: digits only, 0 to INT_MAX; fuzz_step fuzzes
 * the step's text alone). An accepted step must be exactly the text's digits, a valid one must be accepted,
 * and a refusal must name the file.
 * Seeds: train_state.safetensors of fuzz/make_corpus.sh's checkpoints (fuzz/corpus/train_state/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_train_state -max_total_time=60 /tmp/new fuzz/corpus/train_state   (longer, by hand)
 *   build-fuzz/fuzz/fuzz_train_state FILE                 (one input: reproduce a finding) */
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = fuzz_temp_path("train_state.safetensors");
    fuzz_write_file(path, data, nbytes);
    moe_safetensors_file f;
    int opened;
    fuzz_open_safetensors(path, data, nbytes, &f, &opened);
    if (!opened) return 0;
    fuzz_check_step(moe_safetensors_metadata(&f, "step"), path); /* NULL when missing */
    moe_safetensors_close(&f);
    return 0;
}
