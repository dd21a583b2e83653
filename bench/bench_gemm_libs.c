/* bench_gemm_libs.c — CPU GEMM libraries at the MoE layer's shapes: speed (GFLOP/s) and row consistency
 * (is row i of C bitwise the same whatever the number of rows in the call? docs/DETERMINISM.md).
 *
 * One source, one program per library (bench/meson.build builds each whose library is found): OpenBLAS,
 * MKL and BLIS all export cblas_sgemm, so they cannot share a process. GEMM_LIB_* picks the library:
 *   bench_gemm_openblas        Debian's OpenBLAS (the current fp32 path): cblas_sgemm
 *   bench_gemm_scipy_openblas  a newer OpenBLAS from PyPI (scipy-openblas32, symbols prefixed scipy_)
 *   bench_gemm_blis            Debian's BLIS: bli_sgemm
 *   bench_gemm_onednn          Debian's oneDNN: dnnl_sgemm; the matmul primitive in f32 and with bf16 src and
 *                              weights, f32 dst, on plain weights, on weights reordered once ("packed"), and
 *                              made once for any number of rows (M = DNNL_RUNTIME_DIM_VAL, "runtime-m")
 *   bench_gemm_mkl             Intel MKL from PyPI: cblas_sgemm, cblas_gemm_bf16bf16f32, and both with B packed
 *                              once (cblas_sgemm_pack, cblas_gemm_bf16bf16f32_pack)
 *
 * The products (row-major; W as the layer stores it, Hugging Face layout):
 *   up    C[rows, f] = X[rows, d] W1^T       W1 [f, d]   B transposed       (the forward w1/w3)
 *   down  C[rows, d] = A[rows, f] W2^T       W2 [d, f]   B transposed       (the forward w2)
 *   dA    C[rows, f] = dY[rows, d] W2        W2 [d, f]   B not transposed   (backward through w2)
 *   dX    C[rows, d] = dH[rows, f] W1        W1 [f, d]   B not transposed   (backward through w1/w3)
 *   dW1   C[f, d] = dH[rows, f]^T X[rows, d]             A transposed       (weight gradient of w1/w3)
 *   dW2   C[d, f] = dY[rows, d]^T A[rows, f]             A transposed       (weight gradient of w2)
 * at the MoE layer's default shape (d 512, f 1024, rows 1024 = T 4096 * k 2 / E 8) and a Mixtral-like
 * narrow shape (d 1024, f 3584, rows 64 and 512). The row-wise products (up, down, dA, dX) run as one call
 * ("whole") and as calls of exactly 64 rows ("blocks", kernels/gemm_rows.h's layout-invariant mode);
 * methods that prepare B once ("packed") run in blocks on B packed (or reordered) before timing, and the
 * packing itself is timed apart. Weight gradients sum over the rows: whole only.
 *
 * Speed: each measurement repeats the product for at least --min-ms, --reps times, and reports the best
 * (minimum) time as GFLOP/s, and the median's excess over it as the noise. bf16 methods take bf16 arrays
 * (uint16, round to nearest even: kernels/cast_cpu.c); the conversion of A and of B (one thread, scalar
 * loop) is timed separately, and the GFLOP/s with both conversions included is printed beside.
 *
 * Row consistency (--what consistency): for each row-wise product at both shapes and at the narrow ones of
 * the router and the dense layers ("small"), a call of 1200 rows is the reference; calls of M = 1..130, 192,
 * 256, 500, 512, 777, 1000, 1024 rows (at row offsets 0 and 37) are compared with it row by row, bitwise,
 * with 1 thread, and with 2 threads against a 2-thread 1200-row call; then 64-row calls at every 64-row
 * boundary and at shifted offsets (does a row depend on its place in the block?); the method before it of
 * the same precision (a packed method: its unpacked one) and, for bf16, the library's fp32 GEMM on the
 * bf16-rounded inputs; then the reference again (run to run) and with 2 threads. The weight gradients: run
 * to run and 1 vs 2 threads.
 *
 *   build/bench/bench_gemm_onednn [--what speed|consistency|both] [--threads both|1|2] [--reps 7]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/rng.h"
#include "kernels/cast.h"

#if defined(GEMM_LIB_OPENBLAS)
#include <cblas.h>
#define LIB_NAME "openblas"
#elif defined(GEMM_LIB_SCIPY_OPENBLAS)
#include <cblas.h> /* scipy-openblas32's, from its include directory: every name prefixed scipy_ */
#define LIB_NAME "scipy-openblas"
#elif defined(GEMM_LIB_BLIS)
#include <blis.h>
#define LIB_NAME "blis"
#elif defined(GEMM_LIB_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#define LIB_NAME "onednn"
#elif defined(GEMM_LIB_MKL)
#include <mkl.h>
#define LIB_NAME "mkl"
#else
#error "define one of GEMM_LIB_OPENBLAS, GEMM_LIB_SCIPY_OPENBLAS, GEMM_LIB_BLIS, GEMM_LIB_ONEDNN, GEMM_LIB_MKL"
#endif

enum { BLOCK = 64, CHECK_ROWS = 1200 };

/* ---- the products ------------------------------------------------------------------------------------ */

/* One product: C[m, n] = op(A) op(B), row-major, dense. Row-wise products (trans_a = 0): A [m, k], m = the
 * rows of the call. trans_a = 1 (weight gradients): A stored [k, m], m fixed. B [n, k] when trans_b, else [k, n]. */
typedef struct {
    const char *name;
    int trans_a, trans_b, n, k, m; /* m: the fixed m of a weight gradient; 0 for the row-wise ones */
} gemm_op;

typedef struct {
    const char *name; /* "moe", "mixtral" or "qwen3" */
    int d, f;
    int rows[2], num_rows;
} gemm_shape;

/* qwen3: Qwen3-30B-A3B's experts (128 of f 768 at d 2048, top-8), whose ~64 rows per expert and product make one
 * 64-row call each, where preparing B for the blocks costs as much as the call (docs/BENCHMARKS.md, "The CPU MoE
 * layer at a fine-grained shape") */
static const gemm_shape kShapes[] = {{"moe", 512, 1024, {1024}, 1}, {"mixtral", 1024, 3584, {64, 512}, 2},
                                     {"qwen3", 2048, 768, {64}, 1}};
enum { NUM_SHAPES = sizeof kShapes / sizeof kShapes[0] };

/* Row consistency also at the narrow row-wise products that kernels/gemm_rows.h runs in blocks besides the
 * experts': the router's logits and input gradient (E = 8, d = 512), dense linears at moe-train's default
 * width (d 128: attention projections, a 384-wide fused QKV, and back), and docs/DETERMINISM.md's smallest. */
static const gemm_op kSmallOps[] = {
    {"router", 0, 1, 8, 512, 0}, {"router-dX", 0, 0, 512, 8, 0}, {"attn-proj", 0, 1, 128, 128, 0},
    {"qkv", 0, 1, 384, 128, 0},  {"qkv-dX", 0, 0, 128, 384, 0},  {"tiny", 0, 1, 8, 32, 0},
};

/* The six products of a shape at `rows` rows (rows enters only the weight gradients' k). */
static int shape_ops(const gemm_shape *s, int rows, gemm_op *ops) {
    const int d = s->d, f = s->f;
    ops[0] = (gemm_op){"up", 0, 1, f, d, 0};
    ops[1] = (gemm_op){"down", 0, 1, d, f, 0};
    ops[2] = (gemm_op){"dA", 0, 0, f, d, 0};
    ops[3] = (gemm_op){"dX", 0, 0, d, f, 0};
    ops[4] = (gemm_op){"dW1", 1, 0, d, rows, f};
    ops[5] = (gemm_op){"dW2", 1, 0, f, rows, d};
    return 6;
}

/* ---- methods: one library's ways to compute a product ------------------------------------------------ */

/* prepare: for one product and one B (float or bf16, as `bf16` says), under the current thread count;
 * packed methods pack or reorder B here (for calls of pack_m rows). run: C[m, n] = op(A) op(B). */
