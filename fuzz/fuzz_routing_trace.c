/* fuzz_routing_trace.c — fuzzes routing-trace replay (train/routing_trace.c: moe_routing_trace_open, _read):
 * the header against a run, then every record of the run in order until one is refused. Each input is opened
 * twice: for fuzz/make_corpus.sh's first tiny run, and for the run its own header describes (when that is
 * small), so that the fuzzer reaches the records of any E and k. An accepted record must be the file's bytes
 * at its place (step, micro-batch, layer and ids), with ids below E and k distinct ids per token; a refusal
 * must name the file.
 * Seeds: traces written by moe-train --routing-trace-out, top-1 and top-2 (fuzz/corpus/routing_trace/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_routing_trace -max_total_time=60 /tmp/new fuzz/corpus/routing_trace   (longer)
 *   build-fuzz/fuzz/fuzz_routing_trace FILE               (one input: reproduce a finding) */
#include <stdlib.h>

#include "core/fail.h"
#include "fuzz/fuzz_util.h"
#include "train/routing_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

enum { HEADER_NBYTES = 32, RECORD_HEAD_NBYTES = 16, MAX_RECORDS = 64, MAX_IDS = 1 << 12 };

static long le32(const uint8_t *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

/* Record (step, micro_batch, layer) read as ids: it must be the file's bytes where the format puts it. */
static void check_record(const char *path, const uint8_t *data, size_t nbytes, const moe_routing_trace *t, long index,
                         int step, int micro_batch, int layer, const int *ids) {
    const size_t count = (size_t)t->tokens * t->top_k, at = HEADER_NBYTES + index * (RECORD_HEAD_NBYTES + 2 * count);
    if (at + RECORD_HEAD_NBYTES + 2 * count > nbytes || le32(data + at) != step || le32(data + at + 4) != micro_batch ||
        le32(data + at + 8) != layer)
        fuzz_invalid("%s: record of step %d, micro-batch %d, layer %d accepted from elsewhere", path, step,
                     micro_batch, layer);
    for (size_t i = 0; i < count; i++) {
        const uint8_t *b = data + at + RECORD_HEAD_NBYTES + 2 * i;
        if (ids[i] != (b[0] | b[1] << 8) || ids[i] < 0 || ids[i] >= t->num_experts)
            fuzz_invalid("%s: id %zu of step %d, layer %d read as %d", path, i, step, layer, ids[i]);
        for (size_t j = i - i % t->top_k; j < i; j++)
            if (ids[j] == ids[i])
                fuzz_invalid("%s: a token of step %d, layer %d has expert %d twice", path, step, layer, ids[i]);
    }
}

static void replay(const char *path, const uint8_t *data, size_t nbytes, const int run[5]) {
    moe_routing_trace t;
    moe_failure_clear();
    moe_status st = moe_routing_trace_open(&t, path, run[0], run[1], run[2], run[3], run[4]);
    fuzz_check_failure(st, path);
    if (st != MOE_OK) return;
    int *ids = malloc((size_t)run[1] * run[3] * sizeof(int));
    if (!ids) abort();
    long index = 0;
    for (int step = 1; st == MOE_OK && index < MAX_RECORDS; step++)
        for (int mb = 0; mb < run[4] && st == MOE_OK; mb++)
            for (int layer = 0; layer < run[2] && st == MOE_OK; layer++, index++) {
                moe_failure_clear();
                st = moe_routing_trace_read(&t, step, mb, layer, ids);
                if (st == MOE_OK) check_record(path, data, nbytes, &t, index, step, mb, layer, ids);
                fuzz_check_failure(st, path);
            }
    free(ids);
    moe_routing_trace_close(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = fuzz_temp_path("trace.bin");
    fuzz_write_file(path, data, nbytes);
    const moe_train_options *o = fuzz_tiny_run(0); /* E, k, MoE layers, global tokens, micro-batches */
    const int tiny[5] = {o->model.moe.num_experts, o->model.moe.top_k, 1, o->batch * o->model.seq_len,
                         o->micro_batches};
    replay(path, data, nbytes, tiny);
    if (nbytes < HEADER_NBYTES) return 0;
    const int own[5] = {(int)le32(data + 12), (int)le32(data + 16), (int)le32(data + 20), (int)le32(data + 24),
                        (int)le32(data + 28)};
    if (own[0] >= 1 && own[0] <= 4096 && own[1] >= 1 && own[1] <= own[0] && own[2] >= 1 && own[2] <= 8 &&
        own[3] >= 1 && own[4] >= 1 && own[4] <= 8 && (long)own[1] * own[3] <= MAX_IDS)
        replay(path, data, nbytes, own);
    return 0;
}
