/* test_flash_emulated.cc — the tensor-core flash attention's own kernels (kernels/attention_flash.cu, included here
 * and compiled for the host with -DMOE_SIMT_HOST) run lane by lane on the CPU by kernels/simt_host.h, before any GPU
 * runs them: every index, fragment, mask, tile bound and barrier of the CUDA source is exercised as written; what
 * stays for a GPU is the hardware itself (the instructions' models are their PTX ISA definitions, checked against
 * flash_tiles.h's maps by test_flash_tiles), timing, and launch limits.
 * For head_dim 32, 64 and 128 (the three tile plans): 2 sequences of 130 tokens (a partial second query tile, two or
 * three key tiles, the diagonal's masked tiles), 2 query heads on 1 kv head (grouped-query: dK/dV add both heads):
 *   forward (lse, out) against the CPU's fused attention under bf16 (kernels/attention_fused_cpu.c, the same
 *   rounding points) within the tolerance rows "attention fused" bf16 that the GPU is held to; dQ and dK/dV from the
 *   CPU's lse and out against its backward ("attention fused backward" bf16); no NaN anywhere (shared memory starts
 *   as NaN: a read of an unstaged place would show; cp.async copies land only at the wait that covers them: a read
 *   ahead of its wait sees the old tile); a sequence's results bitwise the same alone and beside another (at head_dim
 *   64: the second sequence run by itself); at head_dim 128, dK/dV with one and two stages of queries bitwise the same.
 * Run: meson test -C build test_flash_emulated (suite unit). */
#include "kernels/attention_flash.cu"

extern "C" {
#include "core/rng.h"
#include "core/threads.h"
#include "kernels/attention.h"
#include "tests/test_tolerance.h"
#include "tests/test_util.h"
}

namespace {

struct problem {
    int N, S, H, KV, hd;
    size_t nq, nkv, nlse;
    std::vector<float> q, k, v, dout;
};

struct results {
    std::vector<float> lse, out, dq, dk, dv;
};

std::vector<float> uniform(moe_rng *rng, size_t n) {
    std::vector<float> x(n);
    moe_rng_fill_uniform(rng, x.data(), n, 1);
    return x;
}

std::vector<uint16_t> bf16_of(const float *x, size_t n) { /* kernels/attention_flash.cu's cast_inputs */
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; i++) b[i] = moe_bf16_from_float(x[i]);
    return b;
}

/* the flash kernels on the host, forward then backward (from lse and out given: the CPU's, as the GPU test does), the
 * dK/dV kernel with STAGES stages of queries (the launch picks 2 where they fit, the same arithmetic) */
template <int HD, int STAGES>
void run_flash(const problem &p, const float *qf, const float *kf, const float *vf, const float *doutf, int N,
               const float *lse_in, const float *out_in, results *r) {
    using P = Plan<HD>;
    const FlashDims a = flash_dims(p.S, p.H, p.KV, HD);
    const size_t nq = (size_t)N * p.S * p.H * HD, nkv = (size_t)N * p.S * p.KV * HD, nlse = (size_t)N * p.H * p.S;
    const std::vector<uint16_t> qb = bf16_of(qf, nq), kb = bf16_of(kf, nkv), vb = bf16_of(vf, nkv);
    const std::vector<uint16_t> doutb = bf16_of(doutf, nq);
    const uint16_t *q = qb.data(), *k = kb.data(), *v = vb.data(), *dout = doutb.data();
    r->lse.assign(nlse, NAN), r->out.assign(nq, NAN), r->dq.assign(nq, NAN), r->dk.assign(nkv, NAN);
    r->dv.assign(nkv, NAN);
    const unsigned query_tiles = (unsigned)moe_flash_tiles_over(p.S, P::BM);
    const unsigned key_tiles = (unsigned)moe_flash_tiles_over(p.S, P::BN);
    float *lse = r->lse.data(), *out = r->out.data();
    moe_simt::launch({query_tiles, (unsigned)p.H, (unsigned)N}, P::BM / 16 * 32,
                     (size_t)(P::BM + 4 * P::BN) * P::LD * 2, [&]() { flash_forward<HD>(a, q, k, v, lse, out); });
    /* D_i = dout_i . out_i with dout rounded: kernels/attention_fused.cu's fused_row_dots */
    std::vector<float> D(nlse);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < p.H; h++)
            for (int i = 0; i < p.S; i++) {
                const size_t at = ((size_t)n * p.S + i) * a.ldq + (size_t)h * HD;
                float s = 0;
                for (int x = 0; x < HD; x++) s = fmaf(out_in[at + x], moe_bf16_to_float(dout[at + x]), s);
                D[((size_t)n * p.H + h) * p.S + i] = s;
            }
    float *dq = r->dq.data(), *dk = r->dk.data(), *dv = r->dv.data();
    moe_simt::launch({query_tiles, (unsigned)p.H, (unsigned)N}, P::BM / 16 * 32,
                     (size_t)(2 * P::BM + 4 * P::BN) * P::LD * 2,
                     [&]() { flash_backward_dq<HD>(a, q, k, v, lse_in, D.data(), dout, dq); });
    moe_simt::launch({key_tiles, (unsigned)p.KV, (unsigned)N}, P::BN / 16 * 32, DkvLayout<HD, STAGES>::kBytes,
                     [&]() { flash_backward_dkv<HD, STAGES>(a, q, k, v, lse_in, D.data(), dout, dk, dv); });
}