typedef struct {
    const char *name;
    int bf16;   /* A and B are uint16 bf16, C float */
    int packed; /* prepare packs B: timed apart, runs in blocks */
    int any_m;  /* packed: may be called with any m, not only pack_m */
    int row_only; /* no transposed A (weight gradients) */
    void *(*prepare)(const gemm_op *op, const void *B, int pack_m);
    void (*run)(void *ctx, int m, const void *A, float *C);
    void (*release)(void *ctx);
} method;

static int lda_of(const gemm_op *op, int m) { return op->trans_a ? m : op->k; }
static int ldb_of(const gemm_op *op) { return op->trans_b ? op->k : op->n; }

/* The plain methods keep the product and B. */
typedef struct {
    gemm_op op;
    const void *B;
} plain_ctx;

static void *plain_prepare(const gemm_op *op, const void *B, int pack_m) {
    (void)pack_m;
    plain_ctx *c = malloc(sizeof *c);
    if (!c) bench_fail("out of memory");
    *c = (plain_ctx){*op, B};
    return c;
}

static void plain_release(void *ctx) { free(ctx); }

#if defined(GEMM_LIB_OPENBLAS) || defined(GEMM_LIB_MKL) || defined(GEMM_LIB_SCIPY_OPENBLAS)
#if defined(GEMM_LIB_SCIPY_OPENBLAS)
#define CBLAS(name) scipy_cblas_##name
#else
#define CBLAS(name) cblas_##name
#endif
static void cblas_run(void *ctx, int m, const void *A, float *C) {
    const plain_ctx *c = ctx;
    const gemm_op *op = &c->op;
    CBLAS(sgemm)(CblasRowMajor, op->trans_a ? CblasTrans : CblasNoTrans, op->trans_b ? CblasTrans : CblasNoTrans, m,
                 op->n, op->k, 1, A, lda_of(op, m), c->B, ldb_of(op), 0, C, op->n);
}
#endif

/* ---- library: OpenBLAS (Debian, or scipy-openblas32) ---- */
#if defined(GEMM_LIB_OPENBLAS) || defined(GEMM_LIB_SCIPY_OPENBLAS)
#if defined(GEMM_LIB_SCIPY_OPENBLAS)
#define OPENBLAS(name) scipy_openblas_##name
#else
#define OPENBLAS(name) openblas_##name
#endif
static const method kMethods[] = {{"sgemm", 0, 0, 1, 0, plain_prepare, cblas_run, plain_release}};
static void lib_set_threads(int n) { OPENBLAS(set_num_threads)(n); }
static void lib_describe(void) {
    printf("library: %s; config: %s; core: %s\n", LIB_NAME, OPENBLAS(get_config)(), OPENBLAS(get_corename)());
}
static void lib_init(void) {}
#endif

/* ---- library: BLIS ---- */
#if defined(GEMM_LIB_BLIS)
static void blis_run(void *ctx, int m, const void *A, float *C) {
    const plain_ctx *c = ctx;
    const gemm_op *op = &c->op;
    float one = 1, zero = 0;
    /* row-major: row stride = the leading dimension, column stride 1; a transposed operand is the stored
     * matrix (rows and columns swapped) with BLIS_TRANSPOSE */
    const inc_t rsa = lda_of(op, m), rsb = ldb_of(op);
    bli_sgemm(op->trans_a ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, op->trans_b ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m,
              op->n, op->k, &one, (float *)A, rsa, 1, (float *)c->B, rsb, 1, &zero, C, op->n, 1);
}
static const method kMethods[] = {{"sgemm", 0, 0, 1, 0, plain_prepare, blis_run, plain_release}};
static void lib_set_threads(int n) { bli_thread_set_num_threads(n); }
static void lib_describe(void) {
    printf("library: blis %s; sub-configuration: %s; bf16: none (BLIS 0.9 has s, d, c, z only)\n",
           bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()));
}
static void lib_init(void) {}
#endif

/* ---- library: MKL ---- */
#if defined(GEMM_LIB_MKL)
static void mkl_bf16_run(void *ctx, int m, const void *A, float *C) {
    const plain_ctx *c = ctx;
    const gemm_op *op = &c->op;
    cblas_gemm_bf16bf16f32(CblasRowMajor, op->trans_a ? CblasTrans : CblasNoTrans,
                           op->trans_b ? CblasTrans : CblasNoTrans, m, op->n, op->k, 1, A, lda_of(op, m), c->B,
                           ldb_of(op), 0, C, op->n);
}

/* B packed once for calls of pack_m rows (MKL documents compute with the m, n, k of the pack). */
typedef struct {
    gemm_op op;
    int bf16, pack_m;
    void *packed;
} mkl_packed_ctx;

static void *mkl_packed_prepare_any(const gemm_op *op, const void *B, int pack_m, int bf16) {
    mkl_packed_ctx *c = malloc(sizeof *c);
    if (!c) bench_fail("out of memory");
    *c = (mkl_packed_ctx){*op, bf16, pack_m, NULL};
    const CBLAS_TRANSPOSE tb = op->trans_b ? CblasTrans : CblasNoTrans;
    size_t bytes = bf16 ? cblas_gemm_bf16bf16f32_pack_get_size(CblasBMatrix, pack_m, op->n, op->k)
                        : cblas_sgemm_pack_get_size(CblasBMatrix, pack_m, op->n, op->k);
    c->packed = mkl_malloc(bytes, 64);
    if (!c->packed) bench_fail("out of memory");
    if (bf16)
        cblas_gemm_bf16bf16f32_pack(CblasRowMajor, CblasBMatrix, tb, pack_m, op->n, op->k, B, ldb_of(op), c->packed);
    else
        cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, tb, pack_m, op->n, op->k, 1, B, ldb_of(op), c->packed);
    return c;
}
static void *mkl_packed_prepare(const gemm_op *op, const void *B, int pack_m) {
    return mkl_packed_prepare_any(op, B, pack_m, 0);
}
static void *mkl_bf16_packed_prepare(const gemm_op *op, const void *B, int pack_m) {
    return mkl_packed_prepare_any(op, B, pack_m, 1);
}
static void mkl_packed_run(void *ctx, int m, const void *A, float *C) {
    const mkl_packed_ctx *c = ctx;
    const gemm_op *op = &c->op;
    if (c->bf16)
        cblas_gemm_bf16bf16f32_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, op->n, op->k, 1, A, op->k,
                                       c->packed, ldb_of(op), 0, C, op->n);
    else
        cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, op->n, op->k, A, op->k, c->packed,
                            ldb_of(op), 0, C, op->n);
}
static void mkl_packed_release(void *ctx) {
    mkl_packed_ctx *c = ctx;
    mkl_free(c->packed);
    free(c);
}

static const method kMethods[] = {
    {"sgemm", 0, 0, 1, 0, plain_prepare, cblas_run, plain_release},
    {"sgemm-packed", 0, 1, 0, 1, mkl_packed_prepare, mkl_packed_run, mkl_packed_release},
    {"gemm_bf16bf16f32", 1, 0, 1, 0, plain_prepare, mkl_bf16_run, plain_release},
    {"gemm_bf16bf16f32-packed", 1, 1, 0, 1, mkl_bf16_packed_prepare, mkl_packed_run, mkl_packed_release},
};
static void lib_set_threads(int n) { mkl_set_num_threads(n); }

/* Which of MKL's code-path libraries (libmkl_def, _avx2, _avx512, ...) the process has loaded: MKL picks
 * them by CPU at the first call, and says nothing else about it on a non-Intel CPU. */
static void print_loaded_mkl_paths(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024], seen[16][128];
    int nseen = 0;
    printf("  MKL code-path libraries loaded:");
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strrchr(line, '/');
        if (!p || !strstr(p, "libmkl_") || strstr(p, "core") || strstr(p, "thread") || strstr(p, "lp64") ||
            strstr(p, "libmkl_rt"))
            continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(p + 1, "\n"), p + 1);
        int dup = 0;
        for (int i = 0; i < nseen; i++) dup |= !strcmp(seen[i], name);
        if (dup || nseen == 16) continue;
        strcpy(seen[nseen++], name);
        printf(" %s", name);
    }
    printf("%s\n", nseen ? "" : " none");
    if (f) fclose(f);
}

