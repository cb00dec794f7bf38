// mHC on the GPU (cuda::mhc_maps_collapse, mhc_mix) against cpu::mhc_maps / mhc_collapse / mhc_mix.
#include <gtest/gtest.h>

#include "device_buffer.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cuda/mhc.h"

namespace kiln::test {
namespace {

constexpr int64_t kS = 4;

void run_case(int64_t n, int64_t dim, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "n " << n << " dim " << dim);
  std::mt19937_64 rng(seed);
  const float fn_amp = 2.f / std::sqrt(float(kS * dim));
  const std::vector<float> fn = random_f32(size_t(24 * kS * dim), rng, -fn_amp, fn_amp);
  const std::vector<float> base = random_f32(24, rng, -1.f, 1.f);
  const std::vector<float> scale = random_f32(3, rng, 0.5f, 2.f);
  const std::vector<float> x = random_f32(size_t(n * kS * dim), rng, -3.f, 3.f);
  cpu::MhcParams cp;
  cp.fn = fn.data();
  cp.base = base.data();
  cp.scale = scale.data();
  cp.streams = kS;
  cp.dim = dim;
  std::vector<float> pre(size_t(n * kS)), post(pre.size()), comb(size_t(n * kS * kS)), h(size_t(n * dim));
  cpu::mhc_maps(x.data(), n, cp, pre.data(), post.data(), comb.data());
  cpu::mhc_collapse(x.data(), pre.data(), n, kS, dim, h.data());

  DeviceBuffer<float> d_x(x), d_fn(fn), d_base(base), d_scale(scale);
  DeviceBuffer<float> d_pre(pre.size()), d_post(post.size()), d_comb(comb.size()), d_h(h.size());
  DeviceBuffer<uint16_t> d_h16(h.size());
  for (auto* b : {&d_pre, &d_post, &d_comb, &d_h}) b->poison();
  d_h16.poison();
  cuda::MhcDeviceParams p;
  p.fn = d_fn.get();
  p.base = d_base.get();
  p.scale = d_scale.get();
  p.dim = dim;
  KILN_STATUS_OK(cuda::mhc_maps_collapse(d_x.get(), n, p, d_pre.get(), d_post.get(), d_comb.get(), d_h.get(),
                                         d_h16.get(), nullptr));
  const double e_pre = rel_error(d_pre.download(), pre), e_post = rel_error(d_post.download(), post);
  const double e_comb = rel_error(d_comb.download(), comb), e_h = rel_error(d_h.download(), h);
  const double e_h16 = rel_error(widen(d_h16.download()), h);
  // fp32 dot products of 4 · dim terms in another order; Sinkhorn is well conditioned here.
  EXPECT_LT(e_pre, 1e-5);
  EXPECT_LT(e_post, 1e-5);
  EXPECT_LT(e_comb, 1e-5);
  EXPECT_LT(e_h, 1e-5);
  EXPECT_LT(e_h16, 4e-3);
  // Doubly stochastic comb (up to hc_eps and the last column step).
  const std::vector<float> got_comb = d_comb.download();
  for (int64_t t = 0; t < n; t += std::max<int64_t>(1, n / 7))
    for (int64_t j = 0; j < kS; ++j) {
      float col = 0;
      for (int64_t i = 0; i < kS; ++i) col += got_comb[t * 16 + i * 4 + j];
      EXPECT_NEAR(col, 1.f, 1e-4f);
    }

  // Mix: x ← post · y + Σ_i comb[i][j] x_i, with y in bf16 and in fp32.
  const Bf16Data y = random_bf16(size_t(n * dim), rng, -2.f, 2.f);
  std::vector<float> want = x;
  cpu::mhc_mix(want.data(), y.values.data(), post.data(), comb.data(), n, kS, dim);
  DeviceBuffer<uint16_t> d_y16(y.bits);
  DeviceBuffer<float> d_y32(y.values), d_post_ref(post), d_comb_ref(comb), d_x2(x);
  KILN_STATUS_OK(cuda::mhc_mix(d_x.get(), d_y16.get(), d_post_ref.get(), d_comb_ref.get(), n, dim, nullptr));
  KILN_STATUS_OK(cuda::mhc_mix(d_x2.get(), d_y32.get(), d_post_ref.get(), d_comb_ref.get(), n, dim, nullptr));
  const double e_mix = rel_error(d_x.download(), want), e_mix32 = rel_error(d_x2.download(), want);
  EXPECT_LT(e_mix, 1e-6);
  EXPECT_LT(e_mix32, 1e-6);
  std::printf("  mhc n %ld dim %ld: pre %.1e post %.1e comb %.1e h %.1e h_bf16 %.1e mix %.1e\n", long(n), long(dim),
              e_pre, e_post, e_comb, e_h, e_h16, e_mix);
}

TEST(MhcGpu, MapsCollapseAndMixMatchCpuAtFlashShapes) {
  run_case(1, 4096, 31);
  run_case(5, 4096, 32);
  run_case(601, 4096, 33);  // the 4-tokens-per-CTA path with a partial last CTA
}

TEST(MhcGpu, SmallAndOddShapes) {
  run_case(3, 4, 34);
  run_case(2, 36, 35);
  run_case(515, 20, 36);
}

}  // namespace
}  // namespace kiln::test
