/* plan/search.h — moe-plan --search: every layout of a cluster's GPUs for one model and global batch (each ep
 * dividing the GPUs and the experts, each tensor-parallel tp a power of two inside a node that the model's heads,
 * widths and vocabulary allow, each pipeline pp dividing the GPUs and the layers with each V (virtual stages)
 * that pp V divides the layers (moe_plan_run_problem refusing those with too few micro-batches), ZeRO 0, 1 and 2 (2 only where moe-train's world-invariant sums are on:
 * moe_plan_run_problem), each recompute level, each micro-batch size dividing the sequences per GPU),
 * predicted (plan/cluster.h), the ones that fit in memory ranked by tokens/s as this project runs them
 * (exchanges not overlapped with compute). */
#ifndef MOE_PLAN_SEARCH_H
#define MOE_PLAN_SEARCH_H

#include "plan/cluster.h"
#include "plan/routing.h"

typedef struct {
    moe_plan_run run;
    moe_plan_prediction prediction;
} moe_plan_candidate;

/* base gives the cluster's world, the sequence length, precision, attention, workspace and global batch (a
 * multiple of a stage's GPUs, world / pp, for the pipelines tried); its ep, pp, virtual_stages, zero, recompute and micro_batch are ignored. routing: a run's routing, whose skew
 * each ep gets (plan/routing.h); NULL: every ep gets base's layout.routing_skew. *out (malloc'ed, the caller
 * frees) holds the layouts that fit, best first (ties: smaller ep, pp, tp, V, lower ZeRO, less recompute, larger micro-batch);
 * *num_tried counts all predicted (the valid layouts: not ZeRO-2 where moe_plan_run_problem refuses it).
 * MOE_ERR_OUT_OF_MEMORY is the only failure. */
moe_status moe_plan_search(const moe_plan_model *m, const moe_plan_cluster *c, const moe_plan_run *base,
                           const moe_plan_routing *routing, moe_plan_candidate **out, int *num_fit, int *num_tried);

#endif
