/* gemm_engine_onednn.c — the GEMM engine's oneDNN backend (gemm_backend.h; what it guarantees: gemm_engine.h). One
 * CPU engine for the process; per moe_gemm_engine (one thread's) a stream, its own scratchpad (oneDNN's user mode: no
 * memory the library shares between threads) and a small cache of primitives keyed by the call's shape, each with its
 * memory objects made once and pointed at the call's arrays. A shape with prepared_b also keeps a reorder (plain B, in
 * the call's input type -> the matmul's preferred weights layout), which writes into the caller's buffer.
 *
 * Never a sum post-op: an accumulating call runs into the engine's product buffer, which is then added to C (one fp32
 * addition per value; gemm_engine.h says why). Without AVX-512 every call runs as oneDNN's AVX2 sgemm, which adds C
 * after its first k block when asked to accumulate; brgemm (AVX-512) does not, so before issue 48 the post-op was
 * measured right on one ISA only.
 *
 * A weight gradient (trans_a) of at most RUNTIME_K_MAX rows is built with a run-time k: an expert's is summed over its
 * segments, each a different number of rows at nearly every call, and a primitive per k meant hundreds of primitive
 * creations per training step (each ~0.5 ms, and evicting the row blocks' primitives from the cache). At these
 * shapes the run-time-k primitive gives the bits of the fixed-k one (tests/test_gemm_engine.c); longer sums keep a
 * primitive per k. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <oneapi/dnnl/dnnl.h>

#include "core/fail.h"
#include "kernels/gemm_backend.h"

enum { CACHE_SLOTS = 32 };    /* shapes in use at once: a layer's 64-row blocks ~6, the model's dense ~8, tiles */
enum { RUNTIME_K_MAX = 256 }; /* the longest weight-gradient sum with a run-time k (see above) */
enum { SCRATCHPAD_ALIGN = 4096 };

typedef struct {
    moe_gemm_call key;           /* k is not part of the key when runtime_k; accumulate never is */
    int runtime_k;
    unsigned long long last_use; /* 0: empty */
    dnnl_primitive_t matmul;
    dnnl_memory_t src, weights, dst; /* runtime_k: dst only (src and weights are made per call, with the call's k) */
    dnnl_memory_t scratchpad;        /* user mode: pointed at the engine's buffer at each call */
    size_t scratchpad_bytes;
    dnnl_primitive_t reorder; /* prepared_b: plain B -> weights layout */
    dnnl_memory_t plain_b;    /* prepared_b: the reorder's source (its destination is weights) */
} cached_matmul;

struct moe_gemm_engine {
    dnnl_stream_t stream;
    float *product; /* an accumulating call's product, before it is added to C */
    size_t product_count;
    void *scratchpad; /* the primitives' scratchpad, the largest any of them asked for */
    size_t scratchpad_bytes;
    unsigned long long clock;
    cached_matmul slot[CACHE_SLOTS];
};

static dnnl_engine_t cpu_engine;
static dnnl_status_t cpu_engine_status = dnnl_runtime_error;
static pthread_once_t cpu_engine_once = PTHREAD_ONCE_INIT;

static void make_cpu_engine(void) { cpu_engine_status = dnnl_engine_create(&cpu_engine, dnnl_cpu, 0); }

static moe_status failed(dnnl_status_t st, const char *what, const moe_gemm_call *c) {
    return moe_fail(st == dnnl_out_of_memory ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_LIBRARY,
                    "oneDNN %s for a %s GEMM [%d x %d] x [%d x %d] failed: status %d", what, c->bf16 ? "bf16" : "fp32",
                    c->m, c->k, c->k, c->n, (int)st);
}

static int has_isa(dnnl_cpu_isa_t wanted) { return (dnnl_get_effective_cpu_isa() & wanted) == wanted; }

static int cpu_is_amd(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned eax, ebx, ecx, edx;
    /* the vendor string "AuthenticAMD" in ebx, edx, ecx */
    return __get_cpuid(0, &eax, &ebx, &ecx, &edx) && ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
#else
    return 0;
#endif
}

