/* trainer.c — data, one training step, evaluation and sampling over the model on one rank. */
#include "train/trainer.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/fail.h"
#include "core/rng.h"
#include "train/output_paths.h"
#include "models/zero.h"

/* With shards (cfg.moe.num_shards) every sum over the batch goes through the shard tree (docs/DETERMINISM.md). */
static int world_invariant(const moe_trainer *t) { return moe_model_local_shards(t->model) > 0; }

/* A region of the parameter buffer as ZeRO shards it (models/zero.h): the dense region over the world, the expert
 * region over the expert-data-parallel group; without ZeRO a rank's range is the whole region. */
typedef struct {
    const moe_zero_region *r;
    size_t offset;     /* the region in the buffer                                        */
    size_t moments_at; /* where the range's moments start (the dense range's come first)   */
} zero_region;

static zero_region region_of(const moe_trainer *t, int expert) {
    const moe_zero_layout *z = moe_model_zero(t->model);
    if (!expert) return (zero_region){&z->dense, 0, 0};
    return (zero_region){&z->expert, moe_model_num_dense(t->model), z->dense.end - z->dense.begin};
}

/* --routing-trace-out / --routing-trace-in; every rank agrees on the outcome. */
static moe_status open_traces(moe_trainer *t) {
    const moe_train_options *o = &t->opt;
    const int tokens = o->batch * o->model.seq_len, E = o->model.moe.num_experts, k = o->model.moe.top_k;
    for (int l = 0; l < o->model.num_layers; l++) t->num_moe_layers += moe_model_layer_is_moe(&o->model, l);
    moe_status st = MOE_OK;
    if (*o->routing_trace_out || *o->routing_trace_in) {
        t->trace_ids = malloc((size_t)(t->num_moe_layers ? t->num_moe_layers : 1) * tokens * k * sizeof(int));
        if (!t->trace_ids) st = MOE_ERR_OUT_OF_MEMORY;
    }
    /* world rank 0 creates the trace; the first rank of every other pipeline stage then opens it to write its own
     * layers' records */
    if (st == MOE_OK && *o->routing_trace_out && t->ranks.world_rank == 0)
        st = moe_fail_context(moe_routing_trace_create(&t->trace_out, o->routing_trace_out, E, k, t->num_moe_layers,
                                                       tokens, o->micro_batches),
                              "cannot write the routing trace");
    st = moe_comm_agree(moe_parallel_world(t->par), st);
    if (st == MOE_OK && *o->routing_trace_out && t->ranks.world_rank != 0 && t->ranks.stage_rank == 0)
        st = moe_fail_context(moe_routing_trace_join(&t->trace_out, o->routing_trace_out, E, k, t->num_moe_layers,
                                                     tokens, o->micro_batches),
                              "cannot write the routing trace");
    if (st == MOE_OK && *o->routing_trace_in)
        st = moe_fail_context(moe_routing_trace_open(&t->trace_in, o->routing_trace_in, E, k, t->num_moe_layers,
                                                     tokens, o->micro_batches),
                              "bad routing trace");
    st = moe_comm_agree(moe_parallel_world(t->par), st);
    if (st != MOE_OK) moe_trainer_destroy(t);
    return st;
}

/* A fresh run id, made on world rank 0 and the same on every rank (collective). */
static moe_status make_run_id(moe_trainer *t) {
    moe_comm *world = moe_parallel_world(t->par);
    const int W = moe_comm_size(world);
    uint64_t mine = 0, id = 0;
    if (t->ranks.world_rank == 0) {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(&mine, sizeof mine, 1, f) != 1) { /* no entropy source: time and process */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            mine = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        }
        if (f) fclose(f);
    }
    size_t *nbytes = calloc((size_t)W, sizeof(size_t));
    if (!nbytes) return MOE_ERR_OUT_OF_MEMORY;
    nbytes[0] = sizeof mine;
    moe_status st = moe_comm_allgatherv_bytes(world, &mine, t->ranks.world_rank == 0 ? sizeof mine : 0, &id, nbytes);
    free(nbytes);
    snprintf(t->run_id, sizeof t->run_id, "%016llx", (unsigned long long)id);
    t->parent_run_id[0] = 0;
    return st;
}

/* This rank's pipeline stage of the model (every layer at --pp 1), with a pass for each forward its schedule keeps
 * in flight, and the runner of its schedule. */
static moe_status create_stage_model(moe_trainer *t, moe_runtime *rt) {
    const moe_train_options *o = &t->opt;
    const moe_pp_shape shape = {.stages = t->ranks.pp_size, .virtual_stages = o->virtual_stages,
                                .micro_batches = o->micro_batches};
    int passes;
    MOE_TRY(moe_stage_runner_passes(&shape, t->ranks.pp_rank, &passes));
    const moe_pipeline_split split = moe_train_pipeline_split(o);
    const moe_model_stage stage = moe_model_pipeline_stage(&o->model, &split, t->ranks.pp_rank, passes);
    moe_model_config mc = o->model;
    mc.zero = o->zero; /* the model lays out the ZeRO ranges and, at 2, its gradients */
    MOE_TRY(moe_model_create_stage(&mc, rt, t->par, &stage, t->local_seqs, o->micro_batches, &t->model));
    return moe_stage_runner_init(&t->runner, t->model, moe_parallel_pipeline(t->par), &shape,
                                 t->local_seqs * o->model.seq_len);
}

