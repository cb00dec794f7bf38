// One EXL3-quantized linear module as stored in a checkpoint (specs/exl3.md §1), and its CPU reference arithmetic.
// Stored orientation is W [k = in, n = out] (y = x·W), both dims zero-padded to multiples of 128; the LinearSpec gives
// the real dims, so padding is checked against them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exl3_codebook.h"
#include "kiln/weight_format.h"

namespace kiln::exl3 {

struct Module {
  std::string name;
  int64_t in = 0, out = 0;        // real features (the LinearSpec's)
  int64_t k_pad = 0, n_pad = 0;   // stored, multiples of 128
  int bits = 0;                   // K, 1..8
  Codebook codebook = Codebook::k3Inst;
  const uint16_t* trellis = nullptr;  // [k_pad/16, n_pad/16, 16·K] int16, a view into the checkpoint
  std::vector<float> suh;         // [k_pad] input sign × scale (legacy .su: ±1)
  std::vector<float> svh;         // [n_pad] output sign × scale
  std::vector<float> bias;        // [out], empty when the module has none

  const uint16_t* tile(int64_t i, int64_t j) const { return trellis + (i * (n_pad / 16) + j) * 16 * bits; }
};

// EXL3 iff `<name>.trellis` plus `.suh` or `.su` plus `.svh` or `.sv` (specs/exl3.md §1).
bool is_exl3_module(const WeightSource& source, const std::string& name);
// Whether any EXL3 tensor of the module is present: a half-stored module is an error, not a dense one.
bool has_exl3_tensors(const WeightSource& source, const std::string& name);
// Whether no module of `names` has an EXL3 tensor (false for a synthetic source, which has every name): such a
// stack is what the quantizer left dense, served by the built-in `dense` format where the core offers it.
bool all_stored_dense(const WeightSource& source, const std::vector<std::string>& names);
// The same over the routed experts' gate, up and down projections ("<prefix>.<e>.<proj>_proj").
bool experts_stored_dense(const WeightSource& source, const std::string& prefix, int64_t num_experts);

Result<Module> read_module(const WeightSource& source, const std::string& name, int64_t in, int64_t out);

// Ŵ [k_pad, n_pad], row-major: the decoded codebook matrix.
std::vector<float> decode_matrix(const Module& m);

// y[n, out] = (((x ⊙ suh)·Hb)·Ŵ)·Hb ⊙ svh + bias for x [n, in], all fp32; y is overwritten. Each output element is
// summed in one fixed order whatever n is (batch-invariant).
void forward(const Module& m, const float* x, int64_t n, float* y);

// The HF-oriented dense weight W [out, in] = (diag(suh)·Hb·Ŵ·Hb·diag(svh))ᵀ, cropped to the real dims.
std::vector<float> dequantize(const Module& m);

}  // namespace kiln::exl3
