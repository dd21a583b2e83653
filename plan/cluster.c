/* plan/cluster.c — bytes moved and time per training step of a run (plan/cluster.h). */
#include "plan/cluster.h"

#include <math.h>

moe_plan_cluster moe_plan_cluster_h100(int bf16) {
    return (moe_plan_cluster){.gpus_per_node = 8,
                              .nodes = 1,
                              .gpu_flops = bf16 ? 989.4e12 : 66.9e12,
                              .gemm_efficiency = 0.7,
                              .non_gemm_overhead = 0.25,
                              .gpu_memory = 80e9,
                              .mem_bw = 3.35e12,
                              .intra_bw = 450e9,
                              .inter_bw = 50e9,
                              .intra_latency = 5e-6,
                              .inter_latency = 10e-6};
}

static int positive(double x) { return x > 0 && isfinite(x); }

const char *moe_plan_cluster_problem(const moe_plan_cluster *c) {
    if (c->gpus_per_node < 1 || c->nodes < 1) return "--gpus-per-node and --nodes must be at least 1";
    if (!positive(c->gpu_flops)) return "--gpu-flops must be a positive number";
    if (!positive(c->gemm_efficiency) || c->gemm_efficiency > 1) return "--gemm-efficiency must be in (0, 1]";
    if (!(c->non_gemm_overhead >= 0) || !isfinite(c->non_gemm_overhead)) return "--non-gemm-overhead must be >= 0";
    if (!positive(c->gpu_memory)) return "--gpu-memory must be a positive number";
    if (!positive(c->mem_bw)) return "--mem-bw must be a positive number";
    if (!positive(c->intra_bw) || !positive(c->inter_bw)) return "--intra-bw and --inter-bw must be positive";
    if (!(c->intra_latency >= 0) || !(c->inter_latency >= 0) || !isfinite(c->intra_latency) ||
        !isfinite(c->inter_latency))
        return "--intra-latency and --inter-latency must be >= 0";
    if (!(c->dense_s_per_token >= 0) || !isfinite(c->dense_s_per_token))
        return "--dense-us-per-token must be a positive number (or not given)";
    if (!(c->optimizer_s_per_param >= 0) || !isfinite(c->optimizer_s_per_param))
        return "--optimizer-ns-per-param must be a positive number (or not given)";
    return 0;
}

