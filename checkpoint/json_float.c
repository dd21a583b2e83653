/* checkpoint/json_float.c — the shortest decimal of a float32, in text and as a JSON real (json_float.h). */
#include "checkpoint/json_float.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void moe_format_float(float v, char *out, size_t nbytes) {
    int digits = 1;
    while (digits < 9) { /* 9 significant digits always read back as the same float */
        snprintf(out, nbytes, "%.*g", digits, (double)v);
        if (strtof(out, NULL) == v) break;
        digits++;
    }
    const double size = fabs((double)v);
    if (size >= 1 && size < 1e15) { /* every integer digit, no exponent: 10000, not 1e+04 */
        const int integer_digits = (int)floor(log10(size)) + 1;
        if (integer_digits > digits) digits = integer_digits;
    }
    snprintf(out, nbytes, "%.*g", digits, (double)v);
}

json_t *moe_json_float(float v) {
    char text[32];
    moe_format_float(v, text, sizeof text);
    return json_real(strtod(text, NULL));
}
