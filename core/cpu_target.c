/* cpu_target.c — the start-up check of the CPU a -Dmarch build needs (why: cpu_target.h). Compiled for the
 * default x86-64 target whatever the build's -march (meson.build), so that this check itself runs anywhere.
 * MOE_MARCH and the MOE_BUILT_* flags come from meson.build: what the compiler defined under the build's -march. */
#include "core/cpu_target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* Whether this CPU has a feature (a literal name). tests/meson.build compiles this file again with it defined as 0
 * and 1, so that the refusal and the description are tested on any machine. */
#ifndef MOE_CPU_SUPPORTS
#define MOE_CPU_SUPPORTS(name) __builtin_cpu_supports(name)
#endif

static char description[256]; /* MOE_MARCH and the assumed list */

static void append(char *list, size_t size, const char *name) {
    strncat(list, " ", size - strlen(list) - 1);
    strncat(list, name, size - strlen(list) - 1);
}

typedef struct {
    char assumed[96], missing[96]; /* " avx2 avx512f ...": what the build assumed, and what of it this CPU lacks */
} features;

static void feature(features *f, const char *name, int built, int here) {
    if (!built) return;
    append(f->assumed, sizeof f->assumed, name);
    if (!here) append(f->missing, sizeof f->missing, name);
}

#if defined(__x86_64__)
/* __builtin_cpu_supports takes literal names only: one line per feature the build may assume */
#define FEATURE(name, flag) feature(&f, name, flag, MOE_CPU_SUPPORTS(name))
#else
#define FEATURE(name, flag) feature(&f, name, flag, 1)
#endif

__attribute__((constructor)) static void check_cpu_target(void) {
    if (!MOE_MARCH[0]) {
        snprintf(description, sizeof description, "default");
        return;
    }
    features f = {"", ""};
#if defined(__x86_64__)
    __builtin_cpu_init();
#endif
    FEATURE("avx", MOE_BUILT_AVX);
    FEATURE("avx2", MOE_BUILT_AVX2);
    FEATURE("fma", MOE_BUILT_FMA);
    FEATURE("avx512f", MOE_BUILT_AVX512F);
    FEATURE("avx512bw", MOE_BUILT_AVX512BW);
    FEATURE("avx512vl", MOE_BUILT_AVX512VL);
    FEATURE("avx512dq", MOE_BUILT_AVX512DQ);
    FEATURE("avx512cd", MOE_BUILT_AVX512CD);
    snprintf(description, sizeof description, "%s (%s)", MOE_MARCH,
             f.assumed[0] ? f.assumed + 1 : "no vector features");
    if (f.missing[0]) {
        fprintf(stderr,
                "error: this program was compiled for the CPU of the machine that built it (meson -Dmarch=%s), "
                "and this CPU lacks:%s. Build it on this machine (scripts/setup.sh), or configure a build that runs "
                "on any x86-64 CPU: meson configure BUILD -Dmarch= (README, \"Build options\").\n",
                MOE_MARCH, f.missing);
        exit(1);
    }
}

const char *moe_cpu_target(void) { return description; }

const char *moe_cpu_model(void) {
    static char model[160];
    if (model[0]) return model;
#if defined(__x86_64__)
    unsigned regs[12] = {0}, eax, ebx, ecx, edx;
    char vendor[13] = "", brand[49] = "";
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
        memcpy(vendor, &ebx, 4), memcpy(vendor + 4, &edx, 4), memcpy(vendor + 8, &ecx, 4);
    }
    unsigned family = 0, cpu_model = 0, stepping = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) { /* the displayed family and model: base plus extended fields */
        family = (eax >> 8) & 0xf, cpu_model = (eax >> 4) & 0xf, stepping = eax & 0xf;
        if (family == 0xf) family += (eax >> 20) & 0xff;
        if (family == 0x6 || family >= 0xf) cpu_model += ((eax >> 16) & 0xf) << 4;
    }
    for (unsigned leaf = 0; leaf < 3; leaf++)
        if (!__get_cpuid(0x80000002u + leaf, &regs[4 * leaf], &regs[4 * leaf + 1], &regs[4 * leaf + 2],
                         &regs[4 * leaf + 3]))
            break;
    memcpy(brand, regs, 48);
    const char *b = brand;
    while (*b == ' ') b++;
    snprintf(model, sizeof model, "%s family %u model %u stepping %u%s%s", vendor[0] ? vendor : "unknown", family,
             cpu_model, stepping, *b ? ": " : "", b);
#else
    snprintf(model, sizeof model, "unknown");
#endif
    return model;
}