static moe_bf16_gemm_mode bf16_mode = MOE_BF16_GEMM_AUTO;
static char bf16_mode_refused[40]; /* an MOE_BF16_GEMM value that is none of the three (then auto), for the text */
static int native_bf16; /* the mode's answer on this CPU: asked once (CPUID is a trap to the hypervisor in a VM) */
static pthread_once_t bf16_mode_once = PTHREAD_ONCE_INIT;

static void resolve_bf16_mode(void) {
    native_bf16 = has_isa(dnnl_cpu_isa_avx512_core_bf16) && bf16_mode != MOE_BF16_GEMM_FP32 &&
                  (bf16_mode == MOE_BF16_GEMM_NATIVE || has_isa(dnnl_cpu_isa_avx512_core_amx) || cpu_is_amd());
}

static void read_bf16_mode(void) {
    const char *v = getenv("MOE_BF16_GEMM");
    if (v && !strcmp(v, "native")) bf16_mode = MOE_BF16_GEMM_NATIVE;
    else if (v && !strcmp(v, "fp32")) bf16_mode = MOE_BF16_GEMM_FP32;
    else if (v && *v && strcmp(v, "auto")) snprintf(bf16_mode_refused, sizeof bf16_mode_refused, "%s", v);
    resolve_bf16_mode();
}

static void onednn_set_bf16_mode(moe_bf16_gemm_mode mode) {
    pthread_once(&bf16_mode_once, read_bf16_mode);
    bf16_mode = mode;
    resolve_bf16_mode();
}

static int onednn_native_bf16(void) {
    pthread_once(&bf16_mode_once, read_bf16_mode);
    return native_bf16;
}

/* oneDNN's own name of the instruction set its kernels run on (dnnl_types.h), exactly: ONEDNN_MAX_CPU_ISA lowers it */
static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

static void onednn_describe(char *text, size_t size) {
    const dnnl_version_t *v = dnnl_version();
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const int native = onednn_native_bf16(); /* reads the mode first */
    const char *mode = bf16_mode == MOE_BF16_GEMM_AUTO ? "auto" : bf16_mode == MOE_BF16_GEMM_NATIVE ? "native" : "fp32";
    const int hashed = v->hash && *v->hash && strcmp(v->hash, "N/A"); /* Debian's build has none */
    snprintf(text, size, "oneDNN %d.%d.%d%s%.10s%s, isa %s (%s, MOE_BF16_GEMM %s%s%s%s)", v->major, v->minor, v->patch,
             hashed ? " (" : "", hashed ? v->hash : "", hashed ? ")" : "", isa_name(isa),
             native ? "bf16 kernels" : "bf16 emulated in fp32", mode,
             *bf16_mode_refused ? ": " : "", bf16_mode_refused,
             *bf16_mode_refused ? " is not auto, native or fp32" : "");
}

static moe_status onednn_create(moe_gemm_engine **out) {
    pthread_once(&cpu_engine_once, make_cpu_engine);
    if (cpu_engine_status != dnnl_success)
        return moe_fail(MOE_ERR_LIBRARY, "oneDNN: no CPU engine (status %d)", (int)cpu_engine_status);
    moe_gemm_engine *e = calloc(1, sizeof *e);
    if (!e) return MOE_ERR_OUT_OF_MEMORY;
    dnnl_status_t st = dnnl_stream_create(&e->stream, cpu_engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        free(e);
        return moe_fail(MOE_ERR_LIBRARY, "oneDNN: no CPU stream (status %d)", (int)st);
    }
    *out = e;
    return MOE_OK;
}

static void release(cached_matmul *s) {
    if (s->matmul) dnnl_primitive_destroy(s->matmul);
    dnnl_memory_t mems[] = {s->src, s->weights, s->dst, s->scratchpad, s->plain_b};
    for (size_t i = 0; i < sizeof mems / sizeof *mems; i++)
        if (mems[i]) dnnl_memory_destroy(mems[i]);
    if (s->reorder) dnnl_primitive_destroy(s->reorder);
    *s = (cached_matmul){0};
}

