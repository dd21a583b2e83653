/* nonfinite.h — where the first NaN or Inf of an array is (the trainer's and the layer's checks). */
#ifndef MOE_KERNELS_NONFINITE_H
#define MOE_KERNELS_NONFINITE_H

#include <stddef.h>

#include "core/gpu.h"
#include "core/types.h"

/* The index of the first element of a[0, count) that is NaN or Inf, or -1 when all are finite. */
long long moe_find_nonfinite_cpu(const moe_real *a, size_t count);

/* The same on the GPU (kernels/nonfinite.cu): a device array, *first a host value. Host sync. Uses the
 * context's scratch. */
moe_status moe_find_nonfinite_cuda(moe_gpu *gpu, const float *a, size_t count, long long *first);

#endif
