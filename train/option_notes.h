/* option_notes.h — notes on options given (a flag or a --config file) that the run's other options leave without
 * effect: a model with no MoE layer, a dense width with no dense layer, a drop priority without capacity, the
 * selection bias's step under softmax scores, a skip limit without skipping, a group score without groups. Notes, not
 * refusals: a sweep holds such an option fixed while another varies (docs/SWEEPS.md). */
#ifndef MOE_TRAIN_OPTION_NOTES_H
#define MOE_TRAIN_OPTION_NOTES_H

#include <stdio.h>

#include "train/options.h"

/* One "note: ..." line per such option to notes (NULL: quiet); the options are finished (moe_train_options_finish). */
void moe_train_note_inert_options(const moe_train_options *o, FILE *notes);

#endif
