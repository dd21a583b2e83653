/* train.c — moe-train: trains the MoE language model (models/model.h) on llm.c token files under mpirun.
 *
 *   mpirun -np N moe-train --train-data data/kjv_train.bin --val-data data/kjv_val.bin [flags]
 *
 * Each rank reads its slice of every global batch (models/dataloader.h), runs forward and backward
 * (tokens travel to the experts' ranks inside the MoE layers), gradients are summed over their groups,
 * clipped by the global norm and applied with AdamW. Rank 0 prints one line per step and writes the
 * JSON-lines metrics; every rank fails loudly: a bad flag or file stops all ranks with one message, a
 * failure inside a step aborts the job (MPI_Abort) instead of leaving ranks waiting. */
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alltoall/parallel_mpi.h"
#include "models/dataloader.h"
#include "models/optimizer.h"
#include "models/train_options.h"
#include "moe/rng.h"

typedef struct {
    train_options opt;
    moe_parallel *par;
    moe_model *model;
    token_file train, val;
    moe_real *moment1, *moment2;
    int *inputs, *targets;   /* [local seqs * S] */
    int local_seqs;          /* batch / world size */
    FILE *metrics;           /* rank 0, or NULL */
} trainer;

static int rank0(const trainer *t) { return t->par->world_rank == 0; }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A failure in the middle of collective work: the other ranks may be waiting, so end the whole job. */
static void require(const trainer *t, moe_status st, const char *what) {
    if (st == MOE_OK) return;
    fprintf(stderr, "moe-train: rank %d: %s failed: %s\n", t->par ? t->par->world_rank : -1, what,
            moe_status_string(st));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Every rank loads the files; if any rank fails, all stop, and each failing rank says why. */
static int load_data(trainer *t) {
    const model_config *m = &t->opt.model;
    char message[512] = "";
    moe_status st = token_file_load(t->opt.train_data, m->vocab_size, m->seq_len, &t->train, message, sizeof message);
    if (st == MOE_OK)
        st = token_file_load(t->opt.val_data, m->vocab_size, m->seq_len, &t->val, message, sizeof message);
    int failed = st != MOE_OK, any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed) fprintf(stderr, "moe-train: rank %d: bad data file: %s\n", t->par->world_rank, message);
    return any_failed ? -1 : 0;
}

/* ---- per-step statistics ---------------------------------------------------------------------- */

typedef struct {
    double loss_sum, aux, z, dropped, assignments; /* summed over micro-batches (and ranks, after reduce) */
    double *selected;                              /* [L * E] global top-k counts, summed over micro-batches */
} step_stats;

static void stats_add_micro_batch(const trainer *t, step_stats *s) {
    const model_config *m = &t->opt.model;
    for (int l = 0; l < m->num_layers; l++) {
        const moe_layer_stats *ls = moe_model_layer_stats(t->model, l);
        if (!ls) continue;
        s->aux += ls->aux_loss, s->z += ls->z_loss;
        s->dropped += ls->num_dropped, s->assignments += ls->num_assignments;
        for (int e = 0; e < m->moe.num_experts; e++) s->selected[l * m->moe.num_experts + e] += ls->num_selected_per_expert[e];
    }
}

/* min and max of load / mean load over every (MoE layer, expert), and their coefficient of variation */
static void load_balance(const trainer *t, const step_stats *s, double *lo, double *hi, double *cv) {
    const model_config *m = &t->opt.model;
    const int E = m->moe.num_experts;
    double sum = 0, sum_sq = 0;
    int n = 0;
    *lo = INFINITY, *hi = 0;
    for (int l = 0; l < m->num_layers; l++) {
        if (!model_layer_is_moe(m, l)) continue;
        double mean = 0;
        for (int e = 0; e < E; e++) mean += s->selected[l * E + e] / E;
        for (int e = 0; e < E && mean > 0; e++) {
            double r = s->selected[l * E + e] / mean;
            *lo = fmin(*lo, r), *hi = fmax(*hi, r), sum += r, sum_sq += r * r, n++;
        }
    }
    if (!n) *lo = *hi = 1;
    double mean = n ? sum / n : 1;
    *cv = n ? sqrt(fmax(0, sum_sq / n - mean * mean)) / mean : 0;
}

/* ---- evaluation and sampling ------------------------------------------------------------------ */

static double evaluate(trainer *t) {
    const train_options *o = &t->opt;
    double loss_sum = 0;
    for (int b = 0; b < o->eval_batches; b++) {
        long first = (long)b * o->batch + (long)t->par->world_rank * t->local_seqs;
        token_file_sequences(&t->val, o->model.seq_len, first, t->local_seqs, t->inputs, t->targets);
        double s = 0;
        require(t, moe_model_forward(t->model, t->inputs, t->targets, t->local_seqs, &s, NULL), "validation forward");
        loss_sum += s;
    }
    require(t, t->par->world->ops->allreduce_sum_f64(t->par->world, &loss_sum, 1), "validation all-reduce");
    return loss_sum / ((double)o->eval_batches * o->batch * o->model.seq_len);
}

