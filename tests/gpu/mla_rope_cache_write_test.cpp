// The fused MLA rope + cache-write kernel against the CPU reference and, bit for bit, against the kernels it
// replaces run one after another (RoPE on q and on k_pe, mla_write_cache, f32_to_bf16 of q, the q_pe copy):
// GLM-4.7-Flash's widths and odd small ones, scattered slots, NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "device_buffer.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"
#include "runtime/cuda/mla_rope_cache_write.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::test {
namespace {

constexpr float kEps = 1e-6f;
constexpr double kBf16Tolerance = 1e-2;  // bf16 outputs: rel ‖Δ‖/‖ref‖

struct Dims {
  int64_t n, heads, nope, rope, latent;
};

TEST(GpuMlaRopeCacheWrite, MatchesCpuAndTheSeparateKernelsBitwise) {
  std::mt19937_64 rng(97);
  for (const Dims& d : {Dims{1, 20, 192, 64, 512}, Dims{5, 20, 192, 64, 512}, Dims{3, 7, 32, 16, 128},
                        Dims{4, 4, 16, 8, 33}, Dims{2, 3, 24, 0, 40},
                        // rope 128: the pairs span two warps; latent 1100: past the register form (the general one)
                        Dims{2, 3, 64, 128, 256}, Dims{2, 2, 16, 64, 1100},
                        // ≥ 128 rows: the prefill form (several heads a block; DeepSeek's 128 heads in 7 groups;
                        // latent 1100 with it), the same bits
                        Dims{200, 20, 192, 64, 512}, Dims{130, 7, 32, 16, 128}, Dims{128, 128, 128, 64, 512},
                        Dims{129, 2, 16, 64, 1100}, Dims{140, 3, 24, 0, 40}}) {
    const int64_t n = d.n, H = d.heads, qk = d.nope + d.rope, D = d.latent + d.rope, cache_rows = 3 * n + 1;
    const std::string what = "n " + std::to_string(n) + " heads " + std::to_string(H) + " rope " +
                             std::to_string(d.rope) + " latent " + std::to_string(d.latent);
    const std::vector<float> q = random_f32(size_t(n) * H * qk, rng, -2.f, 2.f);
    const std::vector<float> ckv = random_f32(size_t(n) * D, rng, -3.f, 3.f);
    const Bf16Data norm_w = random_bf16(d.latent, rng, 0.5f, 1.5f);
    std::vector<int64_t> positions(n), slots(n);
    for (auto& p : positions) p = std::uniform_int_distribution<int64_t>(0, 200000)(rng);
    std::vector<int64_t> all(cache_rows);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), n, slots.begin());
    cpu::RopeConfig rc;
    rc.theta = 1e6;
    rc.rotary_dim = std::max<int64_t>(d.rope, 2);
    const std::vector<float> inv_freq = cpu::rope_inv_freq(rc);

    // CPU reference.
    std::vector<float> want_q = q, want_ckv = ckv;
    if (d.rope > 0) {
      const int64_t half = d.rope / 2;
      std::vector<float> cs(size_t(n) * half), sn(cs.size());
      cpu::rope_cos_sin(inv_freq.data(), half, 1.0, positions.data(), n, cs.data(), sn.data());
      cpu::apply_rope_interleaved(want_q.data() + d.nope, n, H, H * qk, qk, cs.data(), sn.data(), d.rope);
      cpu::apply_rope_interleaved(want_ckv.data() + d.latent, n, 1, D, d.rope, cs.data(), sn.data(), d.rope);
    }
    std::vector<float> want_latent(size_t(n) * d.latent), got_latent, want_kpe, got_kpe;
    for (int64_t t = 0; t < n; ++t)
      cpu::rmsnorm(want_ckv.data() + t * D, norm_w.values.data(), 1, d.latent, kEps, want_latent.data() + t * d.latent);

    DeviceBuffer<int64_t> dpos(positions), dslots(slots);
    DeviceBuffer<float> dfreq(inv_freq);
    DeviceBuffer<uint16_t> dw(norm_w.bits);
    // Fused.
    DeviceBuffer<float> fq(q), fckv(ckv), fq_abs(size_t(n) * H * D);
    DeviceBuffer<uint16_t> fcache(size_t(cache_rows) * D), fq_bf(q.size());
    fq_abs.poison(), fcache.poison(), fq_bf.poison();
    cuda::MlaRopeCacheWrite a;
    a.q = fq.get(), a.ckv = fckv.get(), a.n = n, a.heads = H, a.nope = d.nope, a.rope = d.rope, a.latent = d.latent;
    a.positions = dpos.get(), a.inv_freq = dfreq.get(), a.attention_factor = 1.0f;
    a.norm_weight = dw.get(), a.eps = kEps, a.slots = dslots.get(), a.cache = fcache.get();
    a.q_bf = fq_bf.get(), a.q_abs = fq_abs.get();
    KILN_STATUS_OK(cuda::mla_rope_cache_write(a, nullptr));
    // The separate kernels, as the attention block ran them.
    DeviceBuffer<float> sq(q), sckv(ckv), sq_abs(size_t(n) * H * D);
    DeviceBuffer<uint16_t> scache(size_t(cache_rows) * D), sq_bf(q.size());
    sq_abs.poison(), scache.poison(), sq_bf.poison();
    if (d.rope > 0) {
      KILN_STATUS_OK(cuda::apply_rope_interleaved_f32(sq.get() + d.nope, n, H, H * qk, qk, dpos.get(), dfreq.get(),
                                                      1.0f, d.rope, nullptr));
      KILN_STATUS_OK(cuda::apply_rope_interleaved_f32(sckv.get() + d.latent, n, 1, D, d.rope, dpos.get(), dfreq.get(),
                                                      1.0f, d.rope, nullptr));
    }
    KILN_STATUS_OK(cuda::mla_write_cache(sckv.get(), n, d.latent, d.rope, dw.get(), kEps, dslots.get(), scache.get(),
                                         nullptr));
    KILN_STATUS_OK(cuda::f32_to_bf16(sq.get(), q.size(), sq_bf.get(), nullptr));
    if (d.rope > 0)
      KILN_CUDA_OK(cudaMemcpy2D(sq_abs.get() + d.latent, D * sizeof(float), sq.get() + d.nope, qk * sizeof(float),
                                d.rope * sizeof(float), n * H, cudaMemcpyDeviceToDevice));
    KILN_CUDA_OK(cudaDeviceSynchronize());

