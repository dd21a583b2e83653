/* optimizer.c — schedule, grad norm, clipping and AdamW over the model's [dense | experts] buffer; the
 * arithmetic runs in the runtime's dense ops (moe/dense_ops.h). */
#include "models/optimizer.h"

#include <math.h>
#include <stdlib.h>

#include "core/fail.h"
#include "models/zero.h"

float moe_lr_at(const moe_lr_schedule *s, long step) {
    if (step <= s->warmup_steps) return s->lr * (float)step / (float)(s->warmup_steps > 0 ? s->warmup_steps : 1);
    long decay_steps = s->total_steps - s->warmup_steps;
    double progress = decay_steps > 0 ? (double)(step - s->warmup_steps) / decay_steps : 1.0;
    if (progress > 1) progress = 1;
    return (float)(s->min_lr + 0.5 * (s->lr - s->min_lr) * (1 + cos(M_PI * progress)));
}

/* sums[i] = the sum of squares of region r's atom i (models/zero.h): computed for the atoms of this rank's range from
 * g (that range's gradients), 0 for the others; with the region sharded over its group, added over it: an atom is
 * non-zero on its owner alone, so the sum is exact in any order. */
static moe_status atom_sums(moe_model *m, const moe_zero_region *r, const moe_real *g, double **out) {
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    const size_t n = moe_zero_num_atoms(r);
    double *sums = calloc(n, sizeof(double));
    size_t *bounds = malloc((n + 1) * sizeof(size_t));
    if (!sums || !bounds) return free(sums), free(bounds), MOE_ERR_OUT_OF_MEMORY;
    /* the atoms inside this rank's range are consecutive: their bounds one list, their sums one call */
    size_t first = n, count = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t a = moe_zero_atom_begin(r, i), b = moe_zero_atom_begin(r, i + 1);
        if (a < r->begin || b > r->end) continue;
        if (first == n) first = i, bounds[0] = a - r->begin;
        bounds[++count] = b - r->begin;
    }
    moe_status st = count ? dense->sum_squares(s, g, bounds, count, sums + first) : MOE_OK;
    free(bounds);
    if (st == MOE_OK && (r->begin > 0 || r->end < r->part.count)) st = moe_comm_allreduce_sum_f64(r->group, sums, n);
    if (st != MOE_OK) return free(sums), st;
    *out = sums;
    return MOE_OK;
}

/* The chunk (model.h) whose slice of a region holds value `at` of it (expert 0: dense, 1: experts). */
static int chunk_at(const moe_model *m, int expert, size_t at) {
    const int V = moe_model_stage_of(m)->chunks;
    for (int c = 0; c < V; c++) {
        size_t from[2], count[2];
        moe_model_chunk_slices(m, c, &from[0], &count[0], &from[1], &count[1]);
        if (at >= from[expert] && at < from[expert] + count[expert]) return c;
    }
    return V - 1;
}

/* Every local expert's sum of squares, its atoms added in table order (tensor by tensor: the atoms of its slice):
 * mine[moe_layer * E_local + e]; chunk[moe_layer]: the chunk holding that MoE layer. The expert region's atoms follow
 * the table, so one walk visits them in order. */
