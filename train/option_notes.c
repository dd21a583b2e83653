/* option_notes.c — notes on options left without effect (train/option_notes.h). */
#include "train/option_notes.h"

#include <stddef.h>

#include "models/model.h"

/* 1 when the option stored at `offset` was given (a flag or a --config file) other than its default. */
static int given(const moe_train_options *o, size_t offset) {
    const moe_train_option *s = moe_train_option_at(offset);
    return s && moe_train_option_from(o, s, MOE_OPTION_CONFIG_FILE) && !moe_train_option_is_default(o, s);
}

#define GIVEN(field) given(o, offsetof(moe_train_options, field))

void moe_train_note_inert_options(const moe_train_options *o, FILE *notes) {
    if (!notes) return;
    const moe_model_config *m = &o->model;
    const int moe_layers = moe_model_moe_layers(m);
    if (!moe_layers)
        fprintf(notes, "note: no layer is an MoE layer (%d expert%s, --moe-every %d, --first-dense-layers %d, %d "
                       "layers): the model trains dense, and the routing options (--top-k, --ep, the router's) act on "
                       "nothing\n", m->moe.num_experts, m->moe.num_experts == 1 ? "" : "s", m->moe_every,
                m->first_dense, m->num_layers);
    if (moe_layers == m->num_layers && GIVEN(model.dense_d_ff))
        fprintf(notes, "note: --dense-d-ff %d has no effect: every layer is an MoE layer\n", m->dense_d_ff);
    if (moe_layers && m->moe.capacity_factor <= 0 && GIVEN(model.moe.drop_priority))
        fprintf(notes, "note: --drop-priority has no effect: the routing is dropless (--capacity-factor 0)\n");
    if (moe_layers && m->moe.score_func != MOE_SCORE_SIGMOID && GIVEN(model.moe.bias_update_rate))
        fprintf(notes, "note: --bias-update-rate has no effect: the selection bias is sigmoid routing's (--score "
                       "sigmoid), and the scores are softmax\n");
    /* AdamW's second moment underflows in fp32 for gradients below ~1e-19 while the first does not: the update is then
     * lr m / eps, huge when eps is tiny, and finite, so no guard sees it (a probe, 2026-12-07: losses 5.5 -> 444) */
    if (o->adam_eps < 1e-16f)
        fprintf(notes, "note: --adam-eps %g: where a weight's gradients are below ~1e-19, AdamW's second moment "
                       "underflows to 0 in fp32 and its update becomes lr x m / eps (1e-8, the default, bounds it)\n",
                (double)o->adam_eps);
    if (!o->skip_nonfinite && GIVEN(max_skipped_steps))
        fprintf(notes, "note: --max-skipped-steps has no effect without --skip-nonfinite 1\n");
    if (moe_layers && !moe_config_grouped(&m->moe) && GIVEN(model.moe.group_score))
        fprintf(notes, "note: --group-score has no effect without expert groups (--expert-groups)\n");
    /* given 0 (auto's 0 has its own note, in which --shards may be the cause: a probe, 2026-12-07) */
    if (!o->world_invariant && GIVEN(world_invariant) && GIVEN(shards))
        fprintf(notes, "note: --shards %d has no effect with --world-invariant 0 (the sums are per rank)\n", o->shards);
    /* Megatron's --save-interval without --save: nothing saved, said only at a stop (a probe) */
    if (!*o->checkpoint_dir && (GIVEN(checkpoint_interval) || GIVEN(keep_last) || GIVEN(save_dtype) ||
                                GIVEN(save_shard_size)))
        fprintf(notes, "note: no --checkpoint-dir: nothing is saved, and --checkpoint-interval, --keep-last, "
                       "--save-dtype and --save-shard-size have no effect\n");
    if (o->eval_only && !*o->resume && !*o->init_from)
        fprintf(notes, "note: --eval-only without --resume or --init-from evaluates freshly initialised weights\n");
    /* --eval-only evaluates and exits: what a training run does at its end does not happen (a probe: said nowhere) */
    if (o->eval_only && (GIVEN(sample_tokens) || GIVEN(sample_prompt) || GIVEN(routing_trace_in)))
        fprintf(notes, "note: --eval-only evaluates and exits: --sample-tokens, --sample-prompt and --routing-trace-in "
                       "have no effect\n");
}
