// The `bf16-copy` KV layout: pages hold bf16 rows [block_size, latent_dim + rope_dim], latent first — byte for byte
// what the built-in `bf16` layout stores — but appended, attended and gathered by this plugin's own code: a host
// half (bf16_copy_cpu.cpp) and a device half (bf16_copy_cuda.cpp over bf16_copy_kernels.cu). Both store final
// rows only (append_fusions() = 0), so on CUDA the core normalises and ropes the rows and finishes the queries
// itself before append().
#pragma once

#include <bit>
#include <cstdint>
#include <memory>

#include "kiln/kv_layout.h"

namespace example_plugin {

std::unique_ptr<kiln::KvLayout> make_bf16_copy_cpu(const kiln::KvGeometry& g);
#ifdef EXAMPLE_WITH_CUDA
std::unique_ptr<kiln::KvLayout> make_bf16_copy_cuda(const kiln::KvGeometry& g, kiln::Device device);
#endif

inline float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Round to nearest, ties to even; every NaN becomes the canonical quiet NaN (as torch and the built-in layout do).
inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace example_plugin
