// Which trellis bits one lane of a warp needs for its 8 code positions of a 16×16 tile, and how it cuts its 8
// 16-bit states out of them (specs/exl3.md §3). Host and device code: the CPU tests check it against the reference
// extract_state for every K and lane, so the kernels' decoding differs from the CPU's only where they share it.
//
// Lane L holds positions 8L .. 8L+7 (the tensor-core permutation puts exactly its mma.m16n8k16 B fragments there).
// State t is the 16 stream bits ending at bit (t+1)·K, circular over the tile's 256·K bits, so the lane's states
// lie in bits [8L·K + K − 16, (8L + 8)·K): at most 7K + 16 bits, which for every K = 1..8 fit in three consecutive
// (circular) 32-bit stream words — the window below.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KILN_EXL3_HD __host__ __device__ __forceinline__
#else
#define KILN_EXL3_HD inline
#endif

namespace kiln::exl3 {

// The lane's window start in bits of one stream period past position 0 (adding a period keeps it non-negative).
KILN_EXL3_HD int lane_window_bit(int lane, int bits) { return 8 * lane * bits + bits - 16 + 256 * bits; }

// The first of the lane's three stream words (each word = int16 words 2i, 2i+1 read as a little-endian uint32).
KILN_EXL3_HD int lane_first_word(int lane, int bits) { return (lane_window_bit(lane, bits) / 32) % (8 * bits); }

// State of position 8·lane + q from the lane's words w0, w1, w2 (w0 = stream word lane_first_word, then the next
// two, circularly): the 16 bits ending `end` bits after w0's most significant bit, 16 ≤ end ≤ 96.
KILN_EXL3_HD uint32_t lane_state(uint32_t w0, uint32_t w1, uint32_t w2, int lane, int q, int bits) {
  const int end = (8 * lane + q + 1) * bits + 256 * bits - lane_window_bit(lane, bits) / 32 * 32;
  if (end <= 64) return static_cast<uint32_t>(((static_cast<uint64_t>(w0) << 32) | w1) >> (64 - end)) & 0xFFFFu;
  return static_cast<uint32_t>(((static_cast<uint64_t>(w1) << 32) | w2) >> (96 - end)) & 0xFFFFu;
}

}  // namespace kiln::exl3
