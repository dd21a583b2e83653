/* test_torch_reference.c — the fp32 CPU MoE layer (libmoe) against an independent PyTorch implementation,
 * tests/torch_moe_reference.py (Mixtral-style, autograd for every gradient).
 *
 * For each case (score function, k, renormalisation, capacity factor, drop priority) it draws seeded random
 * weights, input x, upstream gradient dout (and, for sigmoid, a nonzero expert bias), runs
 * moe_layer_forward/backward, writes the case to a temporary directory, runs the script, and compares:
 *   - the chosen expert ids [T,k] and the capacity mask [T,k] exactly;
 *   - out, dx, d_router_w, dw1, dw3, dw2 elementwise, and the aux and z losses (tolerances below).
 * The loss differentiated on both sides is sum(out * dout) + aux_coef * aux + z_coef * z. Every capacity case
 * must drop something, the sigmoid bias must change some selection, and two cases build exact ties (copied
 * tokens, twin experts) so that tie-breaking (lower expert id; lower token for score priority) is exercised.
 * The binary formats are documented at the top of torch_moe_reference.py (little-endian int32/float32).
 *
 * Run:  meson test -C BUILD --suite ref -v
 *   or  BUILD/tests/test_torch_reference /usr/bin/python3 tests/torch_moe_reference.py
 * Exit code: 0 pass, 1 fail, 77 skip (PYTHON is 'none', or the script cannot import torch). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe/layer_internal.h"
#include "router/topk.h"
#include "tests/test_util.h"

enum { T = 64, D = 32, DFF = 48, E = 8 };

/* Tolerance, elementwise: |c - ref| <= kAbsTol * max|ref| + kRelTol * |ref|.
 * Both sides are float32 but sum in different orders (OpenBLAS blocking vs torch's kernels, the C library's
 * fixed combine order vs index_add, libm expf vs torch's exp), so each element carries a few ulps of its
 * partial sums: with reductions of at most d_ff = 48 or T = 64 terms of O(1) size, the expected error is
 * ~1e-7 of the tensor's scale (observed: <= 4.3e-7, see the printed errors). 1e-5 of the tensor's scale
 * leaves >= 20x headroom, yet semantic errors fail: a wrong gate, renormalisation or capacity decision moves
 * elements by >= 1e-3 of the scale, and even leaving out the whole aux (or z) term, the subtlest change
 * tried, moves dx and d_router_w by ~1e-4 of theirs. The relative term only matters for the few large
 * elements. aux and z are scalars: relative 1e-5. */
static const double kAbsTol = 1e-5, kRelTol = 1e-4, kScalarTol = 1e-5;

_Static_assert(sizeof(moe_real) == 4, "the reference comparison is for the float32 library");

typedef struct {
    const char *name;
    moe_score_func func;
    int k, renorm;
    float cf;
    moe_drop_priority prio;
    int ties; /* exact ties: tokens are copies of kTieRows rows, and experts 0 and 1 share a router row */
    /* k <= 2: the result arrays below are sized for it */
} ref_case;

enum { kTieRows = 5 };

/* ---- little-endian I/O ---------------------------------------------------------------------------- */