moe_status moe_trainer_create(moe_trainer *t, const moe_train_options *opt, moe_runtime *rt, const moe_parallel *par) {
    memset(t, 0, sizeof *t);
    t->opt = *opt;
    t->par = par;
    t->ranks = moe_parallel_ranks(par);
    const moe_model_config *m = &opt->model;
    struct timespec opening, opened;
    clock_gettime(CLOCK_MONOTONIC, &opening);
    /* --eval-only reads no training data (t->train NULL): a run from elsewhere needs no --train-data (a probe) */
    moe_status st =
        opt->eval_only ? MOE_OK : moe_token_data_open(opt->train_data, m->vocab_size, m->seq_len, &t->train);
    if (st == MOE_OK) st = moe_token_data_open(opt->val_data, m->vocab_size, m->seq_len, &t->val);
    clock_gettime(CLOCK_MONOTONIC, &opened);
    t->data_open_s = (double)(opened.tv_sec - opening.tv_sec) + (opened.tv_nsec - opening.tv_nsec) / 1e9;
    if (st == MOE_OK && moe_trainer_eval_sequences(t) < 1) /* each rank needs a distinct validation window */
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: %lld validation windows of %d + 1 tokens, fewer than the %d data-parallel "
                      "ranks (each reads its own)",
                      opt->val_data, (long long)moe_token_data_num_windows(t->val), m->seq_len, t->ranks.dp_size);
    t->order = (moe_data_order){.shuffle = opt->shuffle, .seed = (uint64_t)opt->seed};
    st = moe_fail_context(st, "bad data file");
    if (st == MOE_OK) st = moe_train_check_output_paths(opt, t->train, t->val);
    /* one rank's bad file stops every rank (the files may differ between nodes) */
    if ((st = moe_comm_agree(moe_parallel_world(par), st)) != MOE_OK) return moe_trainer_destroy(t), st;
    t->local_seqs = opt->batch / t->ranks.dp_size; /* a tensor group's sequences (a rank's at tp 1) */
    t->inputs = calloc((size_t)t->local_seqs * m->seq_len, sizeof(int));
    t->targets = calloc((size_t)t->local_seqs * m->seq_len, sizeof(int));
    t->step_tokens = calloc((size_t)2 * opt->micro_batches * t->local_seqs * m->seq_len, sizeof(int));
    t->next_tokens = calloc((size_t)2 * opt->micro_batches * t->local_seqs * m->seq_len, sizeof(int));
    t->mb_loss = calloc(opt->micro_batches, sizeof(double));
    t->layer_terms = calloc((size_t)opt->micro_batches * m->num_layers * 2, sizeof(double));
    if (!t->inputs || !t->targets || !t->step_tokens || !t->next_tokens || !t->mb_loss || !t->layer_terms) return moe_trainer_destroy(t), MOE_ERR_OUT_OF_MEMORY;
    if ((st = create_stage_model(t, rt)) != MOE_OK) return moe_trainer_destroy(t), st;
    if ((st = moe_model_init_weights(t->model, (unsigned long long)opt->seed)) != MOE_OK)
        return moe_trainer_destroy(t), st;
    const size_t dense = moe_model_num_dense(t->model);
    const moe_zero_layout *z = moe_model_zero(t->model);
    const size_t n = (z->dense.end - z->dense.begin) + (z->expert.end - z->expert.begin);
    moe_runtime *model_rt = moe_model_runtime(t->model); /* the moments live beside the parameters */
    st = moe_runtime_alloc(model_rt, (n ? n : 1) * sizeof(moe_real), (void **)&t->moment1);
    if (st == MOE_OK) st = moe_runtime_alloc(model_rt, (n ? n : 1) * sizeof(moe_real), (void **)&t->moment2);
    if (st == MOE_OK && world_invariant(t) && opt->micro_batches > 1 && opt->zero < 2) /* ZeRO-2: the model's shard */
        st = moe_runtime_alloc(model_rt, (dense + moe_model_num_expert(t->model)) * sizeof(moe_real),
                               (void **)&t->grad_accum);
    if (st != MOE_OK) return moe_trainer_destroy(t), st;
    t->schedule = (moe_lr_schedule){opt->lr, opt->min_lr, opt->warmup, opt->steps};
    if ((st = make_run_id(t)) != MOE_OK) return moe_trainer_destroy(t), st;
    return open_traces(t);
}

void moe_trainer_destroy(moe_trainer *t) {
    if (t->model) { /* the moments are the model runtime's memory: freed before it */
        moe_runtime_free(moe_model_runtime(t->model), t->moment1);
        moe_runtime_free(moe_model_runtime(t->model), t->moment2);
        moe_runtime_free(moe_model_runtime(t->model), t->grad_accum);
    }
    moe_batch_prefetch_wait(&t->prefetch); /* a read still in flight writes into next_tokens */
    moe_stage_runner_free(&t->runner);
    moe_model_destroy(t->model);
    moe_token_data_close(t->train);
    moe_token_data_close(t->val);
    moe_routing_trace_close(&t->trace_out);
    moe_routing_trace_close(&t->trace_in);
    free(t->data_meta_text);
    free(t->inputs), free(t->targets), free(t->step_tokens), free(t->next_tokens), free(t->trace_ids), free(t->mb_loss), free(t->layer_terms);
    memset(t, 0, sizeof *t);
}

moe_trainer_shape moe_trainer_shape_of(const moe_trainer *t) {
    return (moe_trainer_shape){.config = &t->opt.model, .batch = t->opt.batch, .micro_batches = t->opt.micro_batches,
                               .pp = t->opt.pp, .virtual_stages = t->opt.virtual_stages};
}

moe_status moe_trainer_create_reference(moe_trainer *ref, const moe_trainer *run, const moe_parallel *par) {
    moe_train_options o = run->opt;
    o.model.moe.precision = MOE_PRECISION_FP32;
    o.routing_trace_out = ""; /* the run records; the reference replays what the run replays */
    return moe_trainer_create(ref, &o, NULL, par);
}

/* Copies count reals from the model's memory (device memory on a GPU runtime) to the host. */
static moe_status download(const moe_trainer *t, moe_real *host, const moe_real *src, size_t count) {
    return moe_runtime_download(moe_model_runtime(t->model), host, src, count * sizeof(moe_real));
}
static moe_status upload(const moe_trainer *t, moe_real *dst, const moe_real *host, size_t count) {
    return moe_runtime_upload(moe_model_runtime(t->model), dst, host, count * sizeof(moe_real));
}

/* Reverses values [lo, hi) of a, in place. */
static void reverse(moe_real *a, size_t lo, size_t hi) {
    for (; hi > lo + 1; lo++, hi--) {
        const moe_real v = a[lo];
        a[lo] = a[hi - 1], a[hi - 1] = v;
    }
}

/* buf holds W blocks back to back in member order, member p's of nbytes[p] bytes; reorders them in place by at[p]
 * (their places, distinct where not empty): each next block rotated to the end of the ordered prefix (three
 * reversals; W rotations of at most the buffer: only at a checkpoint, and no second buffer). order[] is scratch. */
static void order_blocks(moe_real *buf, const size_t *at, const size_t *nbytes, int W, int *order) {
    for (int p = 0; p < W; p++) order[p] = p; /* the blocks as they lie */
    size_t done = 0;                          /* values of the ordered prefix */
    for (int k = 0; k < W; k++) {
        int best = k;
        for (int i = k + 1; i < W; i++) best = at[order[i]] < at[order[best]] ? i : best;
        size_t start = done; /* where the chosen block lies now */
        for (int i = k; i < best; i++) start += nbytes[order[i]] / sizeof(moe_real);
        const size_t n = nbytes[order[best]] / sizeof(moe_real);
        reverse(buf, done, start), reverse(buf, start, start + n), reverse(buf, done, start + n);
        const int chosen = order[best];
        for (int i = best; i > k; i--) order[i] = order[i - 1];
        order[k] = chosen, done += n;
    }
}

