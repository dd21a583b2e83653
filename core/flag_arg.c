/* flag_arg.c — command-line tokens (flag_arg.h). */
#include "core/flag_arg.h"

#include <stdio.h>
#include <string.h>

moe_flag_arg moe_flag_arg_split(const char *token) {
    moe_flag_arg a = {.value = NULL};
    const char *equals = strncmp(token, "--", 2) ? NULL : strchr(token, '=');
    snprintf(a.name, sizeof a.name, "%.*s", equals ? (int)(equals - token) : (int)strlen(token), token);
    a.value = equals ? equals + 1 : NULL;
    return a;
}

int moe_flag_arg_next_is_value(int argc, char **argv, int i) {
    return i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0;
}