size_t nonfinite(const std::vector<float> &x) {
    size_t bad = 0;
    for (float v : x) bad += !isfinite(v);
    return bad;
}

template <int HD>
void check_head_dim(moe_rng *rng) {
    problem p{2, 130, 2, 1, HD, 0, 0, 0, {}, {}, {}, {}};
    p.nq = (size_t)p.N * p.S * p.H * HD, p.nkv = (size_t)p.N * p.S * p.KV * HD, p.nlse = (size_t)p.N * p.H * p.S;
    p.q = uniform(rng, p.nq), p.k = uniform(rng, p.nkv), p.v = uniform(rng, p.nkv), p.dout = uniform(rng, p.nq);
    /* the CPU's fused attention under bf16: the reference */
    results want;
    want.lse.resize(p.nlse), want.out.resize(p.nq), want.dq.resize(p.nq), want.dk.resize(p.nkv);
    want.dv.resize(p.nkv);
    std::vector<float> scratch(moe_attention_fused_scratch_count(HD) * 64);
    moe_threads_set(1);
    moe_attention_fused_forward_cpu(p.q.data(), p.k.data(), p.v.data(), p.N, p.S, p.H, p.KV, HD, 1, want.lse.data(),
                                    want.out.data(), scratch.data());
    moe_attention_fused_backward_cpu(p.q.data(), p.k.data(), p.v.data(), want.out.data(), want.lse.data(),
                                     p.dout.data(), p.N, p.S, p.H, p.KV, HD, 1, want.dq.data(), want.dk.data(),
                                     want.dv.data(), scratch.data());
    results got, one_stage;
    run_flash<HD, 2>(p, p.q.data(), p.k.data(), p.v.data(), p.dout.data(), p.N, want.lse.data(), want.out.data(), &got);
    char label[64];
    snprintf(label, sizeof label, "flash on the host, hd %d", HD);
    test_tolerance_check("attention fused", "bf16", got.lse.data(), want.lse.data(), p.nlse, "%s: lse", label);
    test_tolerance_check("attention fused", "bf16", got.out.data(), want.out.data(), p.nq, "%s: out", label);
    test_tolerance_check("attention fused backward", "bf16", got.dq.data(), want.dq.data(), p.nq, "%s: dq", label);
    test_tolerance_check("attention fused backward", "bf16", got.dk.data(), want.dk.data(), p.nkv, "%s: dk", label);
    test_tolerance_check("attention fused backward", "bf16", got.dv.data(), want.dv.data(), p.nkv, "%s: dv", label);
    const size_t bad = nonfinite(got.lse) + nonfinite(got.out) + nonfinite(got.dq) + nonfinite(got.dk) +
                       nonfinite(got.dv);
    CHECK(bad == 0, "%s: %zu values are NaN or infinite (unwritten, or read from unstaged shared memory)", label, bad);
    /* sequence 1 alone: its bits among 2 sequences (once: the grid's z is the sequence, whatever the head_dim) */
    bool same = true;
    if (HD == 64) {
        const size_t q1 = p.nq / 2, kv1 = p.nkv / 2, lse1 = p.nlse / 2;
        results alone;
        run_flash<HD, 2>(p, p.q.data() + q1, p.k.data() + kv1, p.v.data() + kv1, p.dout.data() + q1, 1,
                         want.lse.data() + lse1, want.out.data() + q1, &alone);
        same = !memcmp(alone.lse.data(), got.lse.data() + lse1, lse1 * 4) &&
               !memcmp(alone.out.data(), got.out.data() + q1, q1 * 4) &&
               !memcmp(alone.dq.data(), got.dq.data() + q1, q1 * 4) &&
               !memcmp(alone.dk.data(), got.dk.data() + kv1, kv1 * 4) &&
               !memcmp(alone.dv.data(), got.dv.data() + kv1, kv1 * 4);
        CHECK(same, "%s: sequence 1 alone differs from it beside sequence 0", label);
    }
    /* the dK/dV kernel with one stage of queries (what head_dim 128 runs on sm_80): the same bits */
    bool stages_same = true;
    if (HD == 128) {
        run_flash<HD, 1>(p, p.q.data(), p.k.data(), p.v.data(), p.dout.data(), p.N, want.lse.data(), want.out.data(),
                         &one_stage);
        stages_same = !memcmp(one_stage.dk.data(), got.dk.data(), p.nkv * 4) &&
                      !memcmp(one_stage.dv.data(), got.dv.data(), p.nkv * 4);
        CHECK(stages_same, "%s: dK/dV with one stage of queries differ from two", label);
    }
    printf("%s: %s%s%s\n", label, bad ? "NaN" : "finite",
           HD != 64 ? "" : same ? "; sequence 1 alone and beside another: bitwise" : "; sequence 1 alone: DIFFER",
           HD != 128 ? "" : stages_same ? "; dK/dV in 1 and 2 stages: bitwise" : "; dK/dV stages: DIFFER");
}

} // namespace

int main() {
    moe_rng rng = moe_rng_seeded(2026);
    check_head_dim<32>(&rng);
    check_head_dim<64>(&rng);
    check_head_dim<128>(&rng);
    return test_finish("test_flash_emulated");
}