/* Values [from, end) of region z (from this rank's range: `mine`, in the model's memory) of every member, into
 * dst[0 .. end - from) on the host (collective over z's group). The members' ranges are whole atoms in the tree's
 * order, not in rank order (models/zero.h): gathered in rank order, then put in place (order_blocks). */
static moe_status gather_range(moe_trainer *t, const zero_region *z, const moe_real *mine, size_t from, size_t end,
                               moe_real *dst) {
    const moe_zero_layout *layout = moe_model_zero(t->model);
    const moe_zero_region *r = z->r;
    const int W = moe_comm_size(r->group), me = moe_comm_rank(r->group);
    size_t *nbytes = calloc(W, sizeof(size_t)), *at = calloc(W, sizeof(size_t)), lo, hi;
    int *order = calloc(W, sizeof(int));
    moe_status st = nbytes && at && order ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < W && st == MOE_OK; p++) { /* member p's overlap [at[p], at[p] + nbytes[p]) */
        moe_zero_member_range(layout, r, p, &lo, &hi);
        lo = lo > from ? lo : from, hi = hi < end ? hi : end;
        at[p] = lo, nbytes[p] = hi > lo ? (hi - lo) * sizeof(moe_real) : 0;
    }
    moe_real *piece = st == MOE_OK ? malloc(nbytes[me] ? nbytes[me] : 1) : NULL; /* send and receive may not overlap */
    if (st == MOE_OK && !piece) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && nbytes[me]) st = download(t, piece, mine + (at[me] - r->begin), nbytes[me] / sizeof(moe_real));
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(r->group, piece, nbytes[me], dst, nbytes);
    if (st == MOE_OK) order_blocks(dst, at, nbytes, W, order);
    free(nbytes), free(at), free(order), free(piece);
    return st;
}

/* After a ZeRO update: every member's updated range of each region into every member's parameters, in place (the
 * fixed tree's all-gather: the ranges are its reduce-scatter's). */
static moe_status gather_updated_params(moe_trainer *t) {
    moe_real *params = moe_model_params(t->model);
    for (int expert = 0; expert <= 1; expert++) {
        const zero_region z = region_of(t, expert);
        MOE_TRY(moe_comm_allgather_tree_real(z.r->group, params + z.offset, &z.r->part, 0, z.r->part.count));
    }
    return MOE_OK;
}

moe_status moe_trainer_moments_gather(moe_trainer *t, int which, moe_real *full) {
    const moe_real *moments = which ? t->moment2 : t->moment1;
    for (int expert = 0; expert <= 1; expert++) {
        const zero_region z = region_of(t, expert);
        MOE_TRY(t->opt.zero ? gather_range(t, &z, moments + z.moments_at, 0, z.r->part.count, full + z.offset)
                            : download(t, full + z.offset, moments + z.moments_at, z.r->part.count));
    }
    return MOE_OK;
}

moe_status moe_trainer_moment_range(moe_trainer *t, int which, size_t offset, size_t count, moe_real *dst) {
    const moe_real *moments = which ? t->moment2 : t->moment1;
    const zero_region z = region_of(t, offset >= moe_model_num_dense(t->model));
    const size_t from = offset - z.offset; /* in the region */
    if (!t->opt.zero) return download(t, dst, moments + z.moments_at + from, count);
    return gather_range(t, &z, moments + z.moments_at, from, from + count, dst);
}

moe_status moe_trainer_moment_range_set(moe_trainer *t, int which, size_t offset, size_t count, const moe_real *src) {
    moe_real *moments = which ? t->moment2 : t->moment1;
    const zero_region z = region_of(t, offset >= moe_model_num_dense(t->model));
    const size_t from = offset - z.offset, end = from + count; /* in the region */
    const size_t a = z.r->begin > from ? z.r->begin : from, b = z.r->end < end ? z.r->end : end;
    return b > a ? upload(t, moments + z.moments_at + (a - z.r->begin), src + (a - from), b - a) : MOE_OK;
}

/* Routing statistics of micro-batch mb (its pass selected), this stage's MoE layers: per-rank drops, added into
 * *dropped and *assignments; global counts into r; the aux and z losses into t->layer_terms (added up by
 * sum_over_stages). */
static void add_routing_stats(const moe_trainer *t, moe_step_result *r, int mb, double *dropped, double *assignments) {
    const moe_model_config *m = &t->opt.model;
    for (int l = 0; l < m->num_layers; l++) {
        const moe_layer_stats *ls = moe_model_layer_stats(t->model, l); /* NULL: dense, or another stage's */
        if (!ls) continue;
        double *terms = t->layer_terms + ((size_t)mb * m->num_layers + l) * 2;
        terms[0] = ls->aux_loss, terms[1] = ls->z_loss;
        *dropped += ls->num_dropped, *assignments += ls->num_assignments;
        for (int e = 0; e < m->moe.num_experts; e++)
            r->expert_tokens[l * m->moe.num_experts + e] += ls->num_selected_per_expert[e];
    }
}

/* The global routing choices of one micro-batch, every MoE layer: [num_moe_layers][global tokens * k]. */
static size_t micro_batch_routes(const moe_trainer *t) {
    return (size_t)t->num_moe_layers * t->opt.batch * t->opt.model.seq_len * t->opt.model.moe.top_k;
}

/* The MoE layers a forward of chunk `chunk` of this rank's model runs: model layers [begin, end), the first of
 * them MoE layer *first of the whole model (the trace's and ids' numbering); returns how many. One chunk: every
 * layer this rank holds. */
static int chunk_moe_layers(const moe_trainer *t, int chunk, int *begin, int *end, int *first) {
    const moe_model_stage *s = moe_model_stage_of(t->model);
    *begin = s->first_layer + chunk * s->chunk_stride, *end = *begin + s->num_layers, *first = 0;
    int count = 0;
    for (int l = 0; l < *end; l++) {
        const int moe = moe_model_layer_is_moe(&t->opt.model, l);
        if (l < *begin) *first += moe;
        else count += moe;
    }
    return count;
}

/* Forces the routing of the chunk's MoE layers in the next forward from ids (one micro-batch's global choices of
 * every MoE layer of the model; this rank takes its tokens' slice). The array must stay as it is until then. */