static void put_u32(FILE *f, uint32_t v) {
    unsigned char b[4] = {v & 255, (v >> 8) & 255, (v >> 16) & 255, v >> 24};
    fwrite(b, 1, 4, f);
}
static void put_i32(FILE *f, int v) { put_u32(f, (uint32_t)v); }
static void put_f32s(FILE *f, const float *a, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &a[i], 4);
        put_u32(f, u);
    }
}
static uint32_t get_u32(const unsigned char *p) {
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static float get_f32(const unsigned char *p) {
    uint32_t u = get_u32(p);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* ---- the reference run ---------------------------------------------------------------------------- */

typedef struct {
    int expert[T * 2], kept[T * 2];
    float aux, z;
    float out[T * D], dx[T * D], drouter[E * D], dw1[E * DFF * D], dw3[E * DFF * D], dw2[E * D * DFF];
} ref_result;

/* Fork/exec PYTHON SCRIPT CASE RESULT; returns its exit code, or -1 if it did not exit normally. */
static int run_script(const char *python, const char *script, const char *case_path, const char *res_path) {
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execl(python, python, script, case_path, res_path, (char *)NULL);
        perror("test_torch_reference: exec");
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void write_case(const char *path, const moe_config *c, const moe_layer_weights *w, const float *bias,
                       const float *x, const float *dout) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    size_t Efd = (size_t)E * DFF * D;
    fwrite("MOEC", 1, 4, f);
    const int header[] = {1, T, D, DFF, E, c->top_k, c->score_func, c->renormalize, c->drop_priority};
    for (size_t i = 0; i < sizeof header / sizeof *header; i++) put_i32(f, header[i]);
    put_f32s(f, &c->capacity_factor, 1), put_f32s(f, &c->aux_loss_coef, 1), put_f32s(f, &c->z_loss_coef, 1);
    put_f32s(f, x, T * D), put_f32s(f, w->router_w, E * D);
    put_f32s(f, w->w1, Efd), put_f32s(f, w->w3, Efd), put_f32s(f, w->w2, Efd);
    put_f32s(f, bias, E), put_f32s(f, dout, T * D);
    if (fclose(f) != 0) { perror(path); exit(1); }
}

/* Reads and validates the result file; returns 0 on success (the reason is printed otherwise). */
static int read_result(const char *path, int k, ref_result *r) {
    const size_t tk = (size_t)T * k, nf = 2 + 2 * T * D + E * D + 3 * (size_t)E * DFF * D;
    const size_t want = 28 + 4 * (2 * tk + nf);
    unsigned char *buf = malloc(want + 1);
    FILE *f = fopen(path, "rb");
    size_t got = f && buf ? fread(buf, 1, want + 1, f) : 0;
    if (f) fclose(f);
    int ok = buf && got == want && !memcmp(buf, "MOER", 4);
    const int expect[] = {1, T, D, DFF, E, k};
    for (int i = 0; ok && i < 6; i++) ok = (int)get_u32(buf + 4 + 4 * i) == expect[i];
    if (!ok) {
        fprintf(stderr, "%s: %zu bytes or header not as expected (want %zu bytes, MOER v1 T=%d d=%d d_ff=%d "
                        "E=%d k=%d)\n", path, got, want, T, D, DFF, E, k);
        free(buf);
        return -1;
    }
    const unsigned char *p = buf + 28;
    for (size_t i = 0; i < tk; i++, p += 4) r->expert[i] = (int)get_u32(p);
    for (size_t i = 0; i < tk; i++, p += 4) r->kept[i] = (int)get_u32(p);
    float *dst[] = {&r->aux, &r->z, r->out, r->dx, r->drouter, r->dw1, r->dw3, r->dw2};
    const size_t len[] = {1, 1, T * D, T * D, E * D, (size_t)E * DFF * D, (size_t)E * DFF * D, (size_t)E * D * DFF};
    for (int t = 0; t < 8; t++)
        for (size_t i = 0; i < len[t]; i++, p += 4) dst[t][i] = get_f32(p);
    free(buf);
    return 0;
}

/* Elementwise comparison; prints the largest error, absolute and relative to the tensor's scale. */
static double compare(const char *what, const float *c, const float *ref, size_t n) {
    double scale = 0, max_err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)c[i] - ref[i]);
        max_err = fmax(max_err, err);
        if (err > kAbsTol * scale + kRelTol * fabs(ref[i]) && bad++ == 0) first = i;
    }
    CHECK(bad == 0, "%s: %zu of %zu elements out of tolerance; first [%zu]: C %.8g, torch %.8g", what, bad, n,
          first, c[first], ref[first]);
    printf("    %-10s max|err| %.2e  max|ref| %.2e  err/scale %.2e\n", what, max_err, scale,
           scale > 0 ? max_err / scale : 0.0);
    return scale > 0 ? max_err / scale : max_err;
}

static void compare_scalar(const char *what, double c, double ref) {
    double err = fabs(c - ref);
    CHECK(err <= kScalarTol * fabs(ref), "%s: C %.9g, torch %.9g", what, c, ref);
    printf("    %-10s C %.7f  torch %.7f  |err| %.2e\n", what, c, ref, err);
}

