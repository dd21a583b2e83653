/* model_init.c — the model's initial weights from a seed (moe_model_init_weights), through model.h's public view
 * of the buffer: the tensor table, the layout, the runtime. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "models/model.h"

/* uniform with standard deviation std: bound std * sqrt(3) */
static void init_tensor(moe_real *t, size_t count, double std, unsigned long long seed, unsigned long long stream) {
    moe_rng rng = moe_rng_seeded(seed * 0x100000001B3ull + stream);
    moe_rng_fill_uniform(&rng, t, count, std * sqrt(3.0));
}

static double std_of(int num_layers, moe_tensor_kind kind) {
    const double std = 0.02; /* residual projections get std / sqrt(2 L) (GPT-2) */
    return kind == MOE_TENSOR_RESIDUAL ? std / sqrt(2.0 * num_layers) : std;
}

/* A tensor-parallel block (model.h's split): the whole tensor drawn from its stream into scratch, this rank's block of
 * it kept, so that the model is the same at any tp. */
static moe_status init_block(const moe_model_tensor *t, moe_real *data, double std, unsigned long long seed,
                             int part) {
    const size_t rows = (size_t)t->rows, cols = (size_t)t->cols, parts = (size_t)t->parts, whole = t->count * parts;
    moe_real *all = malloc(whole * sizeof(moe_real));
    if (!all) return MOE_ERR_OUT_OF_MEMORY;
    init_tensor(all, whole, std, seed, (unsigned long long)t->index);
    if (t->split == MOE_SPLIT_ROWS) /* rows [part rows, +rows) of the whole [rows parts, cols] */
        memcpy(data, all + (size_t)part * rows * cols, rows * cols * sizeof(moe_real));
    else /* columns [part cols, +cols) of each row of the whole [rows, cols parts] */
        for (size_t r = 0; r < rows; r++)
            memcpy(data + r * cols, all + r * cols * parts + (size_t)part * cols, cols * sizeof(moe_real));
    free(all);
    return MOE_OK;
}

/* Made on the host, then uploaded: dense tensors draw from stream = their index in the whole model's table (the same
 * on every rank and stage; a tensor-parallel block keeps its part of the whole tensor's draw), experts from stream =
 * (layer, global expert, matrix), whatever rank holds the expert. */
moe_status moe_model_init_weights(moe_model *m, unsigned long long seed) {
    const size_t total = moe_model_num_dense(m) + moe_model_num_expert(m);
    moe_real *host = malloc((total ? total : 1) * sizeof(moe_real));
    if (!host) return MOE_ERR_OUT_OF_MEMORY;
    const moe_ranks ranks = moe_parallel_ranks(moe_model_parallel(m));
    const int first = ranks.ep_rank * moe_model_num_local_experts(m), tp = ranks.tp_size;
    moe_status st = MOE_OK;
    int count;
    const moe_model_tensor *tensors = moe_model_tensors(m, &count);
    const int num_layers = moe_model_config_of(m)->num_layers;
    for (int s = 0, matrix = 0; s < count && st == MOE_OK; s++) {
        const moe_model_tensor *t = &tensors[s];
        moe_real *data = host + t->offset;
        if (t->kind == MOE_TENSOR_NORM || t->kind == MOE_TENSOR_BIAS) { /* norms start at 1, biases at 0 */
            for (size_t i = 0; i < t->count; i++) data[i] = t->kind == MOE_TENSOR_NORM;
        } else if (t->split != MOE_SPLIT_NONE && tp > 1) {
            st = init_block(t, data, std_of(num_layers, t->kind), seed, moe_model_tensor_part(t, tp, ranks.tp_rank));
        } else if (!t->experts) {
            init_tensor(data, t->count, std_of(num_layers, t->kind), seed, (unsigned long long)t->index);
        } else {
            /* the layer's expert matrices are numbered 1, 2, 3 in list order (w1, w3, w2) */
            matrix = s > 0 && tensors[s - 1].experts && tensors[s - 1].layer == t->layer ? matrix + 1 : 1;
            const size_t per_expert = (size_t)t->rows * t->cols;
            for (int e = 0; e < t->experts; e++) {
                unsigned long long id =
                    ((unsigned long long)(t->layer + 1) << 40) + ((unsigned long long)(first + e) << 4);
                init_tensor(data + e * per_expert, per_expert, std_of(num_layers, t->kind), seed, id + matrix);
            }
        }
    }
    if (st == MOE_OK)
        st = moe_runtime_upload(moe_model_runtime(m), moe_model_params(m), host, total * sizeof(moe_real));
    free(host);
    return st;
}