static moe_status force_routing(moe_trainer *t, const int *ids, int chunk) {
    const size_t per_layer = micro_batch_routes(t) / (t->num_moe_layers ? t->num_moe_layers : 1);
    /* this rank's tokens: its slice of its tensor group's (models/model.h), the stage's slices in rank order */
    const size_t tokens = (size_t)t->local_seqs * t->opt.model.seq_len / t->ranks.tp_size;
    const size_t first = (size_t)t->ranks.stage_rank * tokens * t->opt.model.moe.top_k;
    int begin, end, i;
    chunk_moe_layers(t, chunk, &begin, &end, &i);
    for (int l = begin; l < end; l++) {
        moe_layer *layer = moe_model_moe_layer(t->model, l);
        if (layer) MOE_TRY(moe_layer_force_routing(layer, ids + (size_t)i++ * per_layer + first));
    }
    return MOE_OK;
}

/* The global routing of the chunk's MoE layers in the last forward into their places of ids, on every rank of the
 * stage (collective over it). */
static moe_status gather_routing(moe_trainer *t, int *ids, int chunk) {
    const size_t per_layer = micro_batch_routes(t) / (t->num_moe_layers ? t->num_moe_layers : 1);
    int begin, end, i;
    chunk_moe_layers(t, chunk, &begin, &end, &i);
    for (int l = begin; l < end; l++) {
        moe_layer *layer = moe_model_moe_layer(t->model, l);
        int tokens;
        if (layer) MOE_TRY(moe_layer_gather_routing(layer, ids + (size_t)i++ * per_layer, &tokens));
    }
    return MOE_OK;
}

/* Forces the chunk's routing of this micro-batch from the trace. A bad record has been reported on every rank of
 * the stage alike: they read the same file. */
static moe_status replay_routing(moe_trainer *t, int step, int mb, int chunk) {
    const size_t per_layer = micro_batch_routes(t) / (t->num_moe_layers ? t->num_moe_layers : 1);
    int begin, end, first;
    const int count = chunk_moe_layers(t, chunk, &begin, &end, &first);
    for (int i = first; i < first + count; i++)
        MOE_TRY(moe_fail_context(moe_routing_trace_read(&t->trace_in, step, mb, i, t->trace_ids + (size_t)i * per_layer),
                                 "routing replay"));
    return force_routing(t, t->trace_ids, chunk);
}

/* The chunk's global routing of this micro-batch, gathered over the stage (collective); the stage's first rank
 * writes its records into the trace (every stage its own layers'). A failed write is kept in t->output_error (the
 * other ranks are in the step: failing it here would leave them waiting), and the trace is written no further. */
static moe_status record_routing(moe_trainer *t, int step, int mb, int chunk) {
    const size_t per_layer = micro_batch_routes(t) / (t->num_moe_layers ? t->num_moe_layers : 1);
    int begin, end, first;
    const int count = chunk_moe_layers(t, chunk, &begin, &end, &first);
    MOE_TRY(gather_routing(t, t->trace_ids, chunk));
    for (int i = first; i < first + count && t->trace_out.file && !t->output_error[0]; i++) {
        moe_status st = moe_routing_trace_write(&t->trace_out, step, mb, i, t->trace_ids + (size_t)i * per_layer);
        if (st == MOE_OK) continue;
        if (st == MOE_ERR_OUT_OF_MEMORY) return st;
        snprintf(t->output_error, sizeof t->output_error, "the routing trace: %s", moe_failure_message(st));
    }
    return MOE_OK;
}

/* With shards (cfg.moe.num_shards): each micro-batch's gradients are summed over the ranks on their own, in the
 * tree, and added into the step's in micro-batch order (an order no world size changes); the step's sum is kept
 * in t->grad_accum while the next micro-batch's backward fills the model's buffer. Chunk by chunk (an interleaved
 * schedule runs a micro-batch's chunks at different times): every value belongs to one chunk. */
static moe_status accumulate_chunk(moe_trainer *t, int mb, int chunk) {
    moe_model *m = t->model;
    MOE_TRY(moe_model_reduce_chunk_grads(m, chunk));
    if (t->opt.micro_batches == 1) return MOE_OK;
    size_t from[2], count[2];
    moe_model_chunk_slices(m, chunk, &from[0], &count[0], &from[1], &count[1]);
    from[1] += moe_model_num_dense(m); /* the expert region follows the dense one */
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    for (int i = 0; i < 2; i++) {
        moe_real *sum = t->grad_accum + from[i], *g = moe_model_grads(m) + from[i];
        if (mb == 0) MOE_TRY(moe_runtime_copy(moe_model_runtime(m), sum, g, count[i] * sizeof(moe_real)));
        else MOE_TRY(dense->add(s, sum, g, count[i], sum));
    }
    return MOE_OK;
}

/* One step's micro-batches as the schedule runs them: the runner's hooks' context. */
typedef struct {
    moe_trainer *t;
    int step, record;
    moe_step_result *r; /* NULL: no statistics (a checked re-run) */
    double *sums;       /* [3]: loss, dropped, assignments */
} step_run;

static moe_status before_forward(void *ctx, int mb, int chunk, const int **inputs, const int **targets) {
    step_run *run = ctx;
    moe_trainer *t = run->t;
    const moe_train_options *o = &t->opt;
    const size_t each = (size_t)t->local_seqs * o->model.seq_len;
    memcpy(t->inputs, t->step_tokens + mb * each, each * sizeof(int));
    memcpy(t->targets, t->step_tokens + (o->micro_batches + mb) * each, each * sizeof(int));
    *inputs = t->inputs, *targets = t->targets;
    if (t->routing_replay) return force_routing(t, t->routing_replay + mb * micro_batch_routes(t), chunk);
    if (t->trace_in.file) return replay_routing(t, run->step, mb, chunk);
    return MOE_OK;
}

/* The loss comes from the head's chunk: with shards summed over the stage per micro-batch, as the gradients are. */
static moe_status after_forward(void *ctx, int mb, int chunk, double loss_sum) {
    step_run *run = ctx;
    moe_trainer *t = run->t;
    if (moe_model_chunk_heads(t->model, chunk)) {
        if (world_invariant(t)) MOE_TRY(moe_comm_allreduce_tree_f64(moe_parallel_stage(t->par), &loss_sum, 1));
        t->mb_loss[mb] = loss_sum;
    }
    if (run->record && *t->opt.routing_trace_out) MOE_TRY(record_routing(t, run->step, mb, chunk));
    if (t->routing_record) MOE_TRY(gather_routing(t, t->routing_record + mb * micro_batch_routes(t), chunk));
    return MOE_OK;
}

