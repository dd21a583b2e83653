/* types.h — the ground floor's vocabulary, shared by every folder above it: the real type, the status codes
 * (one X-macro list gives the enum and its strings, libuv's pattern), bf16 storage, the routing choices and
 * the views of one MoE layer's weights.
 *
 * Precision: moe_real is float. The float64 build (MOE_REAL_IS_DOUBLE, libraries *_f64) exists only so
 * that finite-difference gradient checks can be tight; it is never used for training. */
#ifndef MOE_CORE_TYPES_H
#define MOE_CORE_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef MOE_REAL_IS_DOUBLE
typedef double moe_real;
#else
typedef float moe_real;
#endif

/* bf16 as stored (the top 16 bits of an IEEE float, rounded to nearest even); CUDA code reinterprets it
 * as __nv_bfloat16. */
typedef uint16_t moe_bf16;

#define MOE_STATUS_LIST(X)                                                              \
    X(MOE_OK, "ok")                                                                     \
    X(MOE_ERR_INVALID_ARG, "invalid argument")                                          \
    X(MOE_ERR_INVALID_CONFIG, "invalid configuration")                                  \
    X(MOE_ERR_OUT_OF_MEMORY, "out of memory")                                           \
    X(MOE_ERR_NONFINITE, "a non-finite value (NaN or Inf)")                             \
    X(MOE_ERR_NO_FORWARD, "backward called without a matching forward")                 \
    X(MOE_ERR_CUDA, "CUDA runtime error")                                               \
    X(MOE_ERR_NO_DEVICE, "no CUDA device present")                                      \
    X(MOE_ERR_COMM, "communication error")                                              \
    X(MOE_ERR_COUNT_MISMATCH, "ranks disagree on the rows they exchange")               \
    X(MOE_ERR_TIMEOUT, "an exchange did not complete within the watchdog timeout")      \
    X(MOE_ERR_IO, "a file could not be read or written")                                \
    X(MOE_ERR_BAD_FILE, "a file is not in the expected format")                         \
    X(MOE_ERR_PEER, "another rank failed (see its message)")                           \
    X(MOE_ERR_LIBRARY, "a call into a math library failed")                             \
    X(MOE_ERR_MISMATCH, "the run disagrees with its CPU fp32 reference (--verify-steps)")

typedef enum {
#define MOE__STATUS_ENUM(name, text) name,
    MOE_STATUS_LIST(MOE__STATUS_ENUM)
#undef MOE__STATUS_ENUM
    MOE_STATUS_COUNT
} moe_status;

const char *moe_status_string(moe_status status);

typedef enum {
    MOE_SCORE_SOFTMAX = 0, /* Mixtral: softmax over all experts, then top-k                       */
    MOE_SCORE_SIGMOID = 1, /* DeepSeek-V3: sigmoid affinities; a per-expert bias steers selection */
} moe_score_func;

typedef enum {
    MOE_DROP_BY_TOKEN_ORDER = 0, /* when an expert overflows, earlier tokens are kept        */
    MOE_DROP_BY_SCORE = 1,       /* keep the highest router scores; ties to the earlier token */
} moe_drop_priority;

/* Views of one MoE layer's parameters (and, with the same shapes, of its gradients). Layouts are those of
 * Hugging Face Mixtral, so checkpoints map one to one:
 *   router_w [E, d]            gate.weight       logits = x router_w^T
 *   w1       [E_local, d_ff, d]  experts.j.w1    gate projection
 *   w3       [E_local, d_ff, d]  experts.j.w3    up projection
 *   w2       [E_local, d, d_ff]  experts.j.w2    down projection
 * The router is a dense (replicated) parameter; the experts are this rank's E_local = E / ep (the layout's). A dense
 * SwiGLU FFN is one "expert" with router_w NULL.
 * version: 0, or a number the owner changes whenever the values change (an optimizer step, a load): a bf16 CPU layer
 * then keeps the experts' prepared bf16 copies from one forward to the next while it stays the same
 * (kernels/gemm_rows.h, "prepared weights"); 0 makes them afresh at every forward. */
typedef struct {
    moe_real *router_w;
    moe_real *w1;
    moe_real *w3;
    moe_real *w2;
    unsigned long long version;
} moe_layer_weights;

#endif
