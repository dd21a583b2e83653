/* gemm_engine_onednn.c — the GEMM engine on oneDNN's matmul primitive (why and what it guarantees:
 * gemm_engine.h). One CPU engine for the process; per moe_gemm_engine a stream and a small cache of primitives
 * keyed by the call's shape, each with its memory objects made once and pointed at the call's arrays. A shape
 * with prepared_b also keeps a reorder (plain B, in the call's input type -> the matmul's preferred weights layout),
 * which writes into the caller's buffer.
 *
 * A weight gradient (trans_a) of at most RUNTIME_K_MAX rows is built with a run-time k: an expert's is summed over its
 * segments, each a different number of rows at nearly every call, and a primitive per k meant hundreds of primitive
 * creations per training step (each ~0.5 ms, and evicting the row blocks' primitives from the cache). At these
 * shapes the run-time-k primitive runs as fast and gives the bits of the fixed-k one, the same with 1, 2, 8 or 16
 * threads (measured, fp32 and bf16: docs/BENCHMARKS.md); at long k it may split k over threads (seen from k 1024 at
 * 8 threads), so longer sums keep a primitive per k. oneDNN 2.6 stops with SIGFPE
 * creating a run-time-k matmul with a sum post-op, so an accumulating call runs without it into the engine's
 * scratch and adds that to C: the same single fp32 addition per value as the post-op's, so the same bits. */
#include "kernels/gemm_engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <oneapi/dnnl/dnnl.h>

#include "core/fail.h"

enum { CACHE_SLOTS = 24 }; /* shapes in use at once: a layer's 64-row blocks need ~6, the model's dense ~8 */
enum { RUNTIME_K_MAX = 256 }; /* the longest weight-gradient sum with a run-time k (see above) */

typedef struct {
    moe_gemm_call key;          /* k is not part of the key when runtime_k */
    int runtime_k;
    unsigned long long last_use; /* 0: empty */
    dnnl_primitive_t matmul;
    dnnl_memory_t src, weights, dst; /* runtime_k: dst only (src and weights are made per call, with the call's k) */
    dnnl_primitive_t reorder;   /* prepared_b: plain B -> weights layout */
    dnnl_memory_t plain_b;      /* prepared_b: the reorder's source (its destination is weights) */
} cached_matmul;

