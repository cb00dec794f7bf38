// The CUDA kernels' state extraction (cuda/exl3_lane_states.h: each lane cuts its 8 states out of three stream
// words) against the reference extract_state, for every K, lane and position, on random tiles. Host-compiled, so
// it runs in CPU CI; the device kernels use the same header.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda/exl3_lane_states.h"
#include "exl3_tile.h"

namespace kiln::exl3 {
namespace {

TEST(Exl3LaneStates, ThreeWordWindowEqualsExtractStateForEveryK) {
  std::mt19937 rng(7);
  for (int bits = 1; bits <= kMaxBits; ++bits) {
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<uint16_t> words(static_cast<size_t>(16 * bits));
      for (auto& w : words) w = static_cast<uint16_t>(rng());
      const int stream_words = 8 * bits;
      auto word = [&](int i) {
        i %= stream_words;
        return static_cast<uint32_t>(words[2 * i]) | (static_cast<uint32_t>(words[2 * i + 1]) << 16);
      };
      for (int lane = 0; lane < 32; ++lane) {
        const int first = lane_first_word(lane, bits);
        for (int q = 0; q < 8; ++q)
          ASSERT_EQ(lane_state(word(first), word(first + 1), word(first + 2), lane, q, bits),
                    extract_state(words.data(), bits, 8 * lane + q))
              << "K " << bits << " lane " << lane << " q " << q;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::exl3
