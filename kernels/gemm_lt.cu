/* gemm_lt.cu — the pinned cuBLASLt GEMM of gemm_lt.h: the plan (candidates, checks, the configuration's text), the
 * call, and a set of pinned GEMMs by shape whose fp32 callers' operands are cast or staged through its scratch.
 * The column-major layouts are gemm_lt_layout.c's (on the CPU, tested without a GPU by tests/test_gemm_lt_layout.c).
 * Checked on a GPU by tests/test_gpu_gemm_lt.c (build: ninja -C build; run: meson test -C build test_gpu_gemm_lt);
 * timed by bench/bench_gemm_lt.cu. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "core/gpu_cuda.h"
#include "kernels/cast_device.cuh"

extern "C" {
#include "kernels/cast.h"
#include "kernels/gemm_lt.h"
}

struct moe_gemm_lt {
    moe_gemm_lt_shape shape;
    cublasComputeType_t compute;
    cublasLtMatmulAlgo_t algo;
    uint32_t align_a, align_b, align_d; /* bytes: our A (cuBLASLt's B), our B (its A), D (its C and D) */
    char text[256];                     /* moe_gemm_lt_describe */
};

namespace {

constexpr int kHeuristicCount = 32; /* candidates asked of the heuristic */
constexpr int kMaxAlgoIds = 1024;
constexpr uint32_t kUnknownAlignment = 256; /* assumed where the library does not say: cudaMalloc's */
const int kCheckRows[] = MOE_GEMM_LT_CHECK_ROWS;

cudaDataType_t input_type(moe_gemm_lt_inputs inputs) { return inputs == MOE_GEMM_LT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }
size_t input_nbytes(moe_gemm_lt_inputs inputs) { return inputs == MOE_GEMM_LT_BF16 ? 2 : 4; }
cudaDataType_t output_type(const moe_gemm_lt_shape &s) { return s.bf16_out ? CUDA_R_16BF : CUDA_R_32F; }
bool aligned(const void *p, uint32_t alignment) { return alignment <= 1 || (uintptr_t)p % alignment == 0; }

const char *compute_name(cublasComputeType_t c) {
    return c == CUBLAS_COMPUTE_32F_PEDANTIC ? "32F_PEDANTIC" : c == CUBLAS_COMPUTE_32F ? "32F" : "?";
}

/* One call's descriptors in the caller's memory (the cublasLt*Init forms: nothing to free). */
struct call_descs {
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t first, second, d; /* our B, our A, our D (also C) */
};

moe_status describe_call(const moe_gemm_lt_shape &s, cublasComputeType_t compute, int M, call_descs *c) {
    const moe__gemm_lt_colmajor cm = moe__gemm_lt_colmajor_of(&s, M);
    MOE_CUBLAS_TRY(cublasLtMatmulDescInit(&c->op, compute, CUDA_R_32F));
    const int32_t op_first = cm.op_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t op_second = cm.op_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    MOE_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(&c->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    MOE_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(&c->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    const cudaDataType_t t = input_type(s.inputs);
    MOE_CUBLAS_TRY(cublasLtMatrixLayoutInit(&c->first, t, cm.first_rows, cm.first_cols, cm.first_ld));
    MOE_CUBLAS_TRY(cublasLtMatrixLayoutInit(&c->second, t, cm.second_rows, cm.second_cols, cm.second_ld));
    MOE_CUBLAS_TRY(cublasLtMatrixLayoutInit(&c->d, output_type(s), cm.d_rows, cm.d_cols, cm.d_ld));
    return MOE_OK;
}

template <typename T> bool get_config(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoConfigAttributes_t attr, T *v) {
    size_t written = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(&a, attr, v, sizeof *v, &written) == CUBLAS_STATUS_SUCCESS;
}

template <typename T> bool set_config(cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t attr, T v) {
    return cublasLtMatmulAlgoConfigSetAttribute(a, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

template <typename T> bool get_cap(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoCapAttributes_t attr, T *v) {
    size_t written = 0;
    return cublasLtMatmulAlgoCapGetAttribute(&a, attr, v, sizeof *v, &written) == CUBLAS_STATUS_SUCCESS;
}

/* An array capability (tile or stages ids); {0} (undefined: the algorithm has none to choose) when it lists none. */
std::vector<uint32_t> cap_ids(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoCapAttributes_t attr) {
    size_t nbytes = 0;
    std::vector<uint32_t> ids;
    if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, NULL, 0, &nbytes) == CUBLAS_STATUS_SUCCESS && nbytes) {
        ids.resize(nbytes / sizeof(uint32_t));
        size_t written = 0;
        if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, ids.data(), ids.size() * sizeof(uint32_t), &written) !=
            CUBLAS_STATUS_SUCCESS)
            ids.clear();
        else
            ids.resize(written / sizeof(uint32_t));
    }
    if (ids.empty()) ids.push_back(0);
    return ids;
}

/* Why candidates were turned down: the refusal's message. */
struct tally {
    int tried, config, flags, check, workspace;
    cublasStatus_t last_check, heuristic, ids; /* the last refusal of a check; the two queries' answers */
};

/* The numerical flags the inputs need: an fp32 accumulator; bf16: bf16 (or fp32) MMA inputs, both exact for bf16
 * values; fp32: no tensor op at all (no TF32, no emulation through bf16), fp32 inputs. */
bool flags_suit(const cublasLtMatmulAlgo_t &a, moe_gemm_lt_inputs inputs, uint64_t *flags) {
    if (!get_cap(a, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, flags)) return false;
    const uint64_t f = *flags, input = f & CUBLASLT_NUMERICAL_IMPL_FLAGS_OP_INPUT_TYPE_MASK;
    if ((f & CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_TYPE_MASK) != CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F)
        return false;
    if (inputs == MOE_GEMM_LT_FP32)
        return (f & CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK) == 0 &&
               (input == 0 || input == CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F);
    return input == CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF || input == CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F;
}

moe_status passes_checks(moe_gpu *gpu, const moe_gemm_lt_shape &s, cublasComputeType_t compute,
                         const cublasLtMatmulAlgo_t *a, tally *t, bool *ok);

/* *ok: the candidate, with split-K off and a concrete cluster shape where one passes, suits the inputs and passes
 * cublasLtMatmulAlgoCheck without workspace at every M of kCheckRows; *flags its numerical flags. Only a failure to
 * describe the call is an error. */
moe_status try_candidate(moe_gpu *gpu, const moe_gemm_lt_shape &s, cublasComputeType_t compute,
                         cublasLtMatmulAlgo_t *a, tally *t, bool *ok, uint64_t *flags) {
    *ok = false;
    t->tried++;
    if (!set_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1) ||
        !set_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_REDUCTION_SCHEME_NONE)) {
        t->config++;
        return MOE_OK;
    }
    if (!flags_suit(*a, s.inputs, flags)) {
        t->flags++;
        return MOE_OK;
    }
    /* A thread-block cluster shape left to the library (AUTO, what an enumerated candidate starts with) may be chosen
     * per call, so per M: the first concrete shape that passes at every M is pinned instead. None: the candidate keeps
     * AUTO, which its record names (pinned) and test_gpu_gemm_lt's rows-bitwise check over M would catch. */
    uint16_t cluster = CUBLASLT_CLUSTER_SHAPE_AUTO;
    if (get_config(*a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster) && cluster == CUBLASLT_CLUSTER_SHAPE_AUTO) {
        for (uint16_t shape : {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                               CUBLASLT_CLUSTER_SHAPE_2x2x1}) {
            cublasLtMatmulAlgo_t concrete = *a;
            if (!set_config<uint16_t>(&concrete, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, shape)) continue;
            MOE_TRY(passes_checks(gpu, s, compute, &concrete, t, ok));
            if (*ok) return *a = concrete, MOE_OK;
        }
    }
    return passes_checks(gpu, s, compute, a, t, ok);
}