static void lib_describe(void) {
    char version[256];
    mkl_get_version_string(version, sizeof version);
    printf("library: %s\n", version);
    /* one small call of each kind, so that MKL has chosen its code path */
    float a[64] = {0}, c[64];
    MKL_BF16 h[64] = {0};
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 8, 8, 8, 1, a, 8, a, 8, 0, c, 8);
    cblas_gemm_bf16bf16f32(CblasRowMajor, CblasNoTrans, CblasTrans, 8, 8, 8, 1, h, 8, h, 8, 0, c, 8);
    print_loaded_mkl_paths();
    const int branch = mkl_cbwr_get_auto_branch(), mode = mkl_cbwr_get(MKL_CBWR_ALL);
    static const struct {
        int value;
        const char *name;
    } kBranches[] = {{MKL_CBWR_OFF, "OFF"}, {MKL_CBWR_BRANCH_OFF, "BRANCH_OFF"}, {MKL_CBWR_AUTO, "AUTO"},
                     {MKL_CBWR_COMPATIBLE, "COMPATIBLE"}, {MKL_CBWR_SSE2, "SSE2"}, {MKL_CBWR_SSE4_2, "SSE4_2"},
                     {MKL_CBWR_AVX2, "AVX2"}, {MKL_CBWR_AVX512, "AVX512"}, {MKL_CBWR_AVX512_E1, "AVX512_E1"}};
    const char *bname = "?", *mname = "?";
    for (size_t i = 0; i < sizeof kBranches / sizeof *kBranches; i++) {
        if (kBranches[i].value == branch) bname = kBranches[i].name;
        if (kBranches[i].value == (mode & ~MKL_CBWR_STRICT)) mname = kBranches[i].name;
    }
    printf("  conditional numerical reproducibility: mkl_cbwr_get_auto_branch() = %s, mkl_cbwr_get() = %s%s\n", bname,
           mname, mode & MKL_CBWR_STRICT ? " + STRICT" : "");
}
static void lib_init(void) {}
#endif

/* ---- library: oneDNN ---- */
#if defined(GEMM_LIB_ONEDNN)
static dnnl_engine_t engine;
static dnnl_stream_t stream;

static void dnnl_check(dnnl_status_t st, const char *what) {
    if (st != dnnl_success) bench_fail("%s failed: oneDNN status %d", what, (int)st);
}

static void dnnl_sgemm_run(void *ctx, int m, const void *A, float *C) {
    const plain_ctx *c = ctx;
    const gemm_op *op = &c->op;
    dnnl_check(dnnl_sgemm(op->trans_a ? 'T' : 'N', op->trans_b ? 'T' : 'N', m, op->n, op->k, 1, A, lda_of(op, m),
                          c->B, ldb_of(op), 0, C, op->n),
               "dnnl_sgemm");
}

/* The matmul primitive: src [m, k] (A; tag ba when A is transposed), weights [k, n] (B: tag ba when B is
 * [n, k], ab when [k, n]; or the blocked layout the primitive asked for, "packed"), dst [m, n] f32.
 * A primitive depends on m (and on the thread count it was made under): a few are kept per context. */
enum { DNNL_CACHED = 4 };
typedef struct {
    gemm_op op;
    dnnl_data_type_t dt;
    int packed;
    int runtime_m; /* one primitive made with M = DNNL_RUNTIME_DIM_VAL serves every m */
    dnnl_memory_desc_t weights_md; /* plain, or the blocked layout of the reordered weights */
    dnnl_memory_t weights;
    void *weights_buf; /* packed: the reordered weights */
    struct {
        int m;
        dnnl_primitive_t prim;
    } cache[DNNL_CACHED];
    int next; /* round-robin replacement */
} dnnl_mm_ctx;

static void md_2d(dnnl_memory_desc_t *md, dnnl_dim_t rows, dnnl_dim_t cols, dnnl_data_type_t dt, int transposed) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_check(dnnl_memory_desc_init_by_tag(md, 2, dims, dt, transposed ? dnnl_ba : dnnl_ab), "memory desc");
}

/* A matmul primitive descriptor for m rows with the given weights descriptor. */
static dnnl_primitive_desc_t matmul_pd(const gemm_op *op, dnnl_data_type_t dt, dnnl_dim_t m,
                                       const dnnl_memory_desc_t *weights_md, dnnl_status_t *status) {
    dnnl_memory_desc_t src_md, dst_md;
    md_2d(&src_md, m, op->k, dt, op->trans_a);
    md_2d(&dst_md, m, op->n, dnnl_f32, 0);
    dnnl_matmul_desc_t desc;
    dnnl_check(dnnl_matmul_desc_init(&desc, &src_md, weights_md, NULL, &dst_md), "dnnl_matmul_desc_init");
    dnnl_primitive_desc_t pd = NULL;
    *status = dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL);
    return pd;
}

static const char *pd_impl(const_dnnl_primitive_desc_t pd) {
    const char *impl = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    return impl;
}

static dnnl_primitive_t matmul_prim(dnnl_mm_ctx *c, int m) {
    if (c->runtime_m && !c->op.trans_a) m = -1;
    for (int i = 0; i < DNNL_CACHED; i++)
        if (c->cache[i].prim && c->cache[i].m == m) return c->cache[i].prim;
    dnnl_status_t st;
    dnnl_primitive_desc_t pd = matmul_pd(&c->op, c->dt, m < 0 ? DNNL_RUNTIME_DIM_VAL : m, &c->weights_md, &st);
    if (st != dnnl_success) bench_fail("matmul for m = %d on the %s weights: oneDNN status %d", m,
                                       c->packed ? "reordered" : "plain", (int)st);
    int slot = c->next;
    c->next = (c->next + 1) % DNNL_CACHED;
    if (c->cache[slot].prim) dnnl_primitive_destroy(c->cache[slot].prim);
    dnnl_check(dnnl_primitive_create(&c->cache[slot].prim, pd), "dnnl_primitive_create");
    dnnl_primitive_desc_destroy(pd);
    c->cache[slot].m = m;
    return c->cache[slot].prim;
}

static void *dnnl_mm_prepare_any(const gemm_op *op, const void *B, int pack_m, dnnl_data_type_t dt, int packed,
                                 int runtime_m) {
    dnnl_mm_ctx *c = calloc(1, sizeof *c);
    if (!c) bench_fail("out of memory");
    c->op = *op;
    c->dt = dt;
    c->packed = packed;
    c->runtime_m = runtime_m;
    dnnl_memory_desc_t plain_md;
    md_2d(&plain_md, op->k, op->n, dt, op->trans_b);
    c->weights_md = plain_md;
    if (packed) { /* ask the primitive for pack_m rows which layout it wants, and reorder B into it once */
        dnnl_memory_desc_t any_md;
        dnnl_dims_t dims = {op->k, op->n};
        dnnl_check(dnnl_memory_desc_init_by_tag(&any_md, 2, dims, dt, dnnl_format_tag_any), "memory desc");
        dnnl_status_t st;
        dnnl_primitive_desc_t pd = matmul_pd(op, dt, pack_m, &any_md, &st);
        dnnl_check(st, "matmul primitive descriptor (weights: any)");
        c->weights_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        dnnl_primitive_desc_destroy(pd);
        c->weights_buf = malloc(dnnl_memory_desc_get_size(&c->weights_md));
        if (!c->weights_buf) bench_fail("out of memory");
        dnnl_memory_t from, to;
        dnnl_check(dnnl_memory_create(&from, &plain_md, engine, (void *)B), "dnnl_memory_create");
        dnnl_check(dnnl_memory_create(&to, &c->weights_md, engine, c->weights_buf), "dnnl_memory_create");
        dnnl_primitive_desc_t rpd;
        dnnl_check(dnnl_reorder_primitive_desc_create(&rpd, &plain_md, engine, &c->weights_md, engine, NULL),
                   "reorder primitive descriptor");
        dnnl_primitive_t reorder;
        dnnl_check(dnnl_primitive_create(&reorder, rpd), "reorder primitive");
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
        dnnl_check(dnnl_primitive_execute(reorder, stream, 2, args), "reorder");
        dnnl_check(dnnl_stream_wait(stream), "dnnl_stream_wait");
        dnnl_primitive_destroy(reorder);
        dnnl_primitive_desc_destroy(rpd);
        dnnl_memory_destroy(from);
        c->weights = to;
    } else {
        dnnl_check(dnnl_memory_create(&c->weights, &plain_md, engine, (void *)B), "dnnl_memory_create");
    }
    return c;
}

