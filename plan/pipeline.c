/* plan/pipeline.c — a pipeline stage's share of the model, its activations in flight, the bubble and the refusals
 * (plan/pipeline.h). */
#include "plan/pipeline.h"

#include <stdlib.h>

#include "pipeline/schedule.h"

int64_t moe_plan_layout_pp(const moe_plan_layout *lay) { return lay->pp > 1 ? lay->pp : 1; }

int64_t moe_plan_layout_virtual_stages(const moe_plan_layout *lay) {
    return lay->virtual_stages > 1 ? lay->virtual_stages : 1;
}

int64_t moe_plan_layout_stage_ranks(const moe_plan_layout *lay) { return lay->world / moe_plan_layout_pp(lay); }

int64_t moe_plan_layout_tp(const moe_plan_layout *lay) { return lay->tp > 1 ? lay->tp : 1; }

moe_pipeline_split moe_plan_layout_split(const moe_plan_layout *lay) {
    return (moe_pipeline_split){.pp = (int)moe_plan_layout_pp(lay),
                                .chunks = (int)moe_plan_layout_virtual_stages(lay),
                                .first_layers = (int)lay->first_stage_layers,
                                .last_layers = (int)lay->last_stage_layers};
}

int64_t moe_plan_pipeline_max_layers(const moe_plan_model *m, const moe_plan_layout *lay) {
    int64_t most = 0;
    for (int64_t s = 0; s < moe_plan_layout_pp(lay); s++) {
        const int64_t n = moe_plan_pipeline_stage(m, lay, s).layers;
        most = n > most ? n : most;
    }
    return most;
}

int64_t moe_plan_layout_data_ranks(const moe_plan_layout *lay) {
    return moe_plan_layout_stage_ranks(lay) / moe_plan_layout_tp(lay);
}

/* MoE layers among layers [first, first + count): l >= first_dense and (l + 1) % moe_every == 0 (model.h's rule); a
 * model whose MoE layers follow no rule (HF mlp_only_layers) gets its share, rounded up */
static int64_t moe_layers_in(const moe_plan_model *m, int64_t first, int64_t count) {
    const int64_t all = moe_plan_model_num_moe_layers(m);
    if (all == 0) return 0;
    if (m->irregular_moe_layers) return (all * count + m->num_layers - 1) / m->num_layers;
    return moe_plan_model_moe_layers_below(m, first + count) - moe_plan_model_moe_layers_below(m, first);
}

/* Chunk stashes at the schedule's peak (pipeline/schedule.h), in stages' worth. Where the schedule cannot be made
 * (too few micro-batches: a layout refused elsewhere, or a memory bound asked for without a step), its unclamped
 * peak: 1F1B pp - s, interleaved 2(pp - s - 1) + (V - 1)pp + 1 chunk stashes. */
static double in_flight(int64_t pp, int64_t V, int64_t m, int64_t stage) {
    const moe_pp_shape shape = {.stages = (int)pp, .virtual_stages = (int)V, .micro_batches = (int)m};
    moe_pp_step *steps = NULL;
    int count = 0;
    double chunks = V == 1 ? (double)(pp - stage) : (double)(2 * (pp - stage - 1) + (V - 1) * pp + 1);
    if (m >= 1 && moe_pp_schedule(&shape, (int)stage, &steps, &count) == MOE_OK)
        chunks = moe_pp_schedule_max_in_flight(steps, count);
    free(steps);
    return chunks / (double)V;
}

