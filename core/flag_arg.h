/* flag_arg.h — one command-line token as moe-train and moe-plan read it: "--flag value", or "--flag=value" (argparse's
 * form, which Megatron's and torchtitan's users type). */
#ifndef MOE_CORE_FLAG_ARG_H
#define MOE_CORE_FLAG_ARG_H

#include <stddef.h>

typedef struct {
    char name[64];     /* the token up to its '=' ("--lr" of "--lr=3e-4"); a longer name is cut, and so unknown */
    const char *value; /* what follows the '=', or NULL where the token has none (the value, if any, is the next) */
} moe_flag_arg;

moe_flag_arg moe_flag_arg_split(const char *token);
/* 1 when argv[i + 1] exists and can be a value: it does not start with "--" (a negative number can) */
int moe_flag_arg_next_is_value(int argc, char **argv, int i);

/* NAME as flags are spelled here: two dashes, '-' for '_' ("-lr": "--lr", "--clip_grad": "--clip-grad"); cut at 63
 * bytes. */
void moe_flag_arg_canonical(const char *name, char out[64]);

/* What to add to "unknown flag 'NAME'" (into out, "" when nothing): for a word that is no flag, that a value stands
 * without one (a shell that expanded an unquoted glob into several words); else the known flag it is once spelled
 * canonically (moe_flag_arg_canonical), or the nearest known flag by edit distance (at most 1 plus a quarter of its
 * length without the dashes). */
void moe_flag_arg_hint(const char *name, const char *const *known, int count, char *out, size_t n);

#endif