/* Every rank generates the same text in lockstep (the MoE layers are collective); rank 0 prints it.
 * The context sits at the start of one sequence of S tokens; causal attention makes the padding after
 * it irrelevant to the logits read at the last context position. */
static void sample(trainer *t) {
    const train_options *o = &t->opt;
    const int S = o->model.seq_len, V = o->model.vocab_size;
    int prompt_len = (int)strlen(o->sample_prompt), n = 0;
    int *text = calloc((size_t)prompt_len + o->sample_tokens + 1, sizeof(int));
    moe_real *logits = malloc((size_t)S * V * sizeof(moe_real));
    if (!text || !logits) require(t, MOE_ERR_OUT_OF_MEMORY, "sampling");
    for (int i = 0; i < prompt_len; i++) text[n++] = (unsigned char)o->sample_prompt[i] % V;
    if (n == 0) text[n++] = '\n' % V;
    moe_rng rng = moe_rng_seeded((unsigned long long)o->seed + 7);
    for (int step = 0; step < o->sample_tokens; step++) {
        int start = n > S ? n - S : 0, len = n - start;
        for (int i = 0; i < S; i++) t->inputs[i] = i < len ? text[start + i] : 0;
        require(t, moe_model_forward(t->model, t->inputs, NULL, 1, NULL, logits), "sampling forward");
        const moe_real *l = logits + (size_t)(len - 1) * V;
        int next = 0;
        if (o->sample_temperature <= 0) {
            for (int v = 1; v < V; v++) next = l[v] > l[next] ? v : next;
        } else {
            double max = l[0], total = 0, u = (moe_rng_uniform(&rng) + 1) / 2;
            for (int v = 1; v < V; v++) max = fmax(max, l[v]);
            for (int v = 0; v < V; v++) total += exp((l[v] - max) / o->sample_temperature);
            for (double acc = 0; next < V - 1; next++) {
                acc += exp((l[next] - max) / o->sample_temperature) / total;
                if (acc > u) break;
            }
        }
        text[n++] = next;
    }
    if (rank0(t)) {
        printf("sample (%d tokens, temperature %g):\n---\n", o->sample_tokens, o->sample_temperature);
        for (int i = 0; i < n; i++) putchar(text[i] < 256 && (text[i] >= 32 || text[i] == '\n') ? text[i] : '?');
        printf("\n---\n");
    }
    free(text), free(logits);
}

/* ---- the training step ------------------------------------------------------------------------ */

static void log_step(trainer *t, int step, const step_stats *s, float lr, double grad_norm, double ms, double val_loss) {
    const train_options *o = &t->opt;
    const model_config *m = &o->model;
    const double tokens = (double)o->batch * o->micro_batches * m->seq_len, moe_layers_mb = s->assignments > 0;
    double loss = s->loss_sum / tokens, lo, hi, cv;
    int num_moe = 0;
    for (int l = 0; l < m->num_layers; l++) num_moe += model_layer_is_moe(m, l);
    double per = num_moe ? (double)num_moe * o->micro_batches : 1;
    double aux = s->aux / per, z = s->z / per, drop = moe_layers_mb ? s->dropped / s->assignments : 0;
    load_balance(t, s, &lo, &hi, &cv);
    printf("step %5d | loss %.4f | aux %.4f | z %.3f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | load %.2f-%.2f cv "
           "%.3f | drop %.2f%%",
           step, loss, aux, z, lr, grad_norm, ms, tokens / (ms / 1e3), lo, hi, cv, 100 * drop);
    if (val_loss >= 0) printf(" | val %.4f", val_loss);
    printf("\n");
    fflush(stdout);
    if (!t->metrics) return;
    fprintf(t->metrics,
            "{\"step\":%d,\"loss\":%.6f,\"aux_loss\":%.6f,\"z_loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"ms\":%.3f,"
            "\"tokens_per_s\":%.1f,\"load_min\":%.4f,\"load_max\":%.4f,\"load_cv\":%.4f,\"drop_fraction\":%.6f",
            step, loss, aux, z, lr, grad_norm, ms, tokens / (ms / 1e3), lo, hi, cv, drop);
    if (val_loss >= 0) fprintf(t->metrics, ",\"val_loss\":%.6f", val_loss);
    fprintf(t->metrics, ",\"expert_tokens\":[");
    for (int l = 0, first = 1; l < m->num_layers; l++) {
        if (!model_layer_is_moe(m, l)) continue;
        fprintf(t->metrics, "%s{\"layer\":%d,\"tokens\":[", first ? "" : ",", l);
        for (int e = 0; e < m->moe.num_experts; e++)
            fprintf(t->metrics, "%s%.0f", e ? "," : "", s->selected[l * m->moe.num_experts + e]);
        fprintf(t->metrics, "]}");
        first = 0;
    }
    fprintf(t->metrics, "]}\n");
    fflush(t->metrics);
}

