/* precision.c — the one table of what is bf16 (precision.h). */
#include "core/precision.h"

#include <string.h>

int moe_precision_bf16_inputs(moe_precision p, moe_gemm_site site) {
    if (p != MOE_PRECISION_BF16) return 0;
    return site == MOE_GEMM_EXPERTS || site == MOE_GEMM_DENSE || site == MOE_GEMM_ATTENTION;
}

const char *moe_precision_name(moe_precision p) { return p == MOE_PRECISION_BF16 ? "bf16" : "fp32"; }

int moe_precision_parse(const char *name) {
    if (!strcmp(name, "fp32")) return MOE_PRECISION_FP32;
    if (!strcmp(name, "bf16")) return MOE_PRECISION_BF16;
    return -1;
}