static moe_status before_backward(void *ctx, int mb, int chunk) {
    step_run *run = ctx;
    moe_trainer *t = run->t;
    if (world_invariant(t) && mb > 0 && t->opt.zero < 2) /* each micro-batch summed on its own; ZeRO-2: per layer */
        return moe_model_zero_chunk_grads(t->model, chunk);
    return MOE_OK;
}

/* The chunk's statistics of the micro-batch (this rank's drops into sums, the routing's into r, its MoE layers' aux
 * and z losses into t->layer_terms); with shards its gradients summed (accumulate_chunk). */
static moe_status after_backward(void *ctx, int mb, int chunk) {
    step_run *run = ctx;
    moe_trainer *t = run->t;
    if (run->r) add_routing_stats(t, run->r, mb, &run->sums[1], &run->sums[2]);
    if (world_invariant(t) && t->opt.zero < 2) MOE_TRY(accumulate_chunk(t, mb, chunk)); /* ZeRO-2: in backward */
    return MOE_OK;
}

/* The micro-batches of a step, run by this stage's schedule (models/stage_runner.h): forward and backward of each,
 * the loss sum (with shards already summed over the stage per micro-batch, as the gradients are: accumulate_chunk)
 * and this rank's drop counts into sums [loss, dropped, assignments]. The gradients accumulate into the model's
 * buffer (zeroed first). */
static moe_status run_micro_batches(moe_trainer *t, int step, int record, moe_step_result *r, double sums[3]) {
    const moe_train_options *o = &t->opt;
    const moe_real scale = (moe_real)(1.0 / ((double)o->batch * o->micro_batches * o->model.seq_len)); /* the mean */
    moe_model *m = t->model;
    MOE_TRY(moe_model_zero_grads(m));
    memset(t->layer_terms, 0, (size_t)o->micro_batches * o->model.num_layers * 2 * sizeof(double));
    memset(t->mb_loss, 0, (size_t)o->micro_batches * sizeof(double));
    step_run run = {t, step, record, r, sums};
    const moe_stage_hooks hooks = {&run, before_forward, after_forward, before_backward, after_backward};
    MOE_TRY(moe_stage_runner_step(&t->runner, &hooks, t->local_seqs, scale));
    for (int mb = 0; mb < o->micro_batches; mb++) sums[0] += t->mb_loss[mb]; /* in micro-batch order */
    if (world_invariant(t) && o->micro_batches > 1 && o->zero < 2) {
        const size_t count = moe_model_num_dense(m) + moe_model_num_expert(m);
        MOE_TRY(moe_runtime_copy(moe_model_runtime(m), moe_model_grads(m), t->grad_accum, count * sizeof(moe_real)));
    }
    return moe_model_finish_tied_grads(m); /* a tied lm_head's gradient, summed apart over the step */
}

/* The step's statistics over the pipeline's stages (each holds some layers; the last the loss): every value is one
 * stage's, or an integer count, so the sum is exact in any order; then the aux and z losses added in (micro-batch,
 * layer) order, as one stage would. Collective over the pipeline. */
static moe_status sum_over_stages(moe_trainer *t, moe_step_result *r, double sums[3]) {
    const moe_train_options *o = &t->opt;
    const int L = o->model.num_layers, E = o->model.moe.num_experts;
    const size_t terms = (size_t)o->micro_batches * L * 2, tokens = (size_t)L * E;
    moe_comm *pipeline = moe_parallel_pipeline(t->par);
    MOE_TRY(moe_comm_allreduce_sum_f64(pipeline, sums, 3));
    MOE_TRY(moe_comm_allreduce_sum_f64(pipeline, t->layer_terms, terms));
    MOE_TRY(moe_comm_allreduce_sum_f64(pipeline, r->expert_tokens, tokens));
    for (size_t i = 0; i < terms; i += 2) r->aux += t->layer_terms[i], r->z += t->layer_terms[i + 1];
    return MOE_OK;
}

/* ---- the non-finite guard ---- */

/* What a rank found, by rank of evidence: the weights themselves, the op a checked re-run named, a router
 * logit that ended the re-run, the gradients as the step left them. */
typedef enum { FOUND_NOTHING, FOUND_IN_WEIGHTS, FOUND_IN_OP, FOUND_IN_ROUTER, FOUND_IN_GRADIENTS } finding_kind;

typedef struct {
    int kind;   /* finding_kind */
    long order; /* FOUND_IN_OP: the looks of the checked run before it (the same sequence on every rank) */
    char where[1000];
} finding_record;

/* The first finding of all ranks (by kind, then order, then world rank) into *best, on every rank
 * (collective: an all-gather of one record per rank, only after a step went bad). */
static moe_status share_first_finding(moe_comm *world, const finding_record *mine, finding_record *best) {
    const int W = moe_comm_size(world);
    finding_record *all = malloc((size_t)W * sizeof *all);
    size_t *nbytes = malloc((size_t)W * sizeof(size_t));
    if (!all || !nbytes) return free(all), free(nbytes), MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < W; p++) nbytes[p] = sizeof *all;
    moe_status st = moe_comm_allgatherv_bytes(world, mine, sizeof *mine, all, nbytes);
    *best = (finding_record){FOUND_NOTHING, 0, ""};
    for (int p = 0; p < W && st == MOE_OK; p++) {
        const finding_record *r = &all[p];
        if (r->kind != FOUND_NOTHING && (best->kind == FOUND_NOTHING || r->kind < best->kind ||
                                         (r->kind == best->kind && r->order < best->order)))
            *best = *r;
    }
    best->where[sizeof best->where - 1] = 0;
    free(all), free(nbytes);
    return st;
}

/* Records a finding of `kind` when it ranks before what the rank holds. */
static void note(finding_record *r, finding_kind kind, long order, const char *where) {
    if (r->kind != FOUND_NOTHING && r->kind <= (int)kind) return;
    r->kind = kind, r->order = order;
    snprintf(r->where, sizeof r->where, "%s", where);
}

/* Why a step went non-finite, as the one message every rank returns (collective): where the weights hold a
 * NaN or Inf if they do; else the step run again with every op's output looked at (moe_model_set_checks),
 * naming the layer, op and expert of the first NaN or Inf; else the router logit that ended that run; else
 * the gradients as the step left them. */
