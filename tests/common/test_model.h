// Test access to a loaded model of the MLA + MoE family: its CPU forward pass over a KV pool of its own (TestKv:
// the CacheManager's memory with a plain free list, as tests hand out blocks themselves), and one request through
// the engine (the one decode loop) for tests that generate.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/engine_factory.h"
#include "engine/single_request.h"
#include "model/mla_moe_architecture.h"
#include "model/mla_moe_cpu_instance.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::testing {

// The CPU model of a model loaded on the CPU.
inline MlaMoeModel& cpu_model(LoadedModel& m) {
  auto* cpu = dynamic_cast<MlaMoeCpuInstance*>(m.model.get());
  EXPECT_NE(cpu, nullptr) << "the model is not the CPU MLA + MoE instance";
  return cpu->model();
}
inline const ModelConfig& config_of(const LoadedModel& m) { return *mla_moe_config(*m.arch); }

// A KV pool for `tokens` tokens of the model's layers (and its loaded next-n layers), blocks from a free list.
class TestKv {
 public:
  TestKv(const LoadedModel& m, int64_t tokens, int64_t mtp_layers = -1) {
    const int64_t bs = scheduler_block_size(m);
    CacheManagerConfig cfg;
    cfg.num_blocks = std::max<int64_t>((tokens + bs - 1) / bs, 1);
    cfg.block_size = bs;
    cfg.prefix_caching = false;
    cfg.state_slots = 1;
    const int64_t mtp = mtp_layers >= 0 ? mtp_layers : m.model->num_mtp_layers();
    auto made = CacheManager::create(m.arch->cache_spec(mtp, m.layout->indexer_key_format()), m.layout.get(), m.device.get(), cfg);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    caches_ = std::move(made).value();
    for (int64_t b = cfg.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  }
  const CacheViews& views() const { return caches_->views(); }
  const CacheManager& manager() const { return *caches_; }
  CacheManager& manager() { return *caches_; }
  int64_t block_size() const { return caches_->views().block_size; }
  int64_t num_blocks() const { return caches_->views().num_blocks; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Grows `table` to cover `tokens` positions.
  Status reserve(std::vector<int32_t>& table, int64_t tokens) {
    const int64_t need = (tokens + block_size() - 1) / block_size() - static_cast<int64_t>(table.size());
    if (need > free_blocks()) return resource_exhausted("test KV pool full");
    for (int64_t i = 0; i < need; ++i) {
      table.push_back(free_.back());
      free_.pop_back();
    }
    return ok_status();
  }
  void release(std::vector<int32_t>& table) {
    free_.insert(free_.end(), table.rbegin(), table.rend());
    table.clear();
  }

 private:
  std::unique_ptr<CacheManager> caches_;
  std::vector<int32_t> free_;
};

inline std::unique_ptr<TestKv> make_kv_cache(const LoadedModel& m, int64_t tokens) {
  return std::make_unique<TestKv>(m, tokens);
}

// Greedy generation of one sequence straight through the model's step (any device; logits to the host, argmax
// there), `chunk` prompt tokens per step: the reference engine runs are compared with. Stops after `max_tokens` or
// at a token of `stop`. `adjust`, when set, rewrites each logits row before the argmax, given the tokens so far.
using ReferenceAdjust = std::function<void(const std::vector<int32_t>& tokens, float* row, int64_t vocab)>;
inline std::vector<int32_t> greedy_reference(LoadedModel& m, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                             int64_t chunk = 1 << 20, const std::vector<int32_t>& stop = {},
                                             const ReferenceAdjust& adjust = {}) {
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_tokens;
  TestKv kv(m, total);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.reserve(table, total).ok());
  std::vector<int32_t> tokens = prompt, out;
  int64_t computed = 0;
  StepOutput o;
  const int64_t vocab = m.model->vocab_size();
  while (static_cast<int64_t>(out.size()) < max_tokens) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size()) - computed);
    SequenceStep step{std::span<const int32_t>(tokens.data() + computed, n), computed, &table, false};
    StepOptions options;
    options.want_logits = true;
    const Status s = m.model->step({&step, 1}, {}, kv.views(), options, o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) break;
    computed += n;
    if (computed < static_cast<int64_t>(tokens.size())) continue;
    if (adjust) adjust(tokens, o.logits.data(), vocab);
    const int32_t next = static_cast<int32_t>(std::max_element(o.logits.begin(), o.logits.begin() + vocab) -
                                              o.logits.begin());
    out.push_back(next);
    tokens.push_back(next);
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) break;
  }
  return out;
}

// Loads `sets` (section.key=value) as a recipe and its model.
inline LoadedModel load_recipe_model(const std::vector<std::string>& sets, const ModelLoadOptions& options = {}) {
  auto recipe = load_recipe("", sets, global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), options);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// Generates with the engine over `m` as the recipe (from `sets`) configures it: greedy unless `sampling` says
// otherwise; `max_tokens` tokens at most, stopping at `stop`.
inline Result<std::vector<int32_t>> engine_generate(const LoadedModel& m, const std::vector<std::string>& sets,
                                                    const std::vector<int32_t>& prompt, int64_t max_tokens,
                                                    const SamplingOptions& sampling = {},
                                                    const std::vector<int32_t>& stop = {},
                                                    EngineMetrics* metrics = nullptr) {
  KILN_ASSIGN_OR_RETURN(Recipe recipe, load_recipe("", sets, global_registry()));
  KILN_ASSIGN_OR_RETURN(StartedEngine e, start_engine(m, recipe));
  RequestParams p;
  p.prompt = prompt;
  p.max_tokens = max_tokens;
  p.sampling = sampling;
  p.stop_token_ids = stop;
  auto out = run_single_request(*e.engine, std::move(p));
  if (metrics) *metrics = e.engine->metrics();
  return out;
}

}  // namespace kiln::testing
