// The encoder's trellis search: optimal against exhaustive search on short trellises (free and closed ends), and the
// tail-biting tile search writes a stream that decodes to exactly the states it chose, at exactly its cost.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "exl3_codebook.h"
#include "exl3_encoder.h"
#include "exl3_tile.h"
#include "exl3_viterbi.h"

namespace kiln::exl3 {
namespace {

// Every path: the first state is any 16-bit state whose top 16 − K bits are the entering edge (any, when free),
// each next state is (s << K | v) & 0xFFFF; a closed path must leave through the edge it entered by.
double brute_force(const std::vector<float>& targets, int bits, const float* values, int64_t edge) {
  const uint32_t low = (1u << (16 - bits)) - 1u;
  double best = std::numeric_limits<double>::infinity();
  const int n = static_cast<int>(targets.size());
  std::vector<uint32_t> path(static_cast<size_t>(n));
  // Depth-first over symbols with the running cost.
  auto walk = [&](auto&& self, int t, uint32_t state, double cost, uint32_t entered) -> void {
    if (t == n) {
      if (edge < 0 || (state & low) == entered) best = std::min(best, cost);
      return;
    }
    for (uint32_t v = 0; v < (1u << bits); ++v) {
      const uint32_t s = ((state << bits) | v) & 0xFFFFu;
      const double d = double(values[s]) - targets[static_cast<size_t>(t)];
      self(self, t + 1, s, cost + d * d, entered);
    }
  };
  for (uint32_t e = 0; e <= low; ++e) {
    if (edge >= 0 && e != static_cast<uint32_t>(edge)) continue;
    walk(walk, 0, e, 0.0, e);
  }
  return best;
}

double path_cost(const std::vector<float>& targets, const uint32_t* states, const float* values) {
  double c = 0;
  for (size_t t = 0; t < targets.size(); ++t) c += (double(values[states[t]]) - targets[t]) * (values[states[t]] - targets[t]);
  return c;
}

TEST(Exl3Viterbi, MatchesExhaustiveSearchOnShortTrellises) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const float* values = codebook_values(Codebook::kMcg).data();
  struct Case { int bits, n; int64_t edge; };
  // 2^16·2^(K·(n−1)) paths each (≈ 17 M): K = 8 over 2 steps, K = 4 over 3, and closed paths (fixed edge).
  for (const Case c : {Case{8, 2, -1}, Case{4, 3, -1}, Case{8, 3, 0x5A}, Case{4, 4, 0x123}}) {
    for (int trial = 0; trial < 2; ++trial) {
      std::vector<float> targets(static_cast<size_t>(c.n));
      for (auto& x : targets) x = 1.2f * normal(rng);
      ViterbiWorkspace ws;
      std::vector<uint32_t> states(static_cast<size_t>(c.n));
      const double dp = viterbi_path(targets.data(), c.n, c.bits, values, c.edge, ws, states.data());
      const double exhaustive = brute_force(targets, c.bits, values, c.edge);
      EXPECT_NEAR(dp, exhaustive, 1e-5 * (1 + exhaustive)) << "K " << c.bits << " n " << c.n << " edge " << c.edge;
      // The traced path is a real path of that cost.
      EXPECT_NEAR(path_cost(targets, states.data(), values), dp, 1e-5 * (1 + dp));
      for (int t = 1; t < c.n; ++t)
        EXPECT_EQ(states[static_cast<size_t>(t)] >> c.bits, states[static_cast<size_t>(t - 1)] & ((1u << (16 - c.bits)) - 1u));
      if (c.edge >= 0) {
        EXPECT_EQ(states[0] >> c.bits, static_cast<uint32_t>(c.edge));
        EXPECT_EQ(states[static_cast<size_t>(c.n - 1)] & ((1u << (16 - c.bits)) - 1u), static_cast<uint32_t>(c.edge));
      }
    }
  }
}

TEST(Exl3Viterbi, TailBitingTileDecodesToTheChosenStatesForEveryK) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int bits = 1; bits <= 8; ++bits) {
    const Codebook cb = static_cast<Codebook>(bits % 3);
    const float* values = codebook_values(cb).data();
    float targets[kTileValues];
    for (auto& x : targets) x = normal(rng);
    ViterbiWorkspace ws;
    uint8_t symbols[kTileValues];
    uint32_t chosen[kTileValues], decoded[kTileValues];
    const double cost = viterbi_tile(targets, bits, values, ws, symbols, chosen);
    std::vector<uint16_t> words(static_cast<size_t>(kTile * bits));
    encode_symbols(symbols, bits, words.data());
    tile_states(words.data(), bits, decoded);
    for (int t = 0; t < kTileValues; ++t) {
      ASSERT_EQ(decoded[t], chosen[t]) << "K " << bits << " position " << t;
      ASSERT_EQ(extract_state(words.data(), bits, t), chosen[t]) << "K " << bits << " position " << t;
    }
    const std::vector<float> tv(targets, targets + kTileValues);
    EXPECT_NEAR(path_cost(tv, decoded, values), cost, 1e-4 * cost);
    // Closing the path costs something but not much: never below the free-ended optimum, and close to it (the free
    // path's first 16/K positions have no predecessor to agree with: ≈ 10 % at K = 1, 6 % at K = 2, < 5 % beyond).
    uint32_t free_states[kTileValues];
    const double free_cost = viterbi_path(targets, kTileValues, bits, values, -1, ws, free_states);
    EXPECT_GE(cost, free_cost * (1 - 1e-6));
    EXPECT_LE(cost, free_cost * (bits <= 2 ? 1.15 : 1.05) + 1e-3) << "K " << bits;
  }
}

}  // namespace
}  // namespace kiln::exl3
