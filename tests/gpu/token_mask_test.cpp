// kernels/cuda/token_mask against the host's rule (a clear bit makes the logit −inf, a set bit leaves it bit for
// bit): vocabularies that are and are not multiples of 32, all-allowed and all-refused words, rows in any order,
// and rows the masks do not name left untouched.
#include "kernels/cuda/token_mask.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "device_buffer.h"

namespace kiln::test {
namespace {

using cuda::mask_disallowed_logits;

class TokenMask : public ::testing::TestWithParam<int64_t> {};

TEST_P(TokenMask, MatchesTheHostRule) {
  const int64_t vocab = GetParam(), words = (vocab + 31) / 32, total_rows = 7;
  std::mt19937_64 rng(static_cast<uint64_t>(vocab));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(total_rows * vocab);
  for (float& x : logits) x = normal(rng);
  const std::vector<int32_t> rows = {5, 0, 3};  // any order; rows 1, 2, 4 and 6 are nobody's
  std::vector<uint32_t> masks(rows.size() * words);
  for (size_t i = 0; i < masks.size(); ++i) {
    const uint64_t r = rng();
    masks[i] = i % 5 == 0 ? 0xFFFFFFFFu : i % 5 == 1 ? 0u : static_cast<uint32_t>(r);
  }
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_rows(rows);
  DeviceBuffer<uint32_t> d_masks(masks);
  KILN_STATUS_OK(mask_disallowed_logits(d_logits.get(), vocab, d_rows.get(), d_masks.get(),
                                        static_cast<int64_t>(rows.size()), nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(logits.size());
  KILN_CUDA_OK(cudaMemcpy(got.data(), d_logits.get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<float> want = logits;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t v = 0; v < vocab; ++v)
      if (!((masks[i * words + v / 32] >> (v % 32)) & 1u)) want[rows[i] * vocab + v] = -INFINITY;
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenMask, ::testing::Values(1, 31, 32, 4096, 151552 + 7));

TEST(TokenMaskArgs, RefusesMissingBuffers) {
  EXPECT_FALSE(mask_disallowed_logits(nullptr, 32, nullptr, nullptr, 1, nullptr).ok());
  EXPECT_TRUE(mask_disallowed_logits(nullptr, 32, nullptr, nullptr, 0, nullptr).ok());  // nothing to do
}

}  // namespace
}  // namespace kiln::test
