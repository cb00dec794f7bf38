// The DSA indexer's fp8 key rows (kiln/indexer_key_format.h, kiln/indexer_key_codec.h): the row bytes for known
// keys, and the index scores read from fp8 rows against the scores of the fp32 keys they quantize.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/dsa_indexer.h"
#include "kiln/indexer_key_codec.h"
#include "kiln/indexer_key_format.h"

namespace kiln::cpu {
namespace {

std::vector<uint8_t> encode(const std::vector<float>& k) {
  const int64_t dim = static_cast<int64_t>(k.size());
  std::vector<uint8_t> row(indexer_key_row_bytes(IndexerKeyFormat::kFp8E4m3Scaled, dim), 0xAB);
  encode_indexer_key_fp8(k.data(), dim, row.data());
  return row;
}

std::vector<uint8_t> scale_bytes(const std::vector<uint8_t>& row) { return {row.end() - 4, row.end()}; }

TEST(IndexerKeyFormat, RowBytes) {
  EXPECT_EQ(indexer_key_row_bytes(IndexerKeyFormat::kFp32, 128), 512u);
  EXPECT_EQ(indexer_key_row_bytes(IndexerKeyFormat::kFp8E4m3Scaled, 128), 132u);
  EXPECT_EQ(indexer_key_row_bytes(IndexerKeyFormat::kFp8E4m3Scaled, 16), 20u);
}

// Known keys, byte for byte: 128 codes, then the fp32 scale little-endian.
TEST(IndexerKeyFp8Row, ZeroKeyHasZeroCodesAndTheSmallestNormalScale) {
  const std::vector<uint8_t> row = encode(std::vector<float>(128, 0.0f));
  ASSERT_EQ(row.size(), 132u);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(row[i], 0x00) << i;
  EXPECT_EQ(scale_bytes(row), (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x00}));  // FLT_MIN = 2^-126
}

TEST(IndexerKeyFp8Row, SubnormalKeyKeepsFltMinScaleAndSubnormalCodes) {
  // 1e-40 is a float subnormal: amax / 448 < FLT_MIN, so scale = FLT_MIN and 1e-40 / 2^-126 = 0.0085 = 4.36 · 2^-9.
  std::vector<float> k(128, 0.0f);
  k[0] = 1e-40f, k[1] = -1e-40f;
  const std::vector<uint8_t> row = encode(k);
  EXPECT_EQ(row[0], 0x04);
  EXPECT_EQ(row[1], 0x84);
  for (int i = 2; i < 128; ++i) EXPECT_EQ(row[i], 0x00) << i;
  EXPECT_EQ(scale_bytes(row), (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x00}));
}

TEST(IndexerKeyFp8Row, HugeValuesScaleToTheTopCode) {
  // scale = 1e30 / 448 = 2.232143e27 (0x6CE6CC55); ±1e30 → ±448, 5e29 → 224 = 1.75 · 2^7.
  std::vector<float> k(128, 0.0f);
  k[3] = 1e30f, k[4] = -1e30f, k[5] = 5e29f;
  const std::vector<uint8_t> row = encode(k);
  EXPECT_EQ(row[3], 0x7E);
  EXPECT_EQ(row[4], 0xFE);
  EXPECT_EQ(row[5], 0x76);
  EXPECT_EQ(row[0], 0x00);
  EXPECT_EQ(scale_bytes(row), (std::vector<uint8_t>{0x55, 0xCC, 0xE6, 0x6C}));
}

TEST(IndexerKeyFp8Row, Plus448AndMinus448Boundaries) {
  // amax 448: scale exactly 1, so the codes are the values' own e4m3 (ties to even at 1.0625, 1.1875 and 432; an
  // e4m3 subnormal step 2^-9: 2^-10 ties to 0, 3 · 2^-10 to 2 · 2^-9).
  std::vector<float> k(128, 0.0f);
  const std::vector<float> head = {448.0f, -448.0f, 1.0f,   1.0625f, 1.1875f, 416.0f,
                                   432.0f, -440.0f, 0.0009765625f, 0.0029296875f};
  std::copy(head.begin(), head.end(), k.begin());
  const std::vector<uint8_t> row = encode(k);
  const std::vector<uint8_t> want = {0x7E, 0xFE, 0x38, 0x38, 0x3A, 0x7D, 0x7E, 0xFE, 0x00, 0x02};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(row[i], want[i]) << "value " << head[i];
  EXPECT_EQ(scale_bytes(row), (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3F}));  // 1.0f
  // Just past 448: scale 449 / 448 (0x3F804925) and 449 / scale = 447.99997, which rounds to the top code.
  k[0] = 449.0f;
  const std::vector<uint8_t> past = encode(k);
  EXPECT_EQ(past[0], 0x7E);
  EXPECT_EQ(scale_bytes(past), (std::vector<uint8_t>{0x25, 0x49, 0x80, 0x3F}));
}

