/* bench_util.c — the helpers of bench_util.h: the flag parser, usage errors and failures, timing, JSON;
 * no MPI in here (bench_util_mpi.c installs what MPI needs). */
#include "bench/bench_util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fail.h"

static struct {
    const char *name;
    const bench_cli *cli;    /* the table of the last bench_parse_flags: the usage and the JSON echo */
    char defaults[BENCH_MAX_FLAGS][48]; /* each flag's value before parsing, as --help shows it */
    int rank;                /* -1: a single process, whose messages name no rank */
    void (*finish)(void);    /* before exit after --help, --dry-run or a usage error (MPI: MPI_Finalize) */
    void (*abort_all)(void); /* after a failure (MPI: MPI_Abort) */
} prog = {.name = "bench", .rank = -1};

void bench_set_name(const char *name) { prog.name = name; }

void bench_set_mpi(int rank, void (*finish)(void), void (*abort_all)(void)) {
    prog.rank = rank;
    prog.finish = finish;
    prog.abort_all = abort_all;
}

int bench_rank(void) { return prog.rank > 0 ? prog.rank : 0; }

_Noreturn static void leave(int code) {
    fflush(stdout);
    if (prog.finish) prog.finish();
    exit(code);
}

static void usage(FILE *f);

void bench_usage_error(const char *msg, const char *arg) {
    if (prog.rank <= 0) {
        fprintf(stderr, "%s: %s%s%s\n", prog.name, msg, arg ? ": " : "", arg ? arg : "");
        usage(stderr);
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
    fflush(stdout);
    if (prog.abort_all) prog.abort_all();
    exit(1);
}

void bench_check(moe_status st, const char *what) {
    if (st != MOE_OK) bench_fail("%s failed: %s", what, moe_failure_message(st));
}

/* ---- flags ------------------------------------------------------------------------------------------ */

static const char *const kSizeUnits[] = {"", "K", "M", "G"}; /* powers of 1024 */

/* v as the shortest of %.15g / %.17g that reads back as v. */
static void format_real(double v, char *buf, size_t n) {
    snprintf(buf, n, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, n, "%.17g", v);
}

/* A byte count with its largest exact unit (65536 -> "64K"): what the parser reads back. */
static void format_size(long long v, char *buf, size_t n) {
    int u = 0;
    while (u < 3 && v != 0 && v % 1024 == 0) v /= 1024, u++;
    snprintf(buf, n, "%lld%s", v, kSizeUnits[u]);
}

static int num_choices(const bench_flag *f) {
    int n = 0;
    while (f->choices[n]) n++;
    return n;
}

/* The flag's value in options, as text that the parser reads back. */
static void format_value(const bench_flag *f, const void *options, char *buf, size_t n) {
    const char *at = (const char *)options + f->offset;
    int index;
    switch (f->kind) {
    case BENCH_FLAG_INT: snprintf(buf, n, "%d", *(const int *)at); break;
    case BENCH_FLAG_SIZE: format_size(*(const long long *)at, buf, n); break;
    case BENCH_FLAG_REAL: format_real(*(const double *)at, buf, n); break;
    case BENCH_FLAG_CHOICE:
        index = *(const int *)at;
        snprintf(buf, n, "%s", index >= 0 && index < num_choices(f) ? f->choices[index] : "?");
        break;
    }
}

/* What --help shows after the name: N, X, BYTES or the words joined by '|'. */
static void format_metavar(const bench_flag *f, char *buf, size_t n) {
    if (f->kind != BENCH_FLAG_CHOICE) {
        snprintf(buf, n, "%s", f->kind == BENCH_FLAG_INT ? "N" : f->kind == BENCH_FLAG_SIZE ? "BYTES" : "X");
        return;
    }
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; f->choices[i] && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? "|" : "", f->choices[i]);
}

