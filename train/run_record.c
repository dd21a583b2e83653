/* run_record.c — the metrics log's run record and clock (train/run_record.h).
 *   from train/config.h: the options as JSON;  from version.h (meson vcs_tag): the commit;
 *   from train/machine.h: the CPU, the GEMM and BLAS libraries;  from MPI: its library version */
#include "train/run_record.h"

#include <cblas.h>
#include <jansson.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu_target.h"
#include "core/threads.h"
#include "kernels/gemm_engine.h"
#include "train/config.h"
#include "train/machine.h"
#include "version.h"

#ifndef MOE_PROJECT_VERSION
#define MOE_PROJECT_VERSION "unknown"
#endif
#ifndef MOE_COMPILER
#define MOE_COMPILER "unknown"
#endif

static struct timespec started;

void moe_run_record_start(void) { clock_gettime(CLOCK_MONOTONIC, &started); }

static void utc_now(char *out, size_t n) {
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t len = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + len, n - len, ".%03ldZ", now.tv_nsec / 1000000);
}

void moe_run_record_clock(FILE *f) {
    struct timespec now;
    char when[64];
    clock_gettime(CLOCK_MONOTONIC, &now);
    utc_now(when, sizeof when);
    fprintf(f, ",\"elapsed_s\":%.3f,\"time\":\"%s\"",
            (double)(now.tv_sec - started.tv_sec) + (now.tv_nsec - started.tv_nsec) / 1e9, when);
}

int moe_run_record_gemms(FILE *f, int step, const char *lines) {
    json_t *pinned = moe_run_machine_gemms_json(lines);
    char *text = pinned ? json_dumps(pinned, JSON_COMPACT) : NULL;
    fprintf(f, "{\"record\":\"gemm\",\"step\":%d,\"pinned\":%s", step, text ? text : "null");
    moe_run_record_clock(f);
    fprintf(f, "}\n");
    free(text);
    json_decref(pinned);
    return fflush(f) != 0 || ferror(f) ? -1 : 0;
}

int moe_run_record_write(FILE *f, const moe_trainer *t, int world_size, const char *device) {
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "unknown", when[64];
    int len = 0;
    if (MPI_Get_library_version(mpi, &len) == MPI_SUCCESS) mpi[strcspn(mpi, "\n,")] = 0; /* its first clause */
    utc_now(when, sizeof when);
    json_t *r = json_pack("{s:s, s:o, s:{s:i, s:i, s:i, s:i, s:s}, s:{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}, s:s, "
                          "s:s}",
                          "record", "run", "config", moe_train_options_json(&t->opt, 0), "layout", "world_size",
                          world_size, "ep", t->ranks.ep_size, "expert_data_parallel", t->ranks.edp_size,
                          "threads_per_rank", moe_threads_get(), "device", device, "versions", "moe",
                          MOE_PROJECT_VERSION, "compiler", MOE_COMPILER, "cpu", moe_cpu_model(), "cpu_target",
                          moe_cpu_target(), "gemm", moe_gemm_library(), "openblas", moe_run_openblas_text(), "mpi", mpi,
                          "jansson", JANSSON_VERSION, "git_commit", MOE_GIT_COMMIT, "started", when);
    char *text = r ? json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER | MOE_JSON_FLOATS) : NULL;
    fprintf(f, "%s\n", text ? text : "{\"record\":\"run\",\"error\":\"out of memory\"}");
    free(text);
    json_decref(r);
    return fflush(f) != 0 || ferror(f) ? -1 : 0;
}
