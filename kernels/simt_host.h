/* simt_host.h — the few CUDA device features kernels/attention_flash.cu uses, modelled on the host, so that the
 * kernels' own source runs on a CPU, lane by lane (tests/test_flash_emulated.cc; built with -DMOE_SIMT_HOST by a
 * C++17 host compiler). Not a CUDA emulator: only what that file needs, each to its PTX ISA definition:
 *   - threads: every thread of a block is a user-level context (ucontext) with its own stack, switched on one OS
 *     thread, so the kernel's locals are per thread as registers are; blocks run one after another; threadIdx,
 *     blockIdx, blockDim and gridDim (x; y and z for blocks) read the running thread's and block's;
 *   - __syncthreads(): every thread of the block arrives before any leaves; warp collectives likewise over their
 *     warp's 32 lanes (each takes every lane's operand, then hands each lane its result), so a kernel whose lanes
 *     disagree on the collectives they run stops with a message (a deadlock watchdog), as real hardware would hang
 *     or misbehave;
 *   - __shfl_xor_sync; ldmatrix.sync.aligned.m8n8.x4 (.trans): lanes 8 m .. 8 m + 7 give matrix m's row addresses
 *     (each checked: inside the block's shared memory and 16-byte aligned), register m of lane t gets row t / 4,
 *     columns 2 (t % 4) and + 1 (with .trans rows 2 (t % 4) and + 1, column t / 4), the lower column in the low
 *     half; mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 through kernels/flash_tiles.h's fragment maps (the
 *     products of bf16 values are exact in fp32; the sum runs in k order, where the hardware's order is its own);
 *   - dynamic shared memory: one buffer per block, filled with 0xFF (NaN as bf16 and fp32) before it runs, so a read
 *     of a place no thread wrote shows up as NaN;
 *   - cp.async.cg (16 bytes, src-size 0 or 16), cp.async.commit_group and cp.async.wait_group N: a thread's copies
 *     land only when a wait covers their group (the latest moment the ISA allows), so a read that runs ahead of its
 *     wait, or of the barrier after it, reads the old bytes;
 *   - __expf as expf; cast_device.cuh's bf16 helpers by kernels/cast.h's rounding (the same bits).
 * Launch: moe_simt::launch(grid, threads, shared_bytes, body), body calling the kernel function. */
#ifndef MOE_KERNELS_SIMT_HOST_H
#define MOE_KERNELS_SIMT_HOST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