static moe_status expert_sums(moe_model *m, int *num_moe_layers, double **out, int **chunk) {
    const moe_zero_region *r = &moe_model_zero(m)->expert;
    const int local = moe_model_num_local_experts(m);
    const size_t dense = moe_model_num_dense(m);
    int count, layers = 0;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    for (int i = 0; i < count; i++)
        layers += t[i].experts && (i == 0 || !t[i - 1].experts || t[i - 1].layer != t[i].layer);
    double *atoms, *mine = calloc((size_t)(layers ? layers : 1) * local, sizeof(double));
    *chunk = calloc(layers ? layers : 1, sizeof(int));
    if (!mine || !*chunk) return free(mine), free(*chunk), MOE_ERR_OUT_OF_MEMORY;
    moe_status st = atom_sums(m, r, moe_model_range_grads(m, 1), &atoms);
    if (st != MOE_OK) return free(mine), free(*chunk), st;
    size_t k = 0; /* the next atom */
    for (int i = 0, ml = -1; i < count; i++) {
        if (!t[i].experts) continue;
        if (i == 0 || !t[i - 1].experts || t[i - 1].layer != t[i].layer) ml++;
        (*chunk)[ml] = chunk_at(m, 1, t[i].offset - dense);
        const size_t per_expert = t[i].count / local;
        for (int e = 0; e < local; e++)
            for (const size_t end = t[i].offset - dense + (e + 1) * per_expert; moe_zero_atom_begin(r, k) < end; k++)
                mine[ml * local + e] += atoms[k];
    }
    free(atoms);
    *num_moe_layers = layers;
    *out = mine;
    return MOE_OK;
}

/* A stage's terms of the norm, chunk by chunk: terms[0 .. n), counts[c] of them for chunk c, back to back. */
typedef struct {
    double *terms;
    size_t n, counts[MOE_MODEL_MAX_CHUNKS];
} chunk_terms;

/* Every stage's terms added to *total in the whole model's order — virtual stage v = c P + p is stage p's chunk c, and
 * the virtual stages hold consecutive pieces of the model — the same additions as one stage makes. Collective over the
 * pipeline (P stages of V chunks). */
static moe_status add_in_model_order(moe_comm *pipeline, int V, const chunk_terms *mine, double *total) {
    const int P = moe_comm_size(pipeline);
    size_t *counts = calloc((size_t)P * V, sizeof(size_t)), *nbytes = calloc(P, sizeof(size_t)), sum = 0;
    size_t *start = calloc(P, sizeof(size_t));
    moe_status st = counts && nbytes && start ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < P && st == MOE_OK; p++) nbytes[p] = V * sizeof(size_t);
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(pipeline, mine->counts, V * sizeof(size_t), counts, nbytes);
    for (int p = 0; p < P && st == MOE_OK; p++) {
        start[p] = sum, nbytes[p] = 0;
        for (int c = 0; c < V; c++) nbytes[p] += counts[p * V + c] * sizeof(double);
        sum += nbytes[p] / sizeof(double);
    }
    double *all = st == MOE_OK ? malloc((sum ? sum : 1) * sizeof(double)) : NULL;
    if (st == MOE_OK && !all) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(pipeline, mine->terms, mine->n * sizeof(double), all, nbytes);
    for (int v = 0; v < P * V && st == MOE_OK; v++) {
        const int p = v % P, c = v / P;
        size_t at = start[p];
        for (int k = 0; k < c; k++) at += counts[p * V + k];
        for (size_t i = 0; i < counts[p * V + c]; i++) *total += all[at + i];
    }
    free(counts), free(nbytes), free(start), free(all);
    return st;
}

/* The dense atoms' sums [moe_zero_num_atoms] without those of replica tensors (model.h: another stage counts them),
 * in order, counted per chunk. */
static void dense_terms(moe_model *m, const moe_zero_region *r, double *sums, chunk_terms *out) {
    int count;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    *out = (chunk_terms){.terms = sums};
    for (size_t i = 0; i < moe_zero_num_atoms(r); i++) {
        const size_t at = moe_zero_atom_begin(r, i); /* atoms never cross a tensor's start */
        int replica = 0;
        for (int k = 0; k < count && !replica; k++)
            replica = t[k].replica && at >= t[k].offset && at < t[k].offset + t[k].count;
        if (replica || at >= r->part.count) continue; /* an empty region's one atom too */
        sums[out->n++] = sums[i];
        out->counts[chunk_at(m, 0, at)]++;
    }
}

static size_t num_atoms(size_t n) { return n ? (n + moe_zero_atom_values() - 1) / moe_zero_atom_values() : 0; }