/* Returns 77 if the reference was skipped, else 0 (failures are counted by CHECK). */
static int run_case(const ref_case *rc, const char *python, const char *script, const char *dir, uint64_t seed) {
    moe_config cfg = moe_config_default(D, DFF, E, rc->k);
    cfg.score_func = rc->func;
    cfg.renormalize = rc->renorm;
    cfg.capacity_factor = rc->cf;
    cfg.drop_priority = rc->prio;
    cfg.aux_loss_coef = 0.1f;
    cfg.z_loss_coef = 0.01f;
    moe_layer *layer = NULL;
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &layer));
    if (!layer) return 0;
    moe_rng rng = moe_rng_seeded(seed);
    test_weights w = test_weights_random(&cfg, 1, &rng), g = test_weights_zero(&cfg, 1);
    float *x = test_alloc_uniform(&rng, T * D, 1.5), *dout = test_alloc_uniform(&rng, T * D, 1.0);
    float *out = test_alloc_uniform(&rng, T * D, 0), *dx = test_alloc_uniform(&rng, T * D, 0);
    float *bias = moe_layer_expert_bias(layer);
    if (rc->func == MOE_SCORE_SIGMOID) moe_rng_fill_uniform(&rng, bias, E, 0.3);
    if (rc->ties) {
        memcpy(w.w.router_w + D, w.w.router_w, D * sizeof(float));
        for (int i = 0; i < D; i++) x[i] = 2 * w.w.router_w[i]; /* token 0's copies prefer experts 0 and 1 */
        for (int t = kTieRows; t < T; t++) memcpy(x + t * D, x + (t % kTieRows) * D, D * sizeof(float));
    }

    moe_layer_stats st;
    CHECK_OK(moe_layer_forward(layer, &w.w, x, T, out, &st));
    CHECK_OK(moe_layer_backward(layer, &w.w, dout, dx, &g.w));
    const moe_token_routing *r = moe__layer_token_routing(layer);
    const int k = rc->k, tk = T * k;
    char case_path[512], res_path[512];
    snprintf(case_path, sizeof case_path, "%s/case.bin", dir);
    snprintf(res_path, sizeof res_path, "%s/result.bin", dir);
    ref_result *ref = calloc(1, sizeof *ref);
    int code = -1;
    CHECK(r && ref, "%s: no routing after the forward, or out of memory", rc->name);
    if (!r || !ref) goto done;
    printf("%s: capacity %d, dropped %d/%d, aux %.5f, z %.5f\n", rc->name, st.capacity, st.num_dropped, tk,
           st.aux_loss, st.z_loss);
    /* A capacity case that drops nothing would not test dropping; make sure each one does. */
    CHECK((rc->cf > 0) == (st.num_dropped > 0), "%s: cf %g gave %d drops", rc->name, rc->cf, st.num_dropped);
    if (rc->func == MOE_SCORE_SIGMOID) { /* the bias must actually steer some selection */
        int plain[T * 2], changed = 0;
        moe_router_topk_cpu(r->scores, T, E, k, plain);
        for (int a = 0; a < tk; a++) changed += plain[a] != r->expert[a];
        CHECK(changed > 0, "%s: the expert bias changed no selection", rc->name);
    }
    if (rc->ties) { /* the ties must be exact in C and decide something: top-k order and capacity cuts */
        int topk_ties = 0, cut_ties = 0;
        for (int t = 0; t < T; t++)
            topk_ties += k > 1 && r->scores[t * E] == r->scores[t * E + 1] && r->expert[t * k] == 0 &&
                         r->expert[t * k + 1] == 1;
        for (int a = 0; a < tk; a++)
            for (int b = 0; b < tk && !r->kept[a]; b++)
                cut_ties += r->kept[b] && r->expert[b] == r->expert[a] &&
                            r->scores[b / k * E + r->expert[b]] == r->scores[a / k * E + r->expert[a]];
        printf("    ties       %d tokens pick 0 then its twin 1; %d kept/dropped pairs with equal scores\n",
               topk_ties, cut_ties);
        CHECK(topk_ties > 0 && cut_ties > 0, "%s: the tie case has no decisive ties", rc->name);
    }

    write_case(case_path, &cfg, &w.w, bias, x, dout);
    code = run_script(python, script, case_path, res_path);
    if (code == 0 && read_result(res_path, k, ref) == 0) {
        int id_bad = 0, kept_bad = 0;
        for (int a = 0; a < tk; a++) {
            id_bad += r->expert[a] != ref->expert[a];
            kept_bad += r->kept[a] != ref->kept[a];
            if (r->expert[a] != ref->expert[a] || r->kept[a] != ref->kept[a])
                fprintf(stderr, "  token %d choice %d: C expert %d kept %d, torch expert %d kept %d\n", a / k,
                        a % k, r->expert[a], r->kept[a], ref->expert[a], ref->kept[a]);
        }
        CHECK(id_bad == 0, "%s: %d expert ids differ", rc->name, id_bad);
        CHECK(kept_bad == 0, "%s: %d capacity decisions differ", rc->name, kept_bad);
        printf("    routing    expert ids and kept mask: %d + %d mismatches\n", id_bad, kept_bad);
        compare_scalar("aux", st.aux_loss, ref->aux);
        compare_scalar("z", st.z_loss, ref->z);
        size_t Efd = (size_t)E * DFF * D;
        compare("out", out, ref->out, T * D);
        compare("dx", dx, ref->dx, T * D);
        compare("d_router_w", g.w.router_w, ref->drouter, E * D);
        compare("dw1", g.w.w1, ref->dw1, Efd);
        compare("dw3", g.w.w3, ref->dw3, Efd);
        compare("dw2", g.w.w2, ref->dw2, Efd);
    } else if (code == TEST_SKIP) {
        printf("SKIP: %s could not import torch (see its message above)\n", script);
    } else {
        CHECK(code == 0, "%s: %s %s exited with %d (-1: did not exit normally)", rc->name, python, script, code);
        CHECK(code != 0, "%s: could not read the reference result", rc->name);
    }