extern "C" {
#include "kernels/cast.h"
#include "kernels/flash_tiles.h"
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __expf expf
#define __syncthreads() moe_simt::block_barrier()
#define __shfl_xor_sync(mask, value, lane_mask) moe_simt::shfl_xor(value, lane_mask)
#define threadIdx (moe_simt::running_thread())
#define blockIdx (moe_simt::state().block)
#define blockDim (moe_simt::state().block_dim)
#define gridDim (moe_simt::state().grid)

struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

namespace moe_simt {

struct dim3 {
    unsigned x, y, z;
};

struct async_copy {
    void *dst;
    const void *src;
    bool valid; /* false: 16 zero bytes */
};

struct thread {
    ucontext_t context;
    unsigned x; /* threadIdx.x */
    bool done;
    std::vector<async_copy> open;                /* cp.async not yet committed */
    std::vector<std::vector<async_copy>> groups; /* committed, not yet waited for, oldest first */
};

enum { kStackBytes = 32 * 1024 }; /* a thread's stack: the kernels' locals are a few KiB */

struct launch_state {
    dim3 grid{1, 1, 1}, block{0, 0, 0}, block_dim{0, 1, 1};
    std::vector<thread> threads;
    std::vector<char> stacks; /* kStackBytes a thread, kept from launch to launch */
    size_t running = 0;
    ucontext_t scheduler;
    std::function<void()> body;
    std::vector<uint8_t> shared;
    unsigned block_arrived = 0, block_generation = 0;
    unsigned warp_arrived[32] = {0}, warp_generation[32] = {0};
    /* the warp collectives' mailboxes: [warp][lane] */
    float value[32][32];
    const uint16_t *address[32][32];
    uint32_t a[32][32][4], b[32][32][2];
    float c[32][32][4];
    size_t switches_without_progress = 0;
};

inline launch_state &state() {
    static launch_state s;
    return s;
}

inline dim3 running_thread() { return dim3{state().threads[state().running].x, 0, 0}; }

[[noreturn]] inline void fail(const char *what) {
    fprintf(stderr, "simt_host: block (%u, %u, %u) thread %u: %s\n", state().block.x, state().block.y,
            state().block.z, state().threads[state().running].x, what);
    abort();
}

/* the next unfinished thread in turn runs (straight from this one: a switch costs a signal-mask syscall, so not
 * through the scheduler); this one resumes here when its turn comes again */
inline void yield() {
    launch_state &s = state();
    if (++s.switches_without_progress > 100000000) fail("no thread makes progress (a collective some lanes skip?)");
    const size_t me = s.running, n = s.threads.size();
    for (size_t step = 1; step < n; step++) {
        const size_t next = (me + step) % n;
        if (s.threads[next].done) continue;
        s.running = next;
        swapcontext(&s.threads[me].context, &s.threads[next].context);
        s.running = me;
        return;
    }
}

/* every thread of the block (or of the running thread's warp) arrives before any leaves */
inline void block_barrier() {
    launch_state &s = state();
    const unsigned generation = s.block_generation;
    if (++s.block_arrived == s.threads.size()) {
        s.block_arrived = 0, s.block_generation++, s.switches_without_progress = 0;
        return;
    }
    while (s.block_generation == generation) yield();
}

inline unsigned lane() { return running_thread().x % 32; }
inline unsigned warp() { return running_thread().x / 32; }

inline void warp_barrier() {
    launch_state &s = state();
    const unsigned w = warp(), generation = s.warp_generation[w];
    if (++s.warp_arrived[w] == 32) {
        s.warp_arrived[w] = 0, s.warp_generation[w]++, s.switches_without_progress = 0;
        return;
    }
    while (s.warp_generation[w] == generation) yield();
}

inline float shfl_xor(float v, int lane_mask) {
    launch_state &s = state();
    s.value[warp()][lane()] = v;
    warp_barrier();
    const float got = s.value[warp()][lane() ^ (unsigned)lane_mask];
    warp_barrier();
    return got;
}

inline void check_shared(const uint16_t *p) {
    const uint8_t *base = state().shared.data(), *at = reinterpret_cast<const uint8_t *>(p);
    if (at < base || at + 16 > base + state().shared.size()) fail("a 16-byte shared access outside shared memory");
    if ((at - base) % 16) fail("a 16-byte shared access not 16-byte aligned");
}

inline void ldmatrix_x4(uint32_t r[4], const uint16_t *p, bool trans) {
    launch_state &s = state();
    const unsigned w = warp(), t = lane();
    check_shared(p);
    s.address[w][t] = p;
    warp_barrier();
    for (unsigned m = 0; m < 4; m++) {
        uint32_t word = 0;
        for (unsigned h = 0; h < 2; h++) {
            const unsigned source = 8 * m + (trans ? 2 * (t % 4) + h : t / 4);
            const uint16_t element = s.address[w][source][trans ? t / 4 : 2 * (t % 4) + h];
            word |= (uint32_t)element << (16 * h);
        }
        r[m] = word;
    }
    warp_barrier();
}

inline float bf16_half(uint32_t word, int h) { return moe_bf16_to_float((moe_bf16)(word >> (16 * h))); }

/* c += a b over the warp: each lane's fragments placed by flash_tiles.h's maps */
inline void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    launch_state &s = state();
    const unsigned w = warp(), t = lane();
    memcpy(s.a[w][t], a, sizeof s.a[w][t]);
    s.b[w][t][0] = b0, s.b[w][t][1] = b1;
    memcpy(s.c[w][t], c, sizeof s.c[w][t]);
    warp_barrier();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        for (int e = 0; e < 8; e++) {
            int row, col;
            moe_flash_frag_a(l, e, &row, &col);
            A[row][col] = bf16_half(s.a[w][l][e / 2], e % 2);
        }
        for (int e = 0; e < 4; e++) {
            int k, n;
            moe_flash_frag_b(l, e, &k, &n);
            B[k][n] = bf16_half(s.b[w][l][e / 2], e % 2);
        }
    }
    float d[4];
    for (int e = 0; e < 4; e++) {
        int row, col;
        moe_flash_frag_c((int)t, e, &row, &col);
        float sum = 0;
        for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
        d[e] = s.c[w][t][e] + sum;
    }
    warp_barrier();
    memcpy(c, d, sizeof d);
}