static moe_status explain_nonfinite(moe_trainer *t, int step, double loss, double grad_norm) {
    finding_record mine = {FOUND_NOTHING, 0, ""}, first;
    char text[sizeof mine.where];
    moe_status st = moe_model_check_finite(t->model, moe_model_params(t->model), "the weights before the step");
    if (st == MOE_ERR_NONFINITE) note(&mine, FOUND_IN_WEIGHTS, 0, moe_failure_message(st));
    st = moe_model_check_range_grads_finite(t->model, "the gradients as the step left them");
    if (st == MOE_ERR_NONFINITE) {
        snprintf(text, sizeof text, "%s (a checked re-run of the step found no op that made it)",
                 moe_failure_message(st));
        note(&mine, FOUND_IN_GRADIENTS, 0, text);
    }
    moe_nonfinite_finding finding = {0};
    double sums[3] = {0, 0, 0};
    moe_model_set_checks(t->model, &finding);
    st = run_micro_batches(t, step, 0, NULL, sums); /* a non-finite router logit ends it on every rank alike */
    moe_model_set_checks(t->model, NULL);
    if (st != MOE_OK && st != MOE_ERR_NONFINITE)
        return moe_fail_context(st, "step %d, run again to find a non-finite value", step);
    if (finding.found) note(&mine, FOUND_IN_OP, finding.order, finding.where);
    if (st == MOE_ERR_NONFINITE) note(&mine, FOUND_IN_ROUTER, 0, moe_failure_message(st));
    MOE_TRY(share_first_finding(moe_parallel_world(t->par), &mine, &first));
    if (first.kind == FOUND_NOTHING)
        return moe_fail(MOE_ERR_NONFINITE, "step %d: loss %g, gradient norm %g, but neither the weights, the gradients "
                                           "nor a checked run of the step hold a NaN or Inf", step, loss, grad_norm);
    return moe_fail(MOE_ERR_NONFINITE, "step %d: a non-finite loss or gradient: %s", step, first.where);
}

/* After explain_nonfinite: the run stops with its status, or with --skip-nonfinite drops the step's gradients
 * (r->skipped = 1, the message stays recorded). */
static moe_status stop_or_skip(moe_trainer *t, moe_step_result *r, moe_status st) {
    if (st != MOE_ERR_NONFINITE || !t->opt.skip_nonfinite) return st;
    r->skipped = 1;
    return moe_model_zero_grads(t->model);
}

/* ---- the step ---- */

/* This rank's first sequence of each micro-batch of the step. */
static void step_firsts(const moe_trainer *t, int step, int64_t *firsts) {
    for (int mb = 0; mb < t->opt.micro_batches; mb++)
        firsts[mb] = moe_trainer_first_sequence(t, step, mb) + (int64_t)t->ranks.dp_rank * t->local_seqs;
}

/* The step's tokens into step_tokens: those the thread read for it while the step before computed, else read now;
 * then the next step's read started on the thread (train/batch_reader.h). A failure on any rank (a truncated shard,
 * a token outside the vocabulary) stops every rank here, before the step's exchanges begin. Collective. */
static moe_status load_step(moe_trainer *t, int step) {
    const moe_train_options *o = &t->opt;
    int64_t *firsts = malloc(2 * (size_t)o->micro_batches * sizeof(int64_t));
    if (!firsts) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st;
    const int ahead = t->next_step == step;
    t->step_loaded = t->next_step = 0;
    if (ahead) {
        st = moe_batch_prefetch_wait(&t->prefetch);
        int *swap = t->step_tokens;
        t->step_tokens = t->next_tokens, t->next_tokens = swap;
    } else {
        moe_batch_prefetch_wait(&t->prefetch); /* a read for another step (none in a run that goes step by step) */
        step_firsts(t, step, firsts);
        st = moe_batch_read(t->train, t->order, firsts, NULL, o->micro_batches, t->local_seqs, t->step_tokens);
    }
    st = moe_comm_agree(moe_parallel_world(t->par), moe_fail_context(st, "training data of step %d", step));
    if (st == MOE_OK) t->step_loaded = step;
    if (st == MOE_OK && step < o->steps) { /* the next step's read, and read-ahead advice for the one after */
        step_firsts(t, step + 1, firsts);
        step_firsts(t, step + 2, firsts + o->micro_batches);
        if (moe_batch_prefetch_start(&t->prefetch, t->train, t->order, firsts, firsts + o->micro_batches,
                                     o->micro_batches, t->local_seqs, t->next_tokens) == MOE_OK)
            t->next_step = step + 1;
        else moe_failure_clear(); /* no thread: the next step reads when it begins */
    }
    free(firsts);
    return st;
}

moe_status moe_trainer_compute(moe_trainer *t, int step, moe_step_result *r) {
    const moe_train_options *o = &t->opt;
    if (t->step_loaded != step) MOE_TRY(load_step(t, step));
    const moe_model_config *m = &o->model;
    const double step_tokens = (double)o->batch * o->micro_batches * m->seq_len;
    double sums[3] = {0, 0, 0}; /* loss, dropped, assignments: per rank */
    int num_moe = 0;
    for (int l = 0; l < m->num_layers; l++) num_moe += moe_model_layer_is_moe(m, l);
    memset(r->expert_tokens, 0, (size_t)m->num_layers * m->moe.num_experts * sizeof(double));
    r->aux = r->z = 0, r->skipped = 0;
    moe_status st = run_micro_batches(t, step, 1, r, sums);
    if (st == MOE_ERR_NONFINITE) { /* a router logit: every rank's forward ended */
        r->loss = r->grad_norm = NAN;
        return stop_or_skip(t, r, explain_nonfinite(t, step, NAN, NAN));
    }
    MOE_TRY(st);
    if (!world_invariant(t)) { /* else run_micro_batches summed the gradients and the loss per micro-batch */
        MOE_TRY(moe_model_reduce_grads(t->model));
        MOE_TRY(moe_comm_allreduce_sum_f64(moe_parallel_stage(t->par), sums, 3));
    } else { /* the drop counts: integers, exact in any order */
        MOE_TRY(moe_comm_allreduce_sum_f64(moe_parallel_stage(t->par), sums + 1, 2));
    }
    MOE_TRY(sum_over_stages(t, r, sums));
    double per = num_moe ? (double)num_moe * o->micro_batches : 1;
    r->loss = sums[0] / step_tokens;
    r->aux /= per, r->z /= per;
    r->drop_fraction = sums[2] > 0 ? sums[1] / sums[2] : 0;
    return MOE_OK;
}

