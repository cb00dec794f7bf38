// The pooled DSA indexer on the GPU (cuda::pooled_indexer_pool_keys, _scores, _select) against
// cpu::pooled_indexer_pool_key / _scores / _select.
#include <gtest/gtest.h>

#include <algorithm>

#include "device_buffer.h"
#include "kernels/cpu/pooled_indexer.h"
#include "kernels/cuda/pooled_indexer.h"

namespace kiln::test {
namespace {

constexpr int64_t kDim = 128;
constexpr int64_t kPool = 16;
constexpr int64_t kTopk = 2048;
constexpr int64_t kCacheRow = 2 * kDim + 1;  // [k | gate | valid]

// A sequence of `context` tokens: its cache rows, every complete pool's key (GPU and CPU), then t_q queries at the
// last positions scored and selected; the selection must equal the CPU's, element for element.
void run_case(int64_t context, int64_t t_q, int64_t heads, bool tail, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "context " << context << " queries " << t_q << " heads " << heads << " tail "
                                  << tail);
  std::mt19937_64 rng(seed);
  const std::vector<float> cache = random_f32(size_t(context * kCacheRow), rng, -2.f, 2.f);
  const std::vector<float> ape = random_f32(size_t(kPool * kDim), rng, -1.f, 1.f);
  const int64_t num_pools = context / kPool;
  std::vector<int32_t> first_row(static_cast<size_t>(num_pools)), dst_row(static_cast<size_t>(num_pools));
  // Computed in two batches, as newly completed pools would be, in shuffled destination order.
  for (int64_t p = 0; p < num_pools; ++p) first_row[p] = int32_t(p * kPool), dst_row[p] = int32_t(p);
  std::shuffle(first_row.begin(), first_row.end(), rng);
  for (int64_t i = 0; i < num_pools; ++i) dst_row[i] = first_row[i] / int32_t(kPool);
  std::vector<float> want_keys(size_t(num_pools * kDim));
  for (int64_t p = 0; p < num_pools; ++p) {
    std::vector<float> k(size_t(kPool * kDim)), g(k.size());
    for (int64_t j = 0; j < kPool; ++j)
      for (int64_t c = 0; c < kDim; ++c) {
        k[j * kDim + c] = cache[(p * kPool + j) * kCacheRow + c];
        g[j * kDim + c] = cache[(p * kPool + j) * kCacheRow + kDim + c];
      }
    cpu::pooled_indexer_pool_key(k.data(), g.data(), ape.data(), kPool, kDim, want_keys.data() + p * kDim);
  }
  DeviceBuffer<float> d_cache(cache), d_ape(ape), d_keys(std::max<size_t>(want_keys.size(), 1));
  DeviceBuffer<int32_t> d_first(first_row), d_dst(dst_row);
  d_keys.poison();
  const int64_t half = num_pools / 2;
  KILN_STATUS_OK(cuda::pooled_indexer_pool_keys(d_cache.get(), kCacheRow, d_cache.get() + kDim, kCacheRow, d_ape.get(),
                                                d_first.get(), d_dst.get(), half, kPool, d_keys.get(), nullptr));
  KILN_STATUS_OK(cuda::pooled_indexer_pool_keys(d_cache.get(), kCacheRow, d_cache.get() + kDim, kCacheRow, d_ape.get(),
                                                d_first.get() + half, d_dst.get() + half, num_pools - half, kPool,
                                                d_keys.get(), nullptr));
  if (num_pools > 0) {
    std::vector<float> got_keys = d_keys.download();
    got_keys.resize(want_keys.size());
    EXPECT_LT(rel_error(got_keys, want_keys), 1e-6) << "pool keys";
  }

  const std::vector<float> q = random_f32(size_t(t_q * heads * kDim), rng, -1.f, 1.f);
  const std::vector<float> w = random_f32(size_t(t_q * heads), rng, -0.2f, 0.2f);
  const float scale = 1.f / std::sqrt(float(kDim));
  const int64_t q_pos0 = context - t_q;
  DeviceBuffer<float> d_q(q), d_w(w), d_scores(size_t(std::max<int64_t>(t_q * num_pools, 1)));
  d_scores.poison();
  KILN_STATUS_OK(cuda::pooled_indexer_scores(d_q.get(), d_w.get(), d_keys.get(), t_q, num_pools, heads, scale, q_pos0,
                                             kPool, d_scores.get(), nullptr));
  std::vector<float> got_scores = d_scores.download();
  got_scores.resize(size_t(t_q * num_pools));
  if (num_pools > 0) {
    // The CPU scores every pool; the GPU only the candidates (−inf elsewhere).
    std::vector<float> want_scores(got_scores.size());
    cpu::pooled_indexer_scores(q.data(), w.data(), want_keys.data(), t_q, num_pools, heads, kDim, scale,
                               want_scores.data());
    double num = 0, den = 0;
    for (int64_t s = 0; s < t_q; ++s)
      for (int64_t p = 0; p < num_pools; ++p) {
        const float gv = got_scores[s * num_pools + p], wv = want_scores[s * num_pools + p];
        if (p * kPool + kPool - 1 > q_pos0 + s) {
          ASSERT_TRUE(std::isinf(gv) && gv < 0) << s << " " << p;
          continue;
        }
        ASSERT_TRUE(std::isfinite(gv)) << s << " " << p;
        num += (double(gv) - wv) * (double(gv) - wv);
        den += double(wv) * wv;
      }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-5) << "scores";
  }

