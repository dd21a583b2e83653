/* layer_demo.c — moe-layer-demo: trains one MoE layer end to end on the CPU, a teacher-student fit.
 * A frozen random "teacher" MoE layer defines y = teacher(x); a "student" layer of the same shape, from
 * another seed, is trained by plain gradient descent on L = mean ||student(x) - y||^2 + aux + z-loss,
 * over fresh random batches. The falling loss shows forward, backward and routing working together.
 * A small example of the layer API beside moe-train (train/train.c), which trains the whole model. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/moe.h"
#include "core/rng.h"

typedef struct {
    int steps, tokens, d_model, d_ff, experts, top_k, seed;
    float lr, capacity_factor;
    moe_score_func score_func;
} demo_options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: moe-layer-demo [--steps N] [--tokens T] [--d-model D] [--d-ff F] [--experts E] [--top-k K]\n"
            "                      [--score softmax|sigmoid] [--capacity-factor CF] [--lr LR] [--seed S]\n"
            "Trains a student MoE layer to match a frozen random teacher layer and prints the loss.\n"
            "Defaults: --steps 1000 --tokens 512 --d-model 64 --d-ff 128 --experts 8 --top-k 2 --score softmax\n"
            "          --capacity-factor 0 (dropless) --lr 2 --seed 1\n");
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "moe-layer-demo: %s expects an integer in [%d, %d], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int parse_float(const char *flag, const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "moe-layer-demo: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_options(int argc, char **argv, demo_options *o) {
    *o = (demo_options){1000, 512, 64, 128, 8, 2, 1, 2.0f, 0.0f, MOE_SCORE_SOFTMAX};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return usage(stdout), exit(0), 0;
        if (i + 1 >= argc) {
            fprintf(stderr, "moe-layer-demo: unknown flag or missing value: '%s'\n", f);
            return 0;
        }
        const char *v = argv[++i];
        int ok = !strcmp(f, "--steps")             ? parse_int(f, v, 1, 1000000, &o->steps)
                 : !strcmp(f, "--tokens")          ? parse_int(f, v, 1, 1 << 20, &o->tokens)
                 : !strcmp(f, "--d-model")         ? parse_int(f, v, 1, 1 << 14, &o->d_model)
                 : !strcmp(f, "--d-ff")            ? parse_int(f, v, 1, 1 << 16, &o->d_ff)
                 : !strcmp(f, "--experts")         ? parse_int(f, v, 1, 1024, &o->experts)
                 : !strcmp(f, "--top-k")           ? parse_int(f, v, 1, 1024, &o->top_k)
                 : !strcmp(f, "--seed")            ? parse_int(f, v, 0, 1 << 30, &o->seed)
                 : !strcmp(f, "--lr")              ? parse_float(f, v, 0, 100, &o->lr)
                 : !strcmp(f, "--capacity-factor") ? parse_float(f, v, 0, 1000, &o->capacity_factor)
                                                   : -1;
        if (ok == -1 && !strcmp(f, "--score")) {
            ok = !strcmp(v, "softmax") || !strcmp(v, "sigmoid");
            o->score_func = strcmp(v, "sigmoid") ? MOE_SCORE_SOFTMAX : MOE_SCORE_SIGMOID;
            if (!ok) fprintf(stderr, "moe-layer-demo: --score expects softmax or sigmoid, got '%s'\n", v);
        } else if (ok == -1) {
            fprintf(stderr, "moe-layer-demo: unknown flag '%s' (see --help)\n", f);
            ok = 0;
        }
        if (!ok) return 0;
    }
    if (o->top_k > o->experts) {
        fprintf(stderr, "moe-layer-demo: --top-k %d exceeds --experts %d\n", o->top_k, o->experts);
        return 0;
    }
    return 1;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define DEMO_CHECK(call)                                                                      \
    do {                                                                                      \
        moe_status s_ = (call);                                                               \
        if (s_ != MOE_OK) {                                                                   \
            fprintf(stderr, "moe-layer-demo: %s failed: %s%s\n", #call, moe_status_string(s_), \
                    s_ == MOE_ERR_NONFINITE ? " (the fit diverged: lower --lr)" : "");        \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

int main(int argc, char **argv) {
    demo_options o;
    if (!parse_options(argc, argv, &o)) return 2;
    moe_config cfg = moe_config_default(o.d_model, o.d_ff, o.experts, o.top_k);
    cfg.score_func = o.score_func;
    cfg.capacity_factor = o.capacity_factor;
    const int ep = 1; /* one process: every expert here */
    size_t np = moe_layer_num_params(&cfg, ep), xn = (size_t)o.tokens * o.d_model;
    moe_real *teacher_buf = malloc(np * sizeof(moe_real)), *student_buf = malloc(np * sizeof(moe_real));
    moe_real *grad_buf = malloc(np * sizeof(moe_real));
    moe_real *x = malloc(xn * sizeof(moe_real)), *y = malloc(xn * sizeof(moe_real));
    moe_real *out = malloc(xn * sizeof(moe_real)), *dout = malloc(xn * sizeof(moe_real));
    if (!teacher_buf || !student_buf || !grad_buf || !x || !y || !out || !dout) {
        fprintf(stderr, "moe-layer-demo: out of memory for %zu parameters and %zu activations\n", np, xn);
        return 1;
    }
    moe_layer_weights teacher = moe_layer_weights_view(&cfg, ep, teacher_buf);
    moe_layer_weights student = moe_layer_weights_view(&cfg, ep, student_buf);
    moe_layer_weights grads = moe_layer_weights_view(&cfg, ep, grad_buf);
    moe_rng init_rng = moe_rng_seeded(1000 + o.seed), data_rng = moe_rng_seeded(2000 + o.seed);
    moe_layer_weights_init(&cfg, ep, &teacher, &init_rng);
    moe_layer_weights_init(&cfg, ep, &student, &init_rng);
    moe_layer *teacher_layer, *student_layer;
    DEMO_CHECK(moe_layer_create(&cfg, NULL, NULL, &teacher_layer));
    DEMO_CHECK(moe_layer_create(&cfg, NULL, NULL, &student_layer));

    printf("moe-layer-demo: teacher-student fit of one MoE layer on the CPU\n");
    printf("  T=%d d=%d d_ff=%d E=%d k=%d score=%s capacity_factor=%g%s lr=%g steps=%d params=%zu\n", o.tokens,
           o.d_model, o.d_ff, o.experts, o.top_k, o.score_func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax",
           o.capacity_factor, o.capacity_factor > 0 ? "" : " (dropless)", o.lr, o.steps, np);
    double first_mse = 0, last_mse = 0, t0 = now_ms();
    for (int step = 1; step <= o.steps; step++) {
        moe_rng_fill_uniform(&data_rng, x, xn, 1.7320508); /* unit variance */
        DEMO_CHECK(moe_layer_forward(teacher_layer, &teacher, x, o.tokens, y, NULL));
        moe_layer_stats st;
        DEMO_CHECK(moe_layer_forward(student_layer, &student, x, o.tokens, out, &st));
        /* L = (1/T) sum_t ||out_t - y_t||^2  ->  dL/dout = 2 (out - y) / T */
        double mse = 0;
        for (size_t i = 0; i < xn; i++) {
            moe_real diff = out[i] - y[i];
            mse += (double)diff * diff;
            dout[i] = 2 * diff / o.tokens;
        }
        mse /= o.tokens;
        memset(grad_buf, 0, np * sizeof(moe_real));
        DEMO_CHECK(moe_layer_backward(student_layer, &student, dout, NULL, &grads));
        for (size_t i = 0; i < np; i++) student_buf[i] -= o.lr * grad_buf[i];
        if (cfg.score_func == MOE_SCORE_SIGMOID) DEMO_CHECK(moe_layer_update_expert_bias(student_layer));
        if (step == 1) first_mse = mse;
        last_mse = mse;
        if (step == 1 || step % 25 == 0 || step == o.steps) {
            int lo = st.num_tokens_per_expert[0], hi = lo;
            for (int e = 1; e < o.experts; e++) {
                int n = st.num_tokens_per_expert[e];
                lo = n < lo ? n : lo, hi = n > hi ? n : hi;
            }
            printf("step %5d  mse %.5f  aux %.4f  z %.4f  load min/max %d/%d  dropped %d/%d  %.1f ms/step\n", step,
                   mse, st.aux_loss, st.z_loss, lo, hi, st.num_dropped, st.num_assignments,
                   (now_ms() - t0) / step);
        }
    }
    if (last_mse < first_mse)
        printf("moe-layer-demo: mse %.5f -> %.5f over %d steps (%.1f%% lower)\n", first_mse, last_mse, o.steps,
               100 * (1 - last_mse / first_mse));
    else /* plain SGD at --lr: too large a step for the shape (one expert takes every token's gradient) */
        fprintf(stderr, "moe-layer-demo: the fit did not improve (mse %.5f -> %.5f over %d steps): lower --lr "
                "(now %g)\n", first_mse, last_mse, o.steps, o.lr);
    moe_layer_destroy(teacher_layer);
    moe_layer_destroy(student_layer);
    free(teacher_buf), free(student_buf), free(grad_buf), free(x), free(y), free(out), free(dout);
    return last_mse < first_mse ? 0 : 1;
}
