/* test_machine.c — what fixes a GPU run's bits besides the code, recorded, without a GPU. The machine record
 * (train/machine.h): moe_run_machine_set_gpu's text becomes the record's "gpu" (absent on the CPU), and a resume's note
 * names a GPU that differs, one the saved run had and this one has not (a GPU run resumed on the CPU), and one only
 * this run has; a record equal to this machine's gives no note (issue 50, item 7: cuBLAS's bits hold for one model, SM
 * count and version). The metrics log's gemm record (train/run_record.h): each pinned GEMM's line a string of its
 * "pinned" array, quotes escaped (issue 50, item 2).
 * Run: meson test -C build test_machine (suite unit). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/test_util.h"
#include "train/machine.h"

/* moe_run_machine_note's text for a saved record (NULL: this machine's own with key set to value, or removed) */
static char *note_for(json_t *saved) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    moe_run_machine_note(f, "ckpt/step-00000004", saved);
    fclose(f);
    return text;
}

static json_t *this_machine_with(const char *key, const char *value) {
    json_t *j = moe_run_machine_json();
    if (value) json_object_set_new(j, key, json_string(value));
    else json_object_del(j, key);
    return j;
}

static void test_gemm_record(void) {
    const char *pinned[] = {"A B^T n 64 k 32 bf16 -> bf16: cuBLASLt 130100 compute 32F algo 66 tile 23 stages 35 "
                            "splitk 1 reduction none (heuristic #1 of 8 at 8192 rows)",
                            "A^T B n 32 k 4096 fp32: none (cuBLASLt offers no \"batch-invariant\" algorithm)"};
    char lines[512];
    snprintf(lines, sizeof lines, "%s\n%s\n", pinned[0], pinned[1]);
    json_t *a = moe_run_machine_gemms_json(lines);
    char *text = json_dumps(a, JSON_COMPACT);
    CHECK(text && !strchr(text, '\n'), "the record's array spans lines: %s", text ?: "(none)");
    free(text);
    CHECK(json_array_size(a) == 2, "%zu pinned lines, want 2", json_array_size(a));
    for (size_t i = 0; i < json_array_size(a) && i < 2; i++)
        CHECK(!strcmp(json_string_value(json_array_get(a, i)) ?: "", pinned[i]), "line %zu: %s", i,
              json_string_value(json_array_get(a, i)));
    json_decref(a);
    a = moe_run_machine_gemms_json(pinned[0]); /* a last line without its newline */
    CHECK(json_array_size(a) == 1, "an unterminated line is lost");
    json_decref(a);
    a = moe_run_machine_gemms_json("");
    CHECK(a && json_array_size(a) == 0, "no lines: not an empty array");
    json_decref(a);
    printf("gemm record: the pinned lines as its array's strings\n");
}

int main(void) {
    test_gemm_record();
    const char *h100 = "NVIDIA H100 80GB HBM3, 132 SMs, sm_90; CUDA runtime 12.4, driver 12.8; cuBLAS 12.4.5";
    const char *h200 = "NVIDIA H200, 132 SMs, sm_90; CUDA runtime 12.4, driver 12.8; cuBLAS 12.4.5";
    json_t *cpu = moe_run_machine_json();
    CHECK(cpu && !json_object_get(cpu, "gpu"), "a CPU run's record has a gpu");
    moe_run_machine_set_gpu(h100);
    json_t *gpu = moe_run_machine_json();
    CHECK(gpu && !strcmp(json_string_value(json_object_get(gpu, "gpu")) ?: "", h100), "the record's gpu is not set");
    char *same = note_for(gpu), *other = NULL, *unrecorded = NULL, *gone = NULL;
    CHECK(!*same, "a resume on the same GPU notes: %s", same);
    json_t *saved = this_machine_with("gpu", h200);
    other = note_for(saved);
    CHECK(strstr(other, "another machine or build") && strstr(other, "note:   gpu: saved NVIDIA H200") &&
              strstr(other, ", now NVIDIA H100"), "another GPU: %s", other);
    json_decref(saved);
    saved = this_machine_with("gpu", NULL); /* a run saved on the CPU, resumed on a GPU */
    unrecorded = note_for(saved);
    CHECK(strstr(unrecorded, "note:   gpu: saved unrecorded, now NVIDIA H100"), "a CPU run resumed on a GPU: %s",
          unrecorded);
    json_decref(saved);
    moe_run_machine_set_gpu(NULL); /* a GPU run resumed on the CPU */
    gone = note_for(gpu);
    CHECK(strstr(gone, "note:   gpu: saved NVIDIA H100") && strstr(gone, ", now none"), "a GPU run on the CPU: %s",
          gone);
    printf("%s%s%s", other, unrecorded, gone);
    free(same), free(other), free(unrecorded), free(gone);
    json_decref(cpu), json_decref(gpu);
    return test_finish("test_machine");
}
