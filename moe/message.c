/* message.c — formatting failure messages (message.h). */
#include "moe/message.h"

#include <stdarg.h>
#include <stdio.h>

moe_status moe_fail(moe_status status, char *message, size_t message_nbytes, const char *path, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (path) snprintf(message, message_nbytes, "%s: %s", path, detail);
    else snprintf(message, message_nbytes, "%s", detail);
    return status;
}
