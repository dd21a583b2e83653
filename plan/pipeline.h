/* plan/pipeline.h — what pipeline parallelism (moe-train --pp P --virtual-stages V, issue 27) changes in a plan:
 * which layers and ends a stage holds, how many micro-batches' activations its schedule keeps at once, the bubble,
 * and the layouts that cannot run. Pure arithmetic over pipeline/schedule.h's schedules and pipeline/grid.h's grid;
 * no communication, no I/O.
 *
 * The grid (pipeline/grid.h): W = pp · dp · ep · tp with pp outermost, so a stage is W/pp consecutive ranks (its
 * dense gradients are summed over them) and the expert-data-parallel group is W/(pp · ep). Chunk c of stage s is
 * virtual stage v = c·pp + s of the pp·V the layers are cut into, each L/(pp·V) layers: layers
 * [v·L/(pp·V), (v+1)·L/(pp·V)); with V = 1 the ends may hold their own counts (--first-stage-layers,
 * --last-stage-layers; the stages between an equal share of the rest: models/model.h's moe_pipeline_split, the cut
 * moe-train makes). Virtual stage 0 (stage 0) embeds; virtual stage pp·V - 1 (stage pp - 1) holds the
 * final norm and lm_head, and with tied embeddings a copy of the embedding as its lm_head (Megatron-LM's rule; its
 * gradient is summed with the first stage's).
 *
 * Activations in flight: stage s keeps moe_pp_schedule_max_in_flight of its schedule chunk stashes, each 1/V of its
 * layers: 1F1B min(pp - s, m) stages' worth, interleaved min(2(pp-s-1) + (V-1)pp + 1, mV)/V, at most
 * pp·(1 + (pp-1)/(pp·V)) on stage 0 (pipeline/schedule.h). The bubble: each stage idles (pp - 1)/(V·m) of the
 * pipelined time (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
 * Megatron-LM", sec. 2.2.2: t_pb / t_id = (p - 1)/(v·m)). */
#ifndef MOE_PLAN_PIPELINE_H
#define MOE_PLAN_PIPELINE_H

#include "plan/model.h"

/* The layout's pipeline stages and virtual stages per stage (0 reads as 1: no pipeline). */
int64_t moe_plan_layout_pp(const moe_plan_layout *lay);
int64_t moe_plan_layout_virtual_stages(const moe_plan_layout *lay);

/* The ranks of one stage (W / pp): the data x expert x tensor block that holds its layers. */
int64_t moe_plan_layout_stage_ranks(const moe_plan_layout *lay);
/* The layout's cut of the layers (models/model.h), and the most layers a stage holds (the slowest stage's). */
moe_pipeline_split moe_plan_layout_split(const moe_plan_layout *lay);
int64_t moe_plan_pipeline_max_layers(const moe_plan_model *m, const moe_plan_layout *lay);
/* The layout's tensor-parallel size (0 reads as 1), and the ranks of a stage that read distinct sequences, W / (pp tp):
 * the batch splits over them, and a split tensor's gradient is summed over them (ZeRO shards it over them). */
int64_t moe_plan_layout_tp(const moe_plan_layout *lay);
int64_t moe_plan_layout_data_ranks(const moe_plan_layout *lay);

/* What stage `stage` (0 .. pp - 1) of the layout holds. */
typedef struct moe_plan_stage {
    int64_t layers, moe_layers; /* decoder layers of its V chunks, and how many of them are MoE layers          */
    int embedding;              /* 1: it holds the input embedding (stage 0)                                    */
    int head;                   /* 1: it holds the final norm and lm_head (stage pp - 1; the embedding's copy
                                 * when tied)                                                                    */
    double in_flight;           /* micro-batches' activations it keeps at its schedule's peak, in whole stages'
                                 * worth (chunk stashes / V); 1 without a pipeline                               */
} moe_plan_stage;
moe_plan_stage moe_plan_pipeline_stage(const moe_plan_model *m, const moe_plan_layout *lay, int64_t stage);

/* The search's cut of the layers for the layout's pp and V: equal stages where pp V divides the layers, else (V 1)
 * Megatron's uneven ends: the stages between ceil(L / pp) layers each, the first and the last what they leave, split
 * as evenly as can be (the last the larger half: the first keeps the most micro-batches in flight). Sets the layout's
 * first_stage_layers and last_stage_layers (0 when equal); 0 when no cut exists. */
int moe_plan_layout_cut_layers(const moe_plan_model *m, moe_plan_layout *lay);

/* The idle fraction (pp - 1) / (V · m) of the pipelined time for m micro-batches; 0 without a pipeline. */
double moe_plan_pipeline_bubble(const moe_plan_layout *lay, int64_t micro_batches);

/* NULL when the pipeline can run, else a sentence naming what is wrong: pp not dividing the GPUs, pp·V not
 * dividing the layers (and no ends' counts given), ends' counts that leave the stages between no equal share,
 * --virtual-stages without --pp above 1, fewer micro-batches than stages, an interleaved schedule with micro-batches
 * not a multiple of pp. micro_batches 0: the shape only. */
const char *moe_plan_pipeline_problem(const moe_plan_model *m, const moe_plan_layout *lay, int64_t micro_batches);

#endif
