// The DraftHost the engine lends to drafters (kiln/drafter.h): the target checkpoint's next-n (MTP) layers run
// by MlaMoeModel::mtp_forward, each drafter sequence with its own block table in a KV pool of its own. That
// pool holds pages only for the MTP layers (layer index num_hidden_layers + i, as the model addresses them) in
// the layout `speculative.draft_kv_dtype` selects, so the drafter's precision is independent of the target's.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kiln/drafter.h"
#include "model/kv_cache.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"

namespace kiln {

// What every host of MTP layers shares, whichever device runs them: drafter sequences with their block tables
// and lengths, batch validation (a bad entry leaves every sequence as it was), truncation. Subclasses own the
// pages and run the layer.
class PagedDraftHost : public DraftHost {
 public:
  Status allocate(int64_t seq_id) override;
  Status run(int64_t layer, const std::vector<DraftLayerRows>& batch, DraftLayerOutput& out) override;
  Result<int64_t> length(int64_t seq_id) const override;
  Status truncate(int64_t seq_id, int64_t length) override;
  void release(int64_t seq_id) override;

 protected:
  // Grows `table` until it covers `tokens` positions; fails, leaving it as it was, when the pool runs out.
  virtual Status reserve_blocks(std::vector<int32_t>& table, int64_t tokens) = 0;
  // Returns every block of `table` to the pool and clears it.
  virtual void release_blocks(std::vector<int32_t>& table) = 0;
  virtual int64_t block_size() const = 0;
  // Runs MTP layer `layer` over `steps`; `hidden` [Σ tokens, hidden_size]; out as MlaMoeModel::mtp_forward's.
  virtual Status run_layer(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, StepOutput& out) = 0;
  // Frees every sequence's blocks; subclasses call it from their destructor, while release_blocks is theirs.
  void release_all();

 private:
  struct Sequence {
    std::vector<int32_t> table;
    int64_t length = 0;
  };
  Result<Sequence*> find(int64_t seq_id);

  std::map<int64_t, Sequence> sequences_;
  // Reused across calls: the drafter runs a layer K times per engine step.
  std::vector<Sequence*> batch_seqs_;
  std::vector<float> hidden_;
  std::vector<SequenceStep> steps_;
  StepOutput step_out_;
};

// The host on the CPU: MlaMoeModel::mtp_forward over a KvCache.
class MtpDraftHost final : public PagedDraftHost {
 public:
  // `model` must outlive the host. `kv` must index its MTP layers as the model does.
  MtpDraftHost(const MlaMoeModel& model, std::unique_ptr<KvCache> kv);
  ~MtpDraftHost() override;

  int64_t num_draft_layers() const override;
  int64_t hidden_size() const override;
  int64_t vocab_size() const override;

  const KvCache& kv() const { return *kv_; }

 private:
  Status reserve_blocks(std::vector<int32_t>& table, int64_t tokens) override { return kv_->reserve(table, tokens); }
  void release_blocks(std::vector<int32_t>& table) override { kv_->release(table); }
  int64_t block_size() const override { return kv_->block_size(); }
  Status run_layer(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, StepOutput& out) override;

  const MlaMoeModel& model_;
  std::unique_ptr<KvCache> kv_;
};

// The KV layout for `speculative.draft_kv_dtype`: "bf16" → the built-in bf16 layout, "fp8" → `fp8_ds_mla`
// (the kv-fp8mla plugin), created through `registry` with the recipe's [kv] section (block size).
Result<std::shared_ptr<KvLayout>> create_draft_kv_layout(const Recipe& recipe, const Registry& registry,
                                                         const ModelInfo& info);

// A host over `m`'s loaded MTP layers (none loaded → a host with num_draft_layers() == 0) with a pool of
// `capacity_tokens` tokens per MTP layer, rounded up to whole blocks.
Result<std::unique_ptr<MtpDraftHost>> make_mtp_draft_host(const LoadedModel& m, const Recipe& recipe,
                                                          const Registry& registry, int64_t capacity_tokens);

}  // namespace kiln