TEST(IndexerKeyFp8Row, DecodesWithinHalfAnE4m3Step) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> k(128), back(128);
  for (float& x : k) x = normal(rng);
  const std::vector<uint8_t> row = encode(k);
  decode_indexer_key_fp8(row.data(), 128, back.data());
  const float scale = indexer_key_fp8_scale(row.data(), 128);
  for (int i = 0; i < 128; ++i)  // 3 mantissa bits: half a step is 2^-4 of the value, or 2^-10 · scale below 2^-6
    EXPECT_LE(std::fabs(back[i] - k[i]), std::max(std::fabs(k[i]) / 16.0f, scale / 1024.0f) * 1.0001f) << i;
}

// Scores from fp8 rows: (1) the same as fp32 scores over the keys the rows dequantize to, up to the fp32 rounding of
// where the key's scale is applied; (2) against the fp32 keys themselves, within the bound e4m3's rounding gives:
// |Δ score| ≤ Σ_h |w_h| · scale · Σ_i |q_hi| · |k_i − k̂_i| (ReLU is 1-Lipschitz). The relative drift is printed.
TEST(DsaIndexerFp8Scores, MatchTheDequantizedKeysAndStayWithinTheQuantizationBound) {
  const int64_t t_q = 5, t_kv = 70, heads = 8, dim = 128;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(t_q * heads * dim), k(t_kv * dim), w(t_q * heads);
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  for (float& x : w) x = 0.3f * normal(rng);
  const int64_t rb = static_cast<int64_t>(indexer_key_row_bytes(IndexerKeyFormat::kFp8E4m3Scaled, dim));
  std::vector<uint8_t> rows(t_kv * rb);
  std::vector<float> deq(t_kv * dim);
  for (int64_t t = 0; t < t_kv; ++t) {
    encode_indexer_key_fp8(k.data() + t * dim, dim, rows.data() + t * rb);
    decode_indexer_key_fp8(rows.data() + t * rb, dim, deq.data() + t * dim);
  }
  std::vector<float> fp8(t_q * t_kv), over_deq(t_q * t_kv), fp32(t_q * t_kv), at(t_q * t_kv);
  dsa_indexer_scores_fp8(q.data(), rows.data(), w.data(), t_q, t_kv, heads, dim, scale, fp8.data());
  dsa_indexer_scores(q.data(), deq.data(), w.data(), t_q, t_kv, heads, dim, scale, over_deq.data());
  dsa_indexer_scores(q.data(), k.data(), w.data(), t_q, t_kv, heads, dim, scale, fp32.data());
  std::vector<int64_t> positions(t_kv);
  for (int64_t t = 0; t < t_kv; ++t) positions[t] = t;
  dsa_indexer_scores_fp8_at(q.data(), rows.data(), positions.data(), w.data(), t_q, t_kv - t_q, t_kv, heads, dim,
                            scale, at.data());
  EXPECT_EQ(at, fp8) << "the _at form computes each pair exactly as the paged form";

  double num = 0, den = 0, worst_vs_deq = 0, top = 0;
  for (int64_t s = 0; s < t_q; ++s)
    for (int64_t t = 0; t < t_kv; ++t) {
      const size_t i = static_cast<size_t>(s * t_kv + t);
      if (std::isinf(fp32[i])) {
        EXPECT_TRUE(std::isinf(fp8[i]) && fp8[i] < 0) << s << "," << t;
        continue;
      }
      double bound = 0;
      for (int64_t h = 0; h < heads; ++h) {
        double e = 0;
        for (int64_t d = 0; d < dim; ++d)
          e += std::fabs(q[(s * heads + h) * dim + d]) * std::fabs(k[t * dim + d] - deq[t * dim + d]);
        bound += std::fabs(w[s * heads + h]) * scale * e;
      }
      EXPECT_LE(std::fabs(fp8[i] - fp32[i]), bound * 1.001 + 1e-5) << s << "," << t;
      worst_vs_deq = std::max(worst_vs_deq, static_cast<double>(std::fabs(fp8[i] - over_deq[i])));
      top = std::max(top, static_cast<double>(std::fabs(fp32[i])));
      num += (double(fp8[i]) - fp32[i]) * (double(fp8[i]) - fp32[i]), den += double(fp32[i]) * fp32[i];
    }
  const double rel = std::sqrt(num / den);
  std::printf("DSA indexer scores, fp8 keys vs fp32 keys: relative RMS %.3g; |fp8 − fp32 over dequantized keys| "
              "max %.3g of max |score| %.3g\n", rel, worst_vs_deq, top);
  EXPECT_LT(worst_vs_deq, 1e-5 * top);
  EXPECT_LT(rel, 0.05);  // e4m3's 2^-4 relative rounding averages down over 128-term dot products
  EXPECT_GT(rel, 0.0) << "fp8 scores equal fp32's exactly: the rows were not quantized";
}

}  // namespace
}  // namespace kiln::cpu