static void dnnl_mm_run(void *ctx, int m, const void *A, float *C) {
    dnnl_mm_ctx *c = ctx;
    dnnl_primitive_t prim = matmul_prim(c, m);
    /* fresh memories for this m (cheap: descriptors and handles only) */
    dnnl_memory_desc_t src_md, dst_md;
    md_2d(&src_md, m, c->op.k, c->dt, c->op.trans_a);
    md_2d(&dst_md, m, c->op.n, dnnl_f32, 0);
    dnnl_memory_t src, dst;
    dnnl_check(dnnl_memory_create(&src, &src_md, engine, (void *)A), "dnnl_memory_create");
    dnnl_check(dnnl_memory_create(&dst, &dst_md, engine, C), "dnnl_memory_create");
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, c->weights}, {DNNL_ARG_DST, dst}};
    dnnl_check(dnnl_primitive_execute(prim, stream, 3, args), "matmul");
    dnnl_check(dnnl_stream_wait(stream), "dnnl_stream_wait");
    dnnl_memory_destroy(src);
    dnnl_memory_destroy(dst);
}

static void dnnl_mm_release(void *ctx) {
    dnnl_mm_ctx *c = ctx;
    for (int i = 0; i < DNNL_CACHED; i++)
        if (c->cache[i].prim) dnnl_primitive_destroy(c->cache[i].prim);
    dnnl_memory_destroy(c->weights);
    free(c->weights_buf);
    free(c);
}

static void *mm_f32(const gemm_op *op, const void *B, int pack_m) { return dnnl_mm_prepare_any(op, B, pack_m, dnnl_f32, 0, 0); }
static void *mm_bf16(const gemm_op *op, const void *B, int pack_m) { return dnnl_mm_prepare_any(op, B, pack_m, dnnl_bf16, 0, 0); }
static void *mm_f32_packed(const gemm_op *op, const void *B, int pack_m) {
    return dnnl_mm_prepare_any(op, B, pack_m, dnnl_f32, 1, 0);
}
static void *mm_bf16_packed(const gemm_op *op, const void *B, int pack_m) {
    return dnnl_mm_prepare_any(op, B, pack_m, dnnl_bf16, 1, 0);
}
static void *mm_f32_rtm(const gemm_op *op, const void *B, int pack_m) { return dnnl_mm_prepare_any(op, B, pack_m, dnnl_f32, 0, 1); }
static void *mm_bf16_rtm(const gemm_op *op, const void *B, int pack_m) { return dnnl_mm_prepare_any(op, B, pack_m, dnnl_bf16, 0, 1); }

/* f32 -> bf16 by oneDNN's reorder (its JIT uses the CPU's conversion instructions), for rows x cols floats. */
typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_desc_t from_md, to_md;
} dnnl_convert;

static void *lib_convert_prepare(size_t count) {
    dnnl_convert *c = malloc(sizeof *c);
    if (!c) bench_fail("out of memory");
    dnnl_dims_t dims = {(dnnl_dim_t)count};
    dnnl_check(dnnl_memory_desc_init_by_tag(&c->from_md, 1, dims, dnnl_f32, dnnl_a), "memory desc");
    dnnl_check(dnnl_memory_desc_init_by_tag(&c->to_md, 1, dims, dnnl_bf16, dnnl_a), "memory desc");
    dnnl_primitive_desc_t pd;
    dnnl_check(dnnl_reorder_primitive_desc_create(&pd, &c->from_md, engine, &c->to_md, engine, NULL), "reorder desc");
    dnnl_check(dnnl_primitive_create(&c->prim, pd), "reorder primitive");
    dnnl_primitive_desc_destroy(pd);
    return c;
}
static void lib_convert(void *ctx, const float *x, uint16_t *out) {
    dnnl_convert *c = ctx;
    dnnl_memory_t from, to;
    dnnl_check(dnnl_memory_create(&from, &c->from_md, engine, (void *)x), "dnnl_memory_create");
    dnnl_check(dnnl_memory_create(&to, &c->to_md, engine, out), "dnnl_memory_create");
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    dnnl_check(dnnl_primitive_execute(c->prim, stream, 2, args), "reorder");
    dnnl_check(dnnl_stream_wait(stream), "dnnl_stream_wait");
    dnnl_memory_destroy(from);
    dnnl_memory_destroy(to);
}
static void lib_convert_release(void *ctx) {
    dnnl_convert *c = ctx;
    dnnl_primitive_destroy(c->prim);
    free(c);
}
#define HAVE_LIB_CONVERT 1

static const method kMethods[] = {
    {"sgemm", 0, 0, 1, 0, plain_prepare, dnnl_sgemm_run, plain_release},
    {"matmul-f32", 0, 0, 1, 0, mm_f32, dnnl_mm_run, dnnl_mm_release},
    {"matmul-f32-packed", 0, 1, 1, 1, mm_f32_packed, dnnl_mm_run, dnnl_mm_release},
    {"matmul-bf16", 1, 0, 1, 0, mm_bf16, dnnl_mm_run, dnnl_mm_release},
    {"matmul-bf16-packed", 1, 1, 1, 1, mm_bf16_packed, dnnl_mm_run, dnnl_mm_release},
    {"matmul-f32-runtime-m", 0, 0, 1, 0, mm_f32_rtm, dnnl_mm_run, dnnl_mm_release},
    {"matmul-bf16-runtime-m", 1, 0, 1, 0, mm_bf16_rtm, dnnl_mm_run, dnnl_mm_release},
};
static void lib_set_threads(int n) { omp_set_num_threads(n); }
static void lib_init(void) {
    dnnl_check(dnnl_engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create");
    dnnl_check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "dnnl_stream_create");
}

/* The implementation oneDNN picks for a matmul of m rows at the MoE shape's up product, and the cost of
 * making a primitive for a new m (its primitive cache hit and miss). */
static void describe_matmul(dnnl_data_type_t dt, dnnl_dim_t m, const char *weights) {
    const gemm_op op = {"up", 0, 1, 1024, 512, 0};
    dnnl_memory_desc_t wmd;
    dnnl_dims_t dims = {op.k, op.n};
    if (!strcmp(weights, "plain")) md_2d(&wmd, op.k, op.n, dt, 1);
    else dnnl_check(dnnl_memory_desc_init_by_tag(&wmd, 2, dims, dt, dnnl_format_tag_any), "memory desc");
    char mtext[16];
    if (m == DNNL_RUNTIME_DIM_VAL) snprintf(mtext, sizeof mtext, "runtime");
    else snprintf(mtext, sizeof mtext, "%d", (int)m);
    dnnl_status_t st;
    double t0 = bench_now_ms();
    dnnl_primitive_desc_t pd = matmul_pd(&op, dt, m, &wmd, &st);
    double t1 = bench_now_ms();
    if (st != dnnl_success) {
        printf("  matmul %s m=%s (%s weights): no implementation (status %d)\n", dt == dnnl_bf16 ? "bf16" : "f32", mtext,
               weights, (int)st);
        return;
    }
    dnnl_primitive_t p;
    dnnl_check(dnnl_primitive_create(&p, pd), "dnnl_primitive_create");
    double t2 = bench_now_ms();
    printf("  matmul %s m=%-7s n=1024 k=512, %-5s weights: impl %s (descriptor %.3f ms, primitive %.3f ms)\n",
           dt == dnnl_bf16 ? "bf16" : "f32 ", mtext, weights, pd_impl(pd), t1 - t0, t2 - t1);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

static void lib_describe(void) {
    const dnnl_version_t *v = dnnl_version();
    printf("library: oneDNN %d.%d.%d (%s); effective ISA: %s; threads: OpenMP, omp_get_max_threads() = %d\n", v->major,
           v->minor, v->patch, v->hash, isa_name(dnnl_get_effective_cpu_isa()), omp_get_max_threads());
    describe_matmul(dnnl_bf16, 64, "plain");
    describe_matmul(dnnl_bf16, 64, "any");
    describe_matmul(dnnl_bf16, 1000, "plain");
    describe_matmul(dnnl_bf16, 1000, "plain"); /* again: the primitive cache */
    describe_matmul(dnnl_bf16, 1, "plain");
    describe_matmul(dnnl_f32, 64, "plain");
    describe_matmul(dnnl_f32, 64, "any");
    describe_matmul(dnnl_f32, 1000, "plain");
    describe_matmul(dnnl_bf16, DNNL_RUNTIME_DIM_VAL, "plain");
    describe_matmul(dnnl_f32, DNNL_RUNTIME_DIM_VAL, "plain");
}
#endif

enum { NUM_METHODS = sizeof kMethods / sizeof kMethods[0] };

/* ---- data --------------------------------------------------------------------------------------------- */

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) bench_fail("out of memory");
    return p;
}