static void onednn_free(moe_gemm_engine *e) {
    for (int i = 0; i < CACHE_SLOTS; i++) release(&e->slot[i]);
    free(e->product);
    free(e->scratchpad);
    dnnl_stream_destroy(e->stream);
    free(e);
}

/* The short weight gradients take a run-time k (see the top of this file); never with prepared_b, whose reorder is
 * made for one k (and which same_shape does not compare for these). */
static int has_runtime_k(const moe_gemm_call *c) { return c->trans_a && !c->prepared_b && c->k <= RUNTIME_K_MAX; }

/* A [rows, cols] matrix stored row by row with pitch ld, or its transpose stored [cols, rows] with pitch ld. */
static dnnl_status_t matrix_desc(dnnl_memory_desc_t *md, dnnl_dim_t rows, dnnl_dim_t cols, dnnl_data_type_t type,
                                 int transposed, dnnl_dim_t ld) {
    dnnl_dims_t dims = {rows, cols}, strides = {ld, 1};
    if (transposed) strides[0] = 1, strides[1] = ld;
    return dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides);
}

/* The call's dst: C itself with its pitch, or, accumulating, the engine's dense product buffer. */
static int dst_pitch(const moe_gemm_call *c) { return c->accumulate ? c->n : moe__gemm_ldc(c); }

/* prepared_b: the reorder from B as the caller holds it (plain and dense, in the call's input type) into the matmul's
 * weights layout: a permutation of the values, exact. */
static dnnl_status_t build_reorder(cached_matmul *s, const moe_gemm_call *c, const dnnl_memory_desc_t *weights_md) {
    dnnl_memory_desc_t plain_md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = matrix_desc(&plain_md, c->k, c->n, c->bf16 ? dnnl_bf16 : dnnl_f32, c->trans_b,
                                   moe__gemm_ldb(c));
    if (st == dnnl_success) st = dnnl_memory_create(&s->plain_b, &plain_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success)
        st = dnnl_reorder_primitive_desc_create(&pd, &plain_md, cpu_engine, weights_md, cpu_engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&s->reorder, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return st;
}

/* The matmul for this shape: src op(A) [m, k], weights op(B) [k, n] (plain, or with prepared_b in the layout the
 * primitive picks), dst [m, n] f32; its scratchpad the engine's. Memory objects are made with no data and pointed at
 * the arrays on each call. */
static dnnl_status_t build(cached_matmul *s, const moe_gemm_call *c) {
    const dnnl_data_type_t in = c->bf16 ? dnnl_bf16 : dnnl_f32;
    const dnnl_dim_t k = has_runtime_k(c) ? DNNL_RUNTIME_DIM_VAL : c->k;
    s->runtime_k = has_runtime_k(c);
    dnnl_memory_desc_t src_md, weights_md, dst_md;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = matrix_desc(&src_md, c->m, k, in, c->trans_a, moe__gemm_lda(c));
    if (st == dnnl_success && c->prepared_b) {
        dnnl_dims_t dims = {k, c->n};
        st = dnnl_memory_desc_init_by_tag(&weights_md, 2, dims, in, dnnl_format_tag_any);
    } else if (st == dnnl_success) {
        st = matrix_desc(&weights_md, k, c->n, in, c->trans_b, moe__gemm_ldb(c));
    }
    if (st == dnnl_success) st = matrix_desc(&dst_md, c->m, c->n, dnnl_f32, 0, dst_pitch(c));
    if (st == dnnl_success) st = dnnl_matmul_desc_init(&desc, &src_md, &weights_md, NULL, &dst_md);
    if (st == dnnl_success) st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &desc, attr, cpu_engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&s->matmul, pd);
    if (st == dnnl_success && c->prepared_b) weights_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (st == dnnl_success && !s->runtime_k) st = dnnl_memory_create(&s->src, &src_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && !s->runtime_k)
        st = dnnl_memory_create(&s->weights, &weights_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success) st = dnnl_memory_create(&s->dst, &dst_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success) {
        const dnnl_memory_desc_t *pad_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        s->scratchpad_bytes = pad_md ? dnnl_memory_desc_get_size(pad_md) : 0;
        if (s->scratchpad_bytes) st = dnnl_memory_create(&s->scratchpad, pad_md, cpu_engine, DNNL_MEMORY_NONE);
    }
    if (st == dnnl_success && c->prepared_b) st = build_reorder(s, c, &weights_md);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) release(s);
    return st;
}

