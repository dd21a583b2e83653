/* nonfinite.h — where the first NaN or Inf of an array is (the trainer's and the layer's checks). */
#ifndef MOE_KERNELS_NONFINITE_H
#define MOE_KERNELS_NONFINITE_H

#include <stddef.h>

#include "core/types.h"

/* The index of the first element of a[0, count) that is NaN or Inf, or -1 when all are finite. */
long long moe_find_nonfinite_cpu(const moe_real *a, size_t count);

#endif
