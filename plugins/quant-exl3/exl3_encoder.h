// The EXL3 encoder for one weight matrix (specs/exl3.md §6, without the Hessian): random signs and RMS scales on
// both sides, the 128-point Hadamard rotation on both sides (so the matrix the trellis must fit is close to i.i.d.
// Gaussian whatever the weight's outliers), a small grid search of the global scale, then the tail-biting Viterbi
// search per 16×16 tile, tiles in parallel (OpenMP).
//
// No LDLQ / Hessian feedback: the error minimised is the weight's own squared error per tile, not the layer
// output's error on calibration data, so quality at low K is below upstream's calibrated quantizer.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "exl3_codebook.h"

namespace kiln::exl3 {

struct EncodeOptions {
  int bits = 4;                        // K, 1..8
  Codebook codebook = Codebook::kMcg;
  uint64_t seed = 0;                   // the sign vectors' seed: same seed and weight → same bytes
  int threads = 0;                     // 0: OpenMP's default
  // Optional: searches `tiles` tiles at once (targets [tiles, 256] in code order → symbols [tiles, 256]) with the
  // same results as viterbi_tile, bit for bit (the plugin's CUDA search); false: the CPU searches those tiles.
  std::function<bool(const float* targets, int64_t tiles, int bits, const float* values, uint8_t* symbols)>
      tile_search;
};

// What a module stores (HF `weight` [out, in] → EXL3 orientation k = in, n = out, padded to multiples of 128).
struct EncodedMatrix {
  int64_t k_pad = 0, n_pad = 0;
  int bits = 0;
  std::vector<uint16_t> trellis;  // [k_pad/16, n_pad/16, 16·K] int16 words
  std::vector<uint16_t> suh;      // [k_pad] fp16 bits
  std::vector<uint16_t> svh;      // [n_pad] fp16 bits
  float scale = 0;                // the grid-searched global scale g (the trellis fits g·Ŵ-space targets)
};

// Tiles of a [out, in] weight: the unit of work the progress callback counts.
int64_t tile_count(int64_t out, int64_t in);

// Encodes the row-major fp32 weight `w` [out, in]. `progress(tiles)` is called on the calling thread with the
// number of tiles finished since the last call.
EncodedMatrix encode_matrix(const float* w, int64_t out, int64_t in, const EncodeOptions& options,
                            const std::function<void(int64_t)>& progress = {});

// The codebook's value for each of the 65,536 states (fp32 of the exact fp16 value).
const std::vector<float>& codebook_values(Codebook cb);

}  // namespace kiln::exl3
