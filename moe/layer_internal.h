/* layer_internal.h — for tests and benchmarks only: a read-only look at the last forward's routing. */
#ifndef MOE_MOE_LAYER_INTERNAL_H
#define MOE_MOE_LAYER_INTERNAL_H

#include "moe/moe.h"
#include "router/routing.h"

/* The per-token arrays of the last forward (the runtime's memory: readable by the host on the CPU), or NULL
 * before one. */
const moe_token_routing *moe__layer_token_routing(const moe_layer *layer);

#endif
