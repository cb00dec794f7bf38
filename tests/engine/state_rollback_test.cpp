// Speculative decoding over a model with recurrent state is lossless: a verification pass feeds drafts through the
// recurrent layers, and after a rejection the engine restores the state from the snapshot taken before the pass and
// feeds the accepted tokens again. The fake model here is recurrent (its logits come from a running hash kept in a
// CacheManager state slot, and a state that is not the hash of the computed history is a contract violation), and
// a drafter that is right only part of the time makes rejections at every depth.
#include <gtest/gtest.h>

#include <random>

#include "engine/cache_manager.h"
#include "engine_harness.h"
#include "fake_drafter.h"
#include "runtime/cpu_device_context.h"

namespace kiln::testing {
namespace {

constexpr int64_t kVocab = 53;

TEST(StateRollback, GreedyOutputWithDraftsOverRecurrentStateEqualsWithout) {
  for (int depth : {1, 2, 3, 5}) {
    EngineConfig config = small_config(256);
    config.speculative_depth = depth;
    config.lookahead_slots = 2 * depth;
    config.prefix_caching = false;
    CpuDeviceContext device;
    CacheSpec spec;
    spec.layers.push_back(LayerCacheSpec{{CacheEntry{CacheKind::kState, "fake_state", 0, sizeof(uint64_t)}}});
    CacheManagerConfig cm;
    cm.num_blocks = config.num_blocks, cm.block_size = config.block_size, cm.prefix_caching = false;
    cm.lookahead_slots = config.lookahead_slots, cm.state_slots = config.max_num_seqs;
    auto caches = CacheManager::create(spec, nullptr, &device, cm);
    ASSERT_TRUE(caches.ok()) << caches.status().to_string();
    std::shared_ptr<CacheManager> shared(std::move(*caches));
    auto runner = std::make_unique<FakeModelRunner>(config.num_blocks, config.block_size, kVocab);
    FakeModelRunner* fake = runner.get();
    fake->keep_state(&shared->views());
    auto drafter = std::make_shared<SometimesRightDrafter>(depth, kVocab);
    auto engine = BatchEngine::create(config, std::move(runner), drafter, shared);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();

    Collector c;
    std::vector<std::vector<int32_t>> prompts;
    for (int r = 0; r < 6; ++r) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < 5 + 3 * r; ++i) prompt.push_back((r * 7 + i * 3) % kVocab);
      prompts.push_back(prompt);
    }
    for (int r = 0; r < 6; ++r) {
      RequestParams p;
      p.prompt = prompts[r];
      p.max_tokens = 40;
      p.sampling.temperature = 0.0f;
      drafter->set_prompt(r + 1, prompts[r]);  // sequence ids count from 1 in submission order
      ASSERT_TRUE((*engine)->submit(p, c.sink(r)).ok());
    }
    for (int r = 0; r < 6; ++r) {
      ASSERT_TRUE(c.wait(r));
      EXPECT_EQ(c.get(r).tokens, reference_tokens(prompts[r], 40, {}, kVocab)) << "depth " << depth << " request " << r;
    }
    const EngineMetrics m = (*engine)->metrics();
    EXPECT_GT(m.spec_draft_tokens, m.spec_accepted_tokens) << "no draft was rejected: the test proves nothing";
    EXPECT_GT(m.spec_accepted_tokens, 0);
    EXPECT_TRUE(fake->violations().empty()) << fake->violations().front();
    engine->reset();  // joins the engine thread: the slots of finished sequences are back
    EXPECT_EQ(shared->free_state_slots(), config.max_num_seqs) << "state slots leaked";
  }
}

}  // namespace
}  // namespace kiln::testing
