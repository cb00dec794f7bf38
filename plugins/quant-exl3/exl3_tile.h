// One 16×16 EXL3 tile: the tensor-core order of its 256 codes, the tail-biting bitstream that holds them, and the
// Hadamard rotation applied around the decoded matrix (specs/exl3.md §3, §5).
#pragma once

#include <array>
#include <cstdint>

namespace kiln::exl3 {

constexpr int kTile = 16;
constexpr int kTileValues = kTile * kTile;
constexpr int kMaxBits = 8;
constexpr int kHadamard = 128;

// Code position t → tile element r·16 + c (r: input row, c: output column): the B fragment of mma.m16n8k16.
const std::array<uint16_t, kTileValues>& tile_permutation();

// A tile's K·16 int16 words, as stored.
// The state of position t by direct extraction from the stream (the formula a device lane uses).
uint32_t extract_state(const uint16_t* words, int bits, int t);
// All 256 states in code order by the recurrence state_t = (state_{t−1} << K | v_t) & 0xFFFF, started from the
// tail (tail-biting): equal to extract_state for every t.
void tile_states(const uint16_t* words, int bits, uint32_t* states);
// The test encoder: 256 K-bit symbols in code order → the tile's words (every bit pattern is a valid encoding).
void encode_symbols(const uint8_t* symbols, int bits, uint16_t* words);

// The tile's decoded values in (r, c) order, row-major: out[r·16 + c], exact fp16 values.
enum class Codebook;
void decode_tile(const uint16_t* words, int bits, Codebook cb, float* out);

// x[0..128·blocks) ← blocks of H·x with H the 128-point Sylvester Hadamard / √128, in fp32, with `stride` between
// consecutive elements (1 for a row, the row length for a column).
void hadamard128(float* x, int64_t blocks, int64_t stride = 1);

}  // namespace kiln::exl3
