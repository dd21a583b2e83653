/* parallel_gpu.h — parallel layouts whose layers run on a GPU: the same groups as parallel.h, a moe_gpu
 * context on one device per rank (owned by the layout), and GPU transports (comm_gpu.h). A layer created
 * on such a layout runs on that GPU (moe/backend.h picks the CUDA backend). */
#ifndef MOE_ALLTOALL_PARALLEL_GPU_H
#define MOE_ALLTOALL_PARALLEL_GPU_H

#include "alltoall/parallel.h"

/* A world of one process on CUDA device `device`. */
moe_status moe_parallel_create_self_gpu(int device, moe_parallel **out);

#endif
