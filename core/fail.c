/* fail.c — the thread's failure message (fail.h). */
#include "core/fail.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Long enough for a per-expert count listing of a large layer; longer messages are cut. */
enum { MESSAGE_NBYTES = 4096 };

static _Thread_local struct {
    moe_status status;
    char text[MESSAGE_NBYTES];
} last;

moe_status moe_fail(moe_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last.text, sizeof last.text, fmt, ap);
    va_end(ap);
    last.status = status;
    return status;
}

moe_status moe_fail_context(moe_status status, const char *fmt, ...) {
    if (status == MOE_OK) return status;
    char context[1024], old[MESSAGE_NBYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", last.status == status && last.text[0] ? last.text : moe_status_string(status));
    /* context first, then as much of the old message as fits */
    size_t at = strlen(context);
    memcpy(last.text, context, at + 1);
    if (at + 2 < sizeof last.text) {
        memcpy(last.text + at, ": ", 3);
        at += 2;
        size_t room = sizeof last.text - at - 1, n = strlen(old);
        memcpy(last.text + at, old, n < room ? n : room);
        last.text[at + (n < room ? n : room)] = 0;
    }
    last.status = status;
    return status;
}

const char *moe_failure_message(moe_status status) {
    return last.status == status && last.text[0] ? last.text : moe_status_string(status);
}

void moe_failure_clear(void) {
    last.status = MOE_OK;
    last.text[0] = 0;
}
