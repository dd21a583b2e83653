/* tree_add_cpu.c — y = lower + higher on the host (tree_add.h). */
#include "alltoall/tree_add.h"

void moe_tree_add_f32_cpu(float *y, const float *lower, const float *higher, size_t count) {
    for (size_t i = 0; i < count; i++) y[i] = lower[i] + higher[i];
}

void moe_tree_add_f64_cpu(double *y, const double *lower, const double *higher, size_t count) {
    for (size_t i = 0; i < count; i++) y[i] = lower[i] + higher[i];
}

void moe_tree_add_cpu(moe_tree_dtype dtype, void *y, const void *lower, const void *higher, size_t count) {
    if (dtype == MOE_TREE_F64) moe_tree_add_f64_cpu(y, lower, higher, count);
    else moe_tree_add_f32_cpu(y, lower, higher, count);
}
