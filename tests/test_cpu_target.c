/* test_cpu_target.c — run by tests/meson.build's test_cpu_target and test_cpu_target_refuses, linked with
 * core/cpu_target.c compiled as if built for avx2 and avx512f. With this CPU made to have both, the description must
 * be argv[1]; made to have neither, the check before main must end the program with its message, so main must never
 * run (it fails if it does). */
#include <stdio.h>
#include <string.h>

#include "core/cpu_target.h"

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "(no expected description given)";
    if (strcmp(moe_cpu_target(), want) != 0) {
        printf("FAIL: moe_cpu_target() is \"%s\", expected \"%s\"\n", moe_cpu_target(), want);
        return 1;
    }
    printf("ok: moe_cpu_target() is \"%s\"\n", want);
    return 0;
}