moe_plan_stage moe_plan_pipeline_stage(const moe_plan_model *m, const moe_plan_layout *lay, int64_t stage) {
    const int64_t pp = moe_plan_layout_pp(lay), V = moe_plan_layout_virtual_stages(lay);
    if (pp == 1) /* the whole model, one micro-batch's activations */
        return (moe_plan_stage){.layers = m->num_layers, .moe_layers = moe_plan_model_num_moe_layers(m),
                                .embedding = 1, .head = 1, .in_flight = 1};
    const int64_t per_chunk = m->num_layers / (pp * V);
    moe_plan_stage s = {.embedding = stage == 0, .head = stage == pp - 1};
    if (V == 1) { /* models/model.h's cut, the ends' layers where given */
        const moe_pipeline_split split = moe_plan_layout_split(lay);
        int first = 0;
        s.layers = moe_pipeline_split_stage(&split, (int)m->num_layers, (int)stage, &first);
        s.moe_layers = moe_layers_in(m, first, s.layers);
    } else {
        for (int64_t c = 0; c < V; c++) {
            const int64_t v = c * pp + stage;
            s.layers += per_chunk;
            s.moe_layers += moe_layers_in(m, v * per_chunk, per_chunk);
        }
    }
    const int64_t micro_batches = lay->accum_steps > 0 ? lay->accum_steps : 1;
    s.in_flight = in_flight(pp, V, micro_batches, stage);
    return s;
}

int moe_plan_layout_cut_layers(const moe_plan_model *m, moe_plan_layout *lay) {
    const int64_t pp = moe_plan_layout_pp(lay), V = moe_plan_layout_virtual_stages(lay), L = m->num_layers;
    lay->first_stage_layers = lay->last_stage_layers = 0;
    if (L % (pp * V) == 0) return 1;
    if (V > 1 || pp > L) return 0;
    const int64_t per = (L + pp - 1) / pp, rest = L - (pp - 2) * per; /* the middle stages' share, the ends' */
    if (rest < 2) return 0;
    lay->first_stage_layers = rest / 2, lay->last_stage_layers = rest - rest / 2;
    return 1;
}

double moe_plan_pipeline_bubble(const moe_plan_layout *lay, int64_t micro_batches) {
    const int64_t pp = moe_plan_layout_pp(lay), V = moe_plan_layout_virtual_stages(lay);
    if (pp == 1 || micro_batches < 1) return 0;
    return (double)(pp - 1) / ((double)V * (double)micro_batches);
}

const char *moe_plan_pipeline_problem(const moe_plan_model *m, const moe_plan_layout *lay, int64_t micro_batches) {
    if (lay->pp < 0 || lay->virtual_stages < 0) return "--pp and --virtual-stages must be at least 1";
    const int64_t pp = moe_plan_layout_pp(lay), V = moe_plan_layout_virtual_stages(lay);
    if (V > 1 && pp == 1) return "--virtual-stages needs --pp above 1 (they are chunks of each pipeline stage)";
    if (pp == 1 && (lay->first_stage_layers || lay->last_stage_layers))
        return "--first-stage-layers and --last-stage-layers need a pipeline (--pp 2 or more), as in moe-train";
    if (pp == 1) return 0;
    if (lay->world % pp) return "--pp must divide the number of GPUs (each stage is GPUs / pp of them)";
    if (lay->first_stage_layers > (1 << 20) || lay->last_stage_layers > (1 << 20) || m->num_layers > (1 << 20))
        return "--first-stage-layers, --last-stage-layers and the layers must be at most 2^20";
    const moe_pipeline_split split = moe_plan_layout_split(lay);
    const char *cut = moe_pipeline_split_problem(&split, (int)m->num_layers);
    if (cut && !lay->first_stage_layers && !lay->last_stage_layers)
        return "--pp x --virtual-stages must divide the layers (each of the pp x V chunks gets the same number), or "
               "--first-stage-layers / --last-stage-layers give the ends theirs";
    if (cut) return cut;
    if (micro_batches == 0) return 0; /* the shape only */
    if (micro_batches < pp)
        return "a pipeline needs at least --pp micro-batches per step (global batch / (GPUs / pp x micro-batch)) to "
               "fill its stages";
    if (V > 1 && micro_batches % pp)
        return "the interleaved schedule (--virtual-stages above 1) needs the micro-batches per step to be a multiple "
               "of --pp (they pass each chunk in groups of pp, as in Megatron-LM)";
    const moe_pp_shape shape = {.stages = (int)pp, .virtual_stages = (int)V, .micro_batches = (int)micro_batches};
    if (pp > (1 << 20) || V > (1 << 20) || micro_batches > (1 << 24) || moe_pp_shape_check(&shape) != MOE_OK)
        return "the pipeline schedule has too many steps to count";
    return 0;
}
