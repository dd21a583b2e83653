/* train/device.h — where moe-train's model runs (--device): this rank's runtime and parallel layout, and,
 * on a GPU, the check that the run fits the device's memory before anything big is allocated. */
#ifndef MOE_TRAIN_DEVICE_H
#define MOE_TRAIN_DEVICE_H

#include <mpi.h>
#include <stdio.h>

#include "alltoall/parallel.h"
#include "core/gpu.h"
#include "train/options.h"
#include "moe/runtime.h"

typedef struct {
    moe_runtime *rt;  /* NULL: the CPU (the model makes its own) */
    moe_parallel *par;
    int device;       /* the CUDA device of this rank, -1 on the CPU */
} moe_train_placement;

/* Collective over world; every rank returns the same status (a rank that cannot place itself fails all).
 * --device cuda: device = the rank's index on its node modulo the node's GPUs; the transport is
 * --gpu-transport, or NCCL when each rank has its own GPU and MPI-staged when ranks share one (NCCL refuses
 * two ranks on one GPU). log (world rank 0's stdout, else NULL) gets the placement and the memory estimate. */
moe_status moe_train_place(const moe_train_options *o, MPI_Comm world, FILE *log, moe_train_placement *out);
void moe_train_unplace(moe_train_placement *p);

/* MOE_PROFILE_STEPS=A[-B] in the environment: on a GPU, steps A to B (default B = A) are the range a profiler
 * started with collection off records (bench/profile_train_gpu.sh; ncu --profile-from-start off). Called before
 * (begin 1) and after (0) each step; nothing on the CPU or without the variable. */
moe_status moe_train_profile_mark(const moe_train_placement *p, int step, int begin);
/* On a GPU: 1, with the device's host waits and allocations so far in *out (core/gpu.h); 0 on the CPU. */
int moe_train_gpu_counters(const moe_train_placement *p, moe_gpu_counters *out);
/* On a GPU: the GEMMs pinned there so far (MOE_LINEAR_GEMM=lt; kernels/gemm_lt.h), "shape: configuration" a line each;
 * "" on the CPU or where none is. Returns what snprintf would. */
int moe_train_gpu_gemms(const moe_train_placement *p, char *out, size_t n);

#endif