struct moe_gemm_engine {
    dnnl_stream_t stream;
    float *product;       /* an accumulating run-time-k call's product, before it is added to C */
    size_t product_count;
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

void moe_gemm_set_bf16_mode(moe_bf16_gemm_mode mode) {
    pthread_once(&bf16_mode_once, read_bf16_mode);
    bf16_mode = mode;
    resolve_bf16_mode();
}

int moe_gemm_native_bf16(void) {
    pthread_once(&bf16_mode_once, read_bf16_mode);
    return native_bf16;
}

const char *moe_gemm_library(void) {
    static char name[192];
    const dnnl_version_t *v = dnnl_version();
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const char *isa_name = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx     ? "amx"
                           : (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 ? "avx512_bf16"
                           : (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core           ? "avx512"
                                                                                                    : "below avx512";
    const int native = moe_gemm_native_bf16(); /* reads the mode first */
    const char *mode = bf16_mode == MOE_BF16_GEMM_AUTO ? "auto" : bf16_mode == MOE_BF16_GEMM_NATIVE ? "native" : "fp32";
    snprintf(name, sizeof name, "oneDNN %d.%d.%d (%s%s, MOE_BF16_GEMM %s%s%s%s)", v->major, v->minor, v->patch,
             isa_name, native ? ", bf16 kernels" : ", bf16 emulated in fp32", mode, *bf16_mode_refused ? ": " : "",
             bf16_mode_refused, *bf16_mode_refused ? " is not auto, native or fp32" : "");
    return name;
}

moe_status moe_gemm_engine_create(moe_gemm_engine **out) {
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
    if (s->src) dnnl_memory_destroy(s->src);
    if (s->weights) dnnl_memory_destroy(s->weights);
    if (s->dst) dnnl_memory_destroy(s->dst);
    if (s->reorder) dnnl_primitive_destroy(s->reorder);
    if (s->plain_b) dnnl_memory_destroy(s->plain_b);
    *s = (cached_matmul){0};
}

void moe_gemm_engine_free(moe_gemm_engine *e) {
    if (!e) return;
    for (int i = 0; i < CACHE_SLOTS; i++) release(&e->slot[i]);
    free(e->product);
    dnnl_stream_destroy(e->stream);
    free(e);
}

/* The short weight gradients take a run-time k (see the top of this file); never with prepared_b, whose reorder is
 * made for one k (and which same_shape does not compare for these). */
static int has_runtime_k(const moe_gemm_call *c) { return c->trans_a && !c->prepared_b && c->k <= RUNTIME_K_MAX; }

/* A [rows, cols] matrix, or its transpose stored [cols, rows] (format ba). */
static dnnl_status_t matrix_desc(dnnl_memory_desc_t *md, dnnl_dim_t rows, dnnl_dim_t cols, dnnl_data_type_t type,
                                 int transposed) {
    dnnl_dims_t dims = {rows, cols};
    return dnnl_memory_desc_init_by_tag(md, 2, dims, type, transposed ? dnnl_ba : dnnl_ab);
}

/* prepared_b: the reorder from B as the caller holds it (plain, in the call's input type) into the matmul's weights
 * layout: a permutation of the values, exact. */
static dnnl_status_t build_reorder(cached_matmul *s, const moe_gemm_call *c, const dnnl_memory_desc_t *weights_md) {
    dnnl_memory_desc_t plain_md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = matrix_desc(&plain_md, c->k, c->n, c->bf16 ? dnnl_bf16 : dnnl_f32, c->trans_b);
    if (st == dnnl_success) st = dnnl_memory_create(&s->plain_b, &plain_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success)
        st = dnnl_reorder_primitive_desc_create(&pd, &plain_md, cpu_engine, weights_md, cpu_engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&s->reorder, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return st;
}

/* The matmul for this shape: src op(A) [m, k], weights op(B) [k, n] (plain, or with prepared_b in the layout the
 * primitive picks), dst C [m, n] f32, with a sum post-op when accumulating (C += ...). Memory objects are made
 * with no data and pointed at the arrays on each call. */
static dnnl_status_t build(cached_matmul *s, const moe_gemm_call *c) {
    const dnnl_data_type_t in = c->bf16 ? dnnl_bf16 : dnnl_f32;
    const dnnl_dim_t k = has_runtime_k(c) ? DNNL_RUNTIME_DIM_VAL : c->k;
    s->runtime_k = has_runtime_k(c);
    dnnl_memory_desc_t src_md, weights_md, dst_md;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = matrix_desc(&src_md, c->m, k, in, c->trans_a);
    if (st == dnnl_success && c->prepared_b) {
        dnnl_dims_t dims = {k, c->n};
        st = dnnl_memory_desc_init_by_tag(&weights_md, 2, dims, in, dnnl_format_tag_any);
    } else if (st == dnnl_success) {
        st = matrix_desc(&weights_md, k, c->n, in, c->trans_b);
    }
    if (st == dnnl_success) st = matrix_desc(&dst_md, c->m, c->n, dnnl_f32, 0);
    if (st == dnnl_success) st = dnnl_matmul_desc_init(&desc, &src_md, &weights_md, NULL, &dst_md);
    if (st == dnnl_success) st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success && c->accumulate && !s->runtime_k) {
        st = dnnl_post_ops_create(&post_ops);
        if (st == dnnl_success) st = dnnl_post_ops_append_sum(post_ops, 1.0f);
        if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, post_ops);
    }
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &desc, attr, cpu_engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&s->matmul, pd);
    if (st == dnnl_success && c->prepared_b) weights_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (st == dnnl_success && !s->runtime_k) st = dnnl_memory_create(&s->src, &src_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && !s->runtime_k)
        st = dnnl_memory_create(&s->weights, &weights_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success) st = dnnl_memory_create(&s->dst, &dst_md, cpu_engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && c->prepared_b) st = build_reorder(s, c, &weights_md);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) release(s);
    return st;
}

static int same_shape(const moe_gemm_call *a, const moe_gemm_call *b) {
    if (has_runtime_k(a) || has_runtime_k(b)) /* one primitive for every k, accumulating or not */
        return has_runtime_k(a) && has_runtime_k(b) && a->trans_b == b->trans_b && a->m == b->m && a->n == b->n &&
               a->bf16 == b->bf16;
    return a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->m == b->m && a->n == b->n && a->k == b->k &&
           a->bf16 == b->bf16 && a->accumulate == b->accumulate && a->prepared_b == b->prepared_b;
}

