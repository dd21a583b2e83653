/* checkpoint/lock.c — one job at a time on a checkpoint directory (checkpoint/internal.h): world rank 0 of a
 * training job holds an flock on ROOT/.lock for the job's lifetime. The kernel releases it when the process ends,
 * however it ends (kill -9 included), so a lock is never left behind; while it is held, the file says who holds
 * it, for the message that refuses a second job. flock works on local file systems and on NFS (where Linux
 * emulates it with a whole-file POSIX lock); Lustre needs its flock mount option. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fail.h"
#include "checkpoint/internal.h"
#include "models/fileio.h"

static const char kLockName[] = ".lock";

struct moe_checkpoint_lock {
    int fd;
};

/* What the lock file says of its holder, on one line ("unknown" when it says nothing). */
static void holder_of(int fd, char *out, size_t n) {
    ssize_t got = pread(fd, out, n - 1, 0);
    out[got > 0 ? got : 0] = 0;
    out[strcspn(out, "\n")] = 0;
    if (!*out) snprintf(out, n, "unknown (the holder has not written its name yet)");
}

moe_status moe__checkpoint_lock(const char *root, const char *run_id, moe_checkpoint_lock **out) {
    *out = NULL;
    char *path = moe_path_join(root, kLockName);
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    /* O_NOFOLLOW: a .lock planted as a link to another file must not get that file truncated and rewritten;
     * O_NONBLOCK: a FIFO planted there must not hang the open (refused below, like any file that is not regular) */
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    struct stat st_lock;
    const int opened_errno = errno;
    if (fd < 0 || fstat(fd, &st_lock) != 0 || !S_ISREG(st_lock.st_mode)) {
        moe_status st =
            fd < 0 && opened_errno == ELOOP
                ? moe_fail(MOE_ERR_INVALID_CONFIG,
                           "%s is a symbolic link: the directory's lock file must be a regular file, and moe-train "
                           "does not follow a link there (it would overwrite the link's target). Remove %s, or "
                           "save into another --checkpoint-dir", path, path)
            : fd < 0 ? moe_fail(MOE_ERR_IO, "%s: cannot open the directory's lock file: %s", path,
                                strerror(opened_errno))
                     : moe_fail(MOE_ERR_INVALID_CONFIG,
                                "%s is not a regular file: the directory's lock file must be one. Remove it, or save "
                                "into another --checkpoint-dir", path);
        if (fd >= 0) close(fd);
        free(path);
        return st;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int why = errno;
        char holder[512];
        holder_of(fd, holder, sizeof holder);
        close(fd);
        moe_status st =
            why == EWOULDBLOCK
                ? moe_fail(MOE_ERR_INVALID_CONFIG,
                           "--checkpoint-dir %s is in use by another job: %s (%s is locked until that process ends). "
                           "Wait for it or stop it, or save into another --checkpoint-dir",
                           root, holder, path)
                : moe_fail(MOE_ERR_IO, "%s: cannot lock: %s", path, strerror(why));
        free(path);
        return st;
    }
    char host[256] = "?", when[64] = "?", line[512];
    gethostname(host, sizeof host - 1);
    const time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    const int len = snprintf(line, sizeof line, "run %s, host %s, pid %ld, since %s\n", run_id, host, (long)getpid(),
                             when);
    moe_status st = MOE_OK;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
        st = moe_fail(MOE_ERR_IO, "%s: cannot write the holder's name: %s", path, strerror(errno));
    free(path);
    moe_checkpoint_lock *lock = st == MOE_OK ? malloc(sizeof *lock) : NULL;
    if (st == MOE_OK && !lock) st = MOE_ERR_OUT_OF_MEMORY;
    if (st != MOE_OK) return close(fd), st;
    lock->fd = fd;
    *out = lock;
    return MOE_OK;
}

void moe_checkpoint_unlock(moe_checkpoint_lock *lock) {
    if (!lock) return;
    close(lock->fd); /* the lock goes with the last descriptor; the file stays for the next job */
    free(lock);
}