/* An operand `offset` bytes past a page boundary, not wherever malloc puts it: oneDNN's AVX2 sgemm ran 64-row calls on
 * B held [k, n] at 33-90 GFLOP/s by B's address modulo 64 alone, the same bits at each (docs/BENCHMARKS.md, "The CPU
 * MoE layer at a fine-grained shape"), and glibc puts a block 16 bytes past a page where it maps one, anywhere on its
 * heap once that serves blocks of the size (after a large free), so the bench's numbers depended on what it had freed
 * before. placed_free(p, offset) frees it. */
enum { PAGE_BYTES = 4096 };

static void *placed_alloc(size_t bytes, size_t offset) {
    void *base = NULL;
    if (posix_memalign(&base, PAGE_BYTES, bytes + offset + 1) != 0) bench_fail("out of memory");
    return (char *)base + offset;
}

static void placed_free(void *p, size_t offset) {
    if (p) free((char *)p - offset);
}

enum { A_OFFSET = 16 }; /* A's place, fixed: where glibc maps a block (above) */

static float *random_floats(size_t n, uint64_t seed, size_t offset) {
    float *p = placed_alloc(n * sizeof *p, offset);
    moe_rng rng = moe_rng_seeded(seed);
    moe_rng_fill_uniform(&rng, p, n, 1);
    return p;
}

static void to_bf16(const float *x, size_t n, uint16_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = moe_bf16_from_float(x[i]);
}

/* The same rounding without a branch (NaN by a select), which the compiler vectorizes; checked below to
 * give moe_bf16_from_float's bits. */
static void to_bf16_branchless(const float *x, size_t n, uint16_t *out) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x0040u;
        out[i] = (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet : rounded);
    }
}

/* The operands of one product, float and bf16; A at A_OFFSET and B at b_offset bytes past a page (placed_alloc). */
typedef struct {
    float *A, *B;
    uint16_t *Ah, *Bh;
    size_t a_count, b_count, b_offset;
} operands;

static operands make_operands(size_t a_count, size_t b_count, uint64_t seed, size_t b_offset) {
    operands o = {random_floats(a_count, seed, A_OFFSET), random_floats(b_count, seed + 1, b_offset), NULL, NULL,
                  a_count, b_count, b_offset};
    o.Ah = placed_alloc(a_count * sizeof *o.Ah, A_OFFSET);
    o.Bh = placed_alloc(b_count * sizeof *o.Bh, b_offset);
    to_bf16(o.A, a_count, o.Ah);
    to_bf16(o.B, b_count, o.Bh);
    return o;
}

static void free_operands(operands *o) {
    placed_free(o->A, A_OFFSET), placed_free(o->Ah, A_OFFSET);
    placed_free(o->B, o->b_offset), placed_free(o->Bh, o->b_offset);
}

static const void *A_at(const method *mt, const operands *o, size_t elem) {
    return mt->bf16 ? (const void *)(o->Ah + elem) : (const void *)(o->A + elem);
}
static const void *B_of(const method *mt, const operands *o) { return mt->bf16 ? (const void *)o->Bh : (const void *)o->B; }

/* ---- options ------------------------------------------------------------------------------------------ */

typedef struct {
    int what;      /* 0 both, 1 speed, 2 consistency */
    int threads;   /* 0 both (1 then 2), 1, 2 */
    int reps;
    int min_ms;
    int shapes;    /* 0 all, 1 + an index of kShapes, or NUM_SHAPES + 1: small */
    int precision; /* 0 all, 1 fp32, 2 bf16 */
    int b_offset;  /* bytes past a page boundary where B lies (placed_alloc) */
} options;

static const char *const kWhat[] = {"both", "speed", "consistency", NULL};
static const char *const kThreads[] = {"both", "1", "2", NULL};
static const char *const kShapeChoice[] = {"all", "moe", "mixtral", "qwen3", "small", NULL}; /* kShapes' order */
static const char *const kPrecision[] = {"all", "fp32", "bf16", NULL};

static const bench_flag kFlags[] = {
    BENCH_CHOICE("--what", options, what, kWhat, "speed, row consistency, or both"),
    BENCH_CHOICE("--threads", options, threads, kThreads, "threads of the library: 1, 2 or both in turn"),
    BENCH_INT("--reps", options, reps, 1, 1000, "timed repetitions per measurement; the best is reported"),
    BENCH_INT("--min-ms", options, min_ms, 1, 100000, "each repetition repeats the product for at least this long"),
    BENCH_CHOICE("--shapes", options, shapes, kShapeChoice,
                 "moe (d 512, f 1024), mixtral (d 1024, f 3584), qwen3 (d 2048, f 768, 64 rows), small (router, "
                 "d 128; consistency only) or all"),
    BENCH_CHOICE("--precision", options, precision, kPrecision, "the methods to run: fp32, bf16 or all"),
    BENCH_INT("--b-offset", options, b_offset, 0, 4092,
              "bytes past a page boundary where B lies (a multiple of 4; 16: where glibc maps a large block, as "
              "moe-train's weights lie)"),
};

static void check_options(const void *parsed) {
    const int b_offset = ((const options *)parsed)->b_offset;
    if (b_offset % 4) bench_usage_errorf("--b-offset %d is not a multiple of 4 (a float's alignment)", b_offset);
}

static const bench_cli kCli = {
    .name = "bench_gemm_" LIB_NAME,
    .synopsis = "bench_gemm_" LIB_NAME " [flags]",
    .about = "GFLOP/s and row consistency of " LIB_NAME "'s GEMMs at the MoE layer's shapes (docs/BENCHMARKS.md)",
    .flags = kFlags,
    .num_flags = sizeof kFlags / sizeof kFlags[0],
    .check = check_options,
    .notes = "One line per measurement: method, precision, shape, product, rows, mode, threads, GFLOP/s of the\n"
             "best repetition, the median's excess over it (noise), and for bf16 the GFLOP/s with the conversion\n"
             "of A and B to bf16 included (the fastest conversion measured, each checked to give the bits of\n"
             "kernels/cast_cpu.c). Then the row-consistency findings.",
};

static int method_selected(const options *o, const method *mt) {
    return o->precision == 0 || (o->precision == 1 && !mt->bf16) || (o->precision == 2 && mt->bf16);
}

static int shape_selected(const options *o, int i) { return o->shapes == 0 || o->shapes == i + 1; }

static int thread_count(const options *o, int i) { return o->threads == 0 ? i + 1 : o->threads; }
static int thread_rounds(const options *o) { return o->threads == 0 ? 2 : 1; }

/* ---- speed -------------------------------------------------------------------------------------------- */