/* " [lo, hi]" for the numeric kinds, "" for a choice. */
static void format_range(const bench_flag *f, char *buf, size_t n) {
    char lo[32], hi[32];
    switch (f->kind) {
    case BENCH_FLAG_INT: snprintf(buf, n, " [%.0f, %.0f]", f->lo, f->hi); break;
    case BENCH_FLAG_SIZE:
        format_size((long long)f->lo, lo, sizeof lo), format_size((long long)f->hi, hi, sizeof hi);
        snprintf(buf, n, " [%s, %s]", lo, hi);
        break;
    case BENCH_FLAG_REAL:
        format_real(f->lo, lo, sizeof lo), format_real(f->hi, hi, sizeof hi);
        snprintf(buf, n, " [%s, %s]", lo, hi);
        break;
    case BENCH_FLAG_CHOICE: buf[0] = 0; break;
    }
}

/* The usage, from the table: one line per flag with its range and default, then the two built-in flags. */
static void usage(FILE *f) {
    const bench_cli *c = prog.cli;
    if (!c) return;
    fprintf(f, "usage: %s\n", c->synopsis);
    for (const char *line = c->about; line && *line;) { /* each line of `about`, indented */
        size_t len = strcspn(line, "\n");
        fprintf(f, "  %.*s\n", (int)len, line);
        line += len + (line[len] == '\n');
    }
    char meta[BENCH_MAX_FLAGS][96], left[128], range[80];
    int width = (int)strlen("--help, -h");
    for (int i = 0; i < c->num_flags; i++) {
        format_metavar(&c->flags[i], meta[i], sizeof meta[i]);
        int w = (int)(strlen(c->flags[i].name) + 1 + strlen(meta[i]));
        width = w > width ? w : width;
    }
    fprintf(f, "flags (--name value or --name=value):\n");
    for (int i = 0; i < c->num_flags; i++) {
        snprintf(left, sizeof left, "%.60s %.60s", c->flags[i].name, meta[i]); /* both shorter by far */
        format_range(&c->flags[i], range, sizeof range);
        fprintf(f, "  %-*s  %s%s (default %s)\n", width, left, c->flags[i].help, range, prog.defaults[i]);
    }
    fprintf(f, "  %-*s  parse and check every flag, print them resolved, exit 0 before any work\n", width,
            "--dry-run");
    fprintf(f, "  %-*s  print this text and exit 0\n", width, "--help, -h");
    if (c->notes) fprintf(f, "%s%s", c->notes, c->notes[strlen(c->notes) - 1] == '\n' ? "" : "\n");
}

/* The usage error for a bad value s of f: "<name> <what>: s", what being formatted. */
_Noreturn __attribute__((format(printf, 3, 4))) static void bad_value(const bench_flag *f, const char *s,
                                                                     const char *what, ...) {
    char msg[192];
    int n = snprintf(msg, sizeof msg, "%s ", f->name);
    va_list ap;
    va_start(ap, what);
    vsnprintf(msg + n, sizeof msg - (size_t)n, what, ap);
    va_end(ap);
    bench_usage_error(msg, s);
}