    const auto got_q = fq.download(), got_q_abs = fq_abs.download();
    const auto got_cache = fcache.download(), got_q_bf = fq_bf.download();
    EXPECT_LT(rel_error(got_q, want_q), 1e-5) << what;
    EXPECT_LT(rel_error(widen(got_q_bf), want_q), kBf16Tolerance) << what;
    std::vector<float> got_pe, want_pe;
    for (int64_t t = 0; t < n; ++t) {
      const auto row = got_cache.begin() + slots[t] * D;
      for (int64_t i = 0; i < d.latent; ++i) got_latent.push_back(cpu::bf16_to_float(row[i]));
      for (int64_t i = 0; i < d.rope; ++i) {
        got_kpe.push_back(cpu::bf16_to_float(row[d.latent + i]));
        want_kpe.push_back(want_ckv[t * D + d.latent + i]);
      }
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < d.rope; ++i) {
          got_pe.push_back(got_q_abs[(t * H + h) * D + d.latent + i]);
          want_pe.push_back(want_q[(t * H + h) * qk + d.nope + i]);
        }
    }
    EXPECT_LT(rel_error(got_latent, want_latent), kBf16Tolerance) << what;
    if (d.rope > 0) {
      EXPECT_LT(rel_error(got_kpe, want_kpe), kBf16Tolerance) << what;
      EXPECT_LT(rel_error(got_pe, want_pe), 1e-5) << what;
    }
    // Bit for bit the separate kernels' results (the untouched q_abs latent part and cache rows stay poisoned).
    auto same = [](const auto& x, const auto& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
    };
    EXPECT_TRUE(same(got_q, sq.download())) << what << ": q";
    EXPECT_TRUE(same(got_q_bf, sq_bf.download())) << what << ": q_bf";
    EXPECT_TRUE(same(got_q_abs, sq_abs.download())) << what << ": q_abs";
    EXPECT_TRUE(same(got_cache, scache.download())) << what << ": cache";

    // The latents as a strided slice of a wider row (the runner's q_a | kv_a GEMM output): the same cache rows.
    const int64_t pitch = D + 24;
    std::vector<float> wide(size_t(n) * pitch, 0.f);
    for (int64_t t = 0; t < n; ++t) std::copy_n(ckv.begin() + t * D, D, wide.begin() + t * pitch + 24);
    DeviceBuffer<float> wq(q), wckv(wide), wq_abs(size_t(n) * H * D);
    DeviceBuffer<uint16_t> wcache(size_t(cache_rows) * D), wq_bf(q.size());
    wq_abs.poison(), wcache.poison(), wq_bf.poison();
    cuda::MlaRopeCacheWrite ws = a;
    ws.q = wq.get(), ws.ckv = wckv.get() + 24, ws.ckv_stride = pitch, ws.cache = wcache.get();
    ws.q_bf = wq_bf.get(), ws.q_abs = wq_abs.get();
    KILN_STATUS_OK(cuda::mla_rope_cache_write(ws, nullptr));
    EXPECT_TRUE(same(wcache.download(), got_cache)) << what << ": cache from strided latents";

    // bf16 queries only (q_abs null, the expanded prefill form's steps; kKvFuseQueriesBf16Only): q_bf and the cache
    // rows are the same bits in every form; the wide and register forms leave q as given (unroped).
    DeviceBuffer<float> bq(q), bckv(ckv);
    DeviceBuffer<uint16_t> bcache(size_t(cache_rows) * D), bq_bf(q.size());
    bcache.poison(), bq_bf.poison();
    cuda::MlaRopeCacheWrite bo = a;
    bo.q = bq.get(), bo.ckv = bckv.get(), bo.cache = bcache.get(), bo.q_bf = bq_bf.get(), bo.q_abs = nullptr;
    KILN_STATUS_OK(cuda::mla_rope_cache_write(bo, nullptr));
    EXPECT_TRUE(same(bq_bf.download(), got_q_bf)) << what << ": q_bf, bf16 queries only";
    EXPECT_TRUE(same(bcache.download(), got_cache)) << what << ": cache, bf16 queries only";
    if (d.latent <= 1024) EXPECT_TRUE(same(bq.download(), q)) << what << ": q untouched, bf16 queries only";
  }
}

TEST(GpuMlaRopeCacheWrite, RejectsAnOddOrTooWideRope) {
  cuda::MlaRopeCacheWrite a;
  a.n = 1, a.heads = 1, a.nope = 8, a.latent = 16;
  a.rope = 7;
  EXPECT_FALSE(cuda::mla_rope_cache_write(a, nullptr).ok());
  a.rope = 130;
  EXPECT_FALSE(cuda::mla_rope_cache_write(a, nullptr).ok());
  a.rope = 8, a.ckv_stride = 23;  // narrower than latent + rope
  EXPECT_FALSE(cuda::mla_rope_cache_write(a, nullptr).ok());
}

}  // namespace
}  // namespace kiln::test
