// The rotary-embedding settings the CPU/GPU kernels take, from a model's config.json (transformers' rope
// parameters: default or YaRN). One place, so every path that ropes computes the same frequencies.
#pragma once

#include "kernels/cpu/rope.h"
#include "model/model_config.h"

namespace kiln {

cpu::RopeConfig kernel_rope_config(const ModelConfig& config);

}  // namespace kiln
