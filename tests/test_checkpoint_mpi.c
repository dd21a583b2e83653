/* test_checkpoint_mpi.c — checkpoints under mpirun -np 2 (checkpoint/checkpoint.h), on a tiny model with
 * 8 experts and capacity drops:
 *  - resume is bitwise: 20 steps straight vs 10 + resume + 10, with ep unchanged (1 -> 1) and changed
 *    (1 -> 2), with ZeRO-1 off and on: the losses of steps 11-20 and the final weight and state files are
 *    byte-identical; and 20 steps straight with ZeRO-1 are bitwise those without;
 *  - round trip: load a checkpoint (into the other layout) and save it again: byte-identical files;
 *  - bad checkpoints are refused with a message naming the file and the tensor or field: truncated
 *    weights, a renamed tensor, a wrong dtype, a wrong shape, a config that disagrees with the flags (a
 *    size, the RoPE base), training state from another run; keep-last prunes the oldest; and a save that
 *    fails leaves the earlier checkpoints intact. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "checkpoint/checkpoint.h"
#include "train/checkpoint_run.h"
#include "tests/test_mpi.h"
#include "tests/test_training.h"

enum { STEPS = 20, HALF = 10 };

static test_corpus corpus; /* the checkpoints go into its directory too */
static const char *dir;
static int rank;

static void save(test_run *r, const char *root, int step) {
    test_mpi_require(moe_checkpoint_save(moe_trainer_checkpoint_run(&r->t), root, step, 0), "checkpoint save");
}

static long file_bytes(const char *path, char **data) {
    FILE *f = fopen(path, "rb");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0) {
        *data = malloc((size_t)n + 1);
        rewind(f);
        if (fread(*data, 1, (size_t)n, f) != (size_t)n) n = -1;
    }
    if (f) fclose(f);
    return n;
}

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    long na = file_bytes(a, &x), nb = file_bytes(b, &y);
    int same = na >= 0 && na == nb && !memcmp(x, y, (size_t)na);
    free(x), free(y);
    return same;
}

static void copy_checkpoint(const char *from, const char *to) {
    const char *files[] = {"model.safetensors", "config.json", "train_state.safetensors"};
    char src[300], dst[300], *data = NULL;
    mkdir(to, 0755);
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/%s", from, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, files[i]);
        long n = file_bytes(src, &data);
        FILE *f = fopen(dst, "wb");
        if (n < 0 || !f || fwrite(data, 1, (size_t)n, f) != (size_t)n) test_mpi_require(MOE_ERR_IO, "copy");
        fclose(f), free(data);
    }
}

/* Replaces the first occurrence of `from` by `to` (same length) in a file; truncate > 0 cuts bytes. */
static void corrupt(const char *path, const char *from, const char *to, long truncate) {
    char *data = NULL;
    long n = file_bytes(path, &data);
    if (from) {
        char *at = memmem(data, (size_t)n, from, strlen(from));
        if (!at) test_mpi_require(MOE_ERR_BAD_FILE, "the text to corrupt is not in the file");
        memcpy(at, to, strlen(to));
    }
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, (size_t)(n - truncate), f);
    fclose(f), free(data);
}