static void train_step(trainer *t, int step, step_stats *s) {
    const train_options *o = &t->opt;
    const int S = o->model.seq_len, world_rank = t->par->world_rank;
    const moe_real scale = (moe_real)(1.0 / ((double)o->batch * o->micro_batches * S)); /* mean over the step */
    moe_model_zero_grads(t->model);
    for (int mb = 0; mb < o->micro_batches; mb++) {
        long batch_index = (long)(step - 1) * o->micro_batches + mb;
        long first = batch_index * o->batch + (long)world_rank * t->local_seqs;
        token_file_sequences(&t->train, S, first, t->local_seqs, t->inputs, t->targets);
        double loss_sum = 0;
        require(t, moe_model_forward(t->model, t->inputs, t->targets, t->local_seqs, &loss_sum, NULL), "forward");
        require(t, moe_model_backward(t->model, scale), "backward");
        s->loss_sum += loss_sum;
        stats_add_micro_batch(t, s);
    }
    require(t, moe_model_reduce_grads(t->model), "gradient all-reduce");
    double sums[3] = {s->loss_sum, s->dropped, s->assignments}; /* per-rank quantities */
    require(t, t->par->world->ops->allreduce_sum_f64(t->par->world, sums, 3), "loss all-reduce");
    s->loss_sum = sums[0], s->dropped = sums[1], s->assignments = sums[2];
}

static int run(trainer *t) {
    const train_options *o = &t->opt;
    const model_config *m = &o->model;
    lr_schedule schedule = {o->lr, o->min_lr, o->warmup, o->steps};
    size_t n = moe_model_num_dense(t->model) + moe_model_num_expert(t->model);
    step_stats s = {0};
    s.selected = calloc((size_t)m->num_layers * m->moe.num_experts, sizeof(double));
    t->moment1 = calloc(n, sizeof(moe_real)), t->moment2 = calloc(n, sizeof(moe_real));
    if (!s.selected || !t->moment1 || !t->moment2) require(t, MOE_ERR_OUT_OF_MEMORY, "optimizer state");
    for (int step = 1; step <= o->steps; step++) {
        double t0 = now_ms(), norm = 0;
        memset(s.selected, 0, (size_t)m->num_layers * m->moe.num_experts * sizeof(double));
        s.loss_sum = s.aux = s.z = s.dropped = s.assignments = 0;
        train_step(t, step, &s);
        require(t, model_grad_norm(t->model, t->par, &norm), "gradient norm");
        model_clip_grads(t->model, norm, o->clip);
        adamw_params hp = {lr_at(&schedule, step), o->beta1, o->beta2, 1e-8f, o->weight_decay, step};
        model_adamw_step(t->model, t->moment1, t->moment2, &hp);
        require(t, moe_model_update_expert_bias(t->model), "expert bias update");
        double ms = now_ms() - t0;
        int eval_now = step == o->steps || (o->eval_interval > 0 && step % o->eval_interval == 0);
        double val = eval_now ? evaluate(t) : -1;
        if (rank0(t)) log_step(t, step, &s, hp.lr, norm, ms, val);
    }
    free(s.selected);
    if (o->sample_tokens > 0) sample(t);
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    trainer t = {0};
    int world_rank, world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    /* Every rank parses the same argv; rank 0 alone reports, all ranks stop together. */
    int parsed = train_options_parse(argc, argv, world_size, &t.opt, world_rank == 0 ? stderr : NULL);
    if (parsed != 0) {
        MPI_Finalize();
        return parsed > 0 ? 0 : 2;
    }
    const train_options *o = &t.opt;
    require(&t, moe_parallel_create_mpi(MPI_COMM_WORLD, o->model.moe.ep_size, o->exchange_timeout_s, &t.par),
            "parallel layout");
    if (load_data(&t)) {
        MPI_Finalize();
        return 2;
    }
    t.local_seqs = o->batch / world_size;
    t.inputs = calloc((size_t)t.local_seqs * o->model.seq_len, sizeof(int));
    t.targets = calloc((size_t)t.local_seqs * o->model.seq_len, sizeof(int));
    if (!t.inputs || !t.targets) require(&t, MOE_ERR_OUT_OF_MEMORY, "batch buffers");
    require(&t, moe_model_create(&o->model, t.par, t.local_seqs, o->micro_batches, &t.model), "model");
    moe_model_init_weights(t.model, (unsigned long long)o->seed);
    if (world_rank == 0) {
        train_options_print(o, stdout);
        printf("world %d ranks: ep %d x expert-data-parallel %d; %zu dense + %zu expert parameters on rank 0; "
               "train %ld tokens, val %ld tokens\n",
               world_size, t.par->ep_size, t.par->dp_size, moe_model_num_dense(t.model), moe_model_num_expert(t.model),
               t.train.num_tokens, t.val.num_tokens);
        if (*o->log_file && !(t.metrics = fopen(o->log_file, "w"))) {
            fprintf(stderr, "moe-train: cannot write the metrics file '%s'\n", o->log_file);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    int rc = run(&t);
    if (t.metrics) fclose(t.metrics);
    moe_model_destroy(t.model);
    moe_parallel_destroy(t.par);
    token_file_free(&t.train), token_file_free(&t.val);
    free(t.moment1), free(t.moment2), free(t.inputs), free(t.targets);
    MPI_Finalize();
    return rc;
}
