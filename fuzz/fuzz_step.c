/* fuzz_step.c — fuzzes the parser of the step a training state was saved at (checkpoint/config.c:
 * moe__checkpoint_parse_step), on its own: the input up to its first NUL is the text of train_state's "step"
 * metadata. The parser's rule (checkpoint/internal.h) is written out again in fuzz_check_step: an accepted
 * text must be one or more decimal digits of value at most INT_MAX and read as that value, every such text
 * must be accepted, and a refusal must name the file. (fuzz_train_state reaches the same parser through whole
 * files, where a mutation rarely lands on the step's few bytes.)
 * Seeds: the "step" and "micro_batches_done" metadata of fuzz/make_corpus.sh's train states (fuzz/corpus/step/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_step -max_total_time=60 /tmp/new fuzz/corpus/step   (longer, by hand)
 *   build-fuzz/fuzz/fuzz_step FILE                        (one input: reproduce a finding) */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    char *text = malloc(nbytes + 1);
    if (!text) abort();
    memcpy(text, data, nbytes);
    text[nbytes] = 0;
    fuzz_check_step(text, "train_state.safetensors");
    free(text);
    return 0;
}