/* Rank 0 prepares a bad copy of `good`, then every rank tries to load it and must fail with `expect`. */
static void expect_refusal(const char *what, const char *good, moe_train_options o, int resume, const char *file,
                           const char *from, const char *to, long truncate, const char *expect) {
    char bad[200], path[300];
    snprintf(bad, sizeof bad, "%s/bad-%s", dir, what);
    if (rank == 0) {
        copy_checkpoint(good, bad);
        snprintf(path, sizeof path, "%s/%s", bad, file);
        corrupt(path, from, to, truncate);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    test_run r;
    test_run_start(&r, 1, o);
    int step = 0;
    moe_status st = resume ? moe_checkpoint_resume(moe_trainer_checkpoint_run(&r.t), bad, &step)
                           : moe_checkpoint_load_weights(moe_trainer_checkpoint_run(&r.t), bad);
    CHECK(st != MOE_OK, "%s: accepted", what);
    const char *message = moe_failure_message(st);
    if (rank == 0) {
        CHECK(strstr(message, expect) != NULL, "%s: message '%s' lacks '%s'", what, message, expect);
        printf("%-22s refused: %s\n", what, message);
    }
    test_run_stop(&r);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_corpus_create(&corpus, 100000);
    dir = corpus.dir;
    moe_train_options o = test_small_options(corpus.train, corpus.val, 1, STEPS, 1);
    o.model.moe.score_func = MOE_SCORE_SIGMOID; /* the selection biases are state too */
    char straight[128], path_a[300], path_b[300];
    snprintf(straight, sizeof straight, "%s/straight", dir);

    double reference[STEPS], losses[STEPS];
    test_run r;
    test_run_start(&r, 1, o);
    test_run_steps(&r, 1, HALF, reference);
    save(&r, straight, HALF);
    test_run_steps(&r, HALF + 1, STEPS, reference);
    save(&r, straight, STEPS);
    test_run_stop(&r);

    char half[200], full[200];
    snprintf(half, sizeof half, "%s/step-%08d", straight, HALF);
    snprintf(full, sizeof full, "%s/step-%08d", straight, STEPS);
    /* ZeRO-1 from the start: the same run */
    char zero_root[128];
    snprintf(zero_root, sizeof zero_root, "%s/zero", dir);
    moe_train_options zero = o;
    zero.zero = 1;
    test_run_start(&r, 1, zero);
    test_run_steps(&r, 1, STEPS, losses);
    save(&r, zero_root, STEPS);
    test_run_stop(&r);
    CHECK(!memcmp(losses, reference, sizeof losses), "ZeRO-1: losses differ from the unsharded run");
    for (int i = 0; i < 2 && rank == 0; i++) {
        const char *file = i ? "train_state.safetensors" : "model.safetensors";
        snprintf(path_a, sizeof path_a, "%s/%s", full, file);
        snprintf(path_b, sizeof path_b, "%s/step-%08d/%s", zero_root, STEPS, file);
        CHECK(same_file(path_a, path_b), "ZeRO-1: %s differs from the unsharded run's", file);
    }

    for (int variant = 0; variant < 4; variant++) {
        const int ep = 1 + variant % 2, use_zero = variant / 2;
        char root[128];
        snprintf(root, sizeof root, "%s/resumed-ep%d-zero%d", dir, ep, use_zero);
        int done = 0;
        moe_train_options resumed = o;
        resumed.zero = use_zero;
        test_run_start(&r, ep, resumed);
        test_mpi_require(moe_checkpoint_resume(moe_trainer_checkpoint_run(&r.t), half, &done), "resume");
        CHECK(done == HALF, "resumed after step %d", done);
        memcpy(losses, reference, sizeof losses);
        test_run_steps(&r, HALF + 1, STEPS, losses);
        save(&r, root, STEPS);
        test_run_stop(&r);
        CHECK(!memcmp(losses, reference, sizeof losses), "ep 1 -> %d, ZeRO-1 %d: losses after resume differ", ep,
              use_zero);
        const char *files[] = {"model.safetensors", "train_state.safetensors", "config.json"};
        for (int i = 0; i < 3 && rank == 0; i++) {
            snprintf(path_a, sizeof path_a, "%s/%s", full, files[i]);
            snprintf(path_b, sizeof path_b, "%s/step-%08d/%s", root, STEPS, files[i]);
            CHECK(same_file(path_a, path_b), "ep 1 -> %d, ZeRO-1 %d: %s differs from the straight run's", ep, use_zero,
                  files[i]);
        }
        if (rank == 0)
            printf("resume ep 1 -> %d, ZeRO-1 %s: steps %d-%d and the final files bitwise equal to the straight run\n",
                   ep, use_zero ? "on" : "off", HALF + 1, STEPS);
    }

    /* round trip: load into the other layout, save again */
    char again[128];
    snprintf(again, sizeof again, "%s/again", dir);
    int done = 0;
    test_run_start(&r, 2, o);
    test_mpi_require(moe_checkpoint_resume(moe_trainer_checkpoint_run(&r.t), full, &done), "resume");
    save(&r, again, done);
    test_run_stop(&r);
    for (int i = 0; i < 2 && rank == 0; i++) {
        const char *file = i ? "train_state.safetensors" : "model.safetensors";
        snprintf(path_a, sizeof path_a, "%s/%s", full, file);
        snprintf(path_b, sizeof path_b, "%s/step-%08d/%s", again, STEPS, file);
        CHECK(same_file(path_a, path_b), "round trip: %s not byte-identical", file);
    }

    expect_refusal("truncated", full, o, 0, "model.safetensors", NULL, NULL, 100, "truncated");
    /* the tensor's own entry (its checksum's key in __metadata__ comes first in the sorted header) */
    expect_refusal("renamed tensor", full, o, 0, "model.safetensors", "\"model.norm.weight\":{", "\"model.norx.weight\":{",
                   0, "tensor model.norm.weight is missing");
    expect_refusal("wrong dtype", full, o, 0, "model.safetensors", "\"F32\"", "\"I32\"", 0,
                   "has dtype I32; supported are F32, BF16, F16 and F8_E4M3");
    expect_refusal("F16 with F32's bytes", full, o, 0, "model.safetensors", "\"F32\"", "\"F16\"", 0,
                   "data bytes for 1024 F16 values");
    moe_train_options wide = o;
    wide.model.d_ff = 48, wide.model.moe.d_ff = 48;
    expect_refusal("wrong shape", full, wide, 0, "config.json", "\"intermediate_size\": 32",
                   "\"intermediate_size\": 48", 0, "has shape [32, 32], the model needs [48, 32]");
    moe_train_options deeper = o;
    deeper.model.num_layers = 3;
    expect_refusal("config vs flags", full, deeper, 0, "config.json", NULL, NULL, 0,
                   "num_hidden_layers is 2 but this model has 3");
    moe_train_options far = o;
    far.model.rope_theta = 500000;
    expect_refusal("rope theta", full, far, 0, "config.json", NULL, NULL, 0,
                   "rope_theta is 10000 but this model has 500000");
    moe_train_options other_run = o;
    other_run.seed = 4242;
    expect_refusal("another run's state", full, other_run, 1, "config.json", NULL, NULL, 0,
                   "training state from another run");

    /* keep-last: after saves at 10, 20, 30 with keep_last 2, steps 20 and 30 remain */
    char pruned[128];
    snprintf(pruned, sizeof pruned, "%s/pruned", dir);
    test_run_start(&r, 1, o);
    for (int s = 10; s <= 30; s += 10)
        test_mpi_require(moe_checkpoint_save(moe_trainer_checkpoint_run(&r.t), pruned, s, 2), "checkpoint save");
    test_run_stop(&r);
    if (rank == 0) {
        const int expect[3] = {0, 1, 1};
        for (int s = 10, i = 0; s <= 30; s += 10, i++) {
            snprintf(path_a, sizeof path_a, "%s/step-%08d", pruned, s);
            CHECK((access(path_a, F_OK) == 0) == expect[i], "keep-last 2: step %d %s", s,
                  expect[i] ? "deleted" : "kept");
        }
    }

    /* a save that cannot complete leaves the earlier checkpoints as they were */
    char blocker[200];
    snprintf(blocker, sizeof blocker, "%s/.tmp-step-%08d", straight, 30);
    if (rank == 0) fclose(fopen(blocker, "w"));
    MPI_Barrier(MPI_COMM_WORLD);
    test_run_start(&r, 1, o);
    moe_status blocked = moe_checkpoint_save(moe_trainer_checkpoint_run(&r.t), straight, 30, 1);
    CHECK(blocked != MOE_OK, "a blocked save succeeded");
    if (rank == 0) printf("failed save: %s\n", moe_failure_message(blocked));
    int step = 0;
    test_mpi_require(moe_checkpoint_resume(moe_trainer_checkpoint_run(&r.t), full, &step),
                     "the good checkpoint after a failed save");
    test_run_stop(&r);
    if (rank == 0) {
        snprintf(path_b, sizeof path_b, "%s/step-%08d/model.safetensors", again, STEPS);
        snprintf(path_a, sizeof path_a, "%s/model.safetensors", full);
        CHECK(same_file(path_a, path_b), "the good checkpoint changed");
        CHECK(access(half, F_OK) == 0, "keep-last pruned after a failed save");
    }
    test_corpus_remove(&corpus);
    return test_mpi_finish("test_checkpoint_mpi");
}
