/* test_gpu_ep_layer.c — the GPU layer across ranks, under mpirun, against a one-rank GPU run of the same
 * global batch computed in-process (its own moe_gpu context on the same device).
 *   -np 2: both ranks share GPU 0 through the MPI transport on device buffers (staged through pinned host
 *          memory), ep = 2: each rank holds 4 of the 8 experts and passes its slice of the tokens.
 *   -np 1: the NCCL transport with a world of one (NCCL refuses two ranks on one GPU), when built with NCCL.
 * Both runs take the reference's routing (moe_layer_force_routing), so what is compared is the data
 * movement and the arithmetic: kept sets and row counts exactly; outputs and input gradients of this
 * rank's tokens, and after moe_layer_reduce_gradients the router and local-expert gradients, within the
 * tight "ep_layer ..." rows of tests/test_tolerance.c (the GEMMs see other row counts per call, which may
 * change cuBLAS's kernel choice). */
#include <stdlib.h>
#include <string.h>

#include "alltoall/parallel_gpu_mpi.h"
#include "tests/test_gpu_util.h"
#include "tests/test_mpi.h"
#include "tests/test_tolerance.h"

enum { TG = 600, D = 64, F = 128, E = 8, K = 2 };

typedef struct {
    float *out, *dx, *grads;
    int *experts;
    int dropped;
} run_result;

