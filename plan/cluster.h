/* plan/cluster.h — moe-plan's cluster and its time model: how many bytes each GPU moves per training step
 * (all-to-all split by where its peers are, ring all-reduce or ZeRO-2's reduce-scatter), how long that and the
 * compute take, and the step time, tokens/s and MFU with and without overlap of exchanges and compute. Formulas:
 * docs/SCALING.md.
 *
 * Ranks are placed as mpirun and srun place them by default: rank r on node r / gpus_per_node. EP groups are
 * blocks of ep consecutive ranks, expert-data-parallel groups are ranks ep apart (README "Ranks and experts"); a
 * pipeline stage is a block of world / pp consecutive ranks, its stages world / pp apart; tensor-parallel groups are
 * blocks of tp consecutive ranks inside a node (pipeline/grid.h). */
#ifndef MOE_PLAN_CLUSTER_H
#define MOE_PLAN_CLUSTER_H

#include "plan/model.h"
#include "plan/pipeline.h"

typedef struct {
    int64_t gpus_per_node, nodes;
    double gpu_flops;          /* peak GEMM FLOP/s of one GPU at the run's precision                          */
    double gemm_efficiency;    /* the fraction of gpu_flops that the training GEMMs sustain                   */
    double non_gemm_overhead;  /* time outside GEMMs (norms, softmax, RoPE, routing, permute, SwiGLU, loss) as a
                                  fraction of the GEMM time                                                      */
    double gpu_memory;         /* bytes one GPU may use                                                       */
    double mem_bw;             /* bytes/s of one GPU's memory: the optimizer step is bound by it              */
    double intra_bw, inter_bw; /* bytes/s one GPU sends (and receives) to peers on its node / on other nodes   */
    double intra_latency, inter_latency; /* seconds per collective step                                       */
    /* Measured calibrations (CPU: bench/bench_model_dense.c), 0 when not given. dense_s_per_token: seconds of the
     * dense path's forward + backward per token on one GPU, in place of its FLOPs over the GEMM rate (the GEMM
     * rate and non-GEMM overhead then price the MoE layers only); optimizer_s_per_param: seconds of the optimizer
     * step per parameter, measured in fp32 with every parameter updated, in place of the bytes over mem_bw. */
    double dense_s_per_token, optimizer_s_per_param;
} moe_plan_cluster;

/* An H100 SXM node: 8 GPUs, 989.4 TFLOP/s dense bf16 (67 TFLOP/s fp32 without tensor cores), 80 GB HBM3 at
 * 3.35 TB/s, NVLink 4 at 450 GB/s each way per GPU, one 400 Gb/s InfiniBand NIC (50 GB/s) per GPU; latencies
 * 5 µs (NVLink) and 10 µs (InfiniBand) per collective step; GEMMs at 70% of peak, non-GEMM work 25% of GEMM
 * time. Assumptions, stated in docs/SCALING.md; every one has a flag. No measured calibrations. */
moe_plan_cluster moe_plan_cluster_h100(int bf16);

/* NULL when usable, else a sentence naming the first bad field. */
const char *moe_plan_cluster_problem(const moe_plan_cluster *c);

/* The run: a layout of the cluster's GPUs and the global batch (sequences per optimizer step). */
typedef struct {
    moe_plan_layout layout;
    int64_t global_batch;
} moe_plan_run;

/* NULL when the run can be laid out on the cluster (sizes divide, world = gpus_per_node * nodes, the pipeline's
 * shape and micro-batches: moe_plan_pipeline_problem), else a sentence naming what does not fit; about shapes and
 * divisibility, not memory (and ZeRO-2's need of the world-invariant sums). */
const char *moe_plan_run_problem(const moe_plan_model *m, const moe_plan_cluster *c, const moe_plan_run *r);

typedef struct {
    int64_t accum_steps;          /* micro-batches per step = global_batch / (world / pp * micro_batch)    */
    double tokens_per_step;       /* global_batch * seq_len                                                 */
    double flops_per_token;       /* moe_plan_model_flops_per_token: model FLOPs, what MFU counts          */
    double recompute_flops_per_token; /* what recomputation adds (hardware FLOPs, in the step time only)    */
    /* bytes one GPU sends per step (it receives as many under balanced routing) */
    double alltoall_intra_bytes, alltoall_inter_bytes;
    /* the gradient reduction: ring all-reduce, 2 (n-1)/n of the gradient bytes once per step; under ZeRO-2 a
     * reduce-scatter, (n-1)/n of them per micro-batch (dense over the world, a GPU's experts over dp) */
    double allreduce_dense_bytes, allreduce_expert_bytes;
    double zero_gather_bytes;     /* ZeRO-1's and 2's all-gathers of the updated parameters: (n-1)/n of the dense
                                   * over the world, of a GPU's experts over its expert-data-parallel group    */
    int alltoall_peers_intra, alltoall_peers_inter; /* the busiest rank's EP peers on / off its node   */
    int dense_group_spans_nodes, expert_group_spans_nodes, pipeline_spans_nodes;
    /* the pipeline (pp > 1): a GPU sends one activation forward and one gradient back per micro-batch and chunk, of
     * its micro-batch's T d values at the exchanged precision; the idle fraction (pp - 1)/(V m) and its seconds */
    double p2p_bytes, bubble_fraction;
    double tp_bytes;              /* tensor parallelism's all-gathers, reduce-scatters and all-to-alls (0 at tp 1) */
    /* seconds per step */
    double compute_s, optimizer_s, alltoall_s, control_s;
    double allreduce_s;           /* the gradient reduction (all-reduce, or ZeRO-2's reduce-scatters) and the
                                   * ZeRO all-gather                                                           */
    double compute_dense_s, compute_moe_s; /* compute_s = their sum: the dense path's and the MoE layers' */
    double p2p_s;                 /* the pipeline's sends between stages, one after another                 */
    double tp_s;                  /* tensor parallelism's collectives, one after another                    */
    double bubble_s;              /* bubble_fraction of the pipelined time (compute, all-to-all, control, the
                                   * tensor-parallel collectives, p2p)                                         */
    double step_serial_s;         /* compute + optimizer + every exchange + the bubble, one after another (this
                                   * project)                                                                  */
    double step_overlap_s;        /* exchanges hidden behind compute: max(compute, comm) + optimizer + the bubble */
    double tokens_per_s_serial, tokens_per_s_overlap, mfu_serial, mfu_overlap;
    double routing_skew;          /* the layout's, or 1 at ep 1 (one EP rank waits for no one)                 */
    moe_plan_memory memory;
    int fits;                     /* memory.total <= gpu_memory */
} moe_plan_prediction;

/* For a run with no problem (moe_plan_run_problem NULL). */
moe_plan_prediction moe_plan_predict(const moe_plan_model *m, const moe_plan_cluster *c, const moe_plan_run *r);

#endif
