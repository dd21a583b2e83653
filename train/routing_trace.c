/* routing_trace.c — writing and replaying routing traces (format in routing_trace.h). */
#include "train/routing_trace.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "models/fileio.h"

enum { TRACE_VERSION = 1, HEADER_INTS = 8, RECORD_HEADER_NBYTES = 16 };
static const int32_t kMagic[2] = {0x54454f4d, 0x45434152}; /* "MOETRACE" */

static uint32_t fnv1a(const unsigned short *ids, size_t count) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < count; i++) h = (h ^ ids[i]) * 16777619u, h = (h ^ (ids[i] >> 8)) * 16777619u;
    return h;
}

static size_t ids_per_record(const moe_routing_trace *t) { return (size_t)t->tokens * t->top_k; }

static long record_offset(const moe_routing_trace *t, int step, int micro_batch, int layer) {
    long index = ((long)(step - 1) * t->micro_batches + micro_batch) * t->num_layers + layer;
    return HEADER_INTS * 4 + index * (long)(RECORD_HEADER_NBYTES + 2 * ids_per_record(t));
}

static moe_status start(moe_routing_trace *t, const char *path, int E, int k, int layers, int tokens, int micro) {
    *t = (moe_routing_trace){
        .num_experts = E, .top_k = k, .num_layers = layers, .tokens = tokens, .micro_batches = micro};
    t->path = strdup(path);
    t->buffer = malloc((ids_per_record(t) ? ids_per_record(t) : 1) * sizeof *t->buffer);
    return t->buffer && t->path ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

moe_status moe_routing_trace_create(moe_routing_trace *t, const char *path, int E, int k, int layers, int tokens,
                                    int micro) {
    moe_status st = start(t, path, E, k, layers, tokens, micro);
    if (st != MOE_OK) return st;
    const int32_t header[HEADER_INTS] = {kMagic[0], kMagic[1], TRACE_VERSION, E, k, layers, tokens, micro};
    if (!(t->file = fopen(path, "wb")) || fwrite(header, 4, HEADER_INTS, t->file) != HEADER_INTS ||
        fflush(t->file) != 0) { /* other writers read the header (moe_routing_trace_join) */
        st = moe_fail(MOE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        moe_routing_trace_close(t);
    }
    return st;
}

moe_status moe_routing_trace_write(moe_routing_trace *t, int step, int micro_batch, int layer, const int *experts) {
    for (size_t i = 0; i < ids_per_record(t); i++) t->buffer[i] = (unsigned short)experts[i];
    const int32_t head[4] = {step, micro_batch, layer, (int32_t)fnv1a(t->buffer, ids_per_record(t))};
    if (fseek(t->file, record_offset(t, step, micro_batch, layer), SEEK_SET) != 0 || fwrite(head, 4, 4, t->file) != 4 ||
        fwrite(t->buffer, 2, ids_per_record(t), t->file) != ids_per_record(t) || fflush(t->file) != 0)
        return moe_fail(MOE_ERR_IO, "%s: write failed at step %d: %s", t->path, step, strerror(errno));
    return MOE_OK;
}

/* Opens an existing trace and checks its header against the run: for replay, or (for_writing) to add records. */
static moe_status open_existing(moe_routing_trace *t, const char *path, int E, int k, int layers, int tokens, int micro,
                                int for_writing) {
    moe_status st = start(t, path, E, k, layers, tokens, micro);
    if (st != MOE_OK) return st;
    int32_t h[HEADER_INTS];
    const int32_t want[HEADER_INTS] = {kMagic[0], kMagic[1], TRACE_VERSION, E, k, layers, tokens, micro};
    const char *field[HEADER_INTS] = {"magic", "magic", "version", "experts", "top-k", "MoE layers",
                                      "global tokens per micro-batch", "micro-batches per step"};
    if (!for_writing) st = moe_file_open_regular(path, &t->file);
    else if (!(t->file = fopen(path, "r+b")))
        st = moe_fail(MOE_ERR_IO, "%s: cannot open to write: %s", path, strerror(errno));
    if (st == MOE_OK && fread(h, 4, HEADER_INTS, t->file) != HEADER_INTS)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: truncated header", path);
    for (int i = 0; i < HEADER_INTS && st == MOE_OK; i++)
        if (h[i] != want[i])
            st = i < 2 ? moe_fail(MOE_ERR_BAD_FILE, "%s: not a routing trace (bad magic)", path)
                       : moe_fail(MOE_ERR_BAD_FILE, "%s: %s is %d in the trace but %d in this run", path, field[i],
                                  h[i], want[i]);
    if (st != MOE_OK) moe_routing_trace_close(t);
    return st;
}

moe_status moe_routing_trace_open(moe_routing_trace *t, const char *path, int E, int k, int layers, int tokens,
                                  int micro) {
    return open_existing(t, path, E, k, layers, tokens, micro, 0);
}

moe_status moe_routing_trace_join(moe_routing_trace *t, const char *path, int E, int k, int layers, int tokens,
                                  int micro) {
    return open_existing(t, path, E, k, layers, tokens, micro, 1);
}

moe_status moe_routing_trace_read(moe_routing_trace *t, int step, int micro_batch, int layer, int *experts) {
    int32_t head[4];
    const size_t count = ids_per_record(t);
    if (fseek(t->file, record_offset(t, step, micro_batch, layer), SEEK_SET) != 0 || fread(head, 4, 4, t->file) != 4 ||
        fread(t->buffer, 2, count, t->file) != count)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: no record for step %d, micro-batch %d, layer %d (truncated?)", t->path,
                    step, micro_batch, layer);
    if (head[0] != step || head[1] != micro_batch || head[2] != layer)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: record of step %d found where step %d, layer %d belongs", t->path,
                        head[0], step, layer);
    if ((uint32_t)head[3] != fnv1a(t->buffer, count))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: record of step %d, layer %d is corrupt (hash mismatch)", t->path, step,
                        layer);
    for (size_t i = 0; i < count; i++) {
        experts[i] = t->buffer[i];
        int dup = 0;
        for (size_t j = i - i % t->top_k; j < i; j++) dup |= experts[j] == experts[i];
        if (experts[i] >= t->num_experts || dup)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: record of step %d, layer %d: invalid expert id %d", t->path, step,
                        layer, experts[i]);
    }
    return MOE_OK;
}

void moe_routing_trace_close(moe_routing_trace *t) {
    if (t->file) fclose(t->file);
    free(t->buffer);
    free(t->path);
    memset(t, 0, sizeof *t);
}
