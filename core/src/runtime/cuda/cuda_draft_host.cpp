#include "runtime/cuda/cuda_draft_host.h"

#include <algorithm>
#include <string>

namespace kiln::cuda {

Result<std::unique_ptr<CudaMtpDraftHost>> CudaMtpDraftHost::create(CudaMlaMoeModel& model, int64_t capacity_tokens,
                                                                   int64_t block_size) {
  const ModelConfig& c = model.config();
  if (model.num_mtp_layers() == 0)
    return failed_precondition(c.source + ": no MTP layers are on the GPU (load the model with its next-n layers)");
  if (block_size <= 0) return invalid_argument("draft KV block size must be positive");
  const int64_t blocks = std::max<int64_t>((capacity_tokens + block_size - 1) / block_size, 1);
  auto arena = std::make_unique<DeviceArena>(size_t{1} << 30);
  KILN_ASSIGN_OR_RETURN(GpuKvPool pool, GpuKvPool::create(*arena, model.num_mtp_layers(), blocks, block_size,
                                                          c.kv_lora_rank + c.qk_rope_head_dim,
                                                          c.has_indexer() ? c.index_head_dim : 0));
  return std::unique_ptr<CudaMtpDraftHost>(new CudaMtpDraftHost(model, std::move(arena), std::move(pool)));
}

CudaMtpDraftHost::CudaMtpDraftHost(CudaMlaMoeModel& model, std::unique_ptr<DeviceArena> arena, GpuKvPool pool)
    : model_(model), arena_(std::move(arena)), pool_(std::move(pool)) {
  // Handed out from the back: block 0 first.
  for (int64_t b = pool_.num_blocks() - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

CudaMtpDraftHost::~CudaMtpDraftHost() { release_all(); }

Status CudaMtpDraftHost::reserve_blocks(std::vector<int32_t>& table, int64_t tokens) {
  const int64_t need = (tokens + pool_.block_size() - 1) / pool_.block_size() - static_cast<int64_t>(table.size());
  if (need <= 0) return ok_status();
  if (need > static_cast<int64_t>(free_.size()))
    return resource_exhausted("the GPU draft KV pool is full: " + std::to_string(need) + " more blocks needed, " +
                              std::to_string(free_.size()) + " free of " + std::to_string(pool_.num_blocks()));
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return ok_status();
}

void CudaMtpDraftHost::release_blocks(std::vector<int32_t>& table) {
  free_.insert(free_.end(), table.rbegin(), table.rend());
  table.clear();
}

Status CudaMtpDraftHost::run_layer(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                                   StepOutput& out) {
  return model_.mtp_forward(layer, steps, hidden, pool_, out);
}

}  // namespace kiln::cuda
