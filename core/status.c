/* status.c — the strings of moe_status, generated from the same X-macro list as the enum. */
#include "core/types.h"

const char *moe_status_string(moe_status status) {
    switch (status) {
#define MOE__STATUS_CASE(name, text) \
    case name:                       \
        return text;
        MOE_STATUS_LIST(MOE__STATUS_CASE)
#undef MOE__STATUS_CASE
    default:
        return "unknown status";
    }
}