/* *ok: a passes cublasLtMatmulAlgoCheck without workspace at every M of kCheckRows (each refusal tallied). */
moe_status passes_checks(moe_gpu *gpu, const moe_gemm_lt_shape &s, cublasComputeType_t compute,
                         const cublasLtMatmulAlgo_t *a, tally *t, bool *ok) {
    *ok = false;
    for (int M : kCheckRows) {
        call_descs c;
        MOE_TRY(describe_call(s, compute, M, &c));
        cublasLtMatmulHeuristicResult_t r;
        memset(&r, 0, sizeof r);
        const cublasStatus_t st = cublasLtMatmulAlgoCheck(gpu->blaslt, &c.op, &c.first, &c.second, &c.d, &c.d, a, &r);
        if (st != CUBLAS_STATUS_SUCCESS) {
            t->check++, t->last_check = st;
            return MOE_OK;
        }
        if (r.workspaceSize != 0) {
            t->workspace++;
            return MOE_OK;
        }
    }
    *ok = true;
    return MOE_OK;
}

moe_status pinned(const moe_gemm_lt_shape &s, cublasComputeType_t compute, const cublasLtMatmulAlgo_t &a,
                  uint64_t flags, const char *source, moe_gemm_lt **out) {
    moe_gemm_lt *g = (moe_gemm_lt *)calloc(1, sizeof *g);
    if (!g) return MOE_ERR_OUT_OF_MEMORY;
    g->shape = s, g->compute = compute, g->algo = a;
    g->align_a = g->align_b = g->align_d = kUnknownAlignment;
    uint32_t v = 0;
    if (get_cap(a, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES, &v)) g->align_a = v;
    if (get_cap(a, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, &v)) g->align_b = v;
    uint32_t c_align = kUnknownAlignment, d_align = kUnknownAlignment;
    get_cap(a, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, &c_align);
    get_cap(a, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES, &d_align);
    g->align_d = std::max(c_align, d_align);
    int32_t id = -1, splitk = -1;
    uint32_t tile = 0, stages = 0, reduction = 0, swizzle = 0, custom = 0;
    uint16_t inner = 0, cluster = 0;
    const bool known = get_config(a, CUBLASLT_ALGO_CONFIG_ID, &id) && get_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile) &&
                       get_config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages) &&
                       get_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk) &&
                       get_config(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction) &&
                       get_config(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle) &&
                       get_config(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom);
    /* older libraries may lack these two: 0 (undefined, auto) then */
    get_config(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner);
    get_config(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster);
    char cluster_text[16] = "auto"; /* the library's choice per call (try_candidate pins one where it can) */
    if (cluster != CUBLASLT_CLUSTER_SHAPE_AUTO) snprintf(cluster_text, sizeof cluster_text, "%u", (unsigned)cluster);
    snprintf(g->text, sizeof g->text,
             "cuBLASLt %zu compute %s algo %d tile %u stages %u splitk %d reduction %s swizzle %u custom %u inner %u "
             "cluster %s flags 0x%llx (%s%s)",
             cublasLtGetVersion(), compute_name(compute), (int)id, tile, stages, (int)splitk,
             reduction == CUBLASLT_REDUCTION_SCHEME_NONE ? "none" : "SET", swizzle, custom, (unsigned)inner,
             cluster_text, (unsigned long long)flags, source, known ? "" : "; some attributes unreadable");
    *out = g;
    return MOE_OK;
}