typedef struct {
    const method *mt;
    void *ctx;
    const gemm_op *op;
    const operands *o;
    int rows, blocks; /* blocks: calls of BLOCK rows */
    float *C;
} job;

static void run_job(const job *j) {
    if (j->op->trans_a) {
        j->mt->run(j->ctx, j->op->m, A_at(j->mt, j->o, 0), j->C);
    } else if (!j->blocks) {
        j->mt->run(j->ctx, j->rows, A_at(j->mt, j->o, 0), j->C);
    } else {
        for (int r = 0; r < j->rows; r += BLOCK)
            j->mt->run(j->ctx, BLOCK, A_at(j->mt, j->o, (size_t)r * j->op->k), j->C + (size_t)r * j->op->n);
    }
}

/* Best and median ms of one call of fn(arg) over reps repetitions, each repeating it for at least min_ms. */
typedef struct {
    double best, median;
} timing;

static timing time_it(const options *opt, void (*fn)(const void *), const void *arg) {
    double t[1000];
    fn(arg); /* warm-up */
    for (int r = 0; r < opt->reps; r++) {
        int n = 0;
        double t0 = bench_now_ms(), t1;
        do fn(arg), n++, t1 = bench_now_ms();
        while (t1 - t0 < opt->min_ms);
        t[r] = (t1 - t0) / n;
    }
    timing out = {bench_min(t, opt->reps), 0};
    out.median = bench_median(t, opt->reps);
    return out;
}

static void job_fn(const void *arg) { run_job(arg); }

typedef struct {
    const float *x;
    uint16_t *out;
    size_t n;
} conv_arg;
static void conv_fn(const void *arg) {
    const conv_arg *c = arg;
    to_bf16(c->x, c->n, c->out);
}
static void conv_branchless_fn(const void *arg) {
    const conv_arg *c = arg;
    to_bf16_branchless(c->x, c->n, c->out);
}

#ifdef HAVE_LIB_CONVERT
typedef struct {
    void *ctx;
    const float *x;
    uint16_t *out;
} lib_conv_arg;
static void lib_conv_fn(const void *arg) {
    const lib_conv_arg *c = arg;
    lib_convert(c->ctx, c->x, c->out);
}
#endif

typedef struct {
    const method *mt;
    const gemm_op *op;
    const void *B;
} pack_arg;
static void pack_fn(const void *arg) {
    const pack_arg *p = arg;
    p->mt->release(p->mt->prepare(p->op, p->B, BLOCK));
}

static void speed(const options *opt) {
    printf("\n%-29s %-4s %-7s %-4s %5s %-6s %3s %9s %6s %12s  %s\n", "method", "prec", "shape", "op", "rows", "mode",
           "thr", "GFLOP/s", "noise", "incl.conv", "notes");
    for (int si = 0; si < NUM_SHAPES; si++) {
        if (!shape_selected(opt, si)) continue;
        const gemm_shape *s = &kShapes[si];
        for (int ri = 0; ri < s->num_rows; ri++) {
            const int rows = s->rows[ri];
            gemm_op ops[6];
            int nops = shape_ops(s, rows, ops);
            for (int oi = 0; oi < nops; oi++) {
                const gemm_op *op = &ops[oi];
                const int m = op->trans_a ? op->m : rows;
                operands o = make_operands((size_t)m * op->k, (size_t)op->n * op->k, 100 + oi, opt->b_offset);
                float *C = xmalloc((size_t)m * op->n * sizeof *C);
                const double gflop = 2.0 * m * op->n * op->k * 1e-9;
                /* the bf16 conversions of this product's A and B, one thread */
                timing conv_a = {0, 0}, conv_b = {0, 0};
                int any_bf16 = 0;
                for (int mi = 0; mi < NUM_METHODS; mi++) any_bf16 |= kMethods[mi].bf16 && method_selected(opt, &kMethods[mi]);
                if (any_bf16) {
                    lib_set_threads(1);
                    conv_arg ca = {o.A, o.Ah, o.a_count}, cb = {o.B, o.Bh, o.b_count};
                    conv_a = time_it(opt, conv_fn, &ca);
                    conv_b = time_it(opt, conv_fn, &cb);
                    printf("%-29s %-4s %-7s %-4s %5d %-6s %3d %9s %6s %12s  A %.3f ms (%.2f GB/s of floats), B %.3f ms\n",
                           "convert (moe_bf16_from_float)", "bf16", s->name, op->name, rows, "-", 1, "-", "-", "-",
                           conv_a.best, o.a_count * 4e-6 / conv_a.best, conv_b.best);
                    timing bl_a = time_it(opt, conv_branchless_fn, &ca), bl_b = time_it(opt, conv_branchless_fn, &cb);
                    printf("%-29s %-4s %-7s %-4s %5d %-6s %3d %9s %6s %12s  A %.3f ms (%.2f GB/s of floats), B %.3f ms\n",
                           "convert (branchless loop)", "bf16", s->name, op->name, rows, "-", 1, "-", "-", "-",
                           bl_a.best, o.a_count * 4e-6 / bl_a.best, bl_b.best);
                    uint16_t *check = xmalloc(o.a_count * sizeof *check);
                    to_bf16_branchless(o.A, o.a_count, check);
                    if (memcmp(check, o.Ah, o.a_count * sizeof *check))
                        bench_fail("the branchless conversion differs from moe_bf16_from_float");
                    free(check);
                    /* "incl.conv" below: with the fastest conversion of this program that gives these bits */
                    if (bl_a.best < conv_a.best) conv_a = bl_a;
                    if (bl_b.best < conv_b.best) conv_b = bl_b;
#ifdef HAVE_LIB_CONVERT
                    /* the library's own conversion, 1 and 2 threads; the "incl.conv" column keeps the scalar loop's */
                    for (int ti = 0; ti < thread_rounds(opt); ti++) {
                        lib_set_threads(thread_count(opt, ti));
                        lib_conv_arg la = {lib_convert_prepare(o.a_count), o.A, o.Ah};
                        lib_conv_arg lb = {lib_convert_prepare(o.b_count), o.B, o.Bh};
                        timing ta = time_it(opt, lib_conv_fn, &la), tb = time_it(opt, lib_conv_fn, &lb);
                        if (ta.best < conv_a.best) conv_a = ta;
                        if (tb.best < conv_b.best) conv_b = tb;
                        printf("%-29s %-4s %-7s %-4s %5d %-6s %3d %9s %6s %12s  A %.3f ms (%.2f GB/s of floats), B %.3f ms\n",
                               "convert (library)", "bf16", s->name, op->name, rows, "-", thread_count(opt, ti), "-", "-",
                               "-", ta.best, o.a_count * 4e-6 / ta.best, tb.best);
                        lib_convert_release(la.ctx);
                        lib_convert_release(lb.ctx);
                    }
                    /* and the library's bits are the scalar loop's (round to nearest even) */
                    uint16_t *lib_bits = xmalloc(o.a_count * sizeof *lib_bits);
                    void *cc = lib_convert_prepare(o.a_count);
                    lib_convert(cc, o.A, lib_bits);
                    lib_convert_release(cc);
                    if (memcmp(lib_bits, o.Ah, o.a_count * sizeof *lib_bits))
                        bench_fail("the library's conversion differs from moe_bf16_from_float");
                    free(lib_bits);
#endif
                }
                for (int ti = 0; ti < thread_rounds(opt); ti++) {
                    const int threads = thread_count(opt, ti);
                    lib_set_threads(threads);
                    for (int mi = 0; mi < NUM_METHODS; mi++) {
                        const method *mt = &kMethods[mi];
                        if (!method_selected(opt, mt) || (op->trans_a && mt->row_only)) continue;
                        const int modes = op->trans_a || rows == BLOCK ? 1 : 2;
                        for (int mode = 0; mode < modes; mode++) {
                            const int blocks = mt->packed || (modes == 2 && mode == 1);
                            if (mt->packed && modes == 2 && mode == 0) continue; /* packed: blocks only */
                            char notes[96] = "";
                            if (mt->packed) {
                                pack_arg pa = {mt, op, B_of(mt, &o)};
                                timing tp = time_it(opt, pack_fn, &pa);
                                snprintf(notes, sizeof notes, "pack B once: %.3f ms", tp.best);
                            }
                            void *ctx = mt->prepare(op, B_of(mt, &o), BLOCK);
                            job j = {mt, ctx, op, &o, m, blocks && !op->trans_a, C};
                            timing t = time_it(opt, job_fn, &j);
                            mt->release(ctx);
                            char incl[32] = "-";
                            if (mt->bf16)
                                snprintf(incl, sizeof incl, "%.1f", gflop / (t.best + conv_a.best + conv_b.best) * 1e3);
                            printf("%-29s %-4s %-7s %-4s %5d %-6s %3d %9.1f %5.1f%% %12s  %s\n", mt->name,
                                   mt->bf16 ? "bf16" : "fp32", s->name, op->name, rows,
                                   op->trans_a ? "whole" : j.blocks ? "blocks" : "whole", threads, gflop / t.best * 1e3,
                                   (t.median / t.best - 1) * 100, incl, notes);
                            fflush(stdout);
                        }
                    }
                }
                free(C);
                free_operands(&o);
            }
        }
    }
}

