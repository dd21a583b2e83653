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

/* Levenshtein's distance between a and b, both at most 63 bytes (a flag's name, moe_flag_arg.name) */
static int edit_distance(const char *a, const char *b) {
    int row[64], la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 64;
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diagonal = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            const int above = row[j], cost = a[i - 1] != b[j - 1];
            int best = diagonal + cost;
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best, diagonal = above;
        }
    }
    return row[lb];
}

void moe_flag_arg_canonical(const char *name, char out[64]) {
    const int single = name[0] == '-' && name[1] && name[1] != '-'; /* "-lr": argparse's single dash (a review) */
    snprintf(out, 64, "%s%s", single ? "-" : "", name);
    for (char *c = out; *c; c++)
        if (*c == '_' && c > out + 1) *c = '-';
}

void moe_flag_arg_hint(const char *name, const char *const *known, int count, char *out, size_t n) {
    *out = 0;
    const int single = name[0] == '-' && name[1] && name[1] != '-';
    if (strncmp(name, "--", 2) && !single) {
        snprintf(out, n, ": a value without its flag (if the shell expanded an unquoted pattern into several words, "
                         "quote the pattern)");
        return;
    }
    char canonical[64];
    moe_flag_arg_canonical(name, canonical);
    const int most = 1 + ((int)strlen(canonical) - 2) / 4; /* "--stepz": 2; "--foo" is no "--ep" */
    int best = -1, distance = most + 1;
    for (int i = 0; i < count; i++) {
        if (!strcmp(canonical, known[i])) {
            snprintf(out, n, single ? ": flags take two dashes: %s" : ": flags are spelled with '-' here: %s",
                     known[i]);
            return;
        }
        const int d = edit_distance(canonical, known[i]);
        if (d < distance) best = i, distance = d;
    }
    if (best >= 0) snprintf(out, n, ": did you mean %s?", known[best]);
    else if (single) snprintf(out, n, ": flags take two dashes");
}
