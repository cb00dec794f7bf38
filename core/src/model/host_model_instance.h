// A CPU model as a ModelInstance: the model's forward and MTP layers, token selection on host memory, and the
// target pieces a drafter borrows (embedding, lm_head, draft sampling). One template for every architecture whose
// CPU model offers the same calls (MlaMoeModel, glm5_next's Glm5NextModel); each architecture's instance adds only
// how it is built.
//
// Model provides: config().vocab_size / hidden_size, weights().mtp (a container), forward(steps, caches, options,
// out), mtp_forward(layer, steps, hidden, caches, out), embed(ids, n, float*), lm_head(const float*, n, float*).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "model/host_model_args.h"
#include "model/host_token_select.h"
#include "model/model_instance.h"

namespace kiln {

template <class Model>
class HostModelInstance : public ModelInstance {
 public:
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }

  Device device() const override { return Device::cpu(); }
  DeviceContext& device_context() override { return device_; }
  size_t weight_bytes() const override { return 0; }  // views into the checkpoint's mapping
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t hidden_size() const override { return model_->config().hidden_size; }
  int64_t num_mtp_layers() const override { return static_cast<int64_t>(model_->weights().mtp.size()); }

  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const CacheViews& caches,
              const StepOptions& options, StepOutput& out) override {
    KILN_RETURN_IF_ERROR(model_->forward(steps, caches, options, out));
    if (select.empty()) {
      out.tokens.assign(steps.size(), {});
      out.accepted.assign(steps.size(), 0);
      return ok_status();
    }
    if (select.size() != steps.size())
      return invalid_argument("token selection has " + std::to_string(select.size()) + " entries for " +
                              std::to_string(steps.size()) + " steps");
    return select_tokens_host(out.logits.data(), vocab_size(), out.first_row, select, out);
  }

  // The outputs live in this instance until its next MTP step.
  Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, const CacheViews& caches,
                  MtpStepOutput& out) override {
    KILN_RETURN_IF_ERROR(model_->mtp_forward(layer, steps, hidden, caches, mtp_out_));
    out.logits = mtp_out_.logits.data();
    out.first_row = mtp_out_.first_row;
    out.hidden = mtp_out_.hidden.data();
    return ok_status();
  }

  Status embed(const int32_t* ids, int64_t n, TensorView out) override {
    KILN_RETURN_IF_ERROR(check_host_embed_args(ids, n, out, vocab_size(), hidden_size()));
    if constexpr (std::is_same_v<decltype(model_->embed(ids, n, out.as<float>())), Status>) {
      return model_->embed(ids, n, out.as<float>());  // a rank of a tensor-parallel group can fail to meet the others
    } else {
      model_->embed(ids, n, out.as<float>());
      return ok_status();
    }
  }

  Status lm_head(const TensorView& hidden, float* logits) override {
    KILN_RETURN_IF_ERROR(check_host_lm_head_args(hidden, hidden_size()));
    return model_->lm_head(hidden.as<float>(), hidden.numel() / hidden_size(), logits);
  }

  Status sample_drafts(const DraftSampleRequest& request) override { return sample_drafts_host(request, vocab_size()); }

 protected:
  HostModelInstance(std::unique_ptr<Model> model, DeviceContext& device) : model_(std::move(model)), device_(device) {}

 private:
  std::unique_ptr<Model> model_;
  DeviceContext& device_;
  StepOutput mtp_out_;  // what MtpStepOutput points into until the next MTP step
};

}  // namespace kiln