inline thread &me() { return state().threads[state().running]; }

inline void cp_async16(void *dst, const void *src, bool valid) {
    check_shared(static_cast<const uint16_t *>(dst));
    me().open.push_back(async_copy{dst, src, valid});
}
inline void cp_async_commit() {
    me().groups.push_back(me().open);
    me().open.clear();
}
inline void cp_async_wait(int pending) {
    thread &t = me();
    while (t.groups.size() > (size_t)pending) {
        for (const async_copy &c : t.groups.front()) {
            if (c.valid) memcpy(c.dst, c.src, 16);
            else memset(c.dst, 0, 16);
        }
        t.groups.erase(t.groups.begin());
    }
}

template <typename T>
inline T *shared_memory() {
    return reinterpret_cast<T *>(state().shared.data());
}

inline void thread_entry() {
    launch_state &s = state();
    s.body();
    s.threads[s.running].done = true;
    s.switches_without_progress = 0;
}

/* body() on every thread of every block of grid, blocks in x, then y, then z order */
inline void launch(dim3 grid, unsigned threads, size_t shared_bytes, std::function<void()> body) {
    launch_state &s = state();
    if (threads % 32 || threads > 1024) fail("launch: threads not whole warps of at most 1024");
    s.grid = grid, s.block_dim = dim3{threads, 1, 1}, s.body = body;
    if (s.stacks.size() < (size_t)threads * kStackBytes) s.stacks.resize((size_t)threads * kStackBytes);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                s.block = dim3{x, y, z};
                s.shared.assign(shared_bytes + 16, 0xFF);
                s.threads.assign(threads, thread{});
                s.block_arrived = 0;
                memset(s.warp_arrived, 0, sizeof s.warp_arrived);
                for (unsigned i = 0; i < threads; i++) {
                    thread &th = s.threads[i];
                    th.x = i, th.done = false;
                    getcontext(&th.context);
                    th.context.uc_stack.ss_sp = s.stacks.data() + (size_t)i * kStackBytes;
                    th.context.uc_stack.ss_size = kStackBytes;
                    th.context.uc_link = &s.scheduler;
                    makecontext(&th.context, thread_entry, 0);
                }
                for (size_t left = threads; left > 0;) {
                    left = 0;
                    for (size_t i = 0; i < threads; i++) {
                        if (s.threads[i].done) continue;
                        s.running = i;
                        swapcontext(&s.scheduler, &s.threads[i].context);
                        left += !s.threads[i].done;
                    }
                }
            }
}

} // namespace moe_simt

/* cast_device.cuh's helpers, by kernels/cast.h's rounding */
namespace moe_cuda {
inline uint16_t bf16_bits(float x) { return moe_bf16_from_float(x); }
inline uint32_t bf16_pack2(float lo, float hi) { return (uint32_t)bf16_bits(lo) | ((uint32_t)bf16_bits(hi) << 16); }
} // namespace moe_cuda

#endif
