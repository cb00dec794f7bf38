// model.load = "dummy" for the `exl3` format: an EXL3 module of the requested shape made from the seed alone (any
// trellis payload is a valid encoding), MCG codebook, suh/svh = random sign × √(0.02 / RMS(MCG)) so that
// W = diag(suh)·Hb·Ŵ·Hb·diag(svh) has the std of HF's initializer_range (the rotations are orthonormal).
// The CUDA format generates on the device (fill_random_words / fill_random_signs in cuda/exl3_kernels.cu, with this
// file's seed and scale); make_synthetic_module is the host twin of those formulas (the core's CPU runtime has no
// dummy load): what a device-made module holds, for tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exl3_module.h"

namespace kiln::exl3 {

// |suh| = |svh| of a synthetic module.
float synthetic_scale();
// The per-module seed: the source's seed mixed with the module's name.
uint64_t synthetic_seed(uint64_t source_seed, const std::string& name);

// The module and the storage its `trellis` points into.
struct SyntheticModule {
  Module module;
  std::shared_ptr<std::vector<uint16_t>> trellis;
};
SyntheticModule make_synthetic_module(const std::string& name, int64_t in, int64_t out, int bits, uint64_t source_seed);

}  // namespace kiln::exl3
