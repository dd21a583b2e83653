/* machine.c — what computed a run (train/machine.h).
 *   from core/cpu_target.h: the CPU and the build's target;  from kernels/gemm_engine.h and OpenBLAS: the libraries;
 *   from version.h: the commit */
#include "train/machine.h"

#include <cblas.h>
#include <string.h>

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

static char gpu_text[384]; /* moe_run_machine_set_gpu's; "" on the CPU */

void moe_run_machine_set_gpu(const char *text) { snprintf(gpu_text, sizeof gpu_text, "%s", text ? text : ""); }

json_t *moe_run_machine_json(void) {
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "cpu", moe_cpu_model(), "cpu_target", moe_cpu_target(),
                          "gemm", moe_gemm_library(), "openblas", moe_run_openblas_text(), "git_commit",
                          MOE_GIT_COMMIT, "compiler", MOE_COMPILER);
    if (j && gpu_text[0] && json_object_set_new(j, "gpu", json_string(gpu_text)) != 0) return json_decref(j), NULL;
    return j;
}

json_t *moe_run_machine_gemms_json(const char *lines) {
    json_t *pinned = json_array();
    for (const char *p = lines; pinned && *p;) {
        const size_t len = strcspn(p, "\n");
        if (json_array_append_new(pinned, json_stringn(p, len)) != 0) json_decref(pinned), pinned = NULL;
        p += len + (p[len] == '\n');
    }
    return pinned;
}

void moe_run_machine_note(FILE *notes, const char *dir, json_t *saved) {
    json_t *now = moe_run_machine_json();
    if (!notes || !now || !json_is_object(saved)) return json_decref(now);
    const char *key;
    json_t *is, *was;
    int differ = 0;
    for (int side = 0; side < 2; side++) /* this machine's fields, then those only the saved record has */
        json_object_foreach(side ? saved : now, key, was) {
            is = json_object_get(now, key), was = json_object_get(saved, key);
            if (side ? is != NULL : was && json_equal(was, is)) continue;
            if (!differ++)
                fprintf(notes, "note: --resume %s: this process computes with another machine or build than the run "
                        "it continues, so the results from here on may differ in their last bits from a run that "
                        "stayed (docs/DETERMINISM.md, \"Across CPUs\"):\n", dir);
            fprintf(notes, "note:   %s: saved %s, now %s\n", key,
                    json_is_string(was) ? json_string_value(was) : "unrecorded",
                    json_is_string(is) ? json_string_value(is) : "none");
        }
    json_decref(now);
}