moe_status moe_trainer_apply(moe_trainer *t, int step, moe_step_result *r) {
    const moe_train_options *o = &t->opt;
    r->lr = moe_lr_at(&t->schedule, step);
    if (r->skipped) return MOE_OK; /* compute dropped the step */
    MOE_TRY(moe_model_grad_norm(t->model, t->par, &r->grad_norm));
    /* agreed (one 8-byte all-reduce): a rank whose memory alone went bad must not apply while the others stop */
    moe_status st = moe_comm_agree(moe_parallel_world(t->par), isfinite(r->loss) && isfinite(r->grad_norm)
                                                                   ? MOE_OK
                                                                   : MOE_ERR_NONFINITE);
    if (st == MOE_ERR_NONFINITE || st == MOE_ERR_PEER)
        return stop_or_skip(t, r, explain_nonfinite(t, step, r->loss, r->grad_norm));
    MOE_TRY(st);
    const double clip_factor = moe_model_clip_factor(r->grad_norm, o->clip);
    /* A finite gradient whose squares pass fp32's range (an element above sqrt(FLT_MAX) ~ 1.8e19, possible only where
     * the applied norm is): AdamW's second moments would turn Inf and freeze those weights from then on, silently (a
     * probe, 2026-12-07, with --clip 0); stopped, or skipped, as a non-finite step. Every rank sees the same norm. */
    if (r->grad_norm * clip_factor > 0x1p63)
        return stop_or_skip(t, r, moe_fail(MOE_ERR_NONFINITE, "step %d: gradient norm %g%s: squares of its values "
                                           "could pass fp32's range and make AdamW's second moments Inf (--clip "
                                           "bounds it)", step, r->grad_norm * clip_factor,
                                           clip_factor < 1 ? " after clipping" : ""));
    const moe_adamw_params hp = {.lr = r->lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps,
                                 .weight_decay = o->weight_decay, .step = (long)t->optimizer_updates + 1,
                                 .clip_factor = clip_factor};
    MOE_TRY(moe_model_adamw_step(t->model, t->moment1, t->moment2, &hp));
    t->optimizer_updates++;
    if (o->zero) MOE_TRY(gather_updated_params(t));
    MOE_TRY(moe_model_sync_tied(t->model)); /* tied embeddings on a pipeline: the first stage's into the last's */
    MOE_TRY(moe_model_update_expert_bias(t->model, r->expert_tokens)); /* the step's counts, every micro-batch's */
    /* finite gradients can still overflow a weight: then the run stops before anything is saved */
    char what[96];
    snprintf(what, sizeof what, "the weights after the update of step %d", step);
    return moe_comm_agree(moe_parallel_world(t->par), moe_model_check_finite(t->model, moe_model_params(t->model), what));
}

moe_status moe_trainer_step(moe_trainer *t, int step, moe_step_result *r) {
    MOE_TRY(moe_trainer_compute(t, step, r));
    return moe_trainer_apply(t, step, r);
}

int64_t moe_trainer_first_sequence(const moe_trainer *t, int step, int mb) {
    const moe_train_options *o = &t->opt;
    return t->data_windows_done + ((int64_t)(step - 1 - t->data_step) * o->micro_batches + mb) * o->batch;
}

long moe_trainer_eval_wanted(const moe_trainer *t) {
    return (long)t->opt.eval_batches * t->opt.batch * t->opt.micro_batches;
}

long moe_trainer_eval_sequences(const moe_trainer *t) {
    const moe_train_options *o = &t->opt;
    const long windows = (long)moe_token_data_num_windows(t->val), want = moe_trainer_eval_wanted(t);
    const long n = windows < want ? windows : want, rest = n % o->batch;
    return n - rest + (rest - rest % t->ranks.dp_size); /* whole batches, then a multiple of a stage's data ranks */
}

/* A validation micro-batch whose forward a non-finite value ended, on every rank (a router logit, or its loss): where
 * the weights hold a NaN or Inf if they do; else the micro-batch run again with every op's output looked at names the
 * op where it began (the router was blamed for attention's overflow: a probe); else what ended the forward. */
static moe_status explain_validation_nonfinite(moe_trainer *t, int seqs, const char *seen) {
    finding_record mine = {FOUND_NOTHING, 0, ""}, first;
    note(&mine, FOUND_IN_ROUTER, 0, seen);
    moe_status st = moe_model_check_finite(t->model, moe_model_params(t->model), "the weights");
    if (st == MOE_ERR_NONFINITE) note(&mine, FOUND_IN_WEIGHTS, 0, moe_failure_message(st));
    moe_nonfinite_finding finding = {0};
    double s = 0;
    moe_model_set_checks(t->model, &finding);
    st = moe_stage_runner_forward(&t->runner, t->inputs, t->targets, seqs, &s, NULL);
    moe_model_set_checks(t->model, NULL);
    if (st != MOE_OK && st != MOE_ERR_NONFINITE) return moe_fail_context(st, "validation, run again to find a NaN");
    if (finding.found) note(&mine, FOUND_IN_OP, finding.order, finding.where);
    MOE_TRY(share_first_finding(moe_parallel_world(t->par), &mine, &first));
    return moe_fail(MOE_ERR_NONFINITE, "a non-finite value: %s", first.where);
}