/* The cached matmul for c's shape, or a new one in the least recently used slot. */
static moe_status lookup(moe_gemm_engine *e, const moe_gemm_call *c, cached_matmul **out) {
    cached_matmul *victim = &e->slot[0];
    for (int i = 0; i < CACHE_SLOTS; i++) {
        cached_matmul *s = &e->slot[i];
        if (s->last_use && same_shape(&s->key, c)) {
            *out = s;
            return MOE_OK;
        }
        if (s->last_use < victim->last_use) victim = s;
    }
    release(victim);
    dnnl_status_t st = build(victim, c);
    if (st != dnnl_success) return failed(st, "matmul primitive", c);
    victim->key = *c;
    *out = victim;
    return MOE_OK;
}

/* The cached prepared_b matmul of c's shape (built on first use). */
static moe_status prepared_shape(moe_gemm_engine *e, const moe_gemm_call *c, cached_matmul **s) {
    if (!c->prepared_b) return moe_fail(MOE_ERR_INVALID_ARG, "gemm engine: preparing B for a call without prepared_b");
    MOE_TRY(lookup(e, c, s));
    (*s)->last_use = ++e->clock;
    return MOE_OK;
}

moe_status moe_gemm_engine_prepared_bytes(moe_gemm_engine *e, const moe_gemm_call *c, size_t *bytes) {
    cached_matmul *s = NULL;
    MOE_TRY(prepared_shape(e, c, &s));
    const dnnl_memory_desc_t *md = NULL;
    dnnl_status_t st = dnnl_memory_get_memory_desc(s->weights, &md);
    if (st != dnnl_success) return failed(st, "weights layout", c);
    *bytes = dnnl_memory_desc_get_size(md);
    return MOE_OK;
}

moe_status moe_gemm_engine_prepare_b(moe_gemm_engine *e, const moe_gemm_call *c, const void *B, void *prepared) {
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
    dnnl_status_t st = matrix_desc(&src_md, c->m, c->k, in, c->trans_a);
    if (st == dnnl_success) st = matrix_desc(&weights_md, c->k, c->n, in, c->trans_b);
    if (st == dnnl_success) st = dnnl_memory_create(src, &src_md, cpu_engine, (void *)A);
    if (st == dnnl_success) st = dnnl_memory_create(weights, &weights_md, cpu_engine, (void *)B);
    return st;
}

moe_status moe_gemm_engine_run(moe_gemm_engine *e, const moe_gemm_call *c, const void *A, const void *B,
                               moe_real *C) {
    cached_matmul *s = NULL;
    MOE_TRY(lookup(e, c, &s));
    s->last_use = ++e->clock;
    if (s->runtime_k) {
        const size_t count = (size_t)c->m * c->n;
        if (c->accumulate && e->product_count < count) {
            float *grown = realloc(e->product, count * sizeof *grown);
            if (!grown) return MOE_ERR_OUT_OF_MEMORY;
            e->product = grown, e->product_count = count;
        }
        dnnl_memory_t src, weights;
        dnnl_status_t st = runtime_k_inputs(c, A, B, &src, &weights);
        if (st == dnnl_success) st = dnnl_memory_set_data_handle_v2(s->dst, c->accumulate ? e->product : C, e->stream);
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, s->dst}};
        if (st == dnnl_success) st = dnnl_primitive_execute(s->matmul, e->stream, 3, args);
        if (st == dnnl_success) st = dnnl_stream_wait(e->stream);
        if (src) dnnl_memory_destroy(src);
        if (weights) dnnl_memory_destroy(weights);
        if (st != dnnl_success) return failed(st, "matmul (run-time k)", c);
        if (c->accumulate)
            for (size_t i = 0; i < count; i++) C[i] += e->product[i];
        return MOE_OK;
    }
    dnnl_status_t st = dnnl_memory_set_data_handle_v2(s->src, (void *)A, e->stream);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle_v2(s->weights, (void *)B, e->stream);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle_v2(s->dst, C, e->stream);
    if (st != dnnl_success) return failed(st, "memory", c);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, s->src}, {DNNL_ARG_WEIGHTS, s->weights}, {DNNL_ARG_DST, s->dst}};
    st = dnnl_primitive_execute(s->matmul, e->stream, 3, args);
    if (st == dnnl_success) st = dnnl_stream_wait(e->stream);
    return st == dnnl_success ? MOE_OK : failed(st, "matmul", c);
}
