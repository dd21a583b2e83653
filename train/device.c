/* train/device.c — moe-train's placement on the CPU or a CUDA device (train/device.h). The CUDA part is a module
 * loaded on --device cuda (train/device_cuda.h), built only where libmoe_cuda builds (MOE_HAVE_CUDA); elsewhere
 * --device cuda is refused with the reason. */
#include "train/device.h"

#include <stdio.h>
#include <stdlib.h>

#include "alltoall/parallel_mpi.h"
#include "core/fail.h"
#include "train/device_cuda.h"
#include "train/rank_agreement.h"
#ifdef MOE_HAVE_CUDA
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>
#endif

#ifdef MOE_HAVE_CUDA
/* The CUDA part's entry points once loaded (train/device_cuda.h); NULL before. */
static moe_train_place_cuda_fn place_cuda;
static moe_train_cuda_profiler_range_fn profiler_range;
static moe_train_cuda_counters_fn counters;
static moe_train_cuda_gemms_fn gemms;

/* Loads libmoe_train_cuda.so from moe-train's own directory, once; every symbol is bound now (RTLD_NOW) so that
 * a module that does not match this moe-train is a sentence here, not a crash in the middle of a step. */
static moe_status load_cuda_part(void) {
    if (place_cuda) return MOE_OK;
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return moe_fail(MOE_ERR_IO, "--device cuda: cannot find moe-train's own directory (/proc/self/exe)");
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    const size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
    if (dir + sizeof MOE_TRAIN_CUDA_MODULE > sizeof path)
        return moe_fail(MOE_ERR_IO, "--device cuda: moe-train's directory name is too long");
    memcpy(path + dir, MOE_TRAIN_CUDA_MODULE, sizeof MOE_TRAIN_CUDA_MODULE);
    void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!module)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "--device cuda: cannot load moe-train's CUDA part: %s (it is built "
                        "beside moe-train; rebuild both)", dlerror());
    moe_train_place_cuda_fn place = (moe_train_place_cuda_fn)dlsym(module, MOE_TRAIN_CUDA_PLACE);
    moe_train_cuda_profiler_range_fn range = (moe_train_cuda_profiler_range_fn)dlsym(module,
                                                                                    MOE_TRAIN_CUDA_PROFILER_RANGE);
    moe_train_cuda_counters_fn count = (moe_train_cuda_counters_fn)dlsym(module, MOE_TRAIN_CUDA_COUNTERS);
    moe_train_cuda_gemms_fn pinned = (moe_train_cuda_gemms_fn)dlsym(module, MOE_TRAIN_CUDA_GEMMS);
    if (!place || !range || !count || !pinned)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "--device cuda: %s lacks its entry points; rebuild it with moe-train",
                        path);
    place_cuda = place, profiler_range = range, counters = count, gemms = pinned; /* all or none */
    return MOE_OK;
}
#endif

moe_status moe_train_place(const moe_train_options *o, MPI_Comm world, FILE *log, moe_train_placement *out) {
    *out = (moe_train_placement){.rt = NULL, .par = NULL, .device = -1};
    moe_status st;
    if (o->device != MOE_TRAIN_DEVICE_CUDA) {
        st = moe_parallel_create_mpi_tp(world, o->pp, o->ep, o->tp, o->exchange_timeout_s, &out->par);
    } else {
#ifdef MOE_HAVE_CUDA
        st = moe_train_agree(world, load_cuda_part()); /* all ranks load it, or none goes on */
        if (st == MOE_OK) st = place_cuda(o, world, log, out);
#else
        (void)log;
        st = moe_fail(MOE_ERR_INVALID_CONFIG, "--device cuda: this moe-train was built without CUDA (nvcc was not "
                                              "found when the build was configured): rebuild where the CUDA "
                                              "toolkit is installed");
#endif
    }
    if (st != MOE_OK) moe_train_unplace(out);
    return st;
}

moe_status moe_train_profile_mark(const moe_train_placement *p, int step, int begin) {
#ifdef MOE_HAVE_CUDA
    const char *range = getenv("MOE_PROFILE_STEPS");
    if (!p->rt || !range || !*range) return MOE_OK;
    int first = 0, last = 0;
    const int n = sscanf(range, "%d-%d", &first, &last);
    if (n < 1 || first < 1 || (n == 2 && last < first))
        return moe_fail(MOE_ERR_INVALID_ARG, "MOE_PROFILE_STEPS='%s': give a step or a range of steps (3, 3-5)",
                        range);
    if (n == 1) last = first;
    if (begin ? step != first : step != last) return MOE_OK;
    return profiler_range(p->rt, begin);
#else
    (void)p, (void)step, (void)begin;
    return MOE_OK;
#endif
}

int moe_train_gpu_counters(const moe_train_placement *p, moe_gpu_counters *out) {
#ifdef MOE_HAVE_CUDA
    if (!p->rt || !counters) return 0;
    counters(p->rt, out);
    return 1;
#else
    (void)p, (void)out;
    return 0;
#endif
}

int moe_train_gpu_gemms(const moe_train_placement *p, char *out, size_t n) {
    if (n) out[0] = '\0';
#ifdef MOE_HAVE_CUDA
    if (p->rt && gemms) return gemms(p->rt, out, n);
#else
    (void)p;
#endif
    return 0;
}

void moe_train_unplace(moe_train_placement *p) {
    moe_parallel_destroy(p->par); /* the layout borrows the runtime's GPU: it goes first */
    moe_runtime_destroy(p->rt);
    *p = (moe_train_placement){.rt = NULL, .par = NULL, .device = -1};
}
