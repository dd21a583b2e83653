/* test_nonfinite_mpi.c — the non-finite guard (train/trainer.h) under mpirun -np 2, on the tiny model with
 * ep 2 (rank 1 holds experts 4-7), NaN injected where a real run gets it:
 *  - into one expert weight on rank 1 only: the next step stops on every rank, naming that expert's tensor,
 *    and the weights are not updated; evaluation of those weights fails; a save refuses them and writes
 *    nothing; a checkpoint holding them (a valid file with a NaN) is refused on load;
 *  - into the gradient of one tensor on rank 0, between the step's compute and apply: stopped before AdamW
 *    (weights unchanged), naming the gradient; with --skip-nonfinite the step is dropped instead and the next
 *    step trains;
 *  - finite weights that overflow inside an op (an expert's w1 and w2 at 1e20): the checked re-run names the layer,
 *    op and expert where the first Inf appeared, in a training step and in evaluation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fail.h"
#include "checkpoint/checkpoint.h"
#include "train/checkpoint_run.h"
#include "checkpoint/safetensors.h"
#include "tests/test_mpi.h"
#include "tests/test_training.h"

static int rank;
static test_corpus corpus;

/* The reals of the tensor named `name` (an expert tensor: "...experts.%d..." with the local expert `local`). */
static moe_real *tensor(moe_trainer *t, moe_real *buffer, const char *name, int local, size_t *count) {
    int n;
    const moe_model_tensor *ts = moe_model_tensors(t->model, &n);
    for (int i = 0; i < n; i++)
        if (!strcmp(ts[i].name, name)) {
            const size_t per = ts[i].count / (ts[i].experts ? ts[i].experts : 1);
            *count = per;
            return buffer + ts[i].offset + (size_t)local * per;
        }
    test_mpi_require(MOE_ERR_INVALID_ARG, name);
    return NULL;
}

static moe_real *copy_params(moe_trainer *t) {
    const size_t n = moe_model_num_dense(t->model) + moe_model_num_expert(t->model);
    moe_real *copy = malloc(n * sizeof(moe_real));
    memcpy(copy, moe_model_params(t->model), n * sizeof(moe_real));
    return copy;
}

static int params_equal(moe_trainer *t, const moe_real *copy) {
    const size_t n = moe_model_num_dense(t->model) + moe_model_num_expert(t->model);
    return !memcmp(copy, moe_model_params(t->model), n * sizeof(moe_real));
}

/* Every rank fails; on at least one (where the value is) with MOE_ERR_NONFINITE and a message containing
 * `expect` (the others may say that another rank failed). */
