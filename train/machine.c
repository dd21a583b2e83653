/* machine.c — what computed a run (train/machine.h).
 *   from core/cpu_target.h: the CPU and the build's target;  from kernels/gemm_engine.h and OpenBLAS: the libraries;
 *   from version.h: the commit */
#include "train/machine.h"

#include <cblas.h>

#include "core/cpu_target.h"
#include "kernels/gemm_engine.h"
#include "version.h"

#ifndef MOE_COMPILER
#define MOE_COMPILER "unknown"
#endif

const char *moe_run_openblas_text(void) {
    static char text[192];
    snprintf(text, sizeof text, "%s, core %s", openblas_get_config(), openblas_get_corename());
    return text;
}

json_t *moe_run_machine_json(void) {
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "cpu", moe_cpu_model(), "cpu_target", moe_cpu_target(), "gemm",
                     moe_gemm_library(), "openblas", moe_run_openblas_text(), "git_commit", MOE_GIT_COMMIT, "compiler",
                     MOE_COMPILER);
}

void moe_run_machine_note(FILE *notes, const char *dir, json_t *saved) {
    json_t *now = moe_run_machine_json();
    if (!notes || !now || !json_is_object(saved)) return json_decref(now);
    const char *key;
    json_t *is;
    int differ = 0;
    json_object_foreach(now, key, is) {
        json_t *was = json_object_get(saved, key);
        if (was && json_equal(was, is)) continue;
        if (!differ++)
            fprintf(notes, "note: --resume %s: this process computes with another machine or build than the run it "
                    "continues, so the results from here on may differ in their last bits from a run that stayed "
                    "(docs/DETERMINISM.md, \"Across CPUs\"):\n", dir);
        fprintf(notes, "note:   %s: saved %s, now %s\n", key,
                json_is_string(was) ? json_string_value(was) : "unrecorded", json_string_value(is));
    }
    json_decref(now);
}