moe_status moe_trainer_evaluate(moe_trainer *t, double *val_loss) {
    const moe_train_options *o = &t->opt;
    const long n = moe_trainer_eval_sequences(t);
    double loss_sum = 0;
    for (long first = 0; first < n; first += o->batch) { /* micro-batch of min(batch, n - first) sequences */
        const int seqs = (int)((n - first < o->batch ? n - first : o->batch) / t->ranks.dp_size);
        moe_status st = moe_token_data_sequences(t->val, (moe_data_order){0}, first + (long)t->ranks.dp_rank * seqs,
                                                 seqs, t->inputs, t->targets);
        st = moe_comm_agree(moe_parallel_world(t->par), moe_fail_context(st, "validation data"));
        if (st != MOE_OK) return st;
        double s = 0;
        st = moe_stage_runner_forward(&t->runner, t->inputs, t->targets, seqs, &s, NULL);
        /* under a pipeline a stage whose router stopped its forward leaves the next stages waiting for its activations:
         * no collective can follow, and the job ends with the failure, as before the checked re-run (a review,
         * 2026-12-08: the re-run's exchange hung until the watchdog) */
        if (st != MOE_OK && moe_comm_size(moe_parallel_pipeline(t->par)) > 1) return st;
        if (st == MOE_OK) { /* the loss, on the last stage: agreed (8 bytes) so that every rank looks again alike */
            st = moe_comm_agree(moe_parallel_world(t->par),
                                isfinite(s) ? MOE_OK : moe_fail(MOE_ERR_NONFINITE, "the loss is %g", s));
            if (st == MOE_ERR_PEER) st = moe_fail(MOE_ERR_NONFINITE, "another rank's loss is not finite");
        }
        if (st == MOE_ERR_NONFINITE) { /* a router logit ends the forward on every rank alike */
            char seen[1000];
            snprintf(seen, sizeof seen, "%s", moe_failure_message(st));
            return moe_fail_context(explain_validation_nonfinite(t, seqs, seen), "validation");
        }
        if (st != MOE_OK) return st;
        if (world_invariant(t)) MOE_TRY(moe_comm_allreduce_tree_f64(moe_parallel_stage(t->par), &s, 1));
        loss_sum += s;
    }
    if (!world_invariant(t)) MOE_TRY(moe_comm_allreduce_sum_f64(moe_parallel_stage(t->par), &loss_sum, 1));
    MOE_TRY(moe_comm_allreduce_sum_f64(moe_parallel_pipeline(t->par), &loss_sum, 1)); /* the last stage's: exact */
    *val_loss = loss_sum / ((double)n * o->model.seq_len);
    if (isfinite(*val_loss)) return MOE_OK;
    /* every rank has the same loss: all look for the cause together */
    moe_status st = moe_comm_agree(moe_parallel_world(t->par),
                                   moe_model_check_finite(t->model, moe_model_params(t->model), "the weights"));
    if (st == MOE_OK)
        st = moe_fail(MOE_ERR_NONFINITE, "the weights are finite: an op overflowed (a training step names which)");
    return moe_fail_context(st, "the validation loss is %g", *val_loss);
}

/* The logits [S, V] of one sequence of tokens (host), on every rank: the last stage's, shared over the pipeline; at
 * tp > 1 each rank's vocabulary block [S, V / tp] gathered over its tensor group and put in its columns. */
static moe_status sequence_logits(moe_trainer *t, const int *tokens, moe_real *logits) {
    double loss;
    const int tp = t->ranks.tp_size, S = t->opt.model.seq_len, w = t->opt.model.vocab_size / tp;
    const size_t each = (size_t)S * w * sizeof(moe_real);
    moe_real *block = tp > 1 ? malloc(each) : logits, *blocks = tp > 1 ? malloc(each * tp) : NULL;
    if (tp > 1 && (!block || !blocks)) return free(block), free(blocks), MOE_ERR_OUT_OF_MEMORY;
    /* dropless: every data-parallel rank forwards its copy of the one sequence, and a capacity over all the copies
     * made the text depend on the world size (a probe; with score priority, on the padding after the context too) */
    moe_model_set_dropless(t->model, 1);
    moe_status fst = moe_stage_runner_forward(&t->runner, tokens, NULL, 1, &loss, block);
    moe_model_set_dropless(t->model, 0);
    if (tp > 1) {
        /* every rank of the group takes part, failed or not */
        const moe_status gathered = moe_comm_allgather_bytes(moe_parallel_tensor(t->par), block, each, blocks);
        if (fst == MOE_OK) fst = gathered;
        for (int p = 0; fst == MOE_OK && p < tp; p++) /* block p: columns [p w, (p + 1) w) of every position */
            for (int i = 0; i < S; i++)
                memcpy(logits + (size_t)i * w * tp + (size_t)p * w, blocks + ((size_t)p * S + i) * w,
                       w * sizeof(moe_real));
        free(block), free(blocks);
    }
    MOE_TRY(fst);
    moe_comm *pipeline = moe_parallel_pipeline(t->par);
    const int P = moe_comm_size(pipeline), last = moe_comm_rank(pipeline) == P - 1;
    if (P == 1) return MOE_OK;
    const size_t count = (size_t)t->opt.model.seq_len * t->opt.model.vocab_size;
    size_t *nbytes = calloc(P, sizeof(size_t));
    moe_real *mine = last ? malloc(count * sizeof(moe_real)) : NULL; /* send and receive may not overlap */
    moe_status st = nbytes && (mine || !last) ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) {
        nbytes[P - 1] = count * sizeof(moe_real);
        if (last) memcpy(mine, logits, nbytes[P - 1]);
        st = moe_comm_allgatherv_bytes(pipeline, mine, last ? nbytes[P - 1] : 0, logits, nbytes);
    }
    free(nbytes), free(mine);
    return st;
}

moe_status moe_trainer_validation_logits(moe_trainer *t, moe_real *logits) {
    MOE_TRY(moe_comm_agree(moe_parallel_world(t->par),
                           moe_fail_context(moe_token_data_sequences(t->val, (moe_data_order){0}, 0, 1, t->inputs,
                                                                     t->targets), "validation data")));
    return sequence_logits(t, t->inputs, logits);
}

/* The context sits at the start of one sequence of S tokens; causal attention and dropless routing (sequence_logits)
 * make the padding after it irrelevant to the logits read at the last context position. */
moe_status moe_trainer_sample(moe_trainer *t, int *text, int *n_io, int max_n, float temperature,
                              unsigned long long seed, int (*stop)(void *arg), void *arg) {
    const int S = t->opt.model.seq_len, V = t->opt.model.vocab_size;
    moe_real *logits = malloc((size_t)S * V * sizeof(moe_real));
    if (!logits) return MOE_ERR_OUT_OF_MEMORY;
    moe_rng rng = moe_rng_seeded(seed);
    moe_status st = MOE_OK;
    int n = *n_io;
    while (n < max_n && st == MOE_OK && !(n > *n_io && stop && stop(arg))) {
        int start = n > S ? n - S : 0, len = n - start;
        for (int i = 0; i < S; i++) t->inputs[i] = i < len ? text[start + i] : 0;
        st = sequence_logits(t, t->inputs, logits);
        const moe_real *l = logits + (size_t)(len - 1) * V;
        int next = 0;
        if (temperature <= 0) {
            for (int v = 1; v < V; v++) next = l[v] > l[next] ? v : next;
        } else {
            double max = l[0], total = 0, u = (moe_rng_uniform(&rng) + 1) / 2, acc = 0;
            for (int v = 1; v < V; v++) max = fmax(max, l[v]);
            for (int v = 0; v < V; v++) total += exp((l[v] - max) / temperature);
            for (; next < V - 1; next++) {
                acc += exp((l[next] - max) / temperature) / total;
                if (acc > u) break;
            }
        }
        text[n++] = next;
    }
    free(logits);
    *n_io = n;
    return st;
}
