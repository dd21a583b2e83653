/* train/checkpoint_run.h — the trainer as checkpoints see it: the narrow view of checkpoint/checkpoint.h
 * (moe_checkpoint_run), filled from a trainer, so that checkpoints read a handful of fields and never the trainer's
 * options. Take it right before the checkpoint call: it copies the ranks and notes and points into t. */
#ifndef MOE_TRAIN_CHECKPOINT_RUN_H
#define MOE_TRAIN_CHECKPOINT_RUN_H

#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

moe_checkpoint_run moe_trainer_checkpoint_run(moe_trainer *t);

#endif
