// Test access to a glm5_next fixture on the CPU: its model, and a cache of its own (the CacheManager's memory:
// paged blocks from a plain free list, and state slots the tests hand out themselves).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "engine/cache_manager.h"
#include "model/arch/glm5_next/glm5_next_cpu_instance.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::testing {

inline const std::vector<std::string>& glm5_next_fixtures() {
  static const std::vector<std::string> names = {"glm5_next-tiny", "glm5_next-shared", "glm5_next-flat", "glm5_next-h3",
                                               "glm5_next-h4"};
  return names;
}

inline LoadedModel load_glm5_next(const std::string& name, const std::string& layout = "fp32",
                                  const std::string& precision = "fp32") {
  auto recipe = load_recipe("",
                            {"model.path=" + model_dir(name).string(), "model.device=cpu", "kv.layout=" + layout,
                             "kv.block_size=16", "model.precision=" + precision},
                            global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

inline glm5_next::Glm5NextModel& glm5_next_model(LoadedModel& m) {
  auto* cpu = dynamic_cast<glm5_next::Glm5NextCpuInstance*>(m.model.get());
  EXPECT_NE(cpu, nullptr) << "the model is not the CPU glm5_next instance";
  return cpu->model();
}

class Glm5NextCache {
 public:
  Glm5NextCache(const LoadedModel& m, int64_t tokens, int64_t state_slots) {
    const int64_t bs = scheduler_block_size(m);  // a page per rank of a decode-context group
    CacheManagerConfig cfg;
    cfg.num_blocks = (tokens + bs - 1) / bs;
    cfg.block_size = bs;
    cfg.state_slots = state_slots;
    auto made = CacheManager::create(m.arch->cache_spec(0, m.layout->indexer_key_format()), m.layout.get(), m.device.get(), cfg);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    caches_ = std::move(made).value();
    for (int64_t b = cfg.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  }
  const CacheViews& views() const { return caches_->views(); }
  // A block table covering `tokens` positions.
  std::vector<int32_t> table(int64_t tokens) {
    std::vector<int32_t> t;
    const int64_t bs = caches_->views().block_size;
    for (int64_t i = 0; i < (tokens + bs - 1) / bs; ++i) {
      EXPECT_FALSE(free_.empty()) << "test cache full";
      if (free_.empty()) break;
      t.push_back(free_.back());
      free_.pop_back();
    }
    return t;
  }

 private:
  std::unique_ptr<CacheManager> caches_;
  std::vector<int32_t> free_;
};

}  // namespace kiln::testing
