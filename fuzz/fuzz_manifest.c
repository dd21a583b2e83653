/* fuzz_manifest.c — fuzzes the reading of a checkpoint's manifest.json (checkpoint/dir.c:
 * moe__checkpoint_manifest_read, then _verify against a directory that holds only the manifest). An accepted
 * manifest must say what moe-train writes, checked here on its own parse: format, a run id of 16 hex digits, a
 * parent run id that is empty, "legacy" or 16 hex digits, the step exactly (0 to INT_MAX), each listed file a
 * plain name with its size a byte count, each checksum (of a whole file or of a safetensors header) 8 hex digits
 * of a listed file, at most one per file; a refusal must name the file.
 * Seeds: manifest.json of fuzz/make_corpus.sh's checkpoints (fuzz/corpus/manifest/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_manifest -max_total_time=60 /tmp/new fuzz/corpus/manifest   (longer, by hand)
 *   build-fuzz/fuzz/fuzz_manifest FILE                    (one input: reproduce a finding) */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "fuzz/fuzz_util.h"
#include "checkpoint/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

static int is_run_id(const char *s) {
    if (strlen(s) != 16) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

static void check_accepted(const char *path, const uint8_t *data, size_t nbytes, const moe__checkpoint_manifest *m) {
    json_error_t err;
    json_t *j = json_loadb((const char *)data, nbytes, 0, &err);
    if (!json_is_object(j)) fuzz_invalid("%s: accepted, but not a JSON object (%s)", path, err.text);
    json_t *step = json_object_get(j, "step"), *files = json_object_get(j, "files");
    if (!is_run_id(m->run_id)) fuzz_invalid("%s: accepted with the run id '%s'", path, m->run_id);
    if (*m->parent_run_id && strcmp(m->parent_run_id, "legacy") && !is_run_id(m->parent_run_id))
        fuzz_invalid("%s: accepted with the parent run id '%s'", path, m->parent_run_id);
    if (!json_is_integer(step) || json_integer_value(step) < 0 || json_integer_value(step) > INT_MAX ||
        json_integer_value(step) != m->step)
        fuzz_invalid("%s: accepted with the step read as %d", path, m->step);
    if ((int)json_object_size(files) != m->num_files)
        fuzz_invalid("%s: accepted with %d files listed, the JSON lists %d", path, m->num_files,
                     (int)json_object_size(files));
    json_t *crcs = json_object_get(j, "crc32c"), *header_crcs = json_object_get(j, "header_crc32c");
    for (int i = 0; i < m->num_files; i++) {
        const moe__checkpoint_file *f = &m->files[i];
        json_t *n = json_object_get(files, f->name), *whole = json_object_get(crcs, f->name),
               *header = json_object_get(header_crcs, f->name), *crc = whole ? whole : header;
        if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) != f->nbytes ||
            strchr(f->name, '/') || f->name[0] == '.' || !f->name[0])
            fuzz_invalid("%s: accepted the file '%s' with size %lld", path, f->name, f->nbytes);
        const int kind = whole ? MOE__CRC_WHOLE : header ? MOE__CRC_HEADER : MOE__CRC_NONE;
        if ((whole && header) || kind != f->crc_kind || (crc && strtoul(json_string_value(crc), NULL, 16) != f->crc))
            fuzz_invalid("%s: accepted the checksum of '%s' as %08x (kind %d)", path, f->name, f->crc, f->crc_kind);
    }
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    const char *path = fuzz_temp_path("manifest.json");
    fuzz_write_file(path, data, nbytes);
    moe__checkpoint_manifest m;
    moe_failure_clear();
    moe_status st = moe__checkpoint_manifest_read(fuzz_temp_dir(), &m);
    fuzz_check_failure(st, path);
    if (st != MOE_OK) return 0;
    check_accepted(path, data, nbytes, &m);
    /* the directory holds no checkpoint files: every size the manifest lists must be refused */
    int listed = 0;
    for (int i = 0; i < m.num_files; i++) listed |= strcmp(m.files[i].name, "manifest.json") != 0;
    moe_failure_clear();
    st = moe__checkpoint_manifest_verify(fuzz_temp_dir(), &m);
    if (st == MOE_OK && listed) fuzz_invalid("%s: the sizes of missing files verified", path);
    fuzz_check_failure(st, fuzz_temp_dir());
    moe__checkpoint_manifest_free(&m);
    return 0;
}
