/* routing_trace.h — a file of routing decisions: for every training step, micro-batch and MoE layer, the
 * top-k experts of every token of the global batch. A run can write one and another run can replay it
 * (the routing taken from the trace instead of the router), to debug routing or reproduce a run exactly.
 *
 * Format (little-endian): header of 8 int32 — magic "MOETRACE" as two int32 (0x54454f4d, 0x45434152),
 * version 1, E, k, MoE layers, global tokens per micro-batch, micro-batches per step — then records in
 * (step, micro-batch, layer) order, each: int32 step, int32 micro-batch, int32 layer, uint32 FNV-1a hash
 * of the ids, then tokens * k uint16 expert ids. The trace does not depend on the world size or ep. */
#ifndef MOE_TRAIN_ROUTING_TRACE_H
#define MOE_TRAIN_ROUTING_TRACE_H

#include <stddef.h>
#include <stdio.h>

#include "moe/moe.h"

typedef struct {
    char *path;
    FILE *file;
    int num_experts, top_k, num_layers, tokens, micro_batches;
    unsigned short *buffer; /* one record's ids */
} moe_routing_trace;

/* Creates (truncates) a trace for writing. */
moe_status moe_routing_trace_create(moe_routing_trace *t, const char *path, int num_experts, int top_k, int num_layers,
                                    int tokens, int micro_batches);
/* Opens a trace another process created (its header must match) to write records into it too: a pipeline's stages
 * each write the records of their own layers. */
moe_status moe_routing_trace_join(moe_routing_trace *t, const char *path, int num_experts, int top_k, int num_layers,
                                  int tokens, int micro_batches);
/* Writes the record of (step, micro_batch, layer): experts[tokens * k], at its place (records are of one size, in
 * (step, micro-batch, layer) order), so writers may come in any order. */
moe_status moe_routing_trace_write(moe_routing_trace *t, int step, int micro_batch, int layer, const int *experts);

/* Opens a trace for replay; the header must match the run (E, k, layers, tokens, micro-batches). */
moe_status moe_routing_trace_open(moe_routing_trace *t, const char *path, int num_experts, int top_k, int num_layers,
                                  int tokens, int micro_batches);
/* Reads the record of (step, micro_batch, layer) into experts[tokens * k], checking its position, hash,
 * ids in [0, E) and k distinct ids per token. */
moe_status moe_routing_trace_read(moe_routing_trace *t, int step, int micro_batch, int layer, int *experts);

void moe_routing_trace_close(moe_routing_trace *t);

#endif