/* forward + backward (+ reduce) of tokens [first, first + T) on `par`, host in and out */
static run_result run(moe_runtime *rt, const moe_parallel *par, const moe_config *cfg, const float *w_full, int first,
                      int T, const float *x, const float *dout, const int *forced) {
    moe_gpu *gpu = moe_runtime_gpu(rt);
    const moe_ranks me = moe_parallel_ranks(par);
    size_t P = moe_layer_num_params(cfg, me.ep_size), n = (size_t)T * D;
    /* this rank's parameters: the router, then its experts' slices of w1, w3, w2 */
    moe_layer_weights wf = moe_layer_weights_view(cfg, 1, (float *)w_full);
    float *w_host = malloc(P * sizeof(float));
    moe_layer_weights wl = moe_layer_weights_view(cfg, me.ep_size, w_host);
    size_t per = (size_t)moe_config_num_local_experts(cfg, me.ep_size) * F * D, off = (size_t)me.ep_rank * per;
    memcpy(wl.router_w, wf.router_w, (size_t)E * D * sizeof(float));
    memcpy(wl.w1, wf.w1 + off, per * sizeof(float));
    memcpy(wl.w3, wf.w3 + off, per * sizeof(float));
    memcpy(wl.w2, wf.w2 + off, per * sizeof(float));
    float *w_dev = test_gpu_upload(gpu, w_host, P * sizeof(float)), *g_dev = test_gpu_alloc(gpu, P * sizeof(float));
    test_mpi_require(moe_gpu_zero(gpu, g_dev, P * sizeof(float)), "zero gradients");
    float *x_dev = test_gpu_upload(gpu, x + (size_t)first * D, n * sizeof(float));
    float *dout_dev = test_gpu_upload(gpu, dout + (size_t)first * D, n * sizeof(float));
    float *out_dev = test_gpu_alloc(gpu, n * sizeof(float)), *dx_dev = test_gpu_alloc(gpu, n * sizeof(float));
    moe_layer_weights w = moe_layer_weights_view(cfg, me.ep_size, w_dev),
                      g = moe_layer_weights_view(cfg, me.ep_size, g_dev);
    moe_layer *L;
    moe_layer_stats st;
    test_mpi_require(moe_layer_create(cfg, rt, par, &L), "create");
    if (forced) test_mpi_require(moe_layer_force_routing(L, forced + (size_t)first * K), "force routing");
    test_mpi_require(moe_layer_forward(L, &w, x_dev, T, out_dev, &st), "forward");
    test_mpi_require(moe_layer_backward(L, &w, dout_dev, dx_dev, &g), "backward");
    test_mpi_require(moe_layer_reduce_gradients(L, &g), "reduce gradients");
    int Tg = 0;
    run_result r = {malloc(n * sizeof(float)), malloc(n * sizeof(float)), malloc(P * sizeof(float)),
                    malloc((size_t)TG * K * sizeof(int)), st.num_dropped};
    test_mpi_require(moe_layer_gather_routing(L, r.experts, &Tg), "gather routing");
    CHECK(Tg == TG, "rank %d: the global batch has %d tokens, want %d", me.world_rank, Tg, TG);
    test_gpu_download(gpu, r.out, out_dev, n * sizeof(float));
    test_gpu_download(gpu, r.dx, dx_dev, n * sizeof(float));
    test_gpu_download(gpu, r.grads, g_dev, P * sizeof(float));
    moe_layer_destroy(L);
    void *bufs[] = {w_dev, g_dev, x_dev, dout_dev, out_dev, dx_dev};
    for (int i = 0; i < 6; i++) test_gpu_free(gpu, bufs[i]);
    free(w_host);
    return r;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_mpi_min_devices_or_skip(test_gpu_device_count("test_gpu_ep_layer"), "test_gpu_ep_layer");
    moe_gpu_transport transport = W == 1 ? MOE_GPU_TRANSPORT_NCCL : MOE_GPU_TRANSPORT_MPI;
    moe_config cfg = moe_config_default(D, F, E, K);
    cfg.capacity_factor = 1.0f, cfg.aux_loss_coef = 0.1f, cfg.z_loss_coef = 0.01f;
    cfg.precision = MOE_PRECISION_BF16; /* the CUDA layer's experts */
    moe_rng rng = moe_rng_seeded(4242);
    test_weights w = test_weights_random(&cfg, 1, &rng); /* every expert: the reference's, on one rank */
    moe_real *x = test_alloc_uniform(&rng, (size_t)TG * D, 1.0), *dout = test_alloc_uniform(&rng, (size_t)TG * D, 1.0);

    moe_runtime *rt = NULL; /* every rank on device 0 */
    moe_parallel *ref_par, *par;
    test_mpi_require(moe_runtime_create_cuda(0, &rt), "CUDA runtime");
    test_mpi_require(moe_parallel_create_self_gpu(moe_runtime_gpu(rt), &ref_par), "one-rank GPU layout");
    run_result ref = run(rt, ref_par, &cfg, w.buffer, 0, TG, x, dout, NULL);
    moe_status st = moe_parallel_create_mpi_gpu(MPI_COMM_WORLD, 1, W, 1, 60.0, moe_runtime_gpu(rt), transport, &par);
    if (st == MOE_ERR_INVALID_CONFIG && transport == MOE_GPU_TRANSPORT_NCCL) {
        if (rank == 0) printf("test_gpu_ep_layer: skip: built without NCCL\n");
        MPI_Finalize();
        return TEST_SKIP;
    }
    test_mpi_require(st, "GPU layout over MPI");
    int first = rank * (TG / W), T = rank == W - 1 ? TG - first : TG / W;
    run_result got = run(rt, par, &cfg, w.buffer, first, T, x, dout, ref.experts);
    printf("rank %d (%s transport, ep %d): %d tokens, %d dropped\n", rank, W == 1 ? "nccl" : "mpi-staged", W, T,
           got.dropped);

    CHECK(!memcmp(got.experts, ref.experts, (size_t)TG * K * sizeof(int)), "rank %d: global routing differs", rank);
    size_t n = (size_t)T * D, off = (size_t)first * D;
    test_tolerance_check("ep_layer out", "bf16", got.out, ref.out + off, n, "out (this rank's tokens)");
    test_tolerance_check("ep_layer dx", "bf16", got.dx, ref.dx + off, n, "dx (this rank's tokens)");
    test_tolerance_check("ep_layer drouter_w", "bf16", got.grads, ref.grads, (size_t)E * D,
                         "d router_w (summed over ranks)");
    size_t per = (size_t)(E / W) * F * D, eoff = (size_t)rank * per, R = (size_t)E * D, full = (size_t)E * F * D;
    for (int m = 0; m < 3; m++) /* w1, w3, w2 of this rank's experts */
        test_tolerance_check("ep_layer dexperts", "bf16", got.grads + R + m * per, ref.grads + R + m * full + eoff,
                             per, "d %s (this rank's experts)", m == 0 ? "w1" : m == 1 ? "w3" : "w2");
    moe_parallel_destroy(par);
    moe_parallel_destroy(ref_par);
    moe_runtime_destroy(rt);
    return test_mpi_finish("test_gpu_ep_layer"); /* finalizes MPI */
}