done:
    unlink(case_path), unlink(res_path);
    free(ref), free(x), free(dout), free(out), free(dx);
    test_weights_free(&w), test_weights_free(&g);
    moe_layer_destroy(layer);
    return code == TEST_SKIP ? TEST_SKIP : 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PYTHON SCRIPT\n", argv[0]);
        return 1;
    }
    if (!strcmp(argv[1], "none")) {
        printf("SKIP: /usr/bin/python3 (Debian's python with python3-torch) was not found at configure time\n");
        return TEST_SKIP;
    }
    const ref_case cases[] = {
        {"softmax k=2 renorm dropless", MOE_SCORE_SOFTMAX, 2, 1, 0.0f, MOE_DROP_BY_TOKEN_ORDER, 0},
        {"softmax k=2 renorm cf=1 token-priority", MOE_SCORE_SOFTMAX, 2, 1, 1.0f, MOE_DROP_BY_TOKEN_ORDER, 0},
        {"softmax k=1 cf=1 score-priority", MOE_SCORE_SOFTMAX, 1, 0, 1.0f, MOE_DROP_BY_SCORE, 0},
        {"sigmoid k=2 renorm bias cf=1.25 token-priority", MOE_SCORE_SIGMOID, 2, 1, 1.25f, MOE_DROP_BY_TOKEN_ORDER, 0},
        {"softmax k=2 no-renorm dropless", MOE_SCORE_SOFTMAX, 2, 0, 0.0f, MOE_DROP_BY_TOKEN_ORDER, 0},
        {"softmax k=2 no-renorm cf=1 score-priority", MOE_SCORE_SOFTMAX, 2, 0, 1.0f, MOE_DROP_BY_SCORE, 0},
        {"sigmoid k=2 no-renorm bias cf=1 score-priority", MOE_SCORE_SIGMOID, 2, 0, 1.0f, MOE_DROP_BY_SCORE, 0},
        {"softmax k=2 renorm cf=1 score-priority exact ties", MOE_SCORE_SOFTMAX, 2, 1, 1.0f, MOE_DROP_BY_SCORE, 1},
        {"softmax k=2 renorm cf=1 token-prio exact ties", MOE_SCORE_SOFTMAX, 2, 1, 1.0f, MOE_DROP_BY_TOKEN_ORDER, 1},
    };
    char dir[] = "/tmp/moe-torch-ref-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    int skipped = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases && !skipped; i++)
        skipped = run_case(&cases[i], argv[1], argv[2], dir, 100 + i) == TEST_SKIP;
    rmdir(dir);
    if (skipped && !test_failures) return TEST_SKIP;
    return test_finish("test_torch_reference");
}
