/* fuzz_safetensors.c — fuzzes the safetensors reader (checkpoint/safetensors.c: moe_safetensors_open, _read) with
 * whole files: the header length, the JSON header, dtypes, shapes, data_offsets, checksums and the data. An
 * accepted file must keep the reader's promises (fuzz_util.h: fuzz_open_safetensors): the header all one JSON
 * object, tensors inside the file, not sharing bytes and covering the data section, values read equal to the file's
 * bytes, a wrong shape and a missing tensor refused; a refusal must name the file.
 * Seeds: model.safetensors of fuzz/make_corpus.sh's checkpoints (fuzz/corpus/safetensors/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_safetensors -max_total_time=60 /tmp/new fuzz/corpus/safetensors   (longer, by hand)
 *   build-fuzz/fuzz/fuzz_safetensors FILE                 (one input: reproduce a finding) */
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = fuzz_temp_path("model.safetensors");
    fuzz_write_file(path, data, nbytes);
    moe_safetensors_file f;
    int opened;
    fuzz_open_safetensors(path, data, nbytes, &f, &opened);
    if (opened) moe_safetensors_close(&f);
    return 0;
}
