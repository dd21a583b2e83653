/* machine.h — what computed a run, as far as its bits go (docs/DETERMINISM.md, "Across CPUs"): the CPU, the GEMM
 * library and the instruction set its kernels run on, OpenBLAS's kernels, the build. The run record's versions hold
 * it (train/run_record.h), checkpoints record it in their manifest (checkpoint/checkpoint.h's run_machine), and a
 * resume on another machine or build says so. */
#ifndef MOE_TRAIN_MACHINE_H
#define MOE_TRAIN_MACHINE_H

#include <jansson.h>
#include <stdio.h>

/* {"cpu": moe_cpu_model(), "cpu_target", "gemm": moe_gemm_library() (the library, its version, the instruction set
 * its kernels run on, the bf16 mode), "openblas": moe_run_openblas_text(), "git_commit", "compiler"}, and on a GPU
 * "gpu" (moe_run_machine_set_gpu): a new object; NULL when out of memory. */
json_t *moe_run_machine_json(void);
/* The GPU this process computes on, as core/gpu.h's moe_gpu_describe gives it (model, SMs, compute capability, the
 * CUDA runtime, driver and cuBLAS versions: what cuBLAS's kernel choices, and so the bits, depend on), and NCCL's
 * version when NCCL is the transport; the CUDA module sets it once placed (train/device_cuda.c). NULL: none (a CPU
 * run, the default). */
void moe_run_machine_set_gpu(const char *text);
/* OpenBLAS's configuration and the core whose kernels it runs (attention's products): "OpenBLAS 0.3.21 ..., core
 * Haswell". */
const char *moe_run_openblas_text(void);
/* The note for a resume of DIR, whose manifest recorded `saved`, when this process computes with another machine
 * record: the fields that differ (one recorded on one side only too, such as a GPU's), and that the results from here
 * on may differ in their last bits from a run that stayed; nothing when they agree or saved is not an object (a
 * checkpoint from before the record). Not an error. */
void moe_run_machine_note(FILE *notes, const char *dir, json_t *saved);
/* The GEMMs pinned on cuBLASLt (kernels/gemm_lt.h: which algorithm each product shape ran with, the GPU's other part
 * of the bits), from lines ("\n"-terminated, as moe_train_gpu_gemms gives them) to a JSON array of their strings:
 * the metrics log's gemm record (train/run_record.h). A new array; NULL when out of memory. */
json_t *moe_run_machine_gemms_json(const char *lines);

#endif
