// The KV pool of the CUDA runner: per layer, bf16 pages [num_blocks · block_size, latent + rope] in device
// memory (the built-in `bf16` layout's format, which mla_decode_bf16 reads), and for DSA models the indexer's
// fp32 keys [num_blocks · block_size, index_head_dim] at the same slots (fp32 as the CPU model keeps them).
// Block ids come from the engine's BlockManager; the pool only holds the pages.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/cuda/device_arena.h"

namespace kiln::cuda {

class GpuKvPool {
 public:
  static Result<GpuKvPool> create(DeviceArena& arena, int64_t num_layers, int64_t num_blocks, int64_t block_size,
                                  int64_t row_width, int64_t index_head_dim = 0);
  uint16_t* layer_pages(int64_t layer) const { return pages_[layer]; }
  // nullptr without an indexer.
  float* index_keys(int64_t layer) const { return index_keys_.empty() ? nullptr : index_keys_[layer]; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t row_width() const { return row_width_; }
  static size_t bytes_per_token(int64_t num_layers, int64_t row_width) {
    return static_cast<size_t>(num_layers * row_width) * sizeof(uint16_t);
  }

 private:
  std::vector<uint16_t*> pages_;
  std::vector<float*> index_keys_;
  int64_t num_blocks_ = 0, block_size_ = 0, row_width_ = 0;
};

}  // namespace kiln::cuda
