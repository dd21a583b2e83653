/* wait_policy.c — active or passive waiting (wait_policy.h). */
#include "alltoall/wait_policy.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fail.h"

enum { SPIN_POLLS = 100 };             /* polls before the first yield or sleep */
static const double kWaitSpinS = 2e-4; /* passive: the spin before sleeping (on the 2-vCPU VM an exchange of up to
                                        * 1 MiB a rank takes 6-90 us when both ranks run: bench_alltoall) */
static const long kSleepNs = 10000;    /* asked for; the kernel's timer slack (50 us) makes it ~60 us */

moe_status moe_wait_policy_resolve(const char *setting, moe_wait_policy *out) {
    if (!setting || !*setting || strcmp(setting, "active") == 0) *out = MOE_WAIT_ACTIVE;
    else if (strcmp(setting, "passive") == 0) *out = MOE_WAIT_PASSIVE;
    else return moe_fail(MOE_ERR_INVALID_ARG, "MOE_WAIT_POLICY='%s': expected active or passive", setting);
    return MOE_OK;
}

moe_status moe_wait_policy_here(moe_wait_policy *out) {
    return moe_wait_policy_resolve(getenv("MOE_WAIT_POLICY"), out);
}

void moe_wait_pause(moe_wait_policy p, long polls, double waited_s) {
    if (polls < SPIN_POLLS) return;
    if (p == MOE_WAIT_PASSIVE && waited_s > kWaitSpinS) {
        const struct timespec pause = {0, kSleepNs};
        nanosleep(&pause, NULL);
    } else {
        sched_yield();
    }
}