static void expect_nonfinite(const char *what, moe_status st, const char *expect) {
    CHECK(st == MOE_ERR_NONFINITE || st == MOE_ERR_PEER, "%s: status %d, not a non-finite failure", what, (int)st);
    int has = st == MOE_ERR_NONFINITE && strstr(moe_failure_message(st), expect) != NULL, any = has;
    MPI_Allreduce(&has, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(any, "%s: no rank's message names '%s' (rank %d: %s)", what, expect, rank,
          st != MOE_OK ? moe_failure_message(st) : "no failure");
    if (has) printf("%-26s (rank %d) %s\n", what, rank, moe_failure_message(st));
}

static moe_step_result new_result(const moe_trainer *t) {
    moe_step_result r = {0};
    r.expert_tokens = calloc((size_t)t->opt.model.num_layers * t->opt.model.moe.num_experts, sizeof(double));
    return r;
}

/* NaN in one weight of expert 5 (rank 1's local expert 1), layer 1. */
static void nan_weight(void) {
    moe_train_options o = test_small_options(corpus.train, corpus.val, 2, 10, 1);
    test_run r;
    test_run_start(&r, 2, o);
    test_run_steps(&r, 1, 2, NULL);
    size_t n;
    if (rank == 1)
        tensor(&r.t, moe_model_params(r.t.model), "model.layers.1.block_sparse_moe.experts.%d.w3.weight", 1, &n)[7] =
            NAN;
    moe_real *before = copy_params(&r.t);
    moe_step_result s = new_result(&r.t);
    expect_nonfinite("NaN weight: the step", moe_trainer_step(&r.t, 3, &s),
                     "the weights before the step: model.layers.1.block_sparse_moe.experts.5.w3.weight[7]");
    CHECK(params_equal(&r.t, before), "NaN weight: the weights changed");
    double val = 0;
    expect_nonfinite("NaN weight: evaluation", moe_trainer_evaluate(&r.t, &val),
                     "the weights: model.layers.1.block_sparse_moe.experts.5.w3.weight[7]");

    char root[200], step_dir[260];
    snprintf(root, sizeof root, "%s/nan", corpus.dir);
    snprintf(step_dir, sizeof step_dir, "%s/step-%08d", root, 3);
    expect_nonfinite("NaN weight: a save", moe_checkpoint_save(moe_trainer_checkpoint_run(&r.t), root, 3, 0),
                     "model.layers.1.block_sparse_moe.experts.5.w3.weight[7] is nan: refusing to save");
    CHECK(access(step_dir, F_OK) != 0, "NaN weight: a step directory was written");
    free(before), free(s.expert_tokens);
    test_run_stop(&r);
}

/* A checkpoint whose model.safetensors is a valid file (checksums and all) holding a NaN. */
static void nan_checkpoint(void) {
    moe_train_options o = test_small_options(corpus.train, corpus.val, 1, 10, 1);
    char root[200], path[300];
    snprintf(root, sizeof root, "%s/good", corpus.dir);
    snprintf(path, sizeof path, "%s/step-%08d/model.safetensors", root, 1);
    test_run r;
    test_run_start(&r, 1, o);
    test_run_steps(&r, 1, 1, NULL);
    test_mpi_require(moe_checkpoint_save(moe_trainer_checkpoint_run(&r.t), root, 1, 0), "save");
    if (rank == 0) { /* rewrite the norm with a NaN through the writer: the checksums are right */
        moe_safetensors_file f;
        test_mpi_require(moe_safetensors_open(path, &f), "open");
        const int count = f.num_tensors;
        moe_safetensors_entry *e = calloc((size_t)count, sizeof *e);
        char (*names)[MOE_SAFETENSORS_MAX_NAME] = calloc((size_t)count, sizeof *names);
        for (int i = 0; i < count; i++) {
            const moe_safetensors_tensor *t = &f.tensors[i];
            size_t n = 1;
            for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
            float *data = malloc(n * sizeof(float));
            test_mpi_require(moe_safetensors_read(&f, t->name, t->ndim, t->shape, data), "read");
            if (!strcmp(t->name, "model.norm.weight")) data[3] = NAN;
            memcpy(names[i], t->name, sizeof names[i]);
            e[i] = (moe_safetensors_entry){names[i], t->ndim, {0}, data, MOE_SAFETENSORS_F32};
            memcpy(e[i].shape, t->shape, sizeof e[i].shape);
        }
        moe_safetensors_close(&f);
        test_mpi_require(moe_safetensors_write(path, e, count, NULL, 0), "write");
        snprintf(path, sizeof path, "%s/step-%08d/manifest.json", root, 1); /* its sizes changed: a legacy dir */
        unlink(path);
        for (int i = 0; i < count; i++) free((void *)e[i].data);
        free(e), free(names);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char dir[260];
    snprintf(dir, sizeof dir, "%s/step-%08d", root, 1);
    expect_nonfinite("NaN in a checkpoint", moe_checkpoint_load_weights(moe_trainer_checkpoint_run(&r.t), dir),
                     "model.norm.weight[3]");
    test_run_stop(&r);
}

/* NaN in one gradient on rank 0 after the step's compute, before its apply. */
static void nan_gradient(int skip) {
    moe_train_options o = test_small_options(corpus.train, corpus.val, 2, 10, 1);
    o.skip_nonfinite = skip;
    test_run r;
    test_run_start(&r, 2, o);
    test_run_steps(&r, 1, 2, NULL);
    moe_real *before = copy_params(&r.t);
    moe_step_result s = new_result(&r.t);
    test_mpi_require(moe_trainer_compute(&r.t, 3, &s), "compute");
    size_t n;
    if (rank == 0) tensor(&r.t, moe_model_grads(r.t.model), "model.layers.0.self_attn.o_proj.weight", 0, &n)[11] = NAN;
    moe_status st = moe_trainer_apply(&r.t, 3, &s);
    if (!skip) {
        expect_nonfinite("NaN gradient: the step", st, "the gradients as the step left them: "
                                                          "model.layers.0.self_attn.o_proj.weight[11]");
    } else {
        CHECK(st == MOE_OK && s.skipped == 1, "--skip-nonfinite: status %d, skipped %d", (int)st, s.skipped);
        /* AdamW's t counts the updates applied: the dropped step none (it counted them too before: a probe) */
        CHECK(r.t.optimizer_updates == 2, "after a dropped step 3: %lld updates counted",
              (long long)r.t.optimizer_updates);
        test_run_steps(&r, 4, 4, NULL); /* the run goes on */
        CHECK(r.t.optimizer_updates == 3, "after step 4: %lld updates counted", (long long)r.t.optimizer_updates);
        char root[200], dir[260];
        snprintf(root, sizeof root, "%s/dropped", corpus.dir);
        snprintf(dir, sizeof dir, "%s/step-%08d", root, 4);
        test_mpi_require(moe_checkpoint_save(moe_trainer_checkpoint_run(&r.t), root, 4, 0), "save");
        r.t.optimizer_updates = -1;
        int step = 0;
        test_mpi_require(moe_checkpoint_resume(moe_trainer_checkpoint_run(&r.t), dir, &step), "resume");
        CHECK(step == 4 && r.t.optimizer_updates == 3, "resumed at step %d with %lld updates counted, not 4 and 3",
              step, (long long)r.t.optimizer_updates);
    }
    CHECK(skip || params_equal(&r.t, before), "NaN gradient: the weights changed");
    free(before), free(s.expert_tokens);
    test_run_stop(&r);
}

/* Finite weights whose product overflows: expert 6's w1 and w2 (rank 1's local expert 2) in layer 0 at 1e20. */
static void overflow_in_an_op(void) {
    moe_train_options o = test_small_options(corpus.train, corpus.val, 2, 10, 1);
    test_run r;
    test_run_start(&r, 2, o);
    size_t n;
    if (rank == 1) {
        for (int i = 0; i < 2; i++) {
            const char *name = i ? "model.layers.0.block_sparse_moe.experts.%d.w2.weight"
                                 : "model.layers.0.block_sparse_moe.experts.%d.w1.weight";
            moe_real *w = tensor(&r.t, moe_model_params(r.t.model), name, 2, &n);
            for (size_t j = 0; j < n; j++) w[j] = 1e20f;
        }
    }
    moe_step_result s = new_result(&r.t);
    expect_nonfinite("overflow in an op", moe_trainer_step(&r.t, 1, &s), "layer 0, world rank 1: the output of expert 6");
    /* evaluation too names it (it blamed layer 1's router logits, where the forward stopped: a probe) */
    double val = 0;
    expect_nonfinite("overflow: evaluation", moe_trainer_evaluate(&r.t, &val),
                     "layer 0, world rank 1: the output of expert 6");
    free(s.expert_tokens);
    test_run_stop(&r);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_corpus_create(&corpus, 20000);
    nan_weight();
    nan_checkpoint();
    nan_gradient(0);
    nan_gradient(1);
    overflow_in_an_op();
    test_corpus_remove(&corpus);
    return test_mpi_finish("test_nonfinite_mpi");
}
