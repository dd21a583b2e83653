/* bench_util.h — what the programs in bench/ share: flags and usage errors, failure checks, a monotonic
 * clock, median and minimum of timings, JSON strings.
 *
 * Two files, so that the single-process bench_moe_layer stays free of MPI (and bench_util.c builds where
 * there is no MPI): bench_util.c holds everything here and never names MPI; bench_util_mpi.c
 * (bench_util_mpi.h, compiled into the MPI programs only) starts MPI, checks MPI calls and installs how an
 * MPI program leaves. The two ways a program ends early:
 *   single process (bench_init):      usage error: "prog: msg[: arg]" and the usage on stderr, exit 2;
 *                                     failure: "prog: msg" on stderr, exit 1.
 *   under mpirun (bench_mpi_init):    every rank parses the same argv, so every rank reaches the same usage
 *                                     error: rank 0 prints it, every rank calls MPI_Finalize and exits 2;
 *                                     failure: "prog: rank R: msg" from the failing rank, MPI_Abort(world, 1).
 * --help / -h print the usage on stdout (rank 0 only) and leave the same way with 0.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdio.h>

#include "moe/moe.h"

/* Names the program for every message and gives its usage text; first thing in main (MPI: bench_mpi_init). */
void bench_init(const char *name, void (*usage)(FILE *));

/* Usage errors: "prog: msg: arg" (arg may be NULL) or the formatted text, then the usage; exit 2. */
_Noreturn void bench_usage_error(const char *msg, const char *arg);
_Noreturn void bench_usage_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Failures: "prog: [rank R: ]text"; exit 1 (under MPI, MPI_Abort). */
_Noreturn void bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Fails with "what failed: <status>" unless st is MOE_OK. */
void bench_check(moe_status st, const char *what);

/* One flag of the command line: argv[*i] as "--name value" (the value is argv[*i + 1], and *i moves past
 * it) or "--name=value". --help and -h leave with the usage; anything that is no flag, a name too long to
 * be one, or a missing value is a usage error. The caller compares name and reports an unknown one. */
typedef struct {
    char name[64];
    const char *value;
} bench_flag;
bench_flag bench_next_flag(int argc, char **argv, int *i);

/* The value of flag as an integer in [lo, hi]; anything else is a usage error. */
int bench_parse_int(const char *flag, const char *s, long lo, long hi);
/* The same for a size: an integer with an optional K, M or G (powers of 1024), in [lo, hi] bytes. */
long long bench_parse_size(const char *flag, const char *s, long long lo, long long hi);
/* A finite number in [lo, hi]; anything else is the usage error msg (with s). */
double bench_parse_real(const char *s, double lo, double hi, const char *msg);

/* CLOCK_MONOTONIC in milliseconds. */
double bench_now_ms(void);
/* The median of v[0..n) (n >= 1; sorts v in place) and its minimum. */
double bench_median(double *v, int n);
double bench_min(const double *v, int n);

/* s as a JSON string, quotes included, on stdout. */
void bench_json_string(const char *s);

/* For bench_util_mpi.c: this process's rank (its failures name it; only rank 0 prints usage), what to do
 * before leaving after --help or a usage error, and how to end after a failure. */
void bench_set_mpi(int rank, void (*finish)(void), void (*abort_all)(void));

#endif
