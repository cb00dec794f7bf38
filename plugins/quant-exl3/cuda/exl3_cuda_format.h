// The `exl3` weight format on a CUDA device: reads modules with the CPU reader (exl3_module.h), uploads them through
// the core's DeviceContext, and builds the CUDA Linear / ExpertSet. With model.load = "dummy" it makes EXL3 modules
// of the requested shapes on the device itself (random trellis words, MCG codebook, K = `synthetic_bits`).
#pragma once

#include <memory>

#include "kiln/device_context.h"
#include "kiln/weight_format.h"

namespace kiln::exl3::cuda {

std::unique_ptr<WeightFormat> make_cuda_weight_format(DeviceContext& dev, int synthetic_bits);

}  // namespace kiln::exl3::cuda
