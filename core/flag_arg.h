/* flag_arg.h — one command-line token as moe-train and moe-plan read it: "--flag value", or "--flag=value" (argparse's
 * form, which Megatron's and torchtitan's users type). */
#ifndef MOE_CORE_FLAG_ARG_H
#define MOE_CORE_FLAG_ARG_H

typedef struct {
    char name[64];     /* the token up to its '=' ("--lr" of "--lr=3e-4"); a longer name is cut, and so unknown */
    const char *value; /* what follows the '=', or NULL where the token has none (the value, if any, is the next) */
} moe_flag_arg;

moe_flag_arg moe_flag_arg_split(const char *token);
/* 1 when argv[i + 1] exists and can be a value: it does not start with "--" (a negative number can) */
int moe_flag_arg_next_is_value(int argc, char **argv, int i);

#endif