/* ---- row consistency ---------------------------------------------------------------------------------- */

/* "1-9 11 13-15" from a sorted list */
static void print_ranges(const int *v, int n) {
    if (n == 0) printf(" none");
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
        if (j == i) printf(" %d", v[i]);
        else printf(" %d-%d", v[i], v[j]);
        i = j + 1;
    }
}

static const int kSweepExtra[] = {192, 256, 500, 512, 777, 1000, 1024};

/* Rows of a call of m rows at row offset off, compared with the reference: 1 if any differ. */
static int call_differs(const method *mt, void *ctx, const gemm_op *op, const operands *o, const float *ref, int m,
                        int off, float *C) {
    mt->run(ctx, m, A_at(mt, o, (size_t)off * op->k), C);
    return memcmp(C, ref + (size_t)off * op->n, sizeof(float) * m * op->n) != 0;
}

/* Rows of the 64-row calls (nblk blocks) that differ from `blocks` when B is a copy at 0, 16, 32 and 48 bytes past a
 * 64-byte boundary in turn (the speed of some calls depends on that place: placed_alloc). */
static int b_place_differs(const method *mt, const gemm_op *op, const operands *o, const float *blocks, int nblk,
                           float *C) {
    const size_t b_bytes = o->b_count * (mt->bf16 ? sizeof *o->Bh : sizeof *o->B);
    int differ = 0;
    for (size_t place = 0; place < 64; place += 16) {
        void *B = placed_alloc(b_bytes, place);
        memcpy(B, B_of(mt, o), b_bytes);
        void *ctx = mt->prepare(op, B, BLOCK);
        for (int b = 0; b < nblk; b++) {
            mt->run(ctx, BLOCK, A_at(mt, o, (size_t)b * BLOCK * op->k), C);
            for (int r = 0; r < BLOCK; r++)
                differ += memcmp(C + (size_t)r * op->n, blocks + ((size_t)b * BLOCK + r) * op->n,
                                 sizeof(float) * op->n) != 0;
        }
        mt->release(ctx);
        placed_free(B, place);
    }
    return differ;
}

static void consistency_row_op(const options *opt, const method *mt, const char *shape, const gemm_op *op) {
    operands o = make_operands((size_t)CHECK_ROWS * op->k, (size_t)op->n * op->k, 7, opt->b_offset);
    const size_t csize = (size_t)CHECK_ROWS * op->n;
    float *ref = xmalloc(csize * sizeof *ref), *again = xmalloc(csize * sizeof *again);
    float *C = xmalloc(csize * sizeof *C), *blocks = xmalloc(csize * sizeof *blocks);
    printf("%s %s %s %s (n %d, k %d):\n", mt->name, mt->bf16 ? "bf16" : "fp32", shape, op->name, op->n, op->k);
    lib_set_threads(1);
    void *ctx = mt->prepare(op, B_of(mt, &o), BLOCK);
    int full_ok = !mt->packed || mt->any_m;
    if (full_ok) mt->run(ctx, CHECK_ROWS, A_at(mt, &o, 0), ref);
    /* 64-row calls at every 64-row boundary: the block reference */
    const int nblk = CHECK_ROWS / BLOCK;
    for (int b = 0; b < nblk; b++)
        mt->run(ctx, BLOCK, A_at(mt, &o, (size_t)b * BLOCK * op->k), blocks + (size_t)b * BLOCK * op->n);
    if (!full_ok) /* packed for 64-row calls only: the blocks are the reference */
        memcpy(ref, blocks, sizeof(float) * nblk * BLOCK * op->n);
    const int ref_rows = full_ok ? CHECK_ROWS : nblk * BLOCK;
    for (int ti = 0; ti < thread_rounds(opt) && full_ok; ti++) {
        const int threads = thread_count(opt, ti);
        lib_set_threads(threads);
        void *c2 = threads == 1 ? ctx : mt->prepare(op, B_of(mt, &o), BLOCK);
        float *r = ref;
        if (threads != 1) { /* against this thread count's own 1200-row call (1 vs 2 threads: below) */
            r = again;
            mt->run(c2, CHECK_ROWS, A_at(mt, &o, 0), r);
        }
        int differ[200], nd = 0, tested = 0;
        for (int m = 1; m <= 130 + (int)(sizeof kSweepExtra / sizeof *kSweepExtra); m++) {
            const int mm = m <= 130 ? m : kSweepExtra[m - 131];
            int d = 0;
            for (int off = 0; off <= 37 && off + mm <= CHECK_ROWS; off += 37) d |= call_differs(mt, c2, op, &o, r, mm, off, C);
            if (d) differ[nd++] = mm;
            tested++;
        }
        printf("  %d thread%s: call sizes M (of %d tested: 1-130 and", threads, threads > 1 ? "s" : " ", tested);
        for (size_t i = 0; i < sizeof kSweepExtra / sizeof *kSweepExtra; i++) printf(" %d", kSweepExtra[i]);
        printf(") whose rows differ from a %d-row call:", CHECK_ROWS);
        print_ranges(differ, nd);
        printf("\n");
        if (c2 != ctx) mt->release(c2);
    }
    lib_set_threads(1);
    /* a row's place in a 64-row block */
    int shifted = 0, shifted_differ = 0, blocks_vs_ref = 0;
    for (int shift = 1; shift < BLOCK; shift += 6)
        for (int s0 = shift; s0 + BLOCK <= nblk * BLOCK; s0 += BLOCK * 3) {
            mt->run(ctx, BLOCK, A_at(mt, &o, (size_t)s0 * op->k), C);
            for (int r = 0; r < BLOCK; r++, shifted++)
                shifted_differ += memcmp(C + (size_t)r * op->n, blocks + (size_t)(s0 + r) * op->n, sizeof(float) * op->n) != 0;
        }
    for (int r = 0; r < nblk * BLOCK; r++)
        blocks_vs_ref += memcmp(blocks + (size_t)r * op->n, ref + (size_t)r * op->n, sizeof(float) * op->n) != 0;
    printf("  64-row calls: %d of %d rows differ between block offsets; %d of %d rows differ from the %s\n",
           shifted_differ, shifted, blocks_vs_ref, nblk * BLOCK, full_ok ? "1200-row call" : "aligned blocks (the reference)");
    printf("  64-row calls with B at 0, 16, 32, 48 bytes past a 64-byte boundary: %d of %d rows differ from B at %d\n",
           b_place_differs(mt, op, &o, blocks, nblk, C), 4 * nblk * BLOCK, opt->b_offset);
    /* run to run, and 2 threads */
    int rr = 0, thr = -1, thr_blk = -1;
    if (full_ok) {
        mt->run(ctx, CHECK_ROWS, A_at(mt, &o, 0), again);
        rr = memcmp(again, ref, sizeof(float) * csize) != 0;
    } else {
        for (int b = 0; b < nblk; b++)
            mt->run(ctx, BLOCK, A_at(mt, &o, (size_t)b * BLOCK * op->k), again + (size_t)b * BLOCK * op->n);
        rr = memcmp(again, ref, sizeof(float) * ref_rows * op->n) != 0;
    }
    if (opt->threads != 1) {
        lib_set_threads(2);
        void *c2 = mt->prepare(op, B_of(mt, &o), BLOCK);
        if (full_ok) {
            mt->run(c2, CHECK_ROWS, A_at(mt, &o, 0), again);
            thr = memcmp(again, ref, sizeof(float) * csize) != 0;
        }
        for (int b = 0; b < nblk; b++)
            mt->run(c2, BLOCK, A_at(mt, &o, (size_t)b * BLOCK * op->k), again + (size_t)b * BLOCK * op->n);
        thr_blk = memcmp(again, blocks, sizeof(float) * nblk * BLOCK * op->n) != 0;
        mt->release(c2);
        lib_set_threads(1);
    }
    /* the same bits as the method before it of this precision (a packed method: its unpacked one); 1 thread,
     * 64-row calls where either is packed for 64-row calls only */
    const method *first = mt;
    for (const method *p = mt - 1; p >= kMethods; p--)
        if (p->bf16 == mt->bf16) {
            first = p;
            break;
        }
    if (first != mt) {
        void *fc = first->prepare(op, B_of(first, &o), BLOCK);
        const int whole = full_ok && (!first->packed || first->any_m);
        if (whole) first->run(fc, CHECK_ROWS, A_at(first, &o, 0), again);
        else
            for (int b = 0; b < nblk; b++)
                first->run(fc, BLOCK, A_at(first, &o, (size_t)b * BLOCK * op->k), again + (size_t)b * BLOCK * op->n);
        const float *mine = whole ? ref : blocks;
        int nrows = whole ? CHECK_ROWS : nblk * BLOCK, rows_differ = 0;
        for (int r = 0; r < nrows; r++)
            rows_differ += memcmp(again + (size_t)r * op->n, mine + (size_t)r * op->n, sizeof(float) * op->n) != 0;
        printf("  vs %s (%s): %d of %d rows differ\n", first->name, whole ? "1200-row calls" : "64-row calls",
               rows_differ, nrows);
        first->release(fc);
    }
    /* bf16: against this library's first fp32 method on the bf16-rounded inputs (what an fp32 GEMM of bf16
     * values gives: the products are exact in fp32, only the summation differs) */
    if (mt->bf16 && full_ok && !kMethods[0].bf16) {
        const method *f = &kMethods[0];
        float *Ar = xmalloc(o.a_count * sizeof *Ar), *Br = xmalloc(o.b_count * sizeof *Br);
        for (size_t i = 0; i < o.a_count; i++) Ar[i] = moe_bf16_to_float(o.Ah[i]);
        for (size_t i = 0; i < o.b_count; i++) Br[i] = moe_bf16_to_float(o.Bh[i]);
        void *fc = f->prepare(op, Br, BLOCK);
        f->run(fc, CHECK_ROWS, Ar, again);
        f->release(fc);
        int same_rows = 0;
        double max_diff = 0, max_c = 0;
        for (int r = 0; r < CHECK_ROWS; r++) {
            same_rows += !memcmp(again + (size_t)r * op->n, ref + (size_t)r * op->n, sizeof(float) * op->n);
            for (int j = 0; j < op->n; j++) {
                const double a = again[(size_t)r * op->n + j], b = ref[(size_t)r * op->n + j];
                max_diff = fabs(a - b) > max_diff ? fabs(a - b) : max_diff;
                max_c = fabs(a) > max_c ? fabs(a) : max_c;
            }
        }
        printf("  vs %s (fp32) on the bf16-rounded inputs: %d of %d rows bitwise equal, max |difference| %.2g of max |C| %.3g\n",
               f->name, same_rows, CHECK_ROWS, max_diff, max_c);
        free(Ar), free(Br);
    }
    printf("  run to run: %s; 2 threads vs 1: %s call %s, 64-row calls %s\n", rr ? "DIFFERS" : "identical",
           full_ok ? "1200-row" : "(no 1200-row call)", thr < 0 ? "-" : thr ? "DIFFERS" : "identical",
           thr_blk < 0 ? "-" : thr_blk ? "DIFFER" : "identical");
    (void)ref_rows;
    mt->release(ctx);
    free(ref), free(again), free(C), free(blocks);
    free_operands(&o);
    fflush(stdout);
}

