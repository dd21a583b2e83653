/* real.h — internal: the math and BLAS entry points for moe_real (float, or double in the f64 build). */
#ifndef MOE_REAL_H
#define MOE_REAL_H

#include <cblas.h>
#include <math.h>

#include "core/types.h"

#ifdef MOE_REAL_IS_DOUBLE
#define moe__gemm cblas_dgemm
#define moe__exp exp
#define moe__log log
#else
#define moe__gemm cblas_sgemm
#define moe__exp expf
#define moe__log logf
#endif

#endif
