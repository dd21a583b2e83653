/* slow_disk.c — an LD_PRELOAD shim for the faults suite, a slow or overloaded disk: every fsync takes
 * MOE_TEST_FSYNC_DELAY_S seconds longer (a checkpoint save that outlasts --exchange-timeout), every mkdir of a save's
 * directory (.tmp-step-*; not Open MPI's session directories) MOE_TEST_MKDIR_DELAY_S longer (rank 0 makes it while
 * the others wait: in a CI run something held rank 0 there, or nearby, past --exchange-timeout, and the save hung), and
 * MPI_Init_thread MOE_TEST_MPI_INIT_DELAY_S longer (an MPI_Init on loaded cores: a CI run's took over 2 s). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void delay(const char *variable) {
    const char *seconds = getenv(variable);
    if (seconds) usleep((useconds_t)(atof(seconds) * 1e6));
}

int fsync(int fd) {
    static int (*real_fsync)(int);
    if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (!real_fsync) return errno = ENOSYS, -1;
    delay("MOE_TEST_FSYNC_DELAY_S");
    return real_fsync(fd);
}

int mkdir(const char *path, mode_t mode) {
    static int (*real_mkdir)(const char *, mode_t);
    if (!real_mkdir) real_mkdir = (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "mkdir");
    if (!real_mkdir) return errno = ENOSYS, -1;
    if (strstr(path, ".tmp-step-")) delay("MOE_TEST_MKDIR_DELAY_S");
    return real_mkdir(path, mode);
}

/* moe-train's own call, found first in this preloaded library; MPI's is the next one */
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    static int (*real_init)(int *, char ***, int, int *);
    if (!real_init) real_init = (int (*)(int *, char ***, int, int *))dlsym(RTLD_NEXT, "MPI_Init_thread");
    if (!real_init) return errno = ENOSYS, -1;
    delay("MOE_TEST_MPI_INIT_DELAY_S");
    return real_init(argc, argv, required, provided);
}
