// The vision tower's flash attention kernel (cuda/vision_flash_attention.*) on its own, at the head widths the tower
// instantiates, over frames that are not multiples of a key tile or of a block's queries, some small enough for the
// 4-warp blocks and some large enough for the 8-warp ones, against attention in double precision on the host.
// Tolerance: q, k, v and the probabilities are rounded to bf16 (8-bit mantissas) before the tensor-core products, so
// each output is within 2e-2 of the largest output magnitude (measured worst printed).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/vision_flash_attention.h"

namespace kiln::vision {
namespace {

struct FlashCase {
  int64_t heads, head_dim;
  std::vector<int64_t> frames;  // lengths, one after another in the same rows
};

std::vector<float> reference(const std::vector<float>& qkv, const FlashCase& c, float scale) {
  const int64_t h = c.heads * c.head_dim;
  int64_t n = 0;
  for (int64_t f : c.frames) n += f;
  std::vector<float> out(static_cast<size_t>(n * h));
  int64_t start = 0;
  for (int64_t len : c.frames) {
    for (int64_t head = 0; head < c.heads; ++head)
      for (int64_t i = 0; i < len; ++i) {
        const float* q = qkv.data() + (start + i) * 3 * h + head * c.head_dim;
        std::vector<double> s(static_cast<size_t>(len));
        double mx = -1e300;
        for (int64_t j = 0; j < len; ++j) {
          const float* k = qkv.data() + (start + j) * 3 * h + h + head * c.head_dim;
          double d = 0;
          for (int64_t e = 0; e < c.head_dim; ++e) d += static_cast<double>(q[e]) * k[e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int64_t e = 0; e < c.head_dim; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < len; ++j) acc += s[j] * qkv[(start + j) * 3 * h + 2 * h + head * c.head_dim + e];
          out[(start + i) * h + head * c.head_dim + e] = static_cast<float>(acc / sum);
        }
      }
    start += len;
  }
  return out;
}

class FlashAttention : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashAttention, MatchesDoublePrecisionAttention) {
  const FlashCase c = GetParam();
  const int64_t h = c.heads * c.head_dim;
  int64_t n = 0, longest = 0;
  for (int64_t f : c.frames) n += f, longest = std::max(longest, f);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> qkv(static_cast<size_t>(n * 3 * h));
  for (float& v : qkv) v = dist(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  float *d_qkv = nullptr, *d_out = nullptr;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&d_qkv, qkv.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, static_cast<size_t>(n * h) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, cuda::flash_attention_workspace_bytes(longest, c.heads, c.head_dim)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_out, 0xff, static_cast<size_t>(n * h) * 4), cudaSuccess);  // NaNs where nothing is written
  int64_t start = 0;
  for (int64_t len : c.frames) {
    ASSERT_EQ(cuda::flash_attention_frame(d_qkv, d_out, start, len, c.heads, c.head_dim, scale, ws, nullptr),
              cudaSuccess);
    start += len;
  }
  std::vector<float> got(static_cast<size_t>(n * h));
  ASSERT_EQ(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_qkv), cudaFree(d_out), cudaFree(ws);

  const std::vector<float> want = reference(qkv, c, scale);
  double worst = 0, largest = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " was not written";
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    largest = std::max(largest, std::abs(static_cast<double>(want[i])));
  }
  std::printf("flash attention, %lld heads of %lld: worst |error| %.3g of largest %.3g\n",
              static_cast<long long>(c.heads), static_cast<long long>(c.head_dim), worst, largest);
  EXPECT_LT(worst, 2e-2 * largest);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttention,
    ::testing::Values(FlashCase{16, 64, {1, 63, 65, 130}},   // tiny frames: 4-warp blocks, one partial key tile
                      FlashCase{16, 64, {1100, 17}},        // 9 × 16 = 144 blocks of 128 queries: 8-warp blocks
                      FlashCase{2, 128, {300, 2100}},       // the widest head, both block sizes
                      FlashCase{3, 32, {257}}, FlashCase{5, 16, {129, 3000}}),
    [](const auto& info) {
      return "heads" + std::to_string(info.param.heads) + "_hd" + std::to_string(info.param.head_dim) + "_case" +
             std::to_string(info.index);
    });

}  // namespace
}  // namespace kiln::vision
