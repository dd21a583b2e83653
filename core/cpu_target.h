/* cpu_target.h — the CPU the C code was compiled for (meson's -Dmarch), and the check that this CPU has it.
 *
 * A build configured with -Dmarch=native (scripts/setup.sh's default) lets the compiler use this machine's widest
 * vectors (AVX-512 here) in every loop; the results are the same bits as a portable build's (the build turns FMA
 * contraction off and uses no reassociating math: docs/BENCHMARKS.md measured it), only faster. Such a program
 * would die of an illegal instruction on a CPU without those features (a cluster's compute node unlike the node
 * that built it): core/cpu_target.c, compiled for the default x86-64 target, checks at start, before main, and
 * exits with a message naming the missing features and the fix instead. */
#ifndef MOE_CORE_CPU_TARGET_H
#define MOE_CORE_CPU_TARGET_H

/* "default" (a portable build), or "native (avx avx2 fma avx512f ...)": the -march and the x86 vector
 * features the build assumed, for logs and the run record. Linking it in also links in the start-up check. */
const char *moe_cpu_target(void);

/* This CPU as CPUID names it: "AuthenticAMD family 25 model 17 stepping 1: AMD EPYC 9B14 96-Core Processor". Two
 * CPUs of one family and model run the same GEMM kernels; another model may not (docs/DETERMINISM.md, "Across CPUs").
 * "unknown" off x86. */
const char *moe_cpu_model(void);

#endif