static int same_shape(const moe_gemm_call *a, const moe_gemm_call *b) {
    if (a->trans_a != b->trans_a || a->trans_b != b->trans_b || a->m != b->m || a->n != b->n || a->bf16 != b->bf16 ||
        a->prepared_b != b->prepared_b || moe__gemm_lda(a) != moe__gemm_lda(b) ||
        moe__gemm_ldb(a) != moe__gemm_ldb(b) || dst_pitch(a) != dst_pitch(b))
        return 0;
    if (has_runtime_k(a) || has_runtime_k(b)) return has_runtime_k(a) && has_runtime_k(b); /* one for every k */
    return a->k == b->k;
}

/* The cached matmul for c's shape, or a new one in the least recently used slot. */
static moe_status lookup(moe_gemm_engine *e, const moe_gemm_call *c, cached_matmul **out) {
    cached_matmul *victim = &e->slot[0];
    for (int i = 0; i < CACHE_SLOTS; i++) {
        cached_matmul *s = &e->slot[i];
        if (s->last_use && same_shape(&s->key, c)) {
            *out = s;
            s->last_use = ++e->clock;
            return MOE_OK;
        }
        if (s->last_use < victim->last_use) victim = s;
    }
    release(victim);
    dnnl_status_t st = build(victim, c);
    if (st != dnnl_success) return failed(st, "matmul primitive", c);
    victim->key = *c;
    victim->last_use = ++e->clock;
    if (victim->scratchpad_bytes > e->scratchpad_bytes) { /* page-aligned, as oneDNN aligns its own: the AVX2 sgemm
                                                           * packs into it, and a 16-byte-aligned buffer made its
                                                           * 64-row calls up to 2.8x slower, in some runs only */
        void *grown = NULL;
        if (posix_memalign(&grown, SCRATCHPAD_ALIGN, victim->scratchpad_bytes) != 0) return MOE_ERR_OUT_OF_MEMORY;
        free(e->scratchpad);
        e->scratchpad = grown, e->scratchpad_bytes = victim->scratchpad_bytes;
    }
    *out = victim;
    return MOE_OK;
}

/* brgemm, oneDNN's matmul from AVX-512 on, reads weights in its blocked layout; below it the sgemm reads them plain
 * (gemm_engine.h). The effective ISA counts ONEDNN_MAX_CPU_ISA, so a capped AVX-512 CPU runs as an AVX2 one. */
static int onednn_prefers_prepared_b(void) { return has_isa(dnnl_cpu_isa_avx512_core); }

/* The cached prepared_b matmul of c's shape (built on first use). */
static moe_status prepared_shape(moe_gemm_engine *e, const moe_gemm_call *c, cached_matmul **s) {
    if (!c->prepared_b) return moe_fail(MOE_ERR_INVALID_ARG, "gemm engine: preparing B for a call without prepared_b");
    return lookup(e, c, s);
}

static moe_status onednn_prepared_bytes(moe_gemm_engine *e, const moe_gemm_call *c, size_t *bytes) {
    cached_matmul *s = NULL;
    MOE_TRY(prepared_shape(e, c, &s));
    const dnnl_memory_desc_t *md = NULL;
    dnnl_status_t st = dnnl_memory_get_memory_desc(s->weights, &md);
    if (st != dnnl_success) return failed(st, "weights layout", c);
    *bytes = dnnl_memory_desc_get_size(md);
    return MOE_OK;
}

