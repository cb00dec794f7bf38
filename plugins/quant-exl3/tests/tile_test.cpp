// One tile: the tensor-core permutation, the tail-biting bitstream (recurrence = scalar extraction, the test encoder
// round trip, the pair-swapped word layout) and the Hadamard rotation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "exl3_codebook.h"
#include "exl3_tile.h"

namespace kiln::exl3 {
namespace {

TEST(Exl3Tile, PermutationIsABijectionInMmaFragmentOrder) {
  const auto& perm = tile_permutation();
  std::set<int> seen(perm.begin(), perm.end());
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 255);
  // Lane 0: (0,0) (1,0) (8,0) (9,0) (0,8) (1,8) (8,8) (9,8); lane 5: r0 = 2, c0 = 1.
  const int lane0[8] = {0, 16, 128, 144, 8, 24, 136, 152};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(perm[i], lane0[i]);
  EXPECT_EQ(perm[8 * 5], 2 * 16 + 1);
  EXPECT_EQ(perm[8 * 5 + 7], 11 * 16 + 9);
}

TEST(Exl3Tile, RecurrenceEqualsScalarExtractionForEveryK) {
  std::mt19937 rng(14);
  for (int bits = 1; bits <= kMaxBits; ++bits)
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint16_t> words(16 * bits);
      for (auto& w : words) w = static_cast<uint16_t>(rng());
      uint32_t states[kTileValues];
      tile_states(words.data(), bits, states);
      for (int t = 0; t < kTileValues; ++t)
        ASSERT_EQ(states[t], extract_state(words.data(), bits, t)) << "K " << bits << " t " << t;
    }
}

TEST(Exl3Tile, EncodedSymbolsDecodeToTheirStates) {
  std::mt19937 rng(7);
  for (int bits = 1; bits <= kMaxBits; ++bits) {
    uint8_t symbols[kTileValues];
    for (auto& s : symbols) s = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
    std::vector<uint16_t> words(16 * bits);
    encode_symbols(symbols, bits, words.data());
    uint32_t states[kTileValues];
    tile_states(words.data(), bits, states);
    // state_t: the last 16 bits of the circular symbol sequence ending with v_t, built independently here.
    for (int t = 0; t < kTileValues; ++t) {
      uint32_t expect = 0;
      const int count = (16 + bits - 1) / bits;
      for (int back = count - 1; back >= 0; --back) expect = (expect << bits) | symbols[(t - back + kTileValues) % kTileValues];
      ASSERT_EQ(states[t], expect & 0xFFFFu) << "K " << bits << " t " << t;
      ASSERT_EQ(extract_state(words.data(), bits, t), expect & 0xFFFFu) << "K " << bits << " t " << t;
    }
  }
}

TEST(Exl3Tile, StreamIsMsbFirstWithAdjacentWordsSwapped) {
  // K = 8, symbol 0 = 0xA5, the rest 0: the stream's first 16-bit word w_0 = 0xA500 is stored at int16 index 1.
  uint8_t symbols[kTileValues] = {0xA5};
  std::vector<uint16_t> words(16 * 8);
  encode_symbols(symbols, 8, words.data());
  EXPECT_EQ(words[1], 0xA500);
  EXPECT_EQ(words[0], 0);
  for (size_t i = 2; i < words.size(); ++i) EXPECT_EQ(words[i], 0);
}

TEST(Exl3Tile, DecodedTilePlacesValuesByThePermutation) {
  std::mt19937 rng(3);
  std::vector<uint16_t> words(16 * 3);
  for (auto& w : words) w = static_cast<uint16_t>(rng());
  float tile[kTileValues];
  decode_tile(words.data(), 3, Codebook::kMcg, tile);
  const auto& perm = tile_permutation();
  for (int t = 0; t < kTileValues; ++t)
    EXPECT_EQ(tile[perm[t]], decode_state(extract_state(words.data(), 3, t), Codebook::kMcg));
}

TEST(Exl3Hadamard, IsSymmetricOrthonormalAndSylvester) {
  // Column b of the matrix is H applied to e_b.
  std::vector<float> h(kHadamard * kHadamard, 0.0f);
  for (int b = 0; b < kHadamard; ++b) h[b * kHadamard + b] = 1.0f;  // identity, one row per unit vector
  hadamard128(h.data(), kHadamard);                                  // H·e_b, row b
  const float unit = 1.0f / std::sqrt(128.0f);
  for (int a = 0; a < kHadamard; ++a)
    for (int b = 0; b < kHadamard; ++b) {
      EXPECT_FLOAT_EQ(h[a * kHadamard + b], (__builtin_popcount(a & b) % 2 ? -unit : unit));
      EXPECT_EQ(h[a * kHadamard + b], h[b * kHadamard + a]);
    }
  // H·H = I: apply it again.
  hadamard128(h.data(), kHadamard);
  for (int a = 0; a < kHadamard; ++a)
    for (int b = 0; b < kHadamard; ++b) EXPECT_NEAR(h[a * kHadamard + b], a == b ? 1.0f : 0.0f, 1e-6f);
  // Strided application (a column of a row-major matrix) equals the contiguous one.
  std::vector<float> x(2 * kHadamard), col(2 * kHadamard * 3, 0.0f);
  for (int i = 0; i < 2 * kHadamard; ++i) x[i] = col[i * 3 + 1] = static_cast<float>(i % 7) - 3.0f;
  hadamard128(x.data(), 2);
  hadamard128(col.data() + 1, 2, 3);
  for (int i = 0; i < 2 * kHadamard; ++i) EXPECT_EQ(x[i], col[i * 3 + 1]);
}

}  // namespace
}  // namespace kiln::exl3
