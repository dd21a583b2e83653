/* message.h — the one way library code words a failure for the caller: "PATH: what went wrong". */
#ifndef MOE_MESSAGE_H
#define MOE_MESSAGE_H

#include <stddef.h>

#include "moe/moe.h"

/* Writes "path: <fmt...>" (or just <fmt...> when path is NULL) into message[message_nbytes] and returns
 * status, so that `return moe_fail(MOE_ERR_BAD_FILE, msg, n, path, "...", ...);` reports and fails at once. */
moe_status moe_fail(moe_status status, char *message, size_t message_nbytes, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