static moe_status onednn_prepare_b(moe_gemm_engine *e, const moe_gemm_call *c, const void *B, void *prepared) {
    cached_matmul *s = NULL;
    MOE_TRY(prepared_shape(e, c, &s));
    dnnl_status_t st = dnnl_memory_set_data_handle_v2(s->plain_b, (void *)B, e->stream);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle_v2(s->weights, prepared, e->stream);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, s->plain_b}, {DNNL_ARG_TO, s->weights}};
    if (st == dnnl_success) st = dnnl_primitive_execute(s->reorder, e->stream, 2, args);
    if (st == dnnl_success) st = dnnl_stream_wait(e->stream);
    return st == dnnl_success ? MOE_OK : failed(st, "weights reorder", c);
}

/* A run-time-k call's src and weights, made for its k and pointed at A and B (destroyed after the call). */
static dnnl_status_t runtime_k_inputs(const moe_gemm_call *c, const void *A, const void *B, dnnl_memory_t *src,
                                      dnnl_memory_t *weights) {
    const dnnl_data_type_t in = c->bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t src_md, weights_md;
    *src = *weights = NULL;
    dnnl_status_t st = matrix_desc(&src_md, c->m, c->k, in, c->trans_a, moe__gemm_lda(c));
    if (st == dnnl_success) st = matrix_desc(&weights_md, c->k, c->n, in, c->trans_b, moe__gemm_ldb(c));
    if (st == dnnl_success) st = dnnl_memory_create(src, &src_md, cpu_engine, (void *)A);
    if (st == dnnl_success) st = dnnl_memory_create(weights, &weights_md, cpu_engine, (void *)B);
    return st;
}

static moe_status onednn_run(moe_gemm_engine *e, const moe_gemm_call *c, const void *A, const void *B, moe_real *C) {
    cached_matmul *s = NULL;
    MOE_TRY(lookup(e, c, &s));
    const size_t count = (size_t)c->m * c->n;
    if (c->accumulate && e->product_count < count) {
        float *grown = realloc(e->product, count * sizeof *grown);
        if (!grown) return MOE_ERR_OUT_OF_MEMORY;
        e->product = grown, e->product_count = count;
    }
    dnnl_memory_t src = s->src, weights = s->weights;
    dnnl_status_t st = dnnl_success;
    if (s->runtime_k) {
        st = runtime_k_inputs(c, A, B, &src, &weights);
    } else {
        st = dnnl_memory_set_data_handle_v2(src, (void *)A, e->stream);
        if (st == dnnl_success) st = dnnl_memory_set_data_handle_v2(weights, (void *)B, e->stream);
    }
    if (st == dnnl_success) st = dnnl_memory_set_data_handle_v2(s->dst, c->accumulate ? e->product : C, e->stream);
    if (st == dnnl_success && s->scratchpad)
        st = dnnl_memory_set_data_handle_v2(s->scratchpad, e->scratchpad, e->stream);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, s->dst},
                               {DNNL_ARG_SCRATCHPAD, s->scratchpad}};
    if (st == dnnl_success) st = dnnl_primitive_execute(s->matmul, e->stream, s->scratchpad ? 4 : 3, args);
    if (st == dnnl_success) st = dnnl_stream_wait(e->stream);
    if (s->runtime_k) {
        if (src) dnnl_memory_destroy(src);
        if (weights) dnnl_memory_destroy(weights);
    }
    if (st != dnnl_success) return failed(st, s->runtime_k ? "matmul (run-time k)" : "matmul", c);
    if (c->accumulate) moe__gemm_store(c, e->product, C);
    return MOE_OK;
}

const moe_gemm_backend moe_gemm_backend_onednn = {
    .name = "onednn",
    .create = onednn_create,
    .free = onednn_free,
    .run = onednn_run,
    .prepared_bytes = onednn_prepared_bytes,
    .prepare_b = onednn_prepare_b,
    .prefers_prepared_b = onednn_prefers_prepared_b,
    .native_bf16 = onednn_native_bf16,
    .set_bf16_mode = onednn_set_bf16_mode,
    .describe = onednn_describe,
};
