/* bench_moe_layer_gpu_ep.c — the gpu-ep variant of the MoE layer benchmark (bench_moe_layer_driver.h): one
 * training step of the layer under expert parallelism with one GPU per rank.
 *
 * Under mpirun -np W with --ep EP: as bench_moe_layer_ep (the global batch of --tokens-global tokens split
 * over the ranks in rank order, E/EP experts per rank, one step = forward + backward + gradient all-reduce,
 * the max over ranks of each rank's median, the time inside the exchanges by kind), on the CUDA runtime:
 * each rank takes device (its rank within its node, moe_parallel_node_rank) % (devices on the node), and the
 * layout is moe_parallel_create_mpi_gpu with --transport nccl (one GPU per rank) or mpi (device buffers
 * staged through pinned host memory; ranks may share a GPU). The runtime is synchronised after each part.
 * The expert GEMM path: fixed row blocks with --layout-invariant 1 (the default); with 0, MOE_EXPERT_GEMM
 * (per-expert, the default, or grouped). Exits 77, on every rank, when some rank has no GPU, after the flags are
 * parsed. Last line: "json: {...}".
 * Every rank makes the whole model on the host from --seed before keeping its experts (5.6 GB of fp32 at
 * the default shape), so host memory bounds the ranks per node.
 *
 *   ninja -C build bench/bench_moe_layer_gpu_ep
 *   mpirun -np 8 build/bench/bench_moe_layer_gpu_ep --ep 8 [--transport nccl --tokens-global 16384
 *       --d-model 4096 --d-ff 14336 --experts 8 --top-k 2 --warmup 3 --iters 10]
 */
#include <stdlib.h>

#include "alltoall/parallel_gpu_mpi.h"
#include "alltoall/parallel_mpi.h"
#include "bench/bench_moe_layer_mpi.h"
#include "core/gpu_cuda.h"

/* the words' indices are the moe_gpu_transport values */
_Static_assert(MOE_GPU_TRANSPORT_NCCL == 0 && MOE_GPU_TRANSPORT_MPI == 1, "kTransports follows moe_gpu_transport");
static const char *const kTransports[] = {"nccl", "mpi", NULL};

static const bench_flag kFlags[] = {
    BENCH_LAYER_MPI_FLAGS,
    BENCH_CHOICE("--transport", bench_layer_options, transport, kTransports,
                 "GPU exchanges: nccl (one GPU per rank) or mpi (staged through pinned host memory)"),
};

static struct cudaDeviceProp prop;
static int device, devices_per_node;

static void open_gpu_ep(bench_layer_run *r) {
    bench_check(moe_gpu_device_count(&devices_per_node), "moe_gpu_device_count");
    int mine = devices_per_node > 0, all = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all) { /* every rank leaves alike */
        if (bench_rank() == 0) printf("bench_moe_layer_gpu_ep: some rank has no CUDA device; nothing to measure\n");
        fflush(stdout);
        MPI_CHECK(MPI_Finalize());
        exit(77);
    }
    int node_rank = 0;
    bench_check(moe_parallel_node_rank(MPI_COMM_WORLD, &node_rank), "moe_parallel_node_rank");
    device = node_rank % devices_per_node;
    bench_check(moe_runtime_create_cuda(device, &r->rt), "moe_runtime_create_cuda");
    bench_check(moe_parallel_create_mpi_gpu(MPI_COMM_WORLD, 1, r->o->ep, 1, r->o->timeout_s, moe_runtime_gpu(r->rt),
                                            (moe_gpu_transport)r->o->transport, &r->par),
                "moe_parallel_create_mpi_gpu");
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) bench_fail("cudaGetDeviceProperties failed");
}

/* moe/layer_ops_cuda.c's choice: row blocks under layout invariance, else MOE_EXPERT_GEMM's */
static const char *expert_gemm_mode(const bench_layer_run *r) {
    const char *mode = getenv("MOE_EXPERT_GEMM");
    return r->cfg.layout_invariant ? "row-blocks" : mode ? mode : "per-expert";
}

static void describe_gpu_ep(const bench_layer_run *r) {
    const moe_ranks k = r->ranks;
    printf("gpu %s (%d SMs, %.1f GB; rank 0 on device %d of %d on its node) | transport %s | W=%d ep=%d dp=%d  "
           "experts/rank %d | expert GEMMs: %s\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1e9,
           device, devices_per_node, moe_comm_transport_name(moe_parallel_ep(r->par)), k.world_size, k.ep_size,
           k.edp_size, r->o->experts / k.ep_size, expert_gemm_mode(r));
}

static void json_gpu_ep(const bench_layer_run *r) {
    printf(",\"gpu\":");
    bench_json_string(prop.name);
    printf(",\"devices_per_node\":%d,\"transport_name\":", devices_per_node);
    bench_json_string(moe_comm_transport_name(moe_parallel_ep(r->par)));
    printf(",\"expert_gemm\":");
    bench_json_string(expert_gemm_mode(r));
}

static const bench_layer_variant kGpuEp = {
    .program = "bench_moe_layer_gpu_ep",
    .bench = "moe_layer_gpu_ep",
    .synopsis = "mpirun -np W bench_moe_layer_gpu_ep [flags]",
    .about = "one training step (forward, backward, gradient all-reduce) of the MoE layer under expert\n"
             "parallelism, one GPU per rank, and the time inside its exchanges; exit 77 without a GPU",
    .notes = "--ep must divide W and --experts; MOE_EXPERT_GEMM=per-expert|grouped picks the expert GEMM path with --layout-invariant 0",
    .tokens_flag = "--tokens-global",
    .distributed = 1,
    .defaults = {.tokens = 16384, .d_model = 4096, .d_ff = 14336, .experts = 8, .top_k = 2, .layout_invariant = 1,
                 .precision = MOE_PRECISION_BF16, /* the CUDA experts run bf16 */
                 .warmup = 3, .iters = 10, .seed = 1, .capacity_factor = 0, .ep = 1,
                 .transport = MOE_GPU_TRANSPORT_NCCL, .timeout_s = 300},
    .flags = kFlags,
    .num_flags = sizeof kFlags / sizeof kFlags[0],
    .start = bench_layer_mpi_start,
    .check = bench_layer_mpi_check,
    .open = open_gpu_ep,
    .describe = describe_gpu_ep,
    .json = json_gpu_ep,
    .finish = bench_layer_mpi_finish,
};

int main(int argc, char **argv) { return bench_moe_layer_main(&kGpuEp, argc, argv); }
