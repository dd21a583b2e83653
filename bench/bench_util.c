/* bench_util.c — the helpers of bench_util.h; no MPI in here (bench_util_mpi.c installs what MPI needs). */
#include "bench/bench_util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
    const char *name;
    void (*usage)(FILE *);
    int rank;                /* -1: a single process, whose messages name no rank */
    void (*finish)(void);    /* before exit after --help or a usage error (MPI: MPI_Finalize) */
    void (*abort_all)(void); /* after a failure (MPI: MPI_Abort) */
} prog = {"bench", NULL, -1, NULL, NULL};

void bench_init(const char *name, void (*usage)(FILE *)) {
    prog.name = name;
    prog.usage = usage;
}

void bench_set_mpi(int rank, void (*finish)(void), void (*abort_all)(void)) {
    prog.rank = rank;
    prog.finish = finish;
    prog.abort_all = abort_all;
}

_Noreturn static void leave(int code) {
    if (prog.finish) prog.finish();
    exit(code);
}

void bench_usage_error(const char *msg, const char *arg) {
    if (prog.rank <= 0) {
        fprintf(stderr, "%s: %s%s%s\n", prog.name, msg, arg ? ": " : "", arg ? arg : "");
        if (prog.usage) prog.usage(stderr);
    }
    leave(2);
}

void bench_usage_errorf(const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    bench_usage_error(msg, NULL);
}

void bench_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (prog.rank >= 0) fprintf(stderr, "%s: rank %d: ", prog.name, prog.rank);
    else fprintf(stderr, "%s: ", prog.name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (prog.abort_all) prog.abort_all();
    exit(1);
}

void bench_check(moe_status st, const char *what) {
    if (st != MOE_OK) bench_fail("%s failed: %s", what, moe_status_string(st));
}

bench_flag bench_next_flag(int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        if (prog.rank <= 0 && prog.usage) prog.usage(stdout);
        leave(0);
    }
    if (strncmp(a, "--", 2)) bench_usage_error("unexpected argument", a);
    bench_flag f;
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    if (len >= sizeof f.name) bench_usage_error("unknown flag", a);
    memcpy(f.name, a, len), f.name[len] = 0;
    if (eq) f.value = eq + 1;
    else if (*i + 1 < argc) f.value = argv[++*i];
    else bench_usage_error("missing value for", a);
    return f;
}

long long bench_parse_size(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10), unit = 1;
    if (errno || end == s) bench_usage_error("not an integer", s);
    if (*end && !end[1]) {
        unit = *end == 'K' || *end == 'k' ? 1LL << 10 : *end == 'M' || *end == 'm' ? 1LL << 20
             : *end == 'G' || *end == 'g' ? 1LL << 30 : 0;
        if (unit) end++;
        else unit = 1;
    }
    if (*end) bench_usage_error("not a size (integer with optional K, M or G)", s);
    if (v < lo || v > hi / unit || v * unit < lo) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be in [%lld, %lld]", flag, lo, hi);
        bench_usage_error(msg, s);
    }
    return v * unit;
}

int bench_parse_int(const char *flag, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) bench_usage_error("not an integer", s);
    if (v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be in [%ld, %ld]", flag, lo, hi);
        bench_usage_error(msg, s);
    }
    return (int)v;
}

double bench_parse_real(const char *s, double lo, double hi, const char *msg) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) bench_usage_error(msg, s);
    return v;
}

double bench_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_min(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

void bench_json_string(const char *s) {
    putchar('"');
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}