/* Weight gradients: run to run and 1 vs 2 threads. */
static void consistency_wgrad(const options *opt, const method *mt, const char *shape, const gemm_op *op) {
    operands o = make_operands((size_t)op->m * op->k, (size_t)op->n * op->k, 9, opt->b_offset);
    const size_t csize = (size_t)op->m * op->n;
    float *ref = xmalloc(csize * sizeof *ref), *C = xmalloc(csize * sizeof *C);
    lib_set_threads(1);
    void *ctx = mt->prepare(op, B_of(mt, &o), BLOCK);
    mt->run(ctx, op->m, A_at(mt, &o, 0), ref);
    mt->run(ctx, op->m, A_at(mt, &o, 0), C);
    int rr = memcmp(C, ref, csize * sizeof *C) != 0, thr = -1;
    mt->release(ctx);
    if (opt->threads != 1) {
        lib_set_threads(2);
        ctx = mt->prepare(op, B_of(mt, &o), BLOCK);
        mt->run(ctx, op->m, A_at(mt, &o, 0), C);
        thr = memcmp(C, ref, csize * sizeof *C) != 0;
        mt->release(ctx);
    }
    printf("%s %s %s %s (m %d, n %d, k = rows %d): run to run %s; 2 threads vs 1 %s\n", mt->name,
           mt->bf16 ? "bf16" : "fp32", shape, op->name, op->m, op->n, op->k, rr ? "DIFFERS" : "identical",
           thr < 0 ? "-" : thr ? "DIFFERS" : "identical");
    free(ref), free(C);
    free_operands(&o);
}

static void consistency(const options *opt) {
    printf("\nrow consistency (bitwise):\n");
    for (int mi = 0; mi < NUM_METHODS; mi++) {
        const method *mt = &kMethods[mi];
        if (!method_selected(opt, mt)) continue;
        for (int si = 0; si < NUM_SHAPES; si++) {
            if (!shape_selected(opt, si)) continue;
            const gemm_shape *s = &kShapes[si];
            gemm_op ops[6];
            int nops = shape_ops(s, s->rows[s->num_rows - 1], ops);
            for (int oi = 0; oi < nops; oi++) {
                if (!ops[oi].trans_a) consistency_row_op(opt, mt, s->name, &ops[oi]);
                else if (!mt->row_only) consistency_wgrad(opt, mt, s->name, &ops[oi]);
            }
        }
        if (shape_selected(opt, NUM_SHAPES))
            for (size_t i = 0; i < sizeof kSmallOps / sizeof *kSmallOps; i++) consistency_row_op(opt, mt, "small", &kSmallOps[i]);
    }
}

int main(int argc, char **argv) {
    options opt = {.what = 0, .threads = 0, .reps = 7, .min_ms = 30, .shapes = 0, .precision = 0, .b_offset = 16};
    bench_parse_flags(&kCli, argc, argv, &opt);
    lib_init();
    lib_describe();
    printf("methods:");
    for (int i = 0; i < NUM_METHODS; i++) printf(" %s (%s%s)", kMethods[i].name, kMethods[i].bf16 ? "bf16" : "fp32",
                                                 kMethods[i].packed ? ", B packed once" : "");
    printf("\nreps %d, each at least %d ms; GFLOP/s of the best repetition; noise = median / best - 1; B at %d and A at "
           "%d bytes past a page boundary\n", opt.reps, opt.min_ms, opt.b_offset, A_OFFSET);
    if (opt.what != 2) speed(&opt);
    if (opt.what != 1) consistency(&opt);
    return 0;
}
