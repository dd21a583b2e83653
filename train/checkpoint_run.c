/* train/checkpoint_run.c — a trainer's view for checkpoints (train/checkpoint_run.h).
 *   from train/trainer.h: the moments by range (ZeRO's gathers inside);  from train/config.h: the options as JSON */
#include "train/checkpoint_run.h"

#include "train/config.h"
#include "train/machine.h"

static moe_status moment_range(void *owner, int which, size_t offset, size_t count, moe_real *dst) {
    return moe_trainer_moment_range(owner, which, offset, count, dst);
}

static moe_status moment_range_set(void *owner, int which, size_t offset, size_t count, const moe_real *src) {
    return moe_trainer_moment_range_set(owner, which, offset, count, src);
}

/* as decided, not "auto": the record --resume continues exactly */
static json_t *run_config(const void *owner) {
    return moe_train_options_json(&((const moe_trainer *)owner)->opt, 0);
}

static json_t *run_machine(const void *owner) {
    (void)owner;
    return moe_run_machine_json();
}

moe_checkpoint_run moe_trainer_checkpoint_run(moe_trainer *t) {
    const moe_train_options *o = &t->opt;
    return (moe_checkpoint_run){.model = t->model, .par = t->par, .ranks = t->ranks, .config = &o->model,
                                .batch = o->batch, .micro_batches = o->micro_batches, .seed = o->seed,
                                .save_dtype = o->save_dtype, .save_shard_nbytes = o->save_shard_nbytes,
                                .timeout_s = o->checkpoint_timeout_s, .run_id = t->run_id,
                                .parent_run_id = t->parent_run_id, .notes = t->notes, .owner = t,
                                .moments_sharded = o->zero > 0, .moment_range = moment_range,
                                .moment_range_set = moment_range_set, .run_config = run_config,
                                .run_machine = run_machine};
}
