/* with_gpu CMD ARGS... — runs CMD where a CUDA device is visible, else skips (exit 77, meson's skip) without it.
 *
 * The gpu suite's multi-rank tests run under mpirun, and without a GPU every rank started only to find none: ~2-4 s
 * of a 2-core machine per test, for 10 tests in the main build and 10 more in the GPU machine's rehearsal
 * (test_gpu_check_bundle). The same question as the tests' own (test_gpu_device_count): a CUDA that is there but
 * broken fails here with the reason, as it fails them. */
#include <stdio.h>
#include <unistd.h>

#include "tests/test_gpu_util.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: with_gpu CMD [ARGS...]\n");
        return 2;
    }
    if (test_gpu_device_count("with_gpu") == 0) {
        printf("with_gpu: skip: no CUDA device on this machine (%s not started)\n", argv[1]);
        return TEST_SKIP;
    }
    fflush(stdout);
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 1;
}
