// IEEE binary16 conversions for the EXL3 decoder. The plugin sees only SDK headers, so it carries its own; both
// directions are exact where the value fits, and float → half rounds to nearest even, like CUDA's __float2half_rn,
// so a codebook value computed here equals the device's bit for bit.
#pragma once

#include <cstdint>

namespace kiln::exl3 {

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

}  // namespace kiln::exl3
