/* slow_fsync.c — an LD_PRELOAD shim for the faults suite: every fsync takes MOE_TEST_FSYNC_DELAY_S seconds
 * longer (a slow or overloaded disk), so that a checkpoint save outlasts --exchange-timeout. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

int fsync(int fd) {
    static int (*real_fsync)(int);
    if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (!real_fsync) return errno = ENOSYS, -1;
    const char *delay = getenv("MOE_TEST_FSYNC_DELAY_S");
    if (delay) usleep((useconds_t)(atof(delay) * 1e6));
    return real_fsync(fd);
}
