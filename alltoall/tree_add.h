/* tree_add.h — one node of the fixed tree (tree_reduce.h) over buffers: y[i] = lower[i] + higher[i], one
 * rounded addition per element (no FMA: the build passes -ffp-contract=off), y may be lower or higher.
 * The CPU versions (tree_add_cpu.c) are the local tree's and the MPI transport's; the CUDA one
 * (tree_add_cuda.h, tree_add.cu) is their device twin, bitwise the same (tests/test_gpu_tree_allreduce.c). */
#ifndef MOE_ALLTOALL_TREE_ADD_H
#define MOE_ALLTOALL_TREE_ADD_H

#include <stddef.h>

#include "alltoall/tree_reduce.h"

void moe_tree_add_f32_cpu(float *y, const float *lower, const float *higher, size_t count);
void moe_tree_add_f64_cpu(double *y, const double *lower, const double *higher, size_t count);
/* one of the two by dtype */
void moe_tree_add_cpu(moe_tree_dtype dtype, void *y, const void *lower, const void *higher, size_t count);

#endif
