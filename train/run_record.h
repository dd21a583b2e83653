/* run_record.h — what moe-train's metrics log (--log-file, JSON lines) says besides the steps: its first record,
 * the whole run (every option, the layout, the versions, the commit), and the clock of every later record. */
#ifndef MOE_TRAIN_RUN_RECORD_H
#define MOE_TRAIN_RUN_RECORD_H

#include <stdio.h>

#include "train/trainer.h"

/* Writes {"record":"run","config":{every option, as --print-config},"layout":{...},"versions":{...},
 * "git_commit":"...","started":"<UTC time>"} as one line. device: where the model runs ("cpu", "cuda"). 0, or -1
 * (errno set) when the file could not take it. */
int moe_run_record_write(FILE *f, const moe_trainer *t, int world_size, const char *device);

/* ,"elapsed_s":S,"time":"2026-11-24T10:11:12.345Z" — seconds since moe-train started, and the UTC wall clock:
 * the fields every later record carries. */
void moe_run_record_clock(FILE *f);

/* {"record":"gemm","step":S,"pinned":["<shape>: <configuration>", ...]} from lines ("\n"-terminated, as
 * moe_train_gpu_gemms gives them) and the clock: which algorithm each product ran with, the bits' other half besides
 * the machine record (kernels/gemm_lt.h). 0, or -1 when the file could not take it. */
int moe_run_record_gemms(FILE *f, int step, const char *lines);

/* Marks moe-train's start (elapsed_s counts from here); call first thing in main. */
void moe_run_record_start(void);

#endif
