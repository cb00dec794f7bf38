#include "exl3_tile.h"

#include <cmath>
#include <cstring>

#include "exl3_codebook.h"

namespace kiln::exl3 {
namespace {

// Stream word i read as the little-endian uint32 of int16 words 2i, 2i+1: this view undoes the pair swap, and
// stream bit b is then bit 31 − b mod 32 of word b / 32.
uint32_t stream_word(const uint16_t* words, int64_t i) {
  return static_cast<uint32_t>(words[2 * i]) | (static_cast<uint32_t>(words[2 * i + 1]) << 16);
}

uint32_t stream_bit(const uint16_t* words, int64_t b) { return (stream_word(words, b / 32) >> (31 - b % 32)) & 1u; }

std::array<uint16_t, kTileValues> make_permutation() {
  std::array<uint16_t, kTileValues> perm{};
  for (int lane = 0; lane < 32; ++lane) {
    const int r0 = 2 * (lane % 4), c0 = lane / 4;
    const int rows[8] = {r0, r0 + 1, r0 + 8, r0 + 9, r0, r0 + 1, r0 + 8, r0 + 9};
    const int cols[8] = {c0, c0, c0, c0, c0 + 8, c0 + 8, c0 + 8, c0 + 8};
    for (int i = 0; i < 8; ++i) perm[8 * lane + i] = static_cast<uint16_t>(rows[i] * kTile + cols[i]);
  }
  return perm;
}

}  // namespace

const std::array<uint16_t, kTileValues>& tile_permutation() {
  static const std::array<uint16_t, kTileValues> perm = make_permutation();
  return perm;
}

uint32_t extract_state(const uint16_t* words, int bits, int t) {
  const int64_t b0 = static_cast<int64_t>(t) * bits + bits - 16 + kTileValues * bits;  // + one stream: never negative
  const int64_t b1 = b0 + 16;
  const int64_t i0 = b0 / 32, i1 = (b1 - 1) / 32, w = 8 * bits;
  const uint64_t a = stream_word(words, i0 % w), b = stream_word(words, i1 % w);
  return static_cast<uint32_t>(((a << 32) | b) >> ((i1 + 1) * 32 - b1)) & 0xFFFFu;
}

void tile_states(const uint16_t* words, int bits, uint32_t* states) {
  const int64_t total = static_cast<int64_t>(kTileValues) * bits;
  // Tail-biting: the state before position 0 is the stream's last 16 bits.
  uint32_t state = 0;
  for (int64_t b = total - 16; b < total; ++b) state = (state << 1) | stream_bit(words, b);
  for (int t = 0; t < kTileValues; ++t) {
    uint32_t v = 0;
    for (int j = 0; j < bits; ++j) v = (v << 1) | stream_bit(words, static_cast<int64_t>(t) * bits + j);
    state = ((state << bits) | v) & 0xFFFFu;
    states[t] = state;
  }
}

void encode_symbols(const uint8_t* symbols, int bits, uint16_t* words) {
  std::memset(words, 0, sizeof(uint16_t) * kTile * bits);
  for (int t = 0; t < kTileValues; ++t)
    for (int j = 0; j < bits; ++j) {
      if (!((symbols[t] >> (bits - 1 - j)) & 1u)) continue;
      const int64_t b = static_cast<int64_t>(t) * bits + j;
      const int pos = 31 - static_cast<int>(b % 32);  // bit of the little-endian uint32 stream word
      words[2 * (b / 32) + pos / 16] |= static_cast<uint16_t>(1u << (pos % 16));
    }
}

void decode_tile(const uint16_t* words, int bits, Codebook cb, float* out) {
  uint32_t states[kTileValues];
  tile_states(words, bits, states);
  const auto& perm = tile_permutation();
  for (int t = 0; t < kTileValues; ++t) out[perm[t]] = decode_state(states[t], cb);
}

void hadamard128(float* x, int64_t blocks, int64_t stride) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHadamard));
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float* v = x + blk * kHadamard * stride;
    // Sylvester order: the butterfly gives H[a][b] = (−1)^popcount(a & b).
    for (int h = 1; h < kHadamard; h *= 2)
      for (int i = 0; i < kHadamard; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = v[j * stride], b = v[(j + h) * stride];
          v[j * stride] = a + b;
          v[(j + h) * stride] = a - b;
        }
    for (int i = 0; i < kHadamard; ++i) v[i * stride] *= scale;
  }
}

}  // namespace kiln::exl3