/* The sums of squares of n values from g, in atoms from its start (one call), appended at terms[*k]. */
static moe_status atoms_of(moe_model *m, const moe_real *g, size_t n, double *terms, size_t *k) {
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    const size_t atom = moe_zero_atom_values(), count = num_atoms(n);
    if (!count) return MOE_OK;
    size_t *bounds = malloc((count + 1) * sizeof(size_t));
    if (!bounds) return MOE_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i <= count; i++) bounds[i] = i < count ? i * atom : n;
    const moe_status st = dense->sum_squares(s, g, bounds, count, terms + *k);
    free(bounds);
    *k += count;
    return st;
}

/* The pieces of a dense tensor's gradient that this rank adds to the norm: how many, the values of each, and the
 * first one's place in its block. A split tensor's block holds S / parts pieces; with tp / parts ranks holding it (k
 * and v with fewer kv heads than tp) each adds those of its place in the group, so that the group's lists hold every
 * piece once, in order. */
typedef struct {
    size_t pieces, per, first;
} norm_pieces;

static norm_pieces pieces_of(const moe_model_tensor *t, int S, int tp, int rank) {
    if (t->split == MOE_SPLIT_NONE) return (norm_pieces){1, t->count, 0};
    const size_t held = (size_t)(S / t->parts), local = (size_t)(S / tp);
    return (norm_pieces){local, t->count / held, (size_t)(rank % (tp / t->parts)) * local};
}

/* Dense tensor t's summed gradient (this rank's block): in the whole gradient buffer, or under ZeRO-2 gathered into
 * `whole` from the members of the dense region's group (each holds its range of the region: this rank's part copied
 * into place, the fixed tree's all-gather brings the rest). Collective under ZeRO-2. */
static moe_status tensor_grads(moe_model *m, const moe_model_tensor *t, moe_real *whole, const moe_real **g) {
    if (moe_model_grads(m)) return *g = moe_model_grads(m) + t->offset, MOE_OK;
    const moe_zero_region *r = &moe_model_zero(m)->dense;
    const size_t lo = t->offset > r->begin ? t->offset : r->begin;
    const size_t hi = t->offset + t->count < r->end ? t->offset + t->count : r->end;
    if (hi > lo)
        MOE_TRY(moe_runtime_copy(moe_model_runtime(m), whole + (lo - t->offset),
                                 moe_model_range_grads(m, 0) + (lo - r->begin), (hi - lo) * sizeof(moe_real)));
    MOE_TRY(moe_comm_allgather_tree_real(r->group, whole, &r->part, t->offset, t->count));
    return *g = whole, MOE_OK;
}

/* With fixed pieces (tp_shards S > 1, models/model.h): the dense terms tensor by tensor in buffer order, a replicated
 * tensor's atoms from its start, a split tensor's piece by piece (piece p of the whole tensor, in piece order, each cut
 * into atoms from its start): terms that depend on S and the gradients alone, the same list at any tp. A rank computes
 * its own pieces' (a column-parallel tensor's piece is rows of its block; a row-parallel one's, columns of it, copied
 * out first); the tensor group's lists are gathered and merged. From the whole gradients (ZeRO 0 or 1), or under
 * ZeRO-2 from each tensor's gathered in turn (tensor_grads: one tensor's memory, one all-gather each). */
