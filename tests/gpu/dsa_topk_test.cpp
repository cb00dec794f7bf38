// DSA indexer scores and the row top-k against cpu::dsa_indexer_scores / cpu::dsa_select_topk / cpu::topk_indices.
#include <gtest/gtest.h>

#include "device_buffer.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/topk.h"
#include "kernels/cuda/dsa_indexer.h"
#include "kernels/cuda/topk.h"

namespace kiln::test {
namespace {

TEST(GpuDsaIndexer, ScoresAndSelectionMatchCpu) {
  std::mt19937_64 rng(51);
  for (auto [t_q, t_kv, heads] : {std::tuple{1, 1, 32}, {3, 100, 32}, {2, 3001, 64}, {4, 5000, 32}}) {
    const Bf16Data q = random_bf16(size_t(t_q) * heads * 128, rng);
    const Bf16Data k = random_bf16(size_t(t_kv) * 128, rng);
    const std::vector<float> w = random_f32(size_t(t_q) * heads, rng, -0.2f, 0.2f);
    const float scale = 1.0f / std::sqrt(128.0f);
    std::vector<float> want(size_t(t_q) * t_kv);
    cpu::dsa_indexer_scores(q.values.data(), k.values.data(), w.data(), t_q, t_kv, heads, 128, scale, want.data());
    DeviceBuffer<uint16_t> dq(q.bits), dk(k.bits);
    DeviceBuffer<float> dw(w), dscores(want.size());
    dscores.poison();
    KILN_STATUS_OK(cuda::dsa_indexer_scores_bf16(dq.get(), dk.get(), dw.get(), t_q, t_kv, heads, scale, dscores.get(),
                                                 nullptr));
    const std::vector<float> got = dscores.download();
    // fp32 sums of the same bf16 products in another order; masked entries must be exactly −inf.
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isinf(want[i])) {
        ASSERT_TRUE(std::isinf(got[i]) && got[i] < 0) << i;
        continue;
      }
      ASSERT_TRUE(std::isfinite(got[i])) << i;
      num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      den += double(want[i]) * want[i];
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-5);

    // Selection on the GPU's own scores must equal the CPU's selection on them exactly.
    const int64_t topk = 2048;
    std::vector<int32_t> want_sel(size_t(t_q) * topk);
    cpu::dsa_select_topk(got.data(), t_q, t_kv, topk, want_sel.data());
    DeviceBuffer<int32_t> dsel(want_sel.size());
    dsel.poison();
    KILN_STATUS_OK(cuda::topk_rows(dscores.get(), t_q, t_kv, topk, t_kv - t_q, dsel.get(), nullptr));
    EXPECT_EQ(dsel.download(), want_sel) << t_q << "x" << t_kv;
  }
}

TEST(GpuTopk, TiesNanAndOddSizesMatchCpu) {
  std::mt19937_64 rng(52);
  for (auto [rows, n, k] : {std::tuple{1, 1, 1}, {3, 10, 4}, {2, 154880, 2048}, {5, 4097, 50}, {2, 999, 999}}) {
    std::vector<float> v = random_f32(size_t(rows) * n, rng);
    // Coarse values force many exact ties; sprinkle NaN and infinities.
    for (auto& x : v) x = std::round(x * 20.f) / 20.f;
    for (size_t i = 0; i < v.size(); i += 97) v[i] = NAN;
    for (size_t i = 5; i < v.size(); i += 301) v[i] = -INFINITY;
    std::vector<int32_t> want(size_t(rows) * k, -1);
    for (int64_t r = 0; r < rows; ++r) cpu::topk_indices(v.data() + r * n, n, k, want.data() + r * k);
    DeviceBuffer<float> dv(v);
    DeviceBuffer<int32_t> dout(want.size());
    dout.poison();
    KILN_STATUS_OK(cuda::topk_rows(dv.get(), rows, n, k, -1, dout.get(), nullptr));
    EXPECT_EQ(dout.download(), want) << rows << "x" << n << " k " << k;
  }
}

}  // namespace
}  // namespace kiln::test
