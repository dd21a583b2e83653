/* layer_internal.h — for tests and benchmarks only: a read-only look at the last forward's routing, and the
 * layer's table of steps. */
#ifndef MOE_MOE_LAYER_INTERNAL_H
#define MOE_MOE_LAYER_INTERNAL_H

#include "moe/layer_ops.h"
#include "moe/moe.h"
#include "router/routing.h"

/* The per-token arrays of the last forward (the runtime's memory: readable by the host on the CPU), or NULL
 * before one. */
const moe_token_routing *moe__layer_token_routing(const moe_layer *layer);

/* Tests only: the runtime's table of the layer's steps, and another in its place (which must outlive the layer): a
 * fault injected into one step on one rank (tests/test_ep_faults.c, layout-bug). */
const moe_layer_ops *moe__layer_steps(const moe_layer *layer);
void moe__layer_set_steps(moe_layer *layer, const moe_layer_ops *steps);

#endif
