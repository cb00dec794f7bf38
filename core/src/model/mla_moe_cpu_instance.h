// The MLA + MoE family on the CPU as a ModelInstance: MlaMoeModel's forward and MTP layers, token selection and
// the drafter's target pieces on host memory.
#pragma once

#include <memory>

#include "model/mla_moe_model.h"
#include "model/model_instance.h"

namespace kiln {

class MlaMoeCpuInstance final : public ModelInstance {
 public:
  static Result<std::unique_ptr<MlaMoeCpuInstance>> create(const ModelConfig& config, const BuildContext& ctx);

  MlaMoeModel& model() { return *model_; }
  const MlaMoeModel& model() const { return *model_; }

  Device device() const override { return Device::cpu(); }
  DeviceContext& device_context() override { return device_; }
  size_t weight_bytes() const override { return 0; }  // views into the checkpoint's mapping
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t hidden_size() const override { return model_->config().hidden_size; }
  int64_t num_mtp_layers() const override { return static_cast<int64_t>(model_->weights().mtp.size()); }
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const CacheViews& caches,
              const StepOptions& options, StepOutput& out) override;
  Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, const CacheViews& caches,
                  MtpStepOutput& out) override;
  Status embed(const int32_t* ids, int64_t n, TensorView out) override;
  Status lm_head(const TensorView& hidden, float* logits) override;
  Status sample_drafts(const DraftSampleRequest& request) override;

 private:
  MlaMoeCpuInstance(std::unique_ptr<MlaMoeModel> model, DeviceContext& device)
      : model_(std::move(model)), device_(device) {}
  std::unique_ptr<MlaMoeModel> model_;
  DeviceContext& device_;
  StepOutput mtp_out_;  // what MtpStepOutput points into until the next MTP step
};

}  // namespace kiln
