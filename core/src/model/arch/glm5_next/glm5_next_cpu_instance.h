// glm5_next on the CPU as a ModelInstance: Glm5NextModel's forward, token selection on host memory, and the target
// pieces a drafter borrows (embedding, lm_head, draft sampling).
#pragma once

#include <memory>

#include "model/arch/glm5_next/glm5_next_model.h"
#include "model/model_instance.h"

namespace kiln::glm5_next {

class Glm5NextCpuInstance final : public ModelInstance {
 public:
  static Result<std::unique_ptr<Glm5NextCpuInstance>> create(const Glm5NextConfig& config, const BuildContext& ctx);

  Glm5NextModel& model() { return *model_; }

  Device device() const override { return Device::cpu(); }
  DeviceContext& device_context() override { return device_; }
  size_t weight_bytes() const override { return 0; }  // views into the checkpoint's mapping
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t hidden_size() const override { return model_->config().hidden_size; }
  int64_t num_mtp_layers() const override { return static_cast<int64_t>(model_->weights().mtp.size()); }
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const CacheViews& caches,
              const StepOptions& options, StepOutput& out) override;
  // Glm5NextModel::mtp_forward; the outputs live in this instance until its next MTP step.
  Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, const CacheViews& caches,
                  MtpStepOutput& out) override;
  Status embed(const int32_t* ids, int64_t n, TensorView out) override;
  Status lm_head(const TensorView& hidden, float* logits) override;
  Status sample_drafts(const DraftSampleRequest& request) override;

 private:
  Glm5NextCpuInstance(std::unique_ptr<Glm5NextModel> model, DeviceContext& device)
      : model_(std::move(model)), device_(device) {}
  std::unique_ptr<Glm5NextModel> model_;
  DeviceContext& device_;
  StepOutput mtp_out_;
};

}  // namespace kiln::glm5_next
