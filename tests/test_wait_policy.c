/* test_wait_policy.c — MOE_WAIT_POLICY (alltoall/wait_policy.h): unset or empty is active; active and passive as
 * given; anything else refused with a sentence naming the variable and the value; a pause of either policy, early in
 * a wait or late, returns.
 *   meson test -C build test_wait_policy */
#include <string.h>

#include "alltoall/wait_policy.h"
#include "core/fail.h"
#include "test_util.h"

static moe_wait_policy resolved(const char *setting) {
    moe_wait_policy p = (moe_wait_policy)-1;
    CHECK(moe_wait_policy_resolve(setting, &p) == MOE_OK, "'%s' refused", setting ? setting : "(unset)");
    return p;
}

int main(void) {
    CHECK(resolved(NULL) == MOE_WAIT_ACTIVE && resolved("") == MOE_WAIT_ACTIVE, "the default is not active");
    CHECK(resolved("active") == MOE_WAIT_ACTIVE, "active");
    CHECK(resolved("passive") == MOE_WAIT_PASSIVE, "passive");
    const char *bad[] = {"spin", "ACTIVE", "passive ", "auto", "1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        moe_wait_policy p;
        moe_failure_clear();
        CHECK(moe_wait_policy_resolve(bad[i], &p) == MOE_ERR_INVALID_ARG, "'%s' accepted", bad[i]);
        const char *why = moe_failure_message(MOE_ERR_INVALID_ARG);
        CHECK(strstr(why, "MOE_WAIT_POLICY") && strstr(why, bad[i]), "message for '%s': %s", bad[i], why);
    }
    for (long polls = 0; polls < 300; polls += 50) { /* early polls, yields, sleeps: each returns */
        moe_wait_pause(MOE_WAIT_ACTIVE, polls, 1.0);
        moe_wait_pause(MOE_WAIT_PASSIVE, polls, polls < 150 ? 0.0 : 1.0);
    }
    return test_finish("test_wait_policy");
}