const char *moe_plan_run_problem(const moe_plan_model *m, const moe_plan_cluster *c, const moe_plan_run *r) {
    const moe_plan_layout *l = &r->layout;
    if (l->world != c->gpus_per_node * c->nodes) return "the layout's world size is not gpus-per-node x nodes";
    const char *pipeline = moe_plan_pipeline_problem(m, l, 0); /* its shape; the micro-batches below */
    if (pipeline) return pipeline;
    const int64_t pp = moe_plan_layout_pp(l), ranks = moe_plan_layout_stage_ranks(l), tp = moe_plan_layout_tp(l);
    if (l->tp < 0) return "--tp must be at least 1";
    if (tp > 1) {
        if (tp & (tp - 1))
            return "--tp must be a power of two (the fixed pieces of its products, --tp-shards, are one: "
                   "docs/DETERMINISM.md)";
        if (c->gpus_per_node % tp)
            return "--tp must divide --gpus-per-node: a tensor-parallel group stays inside a node (it all-gathers and "
                   "reduce-scatters every layer's tokens, over NVLink)";
        if (ranks % tp) return "--tp must divide the GPUs of a pipeline stage (GPUs / --pp)";
        if (m->num_heads % tp) return "--tp must divide the attention heads (each GPU computes heads / tp of them)";
        if (m->num_kv_heads % tp && tp % m->num_kv_heads)
            return "--tp and the kv heads: one must divide the other (the kv heads are split, or each GPU keeps the one "
                   "its query heads read)";
        if (moe_plan_model_num_moe_layers(m) < m->num_layers && m->d_ff_dense % tp)
            return "--tp must divide the dense FFNs' width (--d-ff; gate/up are split by rows, down by columns)";
        if (m->vocab_size % tp) return "--tp must divide the vocabulary (the embedding and lm_head are split by rows)";
    }
    const int64_t data = ranks / tp; /* the stage's GPUs reading distinct sequences */
    if (l->ep < 1 || l->world % l->ep) return "--ep must divide the number of GPUs";
    if (data % l->ep)
        return tp > 1 ? "--ep must divide the GPUs of a pipeline stage over --tp (GPUs / (--pp x --tp): expert-parallel "
                        "groups are GPUs of the same tensor-parallel rank)"
                      : "--ep must divide the GPUs of a pipeline stage (GPUs / --pp)";
    if (m->num_experts % l->ep) return "--ep must divide the number of experts";
    if (l->micro_batch < 1 || l->seq_len < 1) return "--micro-batch and --seq-len must be at least 1";
    if (l->seq_len % tp)
        return "--tp must divide --seq-len (every forward's tokens split into --tp slices, as moe-train's)";
    if (l->zero < 0 || l->zero > 2) return "--zero must be 0, 1 or 2";
    if (l->local_shards > 0 && l->micro_batch % l->local_shards)
        return "--shards must divide GPUs x --micro-batch (every shard is whole sequences of one micro-batch)";
    if (l->zero == 2 && moe_plan_layout_local_shards(l) == 0)
        return "--zero 2 needs moe-train's world-invariant sums (its reduce-scatter is their fixed tree), which are "
               "off here: moe-train's shards (the largest power of two dividing a stage's sequences, its GPUs / --tp "
               "x --micro-batch, at most 64) must be a multiple of the stage's GPUs (--tp ones included), a power of "
               "two; use --zero 1, a larger --micro-batch, or --shards";
    if (l->routing_skew != 0 && (!(l->routing_skew >= 1) || !isfinite(l->routing_skew)))
        return "--routing-skew must be at least 1";
    if (l->ep > 1 && l->routing_skew > (double)l->ep)
        return "--routing-skew is at most --ep (the busiest of ep ranks holds at most every row: s = max / (rows / ep))";
    if (r->global_batch < 1 || r->global_batch % (data * l->micro_batch))
        return tp > 1 ? "--global-batch must be a multiple of GPUs / (--pp x --tp) x --micro-batch (every "
                        "tensor-parallel group reads its own sequences)"
               : pp == 1
                   ? "--global-batch must be a multiple of GPUs x --micro-batch (every GPU reads its own sequences)"
                   : "--global-batch must be a multiple of GPUs / --pp x --micro-batch (every GPU of a stage reads its "
                     "own sequences)";
    return moe_plan_pipeline_problem(m, l, r->global_batch / (data * l->micro_batch));
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        const int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

/* The busiest rank's EP peers on its own node and on others: rank r's group is the ep ranks first + i tp (0 <= i <
 * ep) from the start of its block of ep tp (its tensor-parallel rank's: pipeline/grid.h; [g*ep, g*ep + ep) at tp 1),
 * its node's ranks [n*G, n*G + G); the peers on its node are its members there but itself. Ranks r and r + lcm(ep tp,
 * G) see the same, so one such period is counted, each rank's members on its node in closed form (a loop over every
 * rank and member took ~11 minutes at 2^36 GPUs, and --search minutes at 2^15 GPUs of 4096 experts: a probe). */
static void alltoall_peers(int64_t world, int64_t ep, int64_t tp, int64_t G, int *intra, int *inter) {
    *intra = 0, *inter = 0;
    const int64_t block = ep * tp, period = block / gcd64(block, G) * G, end = period < world ? period : world;
    for (int64_t r = 0; r < end; r++) {
        const int64_t first = r / block * block + r % tp, node_first = r / G * G;
        /* i from ceil((node_first - first) / tp) to floor((node_first + G - 1 - first) / tp), within [0, ep) */
        const int64_t lo = node_first - first, hi = node_first + G - 1 - first;
        const int64_t i_lo = lo <= 0 ? 0 : (lo + tp - 1) / tp, i_hi = hi / tp < ep - 1 ? hi / tp : ep - 1;
        const int on_node = (int)(i_hi - i_lo + 1) - 1; /* but itself */
        const int off_node = (int)(ep - 1) - on_node;
        if (off_node > *inter || (off_node == *inter && on_node > *intra)) *inter = off_node, *intra = on_node;
    }
}

/* Seconds of a ring all-reduce of nbytes over n ranks: 2 (n-1) steps, each moving nbytes / n (Patarasuk and
 * Yuan 2009; NCCL's ring). */
static double ring_allreduce_s(double nbytes, int64_t n, double bw, double latency) {
    return n < 2 ? 0 : 2.0 * (n - 1) * latency + 2.0 * (double)(n - 1) / n * nbytes / bw;
}

/* Seconds of reduce-scattering nbytes over n ranks in `collectives` calls (ZeRO-2: one per layer's window and one
 * for the ends, per micro-batch): the ring's first half, (n-1) steps of nbytes / n each, per call. */
static double ring_reduce_scatter_s(double nbytes, int64_t n, double collectives, double bw, double latency) {
    return n < 2 ? 0 : collectives * (n - 1) * latency + (double)(n - 1) / n * nbytes / bw;
}

moe_plan_prediction moe_plan_predict(const moe_plan_model *m, const moe_plan_cluster *c, const moe_plan_run *r) {
    const moe_plan_layout *l = &r->layout;
    /* W: every GPU; under a pipeline each stage's W / pp of them (`ranks`) hold distinct sequences, its dense
     * gradients are summed over them and its experts' over dp = ranks / ep (pipeline/grid.h). The parameters,
     * layers and gradient sums below are the stage's whose memory is reported (the whole model's without one). */
    /* Under tensor parallelism a stage's W / (pp tp) `data` ranks read distinct sequences: its split tensors' gradients
     * are summed over them; the experts (fed distinct tokens by every GPU) over the stage's GPUs holding the same ones */
    const int64_t W = l->world, ep = l->ep, pp = moe_plan_layout_pp(l), ranks = W / pp, dp = ranks / ep;
    const int64_t tp = moe_plan_layout_tp(l), data = ranks / tp;
    const int64_t G = c->gpus_per_node;
    const double row = l->bf16 ? 2 : 4;
    moe_plan_prediction o = {.accum_steps = r->global_batch / (data * l->micro_batch)};
    o.tokens_per_step = (double)r->global_batch * l->seq_len;
    o.flops_per_token = moe_plan_model_flops_per_token(m, l->seq_len);
    moe_plan_layout with_steps = *l;
    with_steps.accum_steps = o.accum_steps;
    o.memory = moe_plan_model_memory(m, &with_steps);
    o.fits = o.memory.total <= c->gpu_memory;
    const moe_plan_stage stage = moe_plan_pipeline_stage(m, &with_steps, o.memory.stage);
    const moe_plan_params p = moe_plan_model_stage_params(m, &stage);
    const moe_plan_tp_share held = moe_plan_model_tp_share(m, &stage, tp); /* this GPU's dense parameters */
    const double Lm = (double)stage.moe_layers;

    /* compute: every GPU holds tokens_per_step / W tokens' work (a stage's GPU, pp times as many through 1/pp of the
     * layers: the ends' work counted as if spread evenly over the stages); the routed experts' work is that of the busiest EP rank,
     * its kept rows over a balanced rank's (the skew, capped by a capacity factor; the router and a shared expert
     * work per token). The dense path at the GEMM rate, or at its measured time per token */
    const double tokens = o.tokens_per_step / (double)W, rate = c->gpu_flops * c->gemm_efficiency;
    moe_plan_layout balanced = *l;
    balanced.routing_skew = 1;
    const double skew = moe_plan_model_busiest_rows(m, l) / moe_plan_model_busiest_rows(m, &balanced);
    o.routing_skew = moe_plan_layout_skew(l);
    const double routed_flops = 6.0 * Lm * (double)m->top_k * 3 * (double)m->d_model * (double)m->d_ff_expert * tokens;
    const double moe_flops = moe_plan_model_moe_flops_per_token(m) * tokens;
    const double overhead = 1 + c->non_gemm_overhead;
    /* recomputation's forward work on top (hardware FLOPs: the time counts them, MFU does not); the routed
     * experts' share waits for the busiest rank like the rest of their work */
    const moe_plan_recompute_flops again = moe_plan_model_recompute_flops_per_token(m, l->seq_len, l->recompute);
    o.recompute_flops_per_token = again.dense + again.moe;
    const double dense_flops = o.flops_per_token * tokens - moe_flops;
    const double moe_work = moe_flops + again.moe * tokens;
    o.compute_moe_s = (moe_work + (moe_flops > 0 ? (skew - 1) * routed_flops * moe_work / moe_flops : 0)) / rate *
                      overhead;
    o.compute_dense_s = (c->dense_s_per_token > 0 ? c->dense_s_per_token * tokens : dense_flops / rate * overhead) *
                        (1 + again.dense * tokens / dense_flops);
    /* stages of unequal layers (--first-stage-layers, --last-stage-layers): the pipeline moves at its slowest
     * stage's pace, the most layers over the mean */
    const double uneven = pp > 1 ? (double)moe_plan_pipeline_max_layers(m, l) * (double)pp / (double)m->num_layers : 1;
    o.compute_dense_s *= uneven, o.compute_moe_s *= uneven;
    o.compute_s = o.compute_dense_s + o.compute_moe_s;

    /* all-to-all: 4 exchanges per MoE layer and micro-batch (dispatch, combine; their backward twins), each
     * sending T k rows of d values (fewer with a capacity factor below 1), 1/ep of them to each EP rank on average;
     * an exchange lasts until the busiest EP rank has moved its skew x the mean */
    alltoall_peers(W, ep, tp, G, &o.alltoall_peers_intra, &o.alltoall_peers_inter);
    const double keep = m->capacity_factor > 0 && m->capacity_factor < 1 ? m->capacity_factor : 1;
    const double T = (double)l->micro_batch * l->seq_len; /* a micro-batch's tokens, of a tensor-parallel group */
    const double per_peer = keep * T / (double)tp * (double)m->top_k * (double)m->d_model * row / (double)ep;
    const double exchanges = (l->recompute == MOE_RECOMPUTE_FULL ? 6 : 4) * Lm * (double)o.accum_steps; /* full:
                                                                          the dispatch and combine run again */
    o.alltoall_intra_bytes = exchanges * per_peer * o.alltoall_peers_intra;
    o.alltoall_inter_bytes = exchanges * per_peer * o.alltoall_peers_inter;
    const double busiest = skew * per_peer;
    const double t_intra = o.alltoall_peers_intra ? c->intra_latency + busiest * o.alltoall_peers_intra / c->intra_bw : 0;
    const double t_inter = o.alltoall_peers_inter ? c->inter_latency + busiest * o.alltoall_peers_inter / c->inter_bw : 0;
    o.alltoall_s = exchanges * (t_intra > t_inter ? t_intra : t_inter); /* NVLink and the NIC work side by side */

    /* control traffic per MoE layer and micro-batch: the counts exchange (ep x E/ep ints, one latency) and, with a
     * capacity factor, the scan of the E per-expert counts over the world (ceil(log2 W) steps) */
    const double ep_latency = o.alltoall_peers_inter ? c->inter_latency : ep > 1 ? c->intra_latency : 0;
    const double world_latency = c->nodes > 1 ? c->inter_latency : W > 1 ? c->intra_latency : 0;
    const double world_bw = c->nodes > 1 ? c->inter_bw : c->intra_bw;
    double control = ep_latency;
    if (m->capacity_factor > 0 && ranks > 1) /* over the ranks sharing the layer: the stage's */
        control += ceil(log2((double)ranks)) * (world_latency + 4.0 * (double)m->num_experts / world_bw);
    o.control_s = Lm * (double)o.accum_steps * control;

    /* gradients: dense fp32 over the world, this GPU's experts over the expert-data-parallel group (ranks ep apart);
     * all-reduced once per step, or under ZeRO-2 reduce-scattered per micro-batch, layer by layer as each layer's
     * backward ends (the ends once more); ZeRO-1 and 2 then all-gather the updated parameters */
    /* a stage's ranks are a block of W / pp (all W without a pipeline): it crosses a node boundary unless it fits in a
     * node whose GPUs it divides */
    o.dense_group_spans_nodes = c->nodes > 1 && (ranks > G || G % ranks != 0); /* the data ranks span the stage */
    /* the group of EP rank ep-1 runs from rank ep-1 of the stage (and ep <= ranks/2 when dp > 1) to its last rank:
     * with dp > 1 some group crosses nodes whenever the stage does */
    o.expert_group_spans_nodes = dp > 1 && o.dense_group_spans_nodes;
    const double dense_nbytes = 4.0 * held.dense, expert_nbytes = 4.0 * (double)p.expert / (double)ep;
    /* A ring over nodes runs as one ring per member GPU of a node (NCCL's channels), each crossing nodes through its
     * GPU's own NIC: the group's bandwidth is its members per node times one NIC's, capped by NVLink. The world's
     * group has G members per node; an expert-data-parallel group G / ep (at least 1: its ranks are ep apart) */
    const double per_node = ranks < G ? (double)ranks : (double)G; /* a stage's GPUs on one node */
    const double expert_members = per_node > ep ? per_node / (double)ep : 1;
    const double dense_nic = per_node / (double)tp * c->inter_bw, expert_nic = expert_members * c->inter_bw;
    const double dense_bw = o.dense_group_spans_nodes ? (dense_nic < c->intra_bw ? dense_nic : c->intra_bw) : c->intra_bw;
    const double dense_lat = o.dense_group_spans_nodes ? c->inter_latency : c->intra_latency;
    const double expert_bw =
        o.expert_group_spans_nodes ? (expert_nic < c->intra_bw ? expert_nic : c->intra_bw) : c->intra_bw;
    const double expert_lat = o.expert_group_spans_nodes ? c->inter_latency : c->intra_latency;
    const double micro = (double)o.accum_steps;
    if (l->zero == 2) {
        o.allreduce_dense_bytes = data > 1 ? micro * (data - 1) / data * dense_nbytes : 0;
        o.allreduce_expert_bytes = dp > 1 ? micro * (dp - 1) / dp * expert_nbytes : 0;
        const double dense_calls = (double)stage.layers + 1; /* each layer's window, then the ends */
        o.allreduce_s = micro * (ring_reduce_scatter_s(dense_nbytes, data, dense_calls, dense_bw, dense_lat) +
                                 ring_reduce_scatter_s(expert_nbytes, dp, Lm, expert_bw, expert_lat));
    } else {
        o.allreduce_dense_bytes = data > 1 ? 2.0 * (data - 1) / data * dense_nbytes : 0;
        o.allreduce_expert_bytes = dp > 1 ? 2.0 * (dp - 1) / dp * expert_nbytes : 0;
        o.allreduce_s = ring_allreduce_s(dense_nbytes, data, dense_bw, dense_lat) +
                        ring_allreduce_s(expert_nbytes, dp, expert_bw, expert_lat);
    }
    /* ZeRO-1's and 2's all-gathers of the updated parameters: a ring's second half, (n-1) steps of 1/n each */
    const double dense_gather = l->zero && data > 1 ? (double)(data - 1) / data * dense_nbytes : 0;
    const double expert_gather = l->zero && dp > 1 ? (double)(dp - 1) / dp * expert_nbytes : 0;
    o.zero_gather_bytes = dense_gather + expert_gather;
    o.allreduce_s += (dense_gather > 0 ? (data - 1) * dense_lat + dense_gather / dense_bw : 0) +
                     (expert_gather > 0 ? (dp - 1) * expert_lat + expert_gather / expert_bw : 0);

    /* AdamW is bound by memory: per parameter it updates, read p, g, m, v and write p, m, v (28 bytes) after the
     * clipping norm read g (4); every gradient held between steps is zeroed (4: all of them, or ZeRO-2's shard);
     * under bf16 each matrix is copied (read 4, write 2) */
    const double updated = l->zero ? held.dense / data + (double)p.expert / ep / dp : held.dense + (double)p.expert / ep;
    const double grads_held = l->zero == 2 ? updated : held.dense + (double)p.expert / ep;
    const double copied = l->bf16 ? held.dense_matrix + (double)p.expert / ep : 0;
    const double optimizer_nbytes = 32 * updated + 4 * grads_held + 6 * copied;
    /* a measured time per parameter was taken with every parameter updated in fp32: 36 bytes each by this count */
    o.optimizer_s = c->optimizer_s_per_param > 0 ? c->optimizer_s_per_param * optimizer_nbytes / 36
                                                 : optimizer_nbytes / c->mem_bw;

    /* the pipeline: per micro-batch and chunk a GPU sends its T d activation to the next virtual stage and its
     * gradient back (none before the first or after the last; every middle GPU sends 2 m V), each a latency and
     * its bytes over the link to its peer, W / pp ranks away: across nodes whenever there are several. Then the
     * bubble: every stage idles (pp - 1)/(V m) of the pipelined time (plan/pipeline.h), that time being what runs per
     * micro-batch (compute, all-to-all, control, these sends), not the step's gradient sums and optimizer */
    /* tensor parallelism with sequence parallelism: per micro-batch, around each block whose weights it splits (every
     * layer's attention, a dense FFN; an MoE layer takes its GPU's T/tp tokens as they are) the group all-gathers the
     * tokens before and reduce-scatters after, forward, and the reverse in backward: 4 collectives, each moving
     * (tp - 1)/tp of the group's T d values per GPU in tp - 1 steps over NVLink. The vocabulary-split ends add 2 each
     * (the embedding's output reduce-scattered, the final norm's gathered for lm_head). Recomputation runs the forward
     * collectives of what it rebuilds again: the attention block's all-gather (attention), a dense FFN's (moe), and
     * under full also o_proj's reduce-scatter. The q/k norms add all-to-alls (models/attention.c), each of q's and of
     * k's moving (tp - 1)/tp of a GPU's [T, its columns] (A/tp of q, max(B/tp, head_dim) of k: with fewer kv heads
     * than tp a kv head's first holder sends its head_dim columns, the others nothing): the whole projection's
     * (OLMoE's) there and back in forward (again under recompute) and in backward (dy there, dx back); each head's
     * (Qwen3's) x and dy there in backward (and each head's 1 / rms, head_dim times fewer: not counted). Multi-head
     * latent attention (models/mla.c) moves its latents instead of ln1: forward gathers [rmsnorm(c) | k_pe] (KL + dr
     * values a token) and q's latent (QL; without one ln1, d), reduce-scatters o_proj's output (d); backward gathers
     * dy (d), sums the input gradients of kv_b (KL), of q_b (QL, or q_proj's d) and the shared key's (dr), and
     * gathers the two latents again (KL, QL or d), the sums counted as the others are; recomputation repeats the two
     * forward gathers. */
    if (tp > 1) {
        const double L = (double)stage.layers, dense_ffn = (double)(stage.layers - stage.moe_layers), d = m->d_model;
        double attention[2] = {4, 4 * d}, rebuilt[2] = {1, d}; /* per layer: collectives, values a token */
        if (m->kv_lora_rank > 0) {
            const double KL = (double)m->kv_lora_rank, dr = (double)m->qk_rope_dim,
                         Q = m->q_lora_rank ? (double)m->q_lora_rank : d;
            attention[0] = 9, attention[1] = (KL + dr + Q + d) + (d + KL + Q + dr) + (KL + Q);
            rebuilt[0] = 2, rebuilt[1] = KL + dr + Q;
        }
        double per_micro = L * attention[0] + 4 * dense_ffn + 2 * (stage.embedding + stage.head),
               width = L * attention[1] + (4 * dense_ffn + 2 * (stage.embedding + stage.head)) * d;
        if (l->recompute >= MOE_RECOMPUTE_ATTENTION) per_micro += L * rebuilt[0], width += L * rebuilt[1];
        if (l->recompute >= MOE_RECOMPUTE_MOE) per_micro += dense_ffn, width += dense_ffn * d;
        if (l->recompute == MOE_RECOMPUTE_FULL) per_micro += L, width += L * d;
        const double nbytes = (double)(tp - 1) / (double)tp * T * width * row; /* a micro-batch's */
        o.tp_bytes = micro * nbytes;
        o.tp_s = micro * (per_micro * (double)(tp - 1) * c->intra_latency + nbytes / c->intra_bw);
        const double hd = (double)m->head_dim, kv = (double)m->num_kv_heads * hd / (double)tp;
        const double qk_nbytes = (double)(tp - 1) / (double)tp * T * row *
                                 ((double)m->num_heads * hd / (double)tp + (kv > hd ? kv : hd)); /* q's and k's */
        const double qk_moves = L * (m->qk_norm == MOE_QK_NORM_PROJECTION
                                         ? 4 + 2 * (l->recompute >= MOE_RECOMPUTE_ATTENTION)
                                         : m->qk_norm == MOE_QK_NORM_HEAD ? 2 : 0);
        o.tp_bytes += qk_moves * micro * qk_nbytes;
        o.tp_s += qk_moves * micro * (2 * (double)(tp - 1) * c->intra_latency + qk_nbytes / c->intra_bw);
    }

    if (pp > 1) {
        const double V = (double)moe_plan_layout_virtual_stages(l), sends = 2 * micro * V;
        const double nbytes = T / (double)tp * (double)m->d_model * row; /* this GPU's tokens */
        o.pipeline_spans_nodes = c->nodes > 1;
        o.p2p_bytes = sends * nbytes;
        o.p2p_s = sends * (o.pipeline_spans_nodes ? c->inter_latency + nbytes / c->inter_bw
                                                  : c->intra_latency + nbytes / c->intra_bw);
        o.bubble_fraction = moe_plan_pipeline_bubble(l, o.accum_steps);
        o.bubble_s = o.bubble_fraction * (o.compute_s + o.alltoall_s + o.control_s + o.tp_s + o.p2p_s);
    }
    const double comm = o.alltoall_s + o.control_s + o.tp_s + o.allreduce_s;
    o.step_serial_s = o.compute_s + o.optimizer_s + comm + o.p2p_s + o.bubble_s;
    const double pipelined_comm = o.alltoall_s + o.control_s + o.tp_s + o.p2p_s; /* overlapped: the bubble of the longer */
    const double hidden = o.compute_s > comm + o.p2p_s ? o.compute_s : comm + o.p2p_s;
    o.step_overlap_s = hidden + o.optimizer_s +
                       o.bubble_fraction * (o.compute_s > pipelined_comm ? o.compute_s : pipelined_comm);
    o.tokens_per_s_serial = o.tokens_per_step / o.step_serial_s;
    o.tokens_per_s_overlap = o.tokens_per_step / o.step_overlap_s;
    const double peak = (double)W * c->gpu_flops;
    o.mfu_serial = o.tokens_per_s_serial * o.flops_per_token / peak;
    o.mfu_overlap = o.tokens_per_s_overlap * o.flops_per_token / peak;
    return o;
}
