/* layer_internal.h — for tests and benchmarks only: a read-only look at the last forward's routing. */
#ifndef MOE_LAYER_INTERNAL_H
#define MOE_LAYER_INTERNAL_H

#include "moe/moe.h"
#include "router/routing.h"

const moe_routing *moe__layer_routing(const moe_layer *layer);

#endif
