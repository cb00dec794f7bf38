// EXL3's three codebooks: a 16-bit trellis state → one fp16 weight value (specs/exl3.md §4). The value is a pure
// function of the state, so the CPU reference and every device kernel must produce the same fp16 bits.
#pragma once

#include <cstdint>

namespace kiln::exl3 {

enum class Codebook { k3Inst, kMcg, kMul1 };

const char* codebook_name(Codebook cb);

// The multipliers stored (as int32 0-dim tensors) in `.mcg` / `.mul1`; a checkpoint with another value was made by
// a codebook this decoder does not know.
constexpr uint32_t kMcgMultiplier = 0xCBAC1FEDu;
constexpr uint32_t kMul1Multiplier = 0x83DCD12Du;

// The fp16 bits of the value for `state` (only its low 16 bits are read).
uint16_t decode_state_bits(uint32_t state, Codebook cb);
float decode_state(uint32_t state, Codebook cb);

}  // namespace kiln::exl3
