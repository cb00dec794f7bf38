// The DraftServices the engine lends drafters: the target model instance's embedding, lm_head, draft sampling and
// next-n layers on its device, the drafter's own cache layers in the engine's CacheManager, and checkpoint loading
// through the recipe's weight format.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/cache_manager.h"
#include "kiln/draft_services.h"
#include "model/model_instance.h"

namespace kiln {

class EngineDraftServices final : public DraftServices {
 public:
  // `model` and `format` must outlive the services; `draft_model` is speculative.draft_model ("" = none).
  EngineDraftServices(ModelInstance& model, std::shared_ptr<WeightFormat> format, int64_t num_target_layers,
                      std::string draft_model)
      : model_(model), format_(std::move(format)), target_layers_(num_target_layers), draft_model_(std::move(draft_model)) {}

  // Once the pool exists: its layers from `first_drafter_layer` on are the drafter's own (cache()), and the next-n
  // layers are the target's num_target_layers .. (mtp_run).
  void attach(CacheManager* caches, int64_t first_drafter_layer) {
    caches_ = caches;
    first_drafter_layer_ = first_drafter_layer;
  }

  DeviceContext& device() override { return model_.device_context(); }
  int64_t hidden_size() const override { return model_.hidden_size(); }
  int64_t vocab_size() const override { return model_.vocab_size(); }
  int64_t num_target_layers() const override { return target_layers_; }
  Status embed(const int32_t* ids, int64_t n, TensorView out) override { return model_.embed(ids, n, out); }
  Status lm_head(const TensorView& hidden, float* logits) override { return model_.lm_head(hidden, logits); }
  Status sample(const DraftSampleRequest& request) override { return model_.sample_drafts(request); }

  int64_t num_mtp_layers() const override { return model_.num_mtp_layers(); }
  // A next-n layer with recurrent state (glm5_next's KDA kind) runs in each sequence's state slot, found by its
  // block table (CacheManager::state_slot_of: MtpRows::block_table must be the DraftSequence's), and is kept
  // lossless for drafting by a committed copy in the slot's snapshot:
  //   - rows conditioned on the target's hidden states are the target's computed rows, which the engine hands the
  //     drafter only once accepted: before them the state goes back to the committed copy (dropping whatever
  //     drafts advanced it since), and after them the new state becomes the committed copy;
  //   - rows conditioned on this layer's own output (MtpOutput::hidden of the previous run) are drafts: they
  //     advance the live state only.
  // So the state a step-1 batch starts from is always that of the accepted tokens, however many drafts ran or
  // were rejected, and no replay is needed (the committed rows are exactly those that ran). Paged next-n caches
  // (DSA kind) need none of this: rows past the accepted ones are rewritten by the next step's rows.
  Status mtp_run(int64_t layer, const std::vector<MtpRows>& batch, MtpOutput& out) override;
  Status mtp_run_device_tokens(int64_t layer, std::vector<MtpRows> batch, const int32_t* device_tokens,
                               MtpOutput& out) override;

  void* cache(int64_t layer, size_t entry) override;
  int64_t block_size() const override { return caches_ ? caches_->views().block_size : 0; }

  std::string draft_model_path() const override { return draft_model_; }
  Result<std::shared_ptr<const WeightSource>> open_checkpoint(const std::string& dir) override;
  WeightFormat& weight_format() override { return *format_; }

 private:
  ModelInstance& model_;
  std::shared_ptr<WeightFormat> format_;
  int64_t target_layers_;
  std::string draft_model_;
  CacheManager* caches_ = nullptr;
  int64_t first_drafter_layer_ = 0;
  // Both mtp_run flavours: tokens from each entry's host array, or (device_tokens set) from the device.
  Status run_mtp(int64_t layer, const std::vector<MtpRows>& batch, const int32_t* device_tokens, MtpOutput& out);
  // mtp_run's packed hidden rows on the device, grown as batches need (device memory lives as long as the model).
  float* packed_ = nullptr;
  int64_t packed_rows_ = 0;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> placeholder_tokens_;  // zeros standing for device tokens in a step's host layout
  std::vector<SequenceStep> steps_;
  MtpStepOutput step_out_;
  int64_t step_out_rows_ = 0;  // rows of hidden in step_out_ (tells a draft row from a target row)
};

}  // namespace kiln
