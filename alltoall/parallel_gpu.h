/* parallel_gpu.h — parallel layouts whose payloads live on a GPU: the same groups as parallel.h, with GPU
 * transports (comm_gpu.h) that queue their device work on the stream of the given context. The layout
 * borrows the context (the runtime's, moe/runtime.h), which must outlive it. */
#ifndef MOE_ALLTOALL_PARALLEL_GPU_H
#define MOE_ALLTOALL_PARALLEL_GPU_H

#include "alltoall/parallel.h"
#include "core/gpu.h"

/* A world of one process whose payloads are on gpu's device. */
moe_status moe_parallel_create_self_gpu(moe_gpu *gpu, moe_parallel **out);

#endif
