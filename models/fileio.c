/* fileio.c — safe opening of user files, path joining, fsync by path (fileio.h). */
#include "models/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"

static const char *kind_of(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO (named pipe)" : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode) || S_ISBLK(mode)             ? "a device"
                                                          : "not a regular file";
}

moe_status moe_file_open_regular(const char *path, FILE **out) {
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return moe_fail(MOE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return moe_fail(MOE_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return moe_fail(MOE_ERR_BAD_FILE, "%s is %s, not a file to read", path, kind_of(sb.st_mode));
    }
    int flags = fcntl(fd, F_GETFL);
    FILE *f = flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        int err = errno;
        close(fd);
        return moe_fail(MOE_ERR_IO, "%s: cannot open: %s", path, strerror(err));
    }
    *out = f;
    return MOE_OK;
}

long long moe_file_size(FILE *f) {
    struct stat sb;
    return fstat(fileno(f), &sb) == 0 ? (long long)sb.st_size : -1;
}

char *moe_path_join(const char *dir, const char *name) {
    const size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t at = a;
    if (a && dir[a - 1] != '/') p[at++] = '/';
    memcpy(p + at, name, b + 1);
    return p;
}

int moe_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (!strcmp(a, b)) return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int moe_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd), err = errno;
    close(fd);
    errno = err;
    return rc;
}

int moe_parse_nbytes(const char *text, long long *nbytes) {
    static const struct {
        const char *unit;
        long long scale;
    } units[] = {{"", 1}, {"B", 1}, {"KB", 1000LL}, {"MB", 1000000LL}, {"GB", 1000000000LL}, {"TB", 1000000000000LL},
                 {"KiB", 1LL << 10}, {"MiB", 1LL << 20}, {"GiB", 1LL << 30}, {"TiB", 1LL << 40}};
    const char *p = text;
    long long n = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (n > (1LL << 62) / 10) return -1;
        n = n * 10 + (*p - '0');
    }
    if (p == text) return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(p, units[i].unit)) {
            if (n < 1 || n > (1LL << 62) / units[i].scale) return -1;
            *nbytes = n * units[i].scale;
            return 0;
        }
    return -1;
}
