/* train/signals.c — the stop requests of train/signals.h: a handler that records the first watched signal and lets
 * a second one take its default action. Async-signal-safe: it stores a sig_atomic_t, or restores SIG_DFL and
 * raises. */
#include "train/signals.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t received;

static const struct {
    const char *name;
    int signo;
} kSignals[] = {{"TERM", SIGTERM}, {"INT", SIGINT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}};
enum { NUM_SIGNALS = sizeof kSignals / sizeof kSignals[0] };

static void on_signal(int signo) {
    if (!received) {
        received = signo;
        return;
    }
    signal(signo, SIG_DFL); /* the second: no more waiting */
    raise(signo);
}

/* chosen[i] = 1 for each signal the list names; 0, or -1 with why */
static int parse(const char *list, int chosen[NUM_SIGNALS], char *why, size_t why_nbytes) {
    memset(chosen, 0, NUM_SIGNALS * sizeof *chosen);
    if (strcmp(list, "none")) {
        const char *p = list;
        while (*p) {
            const size_t len = strcspn(p, ",");
            int found = 0;
            for (int i = 0; i < NUM_SIGNALS && !found; i++)
                if (strlen(kSignals[i].name) == len && !strncmp(p, kSignals[i].name, len)) chosen[i] = found = 1;
            if (!found) {
                snprintf(why, why_nbytes, "'%.*s' is not one of TERM, INT, USR1, USR2, HUP (names without SIG, "
                         "comma-separated), or none", (int)len, p);
                return -1;
            }
            p += len + (p[len] == ',');
        }
    }
    return 0;
}

int moe_train_signals_check(const char *list, char *why, size_t why_nbytes) {
    int chosen[NUM_SIGNALS];
    return parse(list, chosen, why, why_nbytes);
}

int moe_train_signals_watch(const char *list, char *why, size_t why_nbytes) {
    int chosen[NUM_SIGNALS];
    if (parse(list, chosen, why, why_nbytes)) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* a read or write under way goes on: the step finishes normally */
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < NUM_SIGNALS; i++)
        if (chosen[i] && sigaction(kSignals[i].signo, &sa, NULL) != 0) {
            snprintf(why, why_nbytes, "cannot watch SIG%s", kSignals[i].name);
            return -1;
        }
    return 0;
}

int moe_train_signal_received(void) { return received; }

const char *moe_train_signal_name(int signo) {
    static char other[32];
    for (int i = 0; i < NUM_SIGNALS; i++)
        if (kSignals[i].signo == signo) {
            static char name[16];
            snprintf(name, sizeof name, "SIG%s", kSignals[i].name);
            return name;
        }
    snprintf(other, sizeof other, "signal %d", signo);
    return other;
}
