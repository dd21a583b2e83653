/* bench_util.h — what the programs in bench/ share: one table-driven flag parser (the --help text, the
 * --dry-run listing and the JSON echo of the options all come from the same table, so they cannot disagree
 * with the parser), usage errors, failure checks, a monotonic clock, median and minimum of timings, JSON
 * strings.
 *
 * Two files, so that the single-process programs stay free of MPI (and bench_util.c builds where there is
 * no MPI): bench_util.c holds everything here and never names MPI; bench_util_mpi.c (bench_util_mpi.h,
 * compiled into the MPI programs only) starts MPI, checks MPI calls and installs how an MPI program leaves.
 * The two ways a program ends early:
 *   single process:                   usage error: "prog: msg[: arg]" and the usage on stderr, exit 2;
 *                                     failure: "prog: msg" on stderr, exit 1.
 *   under mpirun (bench_mpi_init):    every rank parses the same argv, so every rank reaches the same usage
 *                                     error: rank 0 prints it, every rank calls MPI_Finalize and exits 2;
 *                                     failure: "prog: rank R: msg" from the failing rank, MPI_Abort(world, 1).
 * --help / -h print the usage on stdout (rank 0 only) and leave the same way with 0; so does --dry-run,
 * after every flag has been parsed and checked, with the resolved flags instead of the usage.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stddef.h>
#include <stdio.h>

#include "moe/moe.h"

/* ---- flags ------------------------------------------------------------------------------------------ */

typedef enum {
    BENCH_FLAG_INT,    /* an int in [lo, hi]                                                       */
    BENCH_FLAG_SIZE,   /* a long long byte count with an optional K, M or G (powers of 1024), in [lo, hi] */
    BENCH_FLAG_REAL,   /* a finite double in [lo, hi]                                              */
    BENCH_FLAG_CHOICE, /* one of the words of `choices`; the int target gets its index             */
} bench_flag_kind;

/* One flag of a program: `--name value` or `--name=value`. The target is a field of the program's options
 * struct, named by its offset; the value the struct holds when the parser starts is the default that --help
 * shows. */
typedef struct {
    const char *name;           /* with the leading "--" */
    bench_flag_kind kind;
    size_t offset;              /* of the target in the options struct */
    double lo, hi;              /* INT, SIZE, REAL: the accepted range, both ends included */
    const char *const *choices; /* CHOICE: the words, NULL-terminated */
    const char *help;           /* one line */
} bench_flag;

/* offsetof(type, field), refused at compile time unless the field has the size of ctype (a table entry
 * whose kind does not match its field's type does not build). */
#define BENCH__OFFSET(type, field, ctype)                                                                    \
    (offsetof(type, field) + 0 * sizeof(char[sizeof(((type *)0)->field) == sizeof(ctype) ? 1 : -1]))
#define BENCH_INT(name, type, field, lo, hi, help)                                                           \
    { name, BENCH_FLAG_INT, BENCH__OFFSET(type, field, int), lo, hi, NULL, help }
#define BENCH_SIZE(name, type, field, lo, hi, help)                                                          \
    { name, BENCH_FLAG_SIZE, BENCH__OFFSET(type, field, long long), lo, hi, NULL, help }
#define BENCH_REAL(name, type, field, lo, hi, help)                                                          \
    { name, BENCH_FLAG_REAL, BENCH__OFFSET(type, field, double), lo, hi, NULL, help }
#define BENCH_CHOICE(name, type, field, words, help)                                                         \
    { name, BENCH_FLAG_CHOICE, BENCH__OFFSET(type, field, int), 0, 0, words, help }

enum { BENCH_MAX_FLAGS = 40 };

/* A program's command line: its name, how it is run, what it measures and its flags. */
typedef struct {
    const char *name;           /* every message starts with it */
    const char *synopsis;       /* after "usage: ", e.g. "mpirun -np W bench_alltoall [flags]" */
    const char *about;          /* what it measures, one or more lines (each printed indented) */
    const bench_flag *flags;    /* at most BENCH_MAX_FLAGS; the table must outlive the program */
    int num_flags;
    const char *notes;          /* lines after the flag list, or NULL */
    void (*check)(const void *options); /* checks across flags (bench_usage_error*), or NULL */
} bench_cli;

/* Parses argv[1..argc) into *options by cli's table, then runs cli->check. Leaves with the usage (exit 2)
 * on a word that is no flag, an unknown flag ("unknown flag: --x"), a missing value or one out of range;
 * with 0 after --help / -h (the usage on stdout) and after --dry-run (the resolved flags on stdout, once
 * every flag has been checked). Also names the program for every later message. Under MPI: after
 * bench_mpi_init, on every rank. */
void bench_parse_flags(const bench_cli *cli, int argc, char **argv, void *options);

/* The flags of the last bench_parse_flags as JSON members ("tokens":4096,"pattern":"both",...; names
 * without "--", '-' as '_'), without braces, on stdout. */
void bench_json_flags(const void *options);

/* Usage errors: "prog: msg: arg" (arg may be NULL) or the formatted text, then the usage; exit 2. */
_Noreturn void bench_usage_error(const char *msg, const char *arg);
_Noreturn void bench_usage_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- failures, time, output -------------------------------------------------------------------------- */

/* Names the program for messages before bench_parse_flags (bench_mpi_init does it). */
void bench_set_name(const char *name);

/* Failures: "prog: [rank R: ]text"; exit 1 (under MPI, MPI_Abort). */
_Noreturn void bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Fails with "what failed: <the library's failure message>" unless st is MOE_OK. */
void bench_check(moe_status st, const char *what);

/* CLOCK_MONOTONIC in milliseconds. */
double bench_now_ms(void);
/* The median of v[0..n) (n >= 1; sorts v in place) and its minimum. */
double bench_median(double *v, int n);
double bench_min(const double *v, int n);

/* s as a JSON string, quotes included, on stdout. */
void bench_json_string(const char *s);

/* For bench_util_mpi.c: this process's rank (its failures name it; only rank 0 prints usage), what to do
 * before leaving after --help, --dry-run or a usage error, and how to end after a failure. */
void bench_set_mpi(int rank, void (*finish)(void), void (*abort_all)(void));
/* This process's rank under MPI, 0 for a single process: who prints. */
int bench_rank(void);

#endif
