/* machine.h — what computed a run, as far as its bits go (docs/DETERMINISM.md, "Across CPUs"): the CPU, the GEMM
 * library and the instruction set its kernels run on, OpenBLAS's kernels, the build. The run record's versions hold
 * it (train/run_record.h), checkpoints record it in their manifest (checkpoint/checkpoint.h's run_machine), and a
 * resume on another machine or build says so. */
#ifndef MOE_TRAIN_MACHINE_H
#define MOE_TRAIN_MACHINE_H

#include <jansson.h>
#include <stdio.h>

/* {"cpu": moe_cpu_model(), "cpu_target", "gemm": moe_gemm_library() (the library, its version, the instruction set
 * its kernels run on, the bf16 mode), "openblas": moe_run_openblas_text(), "git_commit", "compiler"}: a new object;
 * NULL when out of memory. */
json_t *moe_run_machine_json(void);
/* OpenBLAS's configuration and the core whose kernels it runs (attention's products): "OpenBLAS 0.3.21 ..., core
 * Haswell". */
const char *moe_run_openblas_text(void);
/* The note for a resume of DIR, whose manifest recorded `saved`, when this process computes with another machine
 * record: the fields that differ, and that the results from here on may differ in their last bits from a run that
 * stayed; nothing when they agree or saved is not an object (a checkpoint from before the record). Not an error. */
void moe_run_machine_note(FILE *notes, const char *dir, json_t *saved);

#endif