/* Reads s into f's target, or leaves with a usage error naming the flag, the rule and the value. */
static void parse_value(const bench_flag *f, const char *s, void *options) {
    char *at = (char *)options + f->offset, *end, lo[32], hi[32];
    errno = 0;
    if (f->kind == BENCH_FLAG_INT) {
        long v = strtol(s, &end, 10);
        if (errno || end == s || *end) bad_value(f, s, "takes an integer");
        if (v < f->lo || v > f->hi) bad_value(f, s, "must be in [%.0f, %.0f]", f->lo, f->hi);
        *(int *)at = (int)v;
    } else if (f->kind == BENCH_FLAG_SIZE) {
        long long v = strtoll(s, &end, 10), unit = 1;
        if (!errno && end != s && *end && !end[1])
            for (int u = 1; u < 4; u++)
                if (*end == kSizeUnits[u][0] || *end == kSizeUnits[u][0] - 'A' + 'a') unit = 1LL << (10 * u), end++;
        if (errno || end == s || *end) bad_value(f, s, "takes a size (an integer with an optional K, M or G)");
        if (v > f->hi / unit || v * unit < f->lo || v * unit > f->hi) { /* the first test keeps v * unit in range */
            format_size((long long)f->lo, lo, sizeof lo), format_size((long long)f->hi, hi, sizeof hi);
            bad_value(f, s, "must be in [%s, %s] bytes", lo, hi);
        }
        *(long long *)at = v * unit;
    } else if (f->kind == BENCH_FLAG_REAL) {
        double v = strtod(s, &end);
        if (errno || end == s || *end || !isfinite(v) || v < f->lo || v > f->hi) {
            format_real(f->lo, lo, sizeof lo), format_real(f->hi, hi, sizeof hi);
            bad_value(f, s, "must be a finite number in [%s, %s]", lo, hi);
        }
        *(double *)at = v;
    } else {
        for (int i = 0; f->choices[i]; i++)
            if (!strcmp(s, f->choices[i])) {
                *(int *)at = i;
                return;
            }
        char words[96];
        format_metavar(f, words, sizeof words);
        bad_value(f, s, "must be one of %s", words);
    }
}

static const bench_flag *find_flag(const bench_cli *c, const char *name, size_t len) {
    for (int i = 0; i < c->num_flags; i++)
        if (strlen(c->flags[i].name) == len && !strncmp(c->flags[i].name, name, len)) return &c->flags[i];
    return NULL;
}

void bench_parse_flags(const bench_cli *cli, int argc, char **argv, void *options) {
    prog.name = cli->name;
    prog.cli = cli;
    if (cli->num_flags > BENCH_MAX_FLAGS) bench_fail("%d flags in the table, at most %d", cli->num_flags, BENCH_MAX_FLAGS);
    for (int i = 0; i < cli->num_flags; i++) format_value(&cli->flags[i], options, prog.defaults[i], sizeof prog.defaults[i]);
    int dry_run = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (prog.rank <= 0) usage(stdout);
            leave(0);
        }
        if (a[0] != '-') bench_usage_error("unexpected argument", a);
        const size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (len == strlen("--dry-run") && !strncmp(a, "--dry-run", len)) {
            if (eq) bench_usage_error("--dry-run takes no value", a);
            dry_run = 1;
            continue;
        }
        const bench_flag *f = find_flag(cli, a, len);
        if (!f) {
            char name[72];
            snprintf(name, sizeof name, "%.*s", (int)(len < 64 ? len : 64), a);
            bench_usage_error("unknown flag", name);
        }
        const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!value) bench_usage_error("missing value for", f->name);
        parse_value(f, value, options);
    }
    if (cli->check) cli->check(options);
    if (!dry_run) return;
    if (prog.rank <= 0) {
        char v[64];
        printf("%s: dry run: every flag parsed and checked, nothing measured\nresolved:", cli->name);
        for (int i = 0; i < cli->num_flags; i++) {
            format_value(&cli->flags[i], options, v, sizeof v);
            printf(" %s %s", cli->flags[i].name, v);
        }
        printf("\n");
    }
    leave(0);
}

void bench_json_flags(const void *options) {
    const bench_cli *c = prog.cli;
    for (int i = 0; c && i < c->num_flags; i++) {
        const bench_flag *f = &c->flags[i];
        const char *at = (const char *)options + f->offset;
        char v[64];
        printf("%s\"", i ? "," : "");
        for (const char *p = f->name + 2; *p; p++) putchar(*p == '-' ? '_' : *p);
        printf("\":");
        if (f->kind == BENCH_FLAG_CHOICE) format_value(f, options, v, sizeof v), bench_json_string(v);
        else if (f->kind == BENCH_FLAG_SIZE) printf("%lld", *(const long long *)at);
        else format_value(f, options, v, sizeof v), fputs(v, stdout);
    }
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
