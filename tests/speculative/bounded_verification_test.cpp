// MTP drafting on the tiny glm4_moe_lite fixture when the runner declares a small batch-invariance bound (here 8
// rows, 4 with logits, as a stand-in for the CUDA runner's 32 / 8): the engine keeps every verification pass inside
// it — the depth shrinks as sequences and prompt chunks share a pass, drafting stops when not even one draft each
// fits — and greedy output still equals plain single-sequence generation, for K = 1..7 with up to four requests
// decoding beside each other's prompt chunks.
#include <gtest/gtest.h>

#include <mutex>
#include <random>

#include "engine/batch_engine.h"
#include "engine/engine_factory.h"
#include "engine/engine_harness.h"
#include "engine/instance_runner.h"
#include "speculative_test_support.h"

namespace kiln::testing {
namespace {

// The CPU runner, telling the engine a bound and checking every pass that verifies drafts against it.
class BoundedRunner final : public ModelRunner {
 public:
  BoundedRunner(std::unique_ptr<ModelRunner> inner, BatchInvariance bound) : inner_(std::move(inner)), bound_(bound) {}
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const StepOptions& options,
              StepOutput& out) override {
    int64_t rows = 0, logit_rows = 0, verifying = 0;
    for (const SequenceStep& s : steps) {
      const auto n = static_cast<int64_t>(s.tokens.size());
      rows += n;
      logit_rows += s.all_logits ? n : 1;
      verifying += s.all_logits;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (verifying > 0) {
        ++verifying_passes_;
        if (rows > bound_.rows || logit_rows > bound_.logit_rows)
          oversized_.push_back(std::to_string(rows) + " rows, " + std::to_string(logit_rows) + " logit rows");
      }
    }
    return inner_->step(steps, select, options, out);
  }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t hidden_size() const override { return inner_->hidden_size(); }
  bool reports_logprobs() const override { return inner_->reports_logprobs(); }
  bool applies_token_masks() const override { return inner_->applies_token_masks(); }
  bool applies_logit_adjustments() const override { return inner_->applies_logit_adjustments(); }
  BatchInvariance batch_invariance() const override { return bound_; }

  std::vector<std::string> oversized() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return oversized_;
  }
  int64_t verifying_passes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return verifying_passes_;
  }

 private:
  std::unique_ptr<ModelRunner> inner_;
  BatchInvariance bound_;
  mutable std::mutex mutex_;
  std::vector<std::string> oversized_;
  int64_t verifying_passes_ = 0;
};

Recipe bounded_recipe(int depth) {
  load_mtp_plugin();
  std::vector<std::string> sets = mtp_sets("glm4_moe_lite-tiny", depth);
  for (const char* s :
       {"scheduler.max_model_len=128", "scheduler.max_num_seqs=4", "scheduler.max_num_batched_tokens=32"})
    sets.emplace_back(s);
  auto recipe = load_recipe("", sets, global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  return std::move(recipe).value();
}

class BoundedVerification : public ::testing::TestWithParam<int> {};

TEST_P(BoundedVerification, GreedyOutputEqualsNoDraftingInsideASmallBound) {
  const int depth = GetParam();
  BatchInvariance bound;
  bound.rows = 8, bound.logit_rows = 4;
  const Recipe recipe = bounded_recipe(depth);
  LoadedModel m = load_with_mtp(recipe);
  ASSERT_EQ(m.model->num_mtp_layers(), 1);

  // As start_engine builds it, with the runner wrapped.
  auto services = std::make_unique<EngineDraftServices>(*m.model, m.format, m.info.num_layers, "");
  auto drafter = create_drafter(recipe, global_registry(), m.info, *m.device, services.get());
  ASSERT_TRUE(drafter.ok()) << drafter.status().to_string();
  auto plan = plan_engine(m, recipe, drafter->get());
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  auto caches = make_cache_manager(m, *plan);
  ASSERT_TRUE(caches.ok()) << caches.status().to_string();
  services->attach(caches->get(), static_cast<int64_t>(plan->spec.layers.size()) -
                                      static_cast<int64_t>((*drafter)->capabilities().cache_layers.size()));
  auto runner = std::make_unique<BoundedRunner>(std::make_unique<InstanceRunner>(*m.model, **caches), bound);
  BoundedRunner* bounded = runner.get();
  auto engine = BatchEngine::create(plan->config, std::move(runner), *drafter, *caches);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();

  std::mt19937 rng(300 + depth);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_prompt(rng, 2 + 7 * i, m.info.vocab_size));  // chunks of up to 32 tokens
    lengths.push_back(i == 0 ? 40 : 3 + 5 * i);  // the first request decodes alone at the end
  }
  const std::vector<Outcome> outcomes = run_requests(**engine, prompts, lengths);
  ASSERT_EQ(outcomes.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(outcomes[i].tokens, greedy_reference(m, prompts[i], lengths[i])) << "request " << i << " at K" << depth;
  const EngineMetrics metrics = wait_idle(**engine);
  EXPECT_EQ(metrics.kv_blocks_used, 0);
  const std::vector<std::string> oversized = bounded->oversized();
  EXPECT_TRUE(oversized.empty()) << oversized.size() << " verification passes beyond the bound, the first of "
                                 << oversized.front();
  EXPECT_GT(bounded->verifying_passes(), 0);
  EXPECT_GT(metrics.spec_drafts, 0);
  // Alone, a sequence verifies at most 3 drafts (4 logit rows); more sequences, fewer.
  EXPECT_LE(static_cast<int64_t>(metrics.spec_drafted_per_pos.size()), std::min(depth, 3));
  if (depth > 3) EXPECT_GT(metrics.spec_bound_limited_steps, 0);
  engine->reset();
}

INSTANTIATE_TEST_SUITE_P(Depths, BoundedVerification, ::testing::Values(1, 2, 3, 5, 7));

}  // namespace
}  // namespace kiln::testing
