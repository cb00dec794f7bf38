// The `exl3` weight format on a CUDA device: reads modules with the CPU reader (exl3_module.h), uploads them through
// the core's DeviceContext, and builds the CUDA Linear / ExpertSet. With model.load = "dummy" it makes EXL3 modules
// of the requested shapes on the device itself (random trellis words, MCG codebook, K = `synthetic.bits`).
// Modules a checkpoint stores dense go to `dense` (the built-in format the core offers; null: the plugin's own
// small dense GEMV serves them).
#pragma once

#include <memory>

#include "kiln/device_context.h"
#include "kiln/weight_format.h"

namespace kiln::exl3::cuda {

struct SyntheticModules {
  int bits = 4;
  // Only the routed experts are EXL3, every other linear dense bf16 (what `kiln quantize --experts-only` makes);
  // needs the built-in `dense` format.
  bool experts_only = false;
};

std::unique_ptr<WeightFormat> make_cuda_weight_format(DeviceContext& dev, WeightFormat* dense,
                                                      SyntheticModules synthetic);

}  // namespace kiln::exl3::cuda