static moe_status piece_terms(moe_model *m, const moe_parallel *par, chunk_terms *out) {
    const moe_model_config *cfg = moe_model_config_of(m);
    moe_comm *group = moe_parallel_tensor(par);
    const int tp = moe_comm_size(group), rank = moe_comm_rank(group), S = moe_model_tp_pieces(cfg, tp);
    int count;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    size_t n = 0, widest = 0; /* this rank's terms; the largest piece */
    for (int i = 0; i < count; i++) {
        if (t[i].experts || t[i].replica) continue;
        const norm_pieces p = pieces_of(&t[i], S, tp, rank);
        n += p.pieces * num_atoms(p.per);
        widest = p.per > widest ? p.per : widest;
    }
    const int zero2 = moe_model_grads(m) == NULL; /* each tensor's gradient gathered in turn (tensor_grads) */
    size_t largest = 0;
    for (int i = 0; i < count && zero2; i++)
        if (!t[i].experts && !t[i].replica && t[i].count > largest) largest = t[i].count;
    double *mine = calloc(n + 1, sizeof(double)), *all = calloc((size_t)tp * n + 1, sizeof(double));
    moe_real *scratch = NULL, *whole = NULL;
    moe_status st = mine && all ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = moe_runtime_alloc(moe_model_runtime(m), (widest ? widest : 1) * sizeof(moe_real),
                                             (void **)&scratch);
    if (st == MOE_OK && zero2) st = moe_runtime_alloc(moe_model_runtime(m), (largest ? largest : 1) * sizeof(moe_real),
                                                      (void **)&whole);
    size_t k = 0;
    for (int i = 0; i < count && st == MOE_OK; i++) {
        if (t[i].experts || t[i].replica) continue;
        const norm_pieces p = pieces_of(&t[i], S, tp, rank);
        const moe_real *g;
        st = tensor_grads(m, &t[i], whole, &g);
        if (st == MOE_OK && t[i].split != MOE_SPLIT_COLS) { /* whole, or row pieces: contiguous */
            for (size_t j = 0; j < p.pieces && st == MOE_OK; j++)
                st = atoms_of(m, g + (p.first + j) * p.per, p.per, mine, &k);
            continue;
        }
        const size_t rows = (size_t)t[i].rows, cols = (size_t)t[i].cols, w = p.per / rows;
        for (size_t j = 0; j < p.pieces && st == MOE_OK; j++) {
            st = moe_runtime_copy_2d(moe_model_runtime(m), scratch, w * sizeof(moe_real), g + (p.first + j) * w,
                                     cols * sizeof(moe_real), w * sizeof(moe_real), rows);
            if (st == MOE_OK) st = atoms_of(m, scratch, rows * w, mine, &k);
        }
    }
    if (st == MOE_OK) st = moe_comm_allgather_bytes(group, mine, n * sizeof(double), all);
    *out = (chunk_terms){.terms = calloc((size_t)tp * n + 1, sizeof(double))};
    if (st == MOE_OK && !out->terms) st = MOE_ERR_OUT_OF_MEMORY;
    size_t at = 0; /* the tensor's first term in each rank's list */
    for (int i = 0; i < count && st == MOE_OK; i++) {
        if (t[i].experts || t[i].replica) continue;
        const norm_pieces p = pieces_of(&t[i], S, tp, rank);
        const size_t terms = p.pieces * num_atoms(p.per);
        for (int r = 0; r < (t[i].split == MOE_SPLIT_NONE ? 1 : tp); r++)
            for (size_t j = 0; j < terms; j++) out->terms[out->n++] = all[(size_t)r * n + at + j];
        out->counts[chunk_at(m, 0, t[i].offset)] += t[i].split == MOE_SPLIT_NONE ? terms : terms * tp;
        at += terms;
    }
    moe_runtime_free(moe_model_runtime(m), scratch), moe_runtime_free(moe_model_runtime(m), whole);
    free(mine), free(all);
    if (st != MOE_OK) free(out->terms), out->terms = NULL;
    return st;
}

/* This stage's terms of the norm in the order the whole model adds them: its dense atoms' sums in buffer order (piece
 * by piece with tp_shards > 1), then every MoE layer's global experts (layer, EP rank, local expert), each counted per
 * chunk. */