/* Tier 1: the heuristic's candidates for MOE_GEMM_LT_PLAN_ROWS rows and no workspace, in its order. */
moe_status from_heuristic(moe_gpu *gpu, const moe_gemm_lt_shape &s, cublasComputeType_t compute, tally *t,
                          moe_gemm_lt **out) {
    call_descs c;
    MOE_TRY(describe_call(s, compute, MOE_GEMM_LT_PLAN_ROWS, &c));
    cublasLtMatmulPreferenceOpaque_t pref;
    MOE_CUBLAS_TRY(cublasLtMatmulPreferenceInit(&pref));
    const uint64_t no_workspace = 0;
    MOE_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace,
                                                        sizeof no_workspace));
    if (s.inputs == MOE_GEMM_LT_FP32) { /* only what flags_suit takes, so that the list holds such candidates */
        const uint64_t mask = ~(uint64_t)CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK;
        MOE_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_IMPL_MASK, &mask, sizeof mask));
    }
    cublasLtMatmulHeuristicResult_t results[kHeuristicCount];
    memset(results, 0, sizeof results);
    int count = 0;
    /* a refusal (no heuristic for these types, say) leaves tier 2; it is named in the plan's message */
    t->heuristic = cublasLtMatmulAlgoGetHeuristic(gpu->blaslt, &c.op, &c.first, &c.second, &c.d, &c.d, &pref,
                                                  kHeuristicCount, results, &count);
    if (t->heuristic != CUBLAS_STATUS_SUCCESS) return MOE_OK;
    for (int i = 0; i < count; i++) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
        cublasLtMatmulAlgo_t a = results[i].algo;
        bool ok = false;
        uint64_t flags = 0;
        MOE_TRY(try_candidate(gpu, s, compute, &a, t, &ok, &flags));
        if (!ok) continue;
        char source[64];
        snprintf(source, sizeof source, "heuristic #%d of %d at %d rows", i + 1, count, (int)MOE_GEMM_LT_PLAN_ROWS);
        return pinned(s, compute, a, flags, source, out);
    }
    return MOE_OK;
}

