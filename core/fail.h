/* fail.h — the one failure channel of the library. A function that fails records one sentence for its
 * thread (what went wrong, which file, rank or value, what to do) and returns its status; the caller adds
 * what it was doing (moe_fail_context) and passes the status up; the program prints moe_failure_message.
 * The library itself never prints and never exits.
 *
 *   return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s has %d dimensions, want 2", path, name, ndim);
 *   MOE_TRY(step());   // returns step()'s status from the enclosing function when it is not MOE_OK
 */
#ifndef MOE_CORE_FAIL_H
#define MOE_CORE_FAIL_H

#include "core/types.h"

/* Records the formatted sentence as this thread's failure message, and returns status. */
moe_status moe_fail(moe_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Puts "<formatted context>: " in front of the recorded message (or records the context alone, with the
 * status's own text, when the failure recorded none), and returns status. MOE_OK passes through. */
moe_status moe_fail_context(moe_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What to print for a failure with this status: the recorded message when it was recorded for this
 * status, else the status's own text. Valid until the thread's next failure. */
const char *moe_failure_message(moe_status status);

/* Forgets the recorded message (for callers that retry, and for tests). */
void moe_failure_clear(void);

/* Propagates a moe_status: returns it from the enclosing function unless it is MOE_OK. */
#define MOE_TRY(call)                                                                                        \
    do {                                                                                                     \
        moe_status moe_try_status_ = (call);                                                                 \
        if (moe_try_status_ != MOE_OK) return moe_try_status_;                                              \
    } while (0)

#endif
