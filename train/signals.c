/* train/signals.c — the stop requests of train/signals.h: a handler that records the first watched signal and lets
 * a second one take its default action, and the masks that keep it out of the GEMMs. Async-signal-safe: it stores
 * a sig_atomic_t, sets O_NONBLOCK with fcntl, or restores SIG_DFL and raises. */
#include "train/signals.h"

#include "core/threads.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

static volatile sig_atomic_t received;
static sigset_t watched;     /* held by every thread that runs GEMMs, taken by this one at step boundaries */
static pid_t launcher;      /* the parent when watching began, if Open MPI's mpirun or daemon or timeout; else 0 */
static int launcher_is_timeout;              /* 1: that parent is coreutils' timeout                           */
static volatile sig_atomic_t copy_absorbed;  /* timeout's second copy of the stop's signal came and was taken  */
static int may_unblock[3];  /* decided when watching began: standard output / error that mpirun reads */
static volatile sig_atomic_t unblocked[3]; /* 1: the handler made this descriptor non-blocking */

static const struct {
    const char *name;
    int signo;
} kSignals[] = {{"TERM", SIGTERM}, {"INT", SIGINT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}};
enum { NUM_SIGNALS = sizeof kSignals / sizeof kSignals[0] };

enum { LAST_WORDS_S = 10 }; /* after a stop's save: how long the last messages and MPI_Finalize may take */

/* A launcher ending a job repeats the stop in its own words: Open MPI's mpirun, given SIGTERM or SIGINT, sends the
 * ranks SIGCONT, SIGTERM odls_base_sigkill_timeout seconds later and SIGKILL as long again after; coreutils' timeout
 * sends its signal to the child and at once again to its process group (2026-12-08: under `timeout`, 4 stops in 10
 * ended unsaved, the second copy arriving after the first was handled). mpirun's SIGTERM, and one copy of timeout's
 * signal, continue the request under way (which a scheduler's SIGTERM to every process may have begun), not a second
 * one; a signal the user sends again through mpirun (it forwards each once) still ends the run (timeout passes on
 * one request only: it ignores any later signal itself). */
static int is_launchers_repeat(int signo, const siginfo_t *info) {
    if (!info || info->si_code != SI_USER || launcher <= 1 || info->si_pid != launcher) return 0;
    if (!launcher_is_timeout) return signo == SIGTERM;
    if (signo != received || copy_absorbed) return 0;
    copy_absorbed = 1;
    return 1;
}

/* The parent, when it is Open MPI's launcher (mpirun, mpiexec, orterun) or daemon (orted), or coreutils' timeout
 * (*is_timeout 1); 0 otherwise (a shell or script that signals its child twice means it). */
static pid_t launching_parent(int *is_timeout) {
    char path[64], name[32] = "";
    const pid_t parent = getppid();
    snprintf(path, sizeof path, "/proc/%ld/comm", (long)parent);
    FILE *f = fopen(path, "r");
    if (f && !fgets(name, sizeof name, f)) name[0] = 0;
    if (f) fclose(f);
    name[strcspn(name, "\n")] = 0;
    *is_timeout = !strcmp(name, "timeout");
    const char *const known[] = {"mpirun", "mpiexec", "orterun", "orted", "timeout"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(name, known[i])) return parent;
    return 0;
}

/* Standard output or error that mpirun reads (a pipe, a socket, or the pseudo-terminal it gives its ranks) and
 * stops reading once told to end the job: made non-blocking by the stop's handler, so that a step's line written
 * into a full buffer cannot hold the rank from the step boundary where the stop is agreed and saved (issue 49: at
 * 1 ms a step nothing was saved). Never the session's own terminal, which the user's shell shares. */
static int read_by_launcher(int fd) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return 0;
    if (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode)) return 1;
    return isatty(fd) && tcgetsid(fd) != getsid(0);
}

static void on_signal(int signo, siginfo_t *info, void *context) {
    (void)context;
    if (!received) {
        received = signo;
        for (int fd = 1; fd <= 2; fd++) {
            const int flags = may_unblock[fd] ? fcntl(fd, F_GETFL) : -1;
            if (flags >= 0 && !(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0) unblocked[fd] = 1;
        }
        return;
    }
    if (is_launchers_repeat(signo, info)) return;
    signal(signo, SIG_DFL); /* the second: no more waiting */
    raise(signo);
}

/* The last messages or MPI_Finalize still waiting LAST_WORDS_S after the save: nobody reads them (an mpirun ending
 * the job); the process ends with the stop's status rather than wait for the launcher's SIGKILL. */
static void last_words_timed_out(int sig) {
    (void)sig;
    _exit(128 + received);
}

void moe_train_signals_block_output(void) {
    for (int fd = 1; fd <= 2; fd++) {
        const int flags = fcntl(fd, F_GETFL);
        if (unblocked[fd] && flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) unblocked[fd] = 0;
    }
    clearerr(stdout), clearerr(stderr); /* what a full buffer refused meanwhile is lost */
    if (!received) return;
    signal(SIGALRM, last_words_timed_out);
    alarm(LAST_WORDS_S);
}

/* chosen[i] = 1 for each signal the list names; 0, or -1 with why */
static int parse(const char *list, int chosen[NUM_SIGNALS], char *why, size_t why_nbytes) {
    memset(chosen, 0, NUM_SIGNALS * sizeof *chosen);
    if (!*list) { /* an unset variable in a job script, not a choice: a scheduler's TERM would lose the save */
        snprintf(why, why_nbytes, "an empty list: name the signals (e.g. TERM,INT,USR1), or none to stop at the first "
                 "signal without saving");
        return -1;
    }
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
    sa.sa_sigaction = on_signal;
    /* no SA_RESTART: a write blocked on a full pipe (standard output to an mpirun that stopped reading) returns, and
     * the step goes on to its boundary; files on disk are not interrupted, and MPI's waits retry on EINTR */
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    launcher = launching_parent(&launcher_is_timeout);
    for (int fd = 1; fd <= 2; fd++) may_unblock[fd] = read_by_launcher(fd);
    sigemptyset(&watched);
    for (int i = 0; i < NUM_SIGNALS; i++) {
        if (chosen[i] && sigaction(kSignals[i].signo, &sa, NULL) != 0) {
            snprintf(why, why_nbytes, "cannot watch SIG%s", kSignals[i].name);
            return -1;
        }
        if (chosen[i]) sigaddset(&watched, kSignals[i].signo);
    }
    moe_threads_block_signals(&watched); /* the pool's threads: never */
    moe_train_signals_boundary(0);       /* this one: only at step boundaries */
    return 0;
}

void moe_train_signals_boundary(int open) { pthread_sigmask(open ? SIG_UNBLOCK : SIG_BLOCK, &watched, NULL); }

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
