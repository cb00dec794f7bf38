// The `exl3` format's CUDA objects: a Linear over stacked parts (EXL3 modules decoded in registers by the trellis
// GEMV, or dense bf16 modules of a mixed checkpoint) and the routed-expert set whose gate, up and down projections
// are EXL3 modules of one K and codebook per projection, served by one launch per step over all (token, expert) pairs.
// Device memory comes from the core's DeviceContext at load time; run() only launches (graph-capturable).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/device_context.h"
#include "kiln/weight_format.h"

namespace kiln::exl3::cuda {

// One EXL3 module in device memory (stored orientation: Ŵ [k_pad = in, n_pad = out]).
struct DeviceModule {
  int64_t in = 0, out = 0, k_pad = 0, n_pad = 0;
  int bits = 0, codebook = 0;
  const uint32_t* trellis = nullptr;  // the int16 words as little-endian uint32 stream words
  const float* suh = nullptr;         // [k_pad]
  const float* svh = nullptr;         // [n_pad]
  const float* bias = nullptr;        // [out] or null
  size_t bytes() const;               // trellis + scales, what a product streams
};

struct DevicePart {
  std::string name;
  int64_t out = 0;
  std::optional<DeviceModule> quantized;
  const uint16_t* dense = nullptr;       // [out, in] bf16 when not quantized
  const float* dense_bias = nullptr;     // [out] or null
};

// 1/√128 computed as the CPU reference computes it, so the rotations agree bit for bit.
float hadamard_scale();

Result<std::unique_ptr<Linear>> make_cuda_linear(DeviceContext& dev, std::vector<DevicePart> parts, int64_t in);

struct DeviceExperts {
  // Per projection (gate, up, down): one module per expert, all of one K and codebook.
  std::vector<DeviceModule> gate, up, down;
};
// Builds the device pointer tables; refuses experts whose K or codebook differ within a projection, naming them.
Result<std::unique_ptr<ExpertSet>> make_cuda_expert_set(DeviceContext& dev, const std::string& prefix,
                                                        DeviceExperts experts, int64_t hidden, int64_t inter);

}  // namespace kiln::exl3::cuda
