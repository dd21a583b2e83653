/* dense_ops_fault.h — a deliberately wrong op, for testing the checks that must catch one (moe-train's
 * --verify-steps, through the MOE_TEST_FAULT environment variable; never set in a real run).
 *
 * The fault: a copy of a dense table in which one entry does its work twice. For the entries that accumulate
 * into their outputs or work in place that is wrong by a factor or a rotation, the way a forgotten zeroing, a
 * double launch or a wrong beta is wrong: rmsnorm_backward (dx and dw added twice), linear_backward_weight (dW
 * twice), embedding_backward, swiglu_backward, rope_forward and rope_backward (rotated twice). */
#ifndef MOE_MOE_DENSE_OPS_FAULT_H
#define MOE_MOE_DENSE_OPS_FAULT_H

#include "moe/dense_ops.h"

/* *out = base with the entry named `entry` run twice; it shares base's state (moe_dense_ops.create is base's),
 * so it can replace base in a model that base created. One faulty table per process (the wrappers reach base
 * through a static). MOE_ERR_INVALID_ARG, naming the entries there are, for any other name. */
moe_status moe_dense_ops_with_fault(const moe_dense_ops *base, const char *entry, moe_dense_ops *out);

#endif
