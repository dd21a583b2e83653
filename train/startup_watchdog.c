/* startup_watchdog.c — see startup_watchdog.h. */
#include "train/startup_watchdog.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/flag_arg.h"

static char message[256]; /* formatted when armed: the handler may only write() */
static struct timespec started;

static void timed_out(int sig) {
    (void)sig;
    ssize_t ignored = write(2, message, strlen(message));
    (void)ignored;
    _exit(3);
}

/* The limit in seconds: startup_timeout_s where > 0, else max(exchange_timeout_s, 60) */
static double startup_limit_s(float startup_timeout_s, float exchange_timeout_s) {
    if (startup_timeout_s > 0) return startup_timeout_s;
    return exchange_timeout_s > 60 ? exchange_timeout_s : 60;
}

static void arm(double limit_s, double elapsed_s) {
    snprintf(message, sizeof message, "moe-train: start-up (MPI_Init and the parallel layout) did not finish within "
             "%g s (--startup-timeout): a rank is stopped, gone or unreachable\n", limit_s);
    const double left = limit_s - elapsed_s;
    signal(SIGALRM, timed_out);
    alarm(left < 1 ? 1 : (unsigned)(left + 0.5));
}

void moe_startup_watchdog_start(int argc, char **argv) {
    clock_gettime(CLOCK_MONOTONIC, &started);
    float startup = 0, exchange = 300; /* the flags' defaults */
    for (int i = 1; i < argc; i++) {
        const moe_flag_arg flag = moe_flag_arg_split(argv[i]);
        const char *v = flag.value ? flag.value : moe_flag_arg_next_is_value(argc, argv, i) ? argv[i + 1] : NULL;
        if (!v) continue;
        /* a malformed value is refused by the parser later, under this alarm's default */
        if (!strcmp(flag.name, "--startup-timeout") && atof(v) >= 0) startup = (float)atof(v);
        if (!strcmp(flag.name, "--exchange-timeout") && atof(v) >= 1) exchange = (float)atof(v);
    }
    arm(startup_limit_s(startup, exchange), 0);
}

void moe_startup_watchdog_rearm(float startup_timeout_s, float exchange_timeout_s) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    arm(startup_limit_s(startup_timeout_s, exchange_timeout_s),
        (double)(now.tv_sec - started.tv_sec) + 1e-9 * (double)(now.tv_nsec - started.tv_nsec));
}

void moe_startup_watchdog_stop(void) { alarm(0); }