static moe_status stage_terms(moe_model *m, const moe_parallel *par, chunk_terms *dense, chunk_terms *experts) {
    moe_comm *ep = moe_parallel_ep(par);
    if (moe_model_tp_pieces(moe_model_config_of(m), moe_parallel_ranks(par).tp_size) > 1) {
        MOE_TRY(piece_terms(m, par, dense));
    } else {
        const moe_zero_region *region = &moe_model_zero(m)->dense;
        double *sums;
        MOE_TRY(atom_sums(m, region, moe_model_range_grads(m, 0), &sums));
        dense_terms(m, region, sums, dense);
    }
    int layers, *chunk;
    double *mine;
    moe_status st = expert_sums(m, &layers, &mine, &chunk);
    if (st != MOE_OK) return free(dense->terms), st;
    const int local = moe_model_num_local_experts(m), R = moe_comm_size(ep);
    double *all = calloc((size_t)R * layers * local + 1, sizeof(double)), *ordered = calloc((size_t)R * layers * local + 1,
                                                                                            sizeof(double));
    size_t *nbytes = calloc(R, sizeof(size_t));
    st = all && ordered && nbytes ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < R && st == MOE_OK; p++) nbytes[p] = (size_t)layers * local * sizeof(double);
    if (st == MOE_OK && layers) st = moe_comm_allgatherv_bytes(ep, mine, nbytes[0], all, nbytes);
    *experts = (chunk_terms){.terms = ordered};
    for (int l = 0; l < layers && st == MOE_OK; l++)
        for (int p = 0; p < R; p++) /* EP rank p holds global experts p * local .. */
            for (int e = 0; e < local; e++) {
                ordered[experts->n++] = all[((size_t)p * layers + l) * local + e];
                experts->counts[chunk[l]]++;
            }
    free(mine), free(all), free(nbytes), free(chunk);
    if (st != MOE_OK) return free(dense->terms), free(ordered), st;
    return MOE_OK;
}

moe_status moe_model_grad_norm(moe_model *m, const moe_parallel *par, double *norm) {
    chunk_terms dense, experts;
    MOE_TRY(stage_terms(m, par, &dense, &experts));
    moe_comm *pipeline = moe_parallel_pipeline(par);
    const int V = moe_model_stage_of(m)->chunks;
    double total = 0; /* the dense terms of the whole model in order, then the experts' */
    moe_status st = add_in_model_order(pipeline, V, &dense, &total);
    if (st == MOE_OK) st = add_in_model_order(pipeline, V, &experts, &total);
    *norm = sqrt(total);
    free(dense.terms), free(experts.terms);
    return st;
}

double moe_model_clip_factor(double norm, float clip) { return clip > 0 && norm > clip ? clip / norm : 1.0; }

moe_status moe_model_adamw_step(moe_model *m, moe_real *moment1, moe_real *moment2, const moe_adamw_params *hp) {
    moe_dense_state *s;
    const moe_dense_ops *ops = moe_model_dense_ops(m, &s);
    int count;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    const moe_zero_layout *z = moe_model_zero(m);
    const size_t dense = moe_model_num_dense(m), kept = z->dense.end - z->dense.begin;
    moe_real *p = moe_model_params(m);
    moe_adamw_params no_decay = *hp;
    no_decay.weight_decay = 0;
    for (int i = 0; i < count; i++) {
        if (t[i].replica) continue; /* another stage updates it and sends it back (moe_model_sync_tied) */
        /* the part of the tensor inside this rank's range of its region, in the buffer */
        const int expert = t[i].offset >= dense;
        const moe_zero_region *r = expert ? &z->expert : &z->dense;
        const size_t base = expert ? dense : 0, begin = base + r->begin, end = base + r->end;
        size_t lo = t[i].offset > begin ? t[i].offset : begin, hi = t[i].offset + t[i].count;
        hi = hi < end ? hi : end;
        if (lo >= hi) continue;
        const size_t at = (expert ? kept : 0) + (lo - begin); /* index in the moments */
        MOE_TRY(ops->adamw_update(s, p + lo, moe_model_range_grads(m, expert) + (lo - begin), moment1 + at,
                                  moment2 + at, hi - lo, moe_tensor_decays(&t[i]) ? hp : &no_decay));
    }
    return MOE_OK;
}
