// The DraftHost (kiln/drafter.h) of a model on the GPU: its next-n (MTP) layers run by
// CudaMlaMoeModel::mtp_forward over a bf16 paged KV pool of their own on the device (one page set per MTP
// layer), blocks handed out by a free list. Logits and hidden states cross to the host as the SDK asks.
#pragma once

#include <memory>
#include <vector>

#include "model/draft_host.h"
#include "runtime/cuda/cuda_mla_moe_model.h"

namespace kiln::cuda {

class CudaMtpDraftHost final : public PagedDraftHost {
 public:
  // A pool of `capacity_tokens` tokens per MTP layer (rounded up to whole blocks of `block_size`). `model` must
  // outlive the host and have its MTP layers uploaded.
  static Result<std::unique_ptr<CudaMtpDraftHost>> create(CudaMlaMoeModel& model, int64_t capacity_tokens,
                                                          int64_t block_size);
  ~CudaMtpDraftHost() override;

  int64_t num_draft_layers() const override { return model_.num_mtp_layers(); }
  int64_t hidden_size() const override { return model_.config().hidden_size; }
  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

 private:
  CudaMtpDraftHost(CudaMlaMoeModel& model, std::unique_ptr<DeviceArena> arena, GpuKvPool pool);
  Status reserve_blocks(std::vector<int32_t>& table, int64_t tokens) override;
  void release_blocks(std::vector<int32_t>& table) override;
  int64_t block_size() const override { return pool_.block_size(); }
  Status run_layer(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, StepOutput& out) override;

  CudaMlaMoeModel& model_;
  std::unique_ptr<DeviceArena> arena_;
  GpuKvPool pool_;
  std::vector<int32_t> free_;
};

}  // namespace kiln::cuda
