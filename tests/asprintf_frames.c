/* asprintf_frames.c — an LD_PRELOAD shim for scripts/sanitize.sh: asprintf and vasprintf (and their _FORTIFY_SOURCE
 * entries, which Debian's Open MPI calls) that call malloc from a frame with a frame pointer. glibc's keep none, so
 * the stack of a string that Open MPI allocates through them (opal_asprintf) and keeps until exit ends at glibc's
 * internal __vasprintf_internal, above which LeakSanitizer's frame-pointer unwinding (fast_unwind_on_malloc) reads
 * noise: only that internal function's name, found in glibc's separate debug info (libc6-dbg), could suppress it.
 * Through these the stack reads malloc, this shim, then the caller: Open MPI's library, which tests/lsan.supp names,
 * and the run needs no debug info of glibc (sanitize.sh hides it: reading it at every exit was a third of the CLI
 * tests' CPU). Built with -fno-omit-frame-pointer, without the sanitizers (it is preloaded into every process of the
 * run); results as glibc's: the length, or -1. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int vasprintf(char **out, const char *format, va_list args) {
    va_list measure;
    va_copy(measure, args);
    const int length = vsnprintf(NULL, 0, format, measure);
    va_end(measure);
    if (length < 0) return -1;
    char *s = malloc((size_t)length + 1);
    if (!s) return -1;
    vsnprintf(s, (size_t)length + 1, format, args);
    *out = s;
    return length;
}

int asprintf(char **out, const char *format, ...) {
    va_list args;
    va_start(args, format);
    const int length = vasprintf(out, format, args);
    va_end(args);
    return length;
}

/* What -D_FORTIFY_SOURCE compiles the two into; flag asks glibc to refuse %n in a writable format, which no caller
 * of the run uses. */
int __vasprintf_chk(char **out, int flag, const char *format, va_list args) {
    (void)flag;
    return vasprintf(out, format, args);
}

int __asprintf_chk(char **out, int flag, const char *format, ...) {
    (void)flag;
    va_list args;
    va_start(args, format);
    const int length = vasprintf(out, format, args);
    va_end(args);
    return length;
}