/* Tier 2: every algorithm id in id order, its tiles and stages in the library's order, swizzle 0, custom option 0. */
moe_status from_enumeration(moe_gpu *gpu, const moe_gemm_lt_shape &s, cublasComputeType_t compute, tally *t,
                            moe_gemm_lt **out) {
    const cudaDataType_t ty = input_type(s.inputs);
    std::vector<int> ids(kMaxAlgoIds);
    int count = 0;
    const cudaDataType_t out_ty = output_type(s);
    t->ids = cublasLtMatmulAlgoGetIds(gpu->blaslt, compute, CUDA_R_32F, ty, ty, out_ty, out_ty, kMaxAlgoIds, ids.data(),
                                      &count);
    if (t->ids != CUBLAS_STATUS_SUCCESS) return MOE_OK;
    ids.resize(count);
    std::sort(ids.begin(), ids.end());
    for (int id : ids) {
        cublasLtMatmulAlgo_t base;
        if (cublasLtMatmulAlgoInit(gpu->blaslt, compute, CUDA_R_32F, ty, ty, out_ty, out_ty, id, &base) !=
            CUBLAS_STATUS_SUCCESS) {
            t->config++;
            continue;
        }
        uint64_t flags = 0;
        if (!flags_suit(base, s.inputs, &flags)) { /* a property of the id: none of its tiles would do */
            t->tried++, t->flags++;
            continue;
        }
        for (uint32_t tile : cap_ids(base, CUBLASLT_ALGO_CAP_TILE_IDS)) {
            for (uint32_t stages : cap_ids(base, CUBLASLT_ALGO_CAP_STAGES_IDS)) {
                cublasLtMatmulAlgo_t a = base;
                if (!set_config<uint32_t>(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, tile) ||
                    !set_config<uint32_t>(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages) ||
                    !set_config<uint32_t>(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 0) ||
                    !set_config<uint32_t>(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 0)) {
                    t->tried++, t->config++;
                    continue;
                }
                bool ok = false;
                MOE_TRY(try_candidate(gpu, s, compute, &a, t, &ok, &flags));
                if (ok) return pinned(s, compute, a, flags, "enumerated", out);
            }
        }
    }
    return MOE_OK;
}

/* ---- staging for fp32 callers (moe_gemm_lt_run_f32) ---- */

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

/* out[r ld + c] = bf16(in[r width + c]): rows padded to ld (moe_gemm_lt_ld_a / _ld_b); the pad, past the matrix's
 * rows as cuBLASLt's layout has them, is left as it is (BLAS: an ld beyond the rows holds no part of the matrix) */
__global__ void cast_rows_bf16(const float *in, int rows, int width, int ld, uint16_t *out) {
    const size_t n = (size_t)rows * width;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i / width * ld + i % width] = moe_cuda::bf16_bits(in[i]);
}

} // namespace

