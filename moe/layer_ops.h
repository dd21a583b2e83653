/* layer_ops.h — the device-dependent steps of one MoE layer, as a table of functions per runtime (CPU, CUDA),
 * so that moe/layer.c is written once: it owns the order of the steps, the exchanges, the global capacity rule
 * (router/capacity.h) and the failure messages; the table owns how each step computes.
 *
 * Memory: the per-token routing arrays (router/routing.h) and every row buffer are device memory of the
 * runtime; the host arrays passed in are runtime host memory (pinned on CUDA), so copies to and from them can
 * stay queued. Token rows (x, out, dx, dout) are moe_real (float on CUDA); rows on the expert side (xp, y, dy,
 * dxp and the exchanges' payloads) are `row_elem` bytes per value: moe_real on the CPU, bf16 on CUDA
 * (DESIGN.md, Precision). The caller's tensors (x, out, dout, dx, weights, gradients) are device memory too.
 *
 * Host syncs (CUDA): choices_to_host waits for the device (the forward's one); everything else is queued
 * (router_losses' values land by the next one). */
#ifndef MOE_MOE_LAYER_OPS_H
#define MOE_MOE_LAYER_OPS_H

#include "moe/moe.h"
#include "router/routing.h"

typedef struct moe_layer_state moe_layer_state; /* one layer's state in a table's implementation */

typedef struct moe_layer_ops {
    const char *name;
    size_t row_elem; /* bytes per value of the expert-side rows */

    moe_status (*create)(const moe_config *cfg, int num_local_experts, moe_runtime *rt, moe_layer_state **out);
    void (*destroy)(moe_layer_state *s);

    /* logits -> scores (+ bias[E], a host array, for selection; sigmoid only) -> top-k (skipped when
     * use_given_experts: tok->expert holds them already) -> gates, for T tokens. Non-finite logits are not
     * a failure here: the choices are then placeholders (valid ids), and choices_to_host reports it, so that
     * every rank learns of it at the same point (through the capacity scan) and none is left waiting. */
    moe_status (*route)(moe_layer_state *s, const moe_layer_weights *w, const moe_real *x, const moe_real *bias,
                        int use_given_experts, const moe_token_routing *tok, int num_tokens);
    /* Host copies of the choices for the capacity rule: expert[T*k], and expert_score[T*k] when with_scores;
     * *nonfinite = 1 when the logits held a NaN or an Inf (with a message naming the first recorded). */
    moe_status (*choices_to_host)(moe_layer_state *s, const moe_token_routing *tok, int num_tokens, int with_scores,
                                  int *expert, moe_real *expert_score, int *nonfinite);
    /* tok->kept[T*k] from the host's kept flags. */
    moe_status (*kept_to_device)(moe_layer_state *s, const unsigned char *kept, const moe_token_routing *tok,
                                 int num_tokens);
    /* tok->slot and tok->perm_token from tok->expert and tok->kept (router/layout.h); the layout's own rows per
     * expert go to layout_counts[E] (host), complete after the next host sync: what the layer checks against
     * the capacity rule's counts. */
    moe_status (*dispatch_layout)(moe_layer_state *s, const moe_token_routing *tok, int num_tokens,
                                  int *layout_counts);
    /* xp[r] = x[perm_token[r]] (converted to the row type) */
    moe_status (*permute)(moe_layer_state *s, const moe_real *x, const int *perm_token, int num_rows, void *xp);
    /* out[t] = sum_j gate * y[slot] in a fixed j order (gate NULL = 1) */
    moe_status (*combine)(moe_layer_state *s, const void *y, const int *slot, const moe_real *gate, int num_tokens,
                          moe_real *out);
    moe_status (*combine_backward)(moe_layer_state *s, const moe_real *dout, const void *y, const int *slot,
                                   const moe_real *gate, int num_tokens, void *dy, moe_real *dgate);

    /* SwiGLU experts on `rows` rows in expert-major order (expert_offset: host [E_local + 1]); the table keeps
     * what backward needs: the SwiGLU intermediates, per layer, or under cfg.recompute MOE and FULL in runtime slots
     * that the layer rebuilds before backward by calling experts_forward again (y NULL: the intermediates only, no
     * down projection). Backward: segment_start as moe_expert_ffn_backward_cpu (host); its scratch is slots. */
    moe_status (*experts_forward)(moe_layer_state *s, const moe_layer_weights *w, const int *expert_offset, int rows,
                                  const void *xp, void *y);
    moe_status (*experts_backward)(moe_layer_state *s, const moe_layer_weights *w, moe_layer_weights *grads,
                                   const int *segment_start, int segments, int rows, const void *xp, const void *dy,
                                   void *dxp);
    /* Grows what experts_forward and experts_backward size by their rows (the kept intermediates or their slots, the
     * backward's scratch, what they stage per expert) to at least `rows` in all and expert_rows per expert now, so
     * that later passes of no more allocate nothing (the layer's reservation with a capacity: moe/layer.c's
     * reserved_rows). May be NULL. */
    moe_status (*reserve_rows)(moe_layer_state *s, int rows, int expert_rows);

    /* NaN provenance: *first = the index of the first NaN or Inf of count values (moe_real, or the row type
     * when rows is set), or -1. Waits for the device; only used while checking (moe_layer_set_checks). */
    moe_status (*find_nonfinite)(moe_layer_state *s, const void *data, size_t count, int rows, long long *first);

    /* This rank's shares {load balance, z} of the router losses (router/aux_loss.h) into loss[2], host memory of the
     * runtime's (moe_runtime_host_alloc), by the runtime's next synchronisation (the CPU at once; CUDA queues the
     * kernels and the copy); num_selected: host [E] global counts (kept by the table for router_backward). */
    moe_status (*router_losses)(moe_layer_state *s, const moe_token_routing *tok, int num_tokens,
                                const int *num_selected, int num_tokens_global, double loss[2]);
    /* From dL/dgate: dL/dscores (gates, balance loss), dL/dlogits (scores, z-loss), kept for router_weight_grad;
     * when dx != NULL, dx += dlogits router_w. */
    moe_status (*router_backward)(moe_layer_state *s, const moe_layer_weights *w, const moe_token_routing *tok,
                                  int num_tokens, const moe_real *x, const moe_real *dgate, int num_tokens_global,
                                  moe_real *dx);
    /* drouter_w [E, d] += dlogits^T x over tokens [first_token, first_token + num_tokens) of the last
     * router_backward (x: all of its tokens) — one product, so that the layer can form it per shard. */
    moe_status (*router_weight_grad)(moe_layer_state *s, const moe_real *x, int first_token, int num_tokens,
                                     moe_real *drouter_w);
    /* y = a + b over n moe_real values, one rounded addition each (the layer's shard trees, moe/shard_tree.h) */
    moe_status (*add)(moe_layer_state *s, const moe_real *a, const moe_real *b, size_t n, moe_real *y);
} moe_layer_ops;

/* The CPU table (always built; float or double with moe_real). */
extern const moe_layer_ops moe_layer_ops_cpu;
/* The CUDA table (libmoe_cuda; float only). */
extern const moe_layer_ops moe_layer_ops_cuda;

/* Whether a layer's table keeps the experts' SwiGLU intermediates from forward to backward (else they are runtime
 * slots, rebuilt before each layer's backward: cfg.recompute MOE and FULL). */
static inline int moe_layer_keeps_expert_acts(const moe_config *cfg) { return cfg->recompute < MOE_RECOMPUTE_MOE; }

#endif
