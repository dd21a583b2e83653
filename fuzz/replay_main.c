/* replay_main.c — a main for the fuzz targets without libFuzzer (any compiler): runs LLVMFuzzerTestOneInput once
 * on each file named, and on each file of each directory named, so that the normal build's unit suite replays
 * fuzz/corpus/ and an input that crashes a parser or is wrongly accepted fails there too (fuzz/meson.build).
 *   build/fuzz/replay_safetensors fuzz/corpus/safetensors */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return perror(path), 1;
    uint8_t *data = NULL;
    size_t nbytes = 0, cap = 0, got;
    do {
        if (nbytes == cap && !(data = realloc(data, cap = cap ? 2 * cap : 1 << 16))) abort();
        nbytes += got = fread(data + nbytes, 1, cap - nbytes, f);
    } while (got > 0);
    int failed = ferror(f);
    fclose(f);
    if (failed) return free(data), perror(path), 1;
    LLVMFuzzerTestOneInput(data, nbytes);
    free(data);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int main(int argc, char **argv) {
    int failures = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) return perror(argv[i]), 1;
        if (!S_ISDIR(sb.st_mode)) {
            failures += run_file(argv[i]), count++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, by_name);
        if (n < 0) return perror(argv[i]), 1;
        for (int j = 0; j < n; j++) {
            if (names[j]->d_name[0] != '.') {
                size_t len = strlen(argv[i]) + strlen(names[j]->d_name) + 2;
                char *path = malloc(len);
                if (!path) abort();
                snprintf(path, len, "%s/%s", argv[i], names[j]->d_name);
                failures += run_file(path), count++;
                free(path);
            }
            free(names[j]);
        }
        free(names);
    }
    printf("%s: replayed %d inputs, %d unreadable\n", argv[0], count, failures);
    return failures || count == 0;
}