enum { SLOT_A, SLOT_B, SLOT_D, SLOTS };

struct lt_entry {
    moe_gemm_lt_shape shape;
    moe_gemm_lt *g; /* NULL: cuBLASLt offers none; refusal says why */
    char *refusal;
};

struct moe_gemm_lt_set {
    lt_entry *entries; /* in the order met */
    int count, capacity;
    void *buf[SLOTS];  /* staged operands: [rows, ld] of the input type for A and B, [M, N] fp32 for D */
    size_t buf_nbytes[SLOTS];
};

namespace {

bool same_shape(const moe_gemm_lt_shape &a, const moe_gemm_lt_shape &b) {
    return a.trans_a == b.trans_a && a.trans_b == b.trans_b && a.n == b.n && a.k == b.k && a.inputs == b.inputs &&
           a.bf16_out == b.bf16_out;
}

moe_status grow(moe_gpu *gpu, moe_gemm_lt_set *set, int slot, size_t nbytes) {
    if (nbytes <= set->buf_nbytes[slot]) return MOE_OK;
    MOE_TRY(moe_gpu_synchronize(gpu)); /* queued calls may still read the old buffer */
    moe_gpu_free(gpu, set->buf[slot]);
    set->buf[slot] = NULL, set->buf_nbytes[slot] = 0;
    const size_t grown = nbytes + nbytes / 4;
    MOE_TRY(moe_gpu_alloc(gpu, grown, &set->buf[slot]));
    set->buf_nbytes[slot] = grown;
    return MOE_OK;
}

/* out [rows, ld] = bf16(x [rows, width]) (the pad columns untouched) */
moe_status cast_padded(moe_gpu *gpu, const float *x, int rows, int width, int ld, void *out) {
    if (ld == width) return moe_cast_f32_to_bf16_cuda(gpu, x, (size_t)rows * width, (moe_bf16 *)out);
    const size_t n = (size_t)rows * width, blocks = (n + kThreads - 1) / kThreads;
    cast_rows_bf16<<<blocks > (size_t)kMaxBlocks ? kMaxBlocks : (int)blocks, kThreads, 0, gpu->stream>>>(
        x, rows, width, ld, (uint16_t *)out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* x [rows, width] fp32 dense as the call reads it: [rows, ld] of the input type, at an address of `alignment` */
moe_status stage_input(moe_gpu *gpu, moe_gemm_lt_set *set, int slot, const float *x, int rows, int width, int ld,
                       moe_gemm_lt_inputs inputs, uint32_t alignment, const void **out) {
    if (inputs == MOE_GEMM_LT_FP32 && ld == width && aligned(x, alignment)) {
        *out = x;
        return MOE_OK;
    }
    MOE_TRY(grow(gpu, set, slot, (size_t)rows * ld * input_nbytes(inputs)));
    void *buf = set->buf[slot];
    *out = buf;
    if (inputs == MOE_GEMM_LT_FP32) {
        MOE_CUDA_TRY(cudaMemcpy2DAsync(buf, (size_t)ld * sizeof(float), x, (size_t)width * sizeof(float),
                                       (size_t)width * sizeof(float), rows, cudaMemcpyDeviceToDevice, gpu->stream));
        return MOE_OK;
    }
    return cast_padded(gpu, x, rows, width, ld, buf);
}

moe_status check_call(const char *what, const moe_gemm_lt_shape &s, int M, float beta) {
    if (M < 0) return moe_fail(MOE_ERR_INVALID_ARG, "%s: %d rows", what, M);
    if (beta != 0 && beta != 1) return moe_fail(MOE_ERR_INVALID_ARG, "%s: beta %g is neither 0 nor 1", what, (double)beta);
    if (beta != 0 && s.bf16_out)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: beta 1 with a bf16 D (its sum would round twice)", what);
    return MOE_OK;
}

} // namespace

extern "C" moe_status moe_gemm_lt_plan(moe_gpu *gpu, const moe_gemm_lt_shape *shape, moe_gemm_lt **out) {
    *out = NULL;
    const moe_gemm_lt_shape s = *shape;
    char text[96];
    moe_gemm_lt_shape_text(&s, text, sizeof text);
    if ((s.trans_a != 0 && s.trans_a != 1) || (s.trans_b != 0 && s.trans_b != 1) || s.n < 1 || s.k < 1 ||
        (s.inputs != MOE_GEMM_LT_BF16 && s.inputs != MOE_GEMM_LT_FP32) || (s.bf16_out != 0 && s.bf16_out != 1) ||
        (s.bf16_out && s.inputs != MOE_GEMM_LT_BF16))
        return moe_fail(MOE_ERR_INVALID_ARG, "gemm_lt: no such shape: trans %d %d, n %d, k %d, inputs %d, bf16 out %d",
                        s.trans_a, s.trans_b, s.n, s.k, (int)s.inputs, s.bf16_out);
    /* fp32: the pedantic type first (it rules out TF32 and emulation by itself), then plain 32F with FMA-only flags */
    const cublasComputeType_t bf16[] = {CUBLAS_COMPUTE_32F};
    const cublasComputeType_t fp32[] = {CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F};
    const cublasComputeType_t *computes = s.inputs == MOE_GEMM_LT_BF16 ? bf16 : fp32;
    const int num_computes = s.inputs == MOE_GEMM_LT_BF16 ? 1 : 2;
    char tried[1024] = "";
    size_t used = 0;
    for (int i = 0; i < num_computes; i++) {
        tally t;
        memset(&t, 0, sizeof t);
        cublasLtMatmulDescOpaque_t probe; /* a compute type this library does not take is no error: the next one */
        const cublasStatus_t taken = cublasLtMatmulDescInit(&probe, computes[i], CUDA_R_32F);
        if (taken == CUBLAS_STATUS_SUCCESS) {
            MOE_TRY(from_heuristic(gpu, s, computes[i], &t, out));
            if (!*out) MOE_TRY(from_enumeration(gpu, s, computes[i], &t, out));
            if (*out) return MOE_OK;
        }
        const int w =
            taken != CUBLAS_STATUS_SUCCESS
                ? snprintf(tried + used, sizeof tried - used, "%scompute %s: the descriptor refused it (%s)",
                           i ? "; " : "", compute_name(computes[i]), moe_cublas_status_string(taken))
                : snprintf(tried + used, sizeof tried - used,
                           "%scompute %s: heuristic %s, algorithm ids %s; %d candidates: %d refused the "
                           "configuration, %d without the numerical flags of %s, %d refused by cublasLtMatmulAlgoCheck "
                           "(last: %s), %d needing workspace",
                           i ? "; " : "", compute_name(computes[i]), moe_cublas_status_string(t.heuristic),
                           moe_cublas_status_string(t.ids), t.tried, t.config, t.flags,
                           s.inputs == MOE_GEMM_LT_BF16 ? "bf16 inputs" : "fp32 without tensor ops", t.check,
                           t.check ? moe_cublas_status_string(t.last_check) : "-", t.workspace);
        used += w > 0 ? (size_t)w : 0;
        if (used >= sizeof tried) used = sizeof tried - 1;
    }
    return moe_fail(MOE_ERR_LIBRARY, "cuBLASLt offers no batch-invariant algorithm (split-K off, no workspace, every "
                                     "checked row count) for %s: %s", text, tried);
}

extern "C" void moe_gemm_lt_free(moe_gemm_lt *g) { free(g); }

extern "C" const moe_gemm_lt_shape *moe_gemm_lt_shape_of(const moe_gemm_lt *g) { return &g->shape; }

extern "C" void moe_gemm_lt_describe(const moe_gemm_lt *g, char *out, size_t n) { snprintf(out, n, "%s", g->text); }

extern "C" unsigned moe_gemm_lt_alignment(const moe_gemm_lt *g) {
    return std::max(g->align_a, std::max(g->align_b, g->align_d));
}

extern "C" moe_status moe_gemm_lt_run(moe_gpu *gpu, const moe_gemm_lt *g, int M, const void *A, const void *B,
                                      float beta, void *D) {
    MOE_TRY(check_call("gemm_lt", g->shape, M, beta));
    if (M == 0) return MOE_OK;
    const void *ptrs[] = {A, B, D};
    const uint32_t need[] = {g->align_a, g->align_b, g->align_d};
    const char *names[] = {"A", "B", "D"};
    for (int i = 0; i < 3; i++)
        if (!aligned(ptrs[i], need[i]))
            return moe_fail(MOE_ERR_INVALID_ARG, "gemm_lt: %s at %p is not aligned to the %u bytes its algorithm needs "
                                                 "(moe_gemm_lt_run_f32 stages such operands)",
                            names[i], ptrs[i], need[i]);
    call_descs c;
    MOE_TRY(describe_call(g->shape, g->compute, M, &c));
    const float one = 1;
    MOE_CUBLAS_TRY(cublasLtMatmul(gpu->blaslt, &c.op, &one, B, &c.first, A, &c.second, &beta, D, &c.d, D, &c.d,
                                  &g->algo, NULL, 0, gpu->stream));
    return MOE_OK;
}

extern "C" moe_status moe_gemm_lt_set_create(moe_gemm_lt_set **out) {
    *out = (moe_gemm_lt_set *)calloc(1, sizeof **out);
    return *out ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

extern "C" void moe_gemm_lt_set_destroy(moe_gpu *gpu, moe_gemm_lt_set *set) {
    if (!set) return;
    for (int i = 0; i < set->count; i++) moe_gemm_lt_free(set->entries[i].g), free(set->entries[i].refusal);
    free(set->entries);
    for (int i = 0; i < SLOTS; i++) moe_gpu_free(gpu, set->buf[i]);
    free(set);
}

extern "C" moe_status moe_gemm_lt_context_set(moe_gpu *gpu, moe_gemm_lt_set **out) {
    if (!gpu->gemm_lt) {
        MOE_TRY(moe_gemm_lt_set_create(&gpu->gemm_lt));
        gpu->gemm_lt_free = moe_gemm_lt_set_destroy;
    }
    *out = gpu->gemm_lt;
    return MOE_OK;
}

extern "C" int moe_gemm_lt_context_describe(moe_gpu *gpu, char *out, size_t n) {
    if (gpu->gemm_lt) return moe_gemm_lt_set_describe(gpu->gemm_lt, out, n);
    if (n) out[0] = '\0';
    return 0;
}

extern "C" moe_status moe_gemm_lt_set_get(moe_gpu *gpu, moe_gemm_lt_set *set, const moe_gemm_lt_shape *shape,
                                          const moe_gemm_lt **out) {
    *out = NULL;
    for (int i = 0; i < set->count; i++)
        if (same_shape(set->entries[i].shape, *shape)) {
            *out = set->entries[i].g;
            return MOE_OK;
        }
    if (set->count == set->capacity) {
        const int capacity = set->capacity ? 2 * set->capacity : 16;
        lt_entry *grown = (lt_entry *)realloc(set->entries, (size_t)capacity * sizeof *grown);
        if (!grown) return MOE_ERR_OUT_OF_MEMORY;
        set->entries = grown, set->capacity = capacity;
    }
    moe_gemm_lt *g = NULL;
    const moe_status st = moe_gemm_lt_plan(gpu, shape, &g);
    if (st != MOE_OK && st != MOE_ERR_LIBRARY) return st;
    lt_entry e = {*shape, g, NULL};
    if (st == MOE_ERR_LIBRARY) {
        e.refusal = strdup(moe_failure_message(st));
        moe_failure_clear();
        if (!e.refusal) return MOE_ERR_OUT_OF_MEMORY;
    }
    set->entries[set->count++] = e;
    *out = g;
    return MOE_OK;
}

extern "C" size_t moe_gemm_lt_b_count(const moe_gemm_lt *g) {
    const moe_gemm_lt_shape &s = g->shape;
    return (size_t)(s.trans_b ? s.n : s.k) * moe_gemm_lt_ld_b(&s);
}

extern "C" moe_status moe_gemm_lt_cast_b(moe_gpu *gpu, const moe_gemm_lt *g, const float *B, moe_bf16 *out) {
    const moe_gemm_lt_shape &s = g->shape;
    if (s.inputs != MOE_GEMM_LT_BF16) return moe_fail(MOE_ERR_INVALID_ARG, "gemm_lt: a kept B is bf16");
    return cast_padded(gpu, B, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, moe_gemm_lt_ld_b(&s), out);
}

namespace {

/* moe_gemm_lt_run_f32 with B staged already where kept_b is not NULL */
moe_status run_f32(moe_gpu *gpu, moe_gemm_lt_set *set, const moe_gemm_lt *g, int M, const float *A, const float *B,
                   const moe_bf16 *kept_b, float beta, float *D) {
    MOE_TRY(check_call("gemm_lt", g->shape, M, beta));
    if (M == 0) return MOE_OK;
    const moe_gemm_lt_shape &s = g->shape;
    if (s.bf16_out) return moe_fail(MOE_ERR_INVALID_ARG, "gemm_lt: moe_gemm_lt_run_f32 writes fp32 D only");
    const void *a = NULL, *b = kept_b;
    MOE_TRY(stage_input(gpu, set, SLOT_A, A, s.trans_a ? s.k : M, s.trans_a ? M : s.k, moe_gemm_lt_ld_a(&s, M),
                        s.inputs, g->align_a, &a));
    if (!b)
        MOE_TRY(stage_input(gpu, set, SLOT_B, B, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, moe_gemm_lt_ld_b(&s),
                            s.inputs, g->align_b, &b));
    if (aligned(D, g->align_d)) return moe_gemm_lt_run(gpu, g, M, a, b, beta, D);
    const size_t d_nbytes = (size_t)M * s.n * sizeof(float);
    MOE_TRY(grow(gpu, set, SLOT_D, d_nbytes));
    float *d = (float *)set->buf[SLOT_D];
    if (beta != 0) MOE_CUDA_TRY(cudaMemcpyAsync(d, D, d_nbytes, cudaMemcpyDeviceToDevice, gpu->stream));
    MOE_TRY(moe_gemm_lt_run(gpu, g, M, a, b, beta, d));
    MOE_CUDA_TRY(cudaMemcpyAsync(D, d, d_nbytes, cudaMemcpyDeviceToDevice, gpu->stream));
    return MOE_OK;
}

} // namespace

extern "C" moe_status moe_gemm_lt_run_f32(moe_gpu *gpu, moe_gemm_lt_set *set, const moe_gemm_lt *g, int M,
                                          const float *A, const float *B, float beta, float *D) {
    return run_f32(gpu, set, g, M, A, B, NULL, beta, D);
}

extern "C" moe_status moe_gemm_lt_run_f32_kept_b(moe_gpu *gpu, moe_gemm_lt_set *set, const moe_gemm_lt *g, int M,
                                                 const float *A, const moe_bf16 *B, float beta, float *D) {
    if (g->shape.inputs != MOE_GEMM_LT_BF16 || !B || !aligned(B, g->align_b))
        return moe_fail(MOE_ERR_INVALID_ARG, "gemm_lt: a kept B must be bf16 at the algorithm's alignment (%u)",
                        (unsigned)g->align_b);
    return run_f32(gpu, set, g, M, A, NULL, B, beta, D);
}

extern "C" int moe_gemm_lt_set_describe(const moe_gemm_lt_set *set, char *out, size_t n) {
    size_t used = 0;
    if (n) out[0] = '\0';
    for (int i = 0; i < set->count; i++) {
        const lt_entry &e = set->entries[i];
        char shape[96];
        moe_gemm_lt_shape_text(&e.shape, shape, sizeof shape);
        const int w = e.g ? snprintf(used < n ? out + used : NULL, used < n ? n - used : 0, "%s: %s\n", shape,
                                     e.g->text)
                          : snprintf(used < n ? out + used : NULL, used < n ? n - used : 0, "%s: none (%s)\n", shape,
                                     e.refusal);
        used += w > 0 ? (size_t)w : 0;
    }
    return (int)used;
}
