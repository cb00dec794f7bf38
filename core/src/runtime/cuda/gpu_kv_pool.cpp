#include "runtime/cuda/gpu_kv_pool.h"

#include <cuda_runtime.h>

#include <string>

namespace kiln::cuda {

Result<GpuKvPool> GpuKvPool::create(DeviceArena& arena, int64_t num_layers, int64_t num_blocks, int64_t block_size,
                                    int64_t row_width, int64_t index_head_dim) {
  if (num_layers <= 0 || num_blocks <= 0 || block_size <= 0 || row_width <= 0)
    return invalid_argument("GPU KV pool: layers, blocks, block_size and row width must be positive (got " +
                            std::to_string(num_layers) + ", " + std::to_string(num_blocks) + ", " +
                            std::to_string(block_size) + ", " + std::to_string(row_width) + ")");
  GpuKvPool pool;
  pool.num_blocks_ = num_blocks;
  pool.block_size_ = block_size;
  pool.row_width_ = row_width;
  const size_t per_layer = static_cast<size_t>(num_blocks * block_size * row_width);
  for (int64_t l = 0; l < num_layers; ++l) {
    KILN_ASSIGN_OR_RETURN(uint16_t * p, arena.allocate_array<uint16_t>(per_layer, "KV pages"));
    // Zeroed, so a page never read before being written still holds finite values.
    const cudaError_t e = cudaMemset(p, 0, per_layer * sizeof(uint16_t));
    if (e != cudaSuccess) return internal_error(std::string("clearing KV pages: ") + cudaGetErrorString(e));
    pool.pages_.push_back(p);
    if (index_head_dim > 0) {
      const size_t keys = static_cast<size_t>(num_blocks * block_size * index_head_dim);
      KILN_ASSIGN_OR_RETURN(float* k, arena.allocate_array<float>(keys, "indexer keys"));
      const cudaError_t ke = cudaMemset(k, 0, keys * sizeof(float));
      if (ke != cudaSuccess) return internal_error(std::string("clearing indexer keys: ") + cudaGetErrorString(ke));
      pool.index_keys_.push_back(k);
    }
  }
  return pool;
}

}  // namespace kiln::cuda