  // Selection from the GPU's scores must equal the CPU's selection from the same scores exactly.
  const int64_t width = kTopk + (tail ? kPool - 1 : 0) + 3;
  std::vector<int32_t> want(size_t(t_q * width));
  for (int64_t s = 0; s < t_q; ++s)
    cpu::pooled_indexer_select(got_scores.data() + s * num_pools, num_pools, q_pos0 + s, kPool, kTopk, tail,
                               want.data() + s * width, width, cpu::PoolTies::kLowestPool);
  DeviceBuffer<int32_t> d_ws(size_t(t_q * (kTopk / kPool))), d_out(want.size());
  d_out.poison();
  KILN_STATUS_OK(cuda::pooled_indexer_select(d_scores.get(), t_q, num_pools, q_pos0, kPool, kTopk, tail, d_ws.get(),
                                             d_out.get(), width, nullptr));
  EXPECT_EQ(d_out.download(), want);
}

TEST(PooledIndexerGpu, MatchesCpuAroundTheDenseThreshold) {
  // 2063 visible tokens = 128 complete pools + a 15-token tail: below and at it the selection is dense causal.
  run_case(2000, 4, 32, true, 41);
  run_case(2063, 3, 32, true, 42);
  run_case(2064, 2, 32, true, 43);
  run_case(5003, 5, 32, true, 44);
  run_case(20000, 2, 32, true, 45);
  run_case(65536, 2, 32, true, 51);  // 4,096 pools: the largest row ranked in one block
  run_case(70000, 2, 32, true, 52);  // 4,375 pools: ranked by topk_rows
}

TEST(PooledIndexerGpu, SmallOddShapesAndNoTail) {
  run_case(10, 3, 32, true, 46);   // no complete pool yet: the tail alone
  run_case(47, 40, 7, true, 47);   // queries across pool boundaries
  run_case(3000, 2, 64, false, 48);
  run_case(16, 1, 1, true, 49);
}

class PooledIndexerTies : public ::testing::TestWithParam<int64_t> {};

// Both ranking paths (one block up to 4,096 pools, topk_rows beyond), with many exact ties.
TEST_P(PooledIndexerTies, SelectionTiesGoToTheLowerPool) {
  std::mt19937_64 rng(50);
  const int64_t num_pools = GetParam(), t_q = 3, q_pos0 = num_pools * kPool - 2;
  std::vector<float> scores = random_f32(size_t(t_q * num_pools), rng, 0.f, 1.f);
  for (auto& v : scores) v = std::round(v * 8.f) / 8.f;  // many exact ties
  for (int64_t s = 0; s < t_q; ++s)
    for (int64_t p = 0; p < num_pools; ++p)
      if (p * kPool + kPool - 1 > q_pos0 + s) scores[s * num_pools + p] = -INFINITY;
  const int64_t width = kTopk + kPool - 1;
  std::vector<int32_t> want(size_t(t_q * width));
  for (int64_t s = 0; s < t_q; ++s)
    cpu::pooled_indexer_select(scores.data() + s * num_pools, num_pools, q_pos0 + s, kPool, kTopk, true,
                               want.data() + s * width, width, cpu::PoolTies::kLowestPool);
  DeviceBuffer<float> d_scores(scores);
  DeviceBuffer<int32_t> d_ws(size_t(t_q * (kTopk / kPool))), d_out(want.size());
  d_out.poison();
  KILN_STATUS_OK(cuda::pooled_indexer_select(d_scores.get(), t_q, num_pools, q_pos0, kPool, kTopk, true, d_ws.get(),
                                             d_out.get(), width, nullptr));
  EXPECT_EQ(d_out.download(), want);
}

INSTANTIATE_TEST_SUITE_P(Pools, PooledIndexerTies, ::testing::Values(700, 4096, 5000));

}  // namespace
}  // namespace kiln::test
