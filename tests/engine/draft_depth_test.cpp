// Drafting inside the runner's batch-invariance bound (engine/draft_depth.h): every pass that verifies drafts holds
// at most the bound's rows and logit rows, with 1, 4 and 16 sequences at depths 1..7 and prompts arriving mid-run;
// the depth is the same for every drafting sequence, shrinks as sequences join and returns to K as they leave; the
// per-position acceptance counters follow the depth each pass ran at; and output stays the undrafted output.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/draft_depth.h"
#include "engine_harness.h"
#include "fake_drafter.h"

namespace kiln::testing {
namespace {

constexpr int64_t kVocab = 61;

BatchInvariance bound_of(int64_t rows, int64_t logit_rows) {
  BatchInvariance b;
  b.rows = rows, b.logit_rows = logit_rows;
  return b;
}

TEST(FairDraftDepth, UnboundedRunnersDraftTheFullDepth) {
  for (int64_t n : {1, 16, 1024}) EXPECT_EQ(fair_draft_depth(5, n, n, {4096, 64}, BatchInvariance{}), 5);
  EXPECT_EQ(fair_draft_depth(0, 4, 4, {}, BatchInvariance{}), 0);
  EXPECT_EQ(fair_draft_depth(5, 4, 0, {}, BatchInvariance{}), 0);
}

TEST(FairDraftDepth, SharesTheRowsLeftEquallyAndStopsBelowOneDraft) {
  // An 8-row bound (GLM-4.7-Flash on the H200 had it before its lm_head kept 32 logit rows invariant).
  const BatchInvariance flash = bound_of(8, 8);
  EXPECT_EQ(fair_draft_depth(5, 1, 1, {}, flash), 5);   // 6 rows
  EXPECT_EQ(fair_draft_depth(5, 2, 2, {}, flash), 3);   // 8 rows
  EXPECT_EQ(fair_draft_depth(5, 4, 4, {}, flash), 1);   // 8 rows
  EXPECT_EQ(fair_draft_depth(5, 5, 5, {}, flash), 0);   // 10 rows even at depth 1
  EXPECT_EQ(fair_draft_depth(5, 16, 16, {}, flash), 0);
  // A 32-row runner with a narrow vocabulary: batch 16 at K5 would be 96 rows.
  const BatchInvariance narrow = bound_of(32, 32);
  EXPECT_EQ(fair_draft_depth(5, 16, 16, {}, narrow), 1);
  EXPECT_EQ(fair_draft_depth(5, 6, 6, {}, narrow), 4);
  EXPECT_EQ(fair_draft_depth(5, 4, 4, {}, narrow), 5);
  // Sequences that decode without drafts (near their limits) take their one row.
  EXPECT_EQ(fair_draft_depth(7, 4, 2, {}, bound_of(8, 8)), 2);
  // The tighter of the two bounds decides.
  EXPECT_EQ(fair_draft_depth(7, 1, 1, {}, bound_of(8, 4)), 3);
  EXPECT_EQ(fair_draft_depth(7, 1, 1, {}, bound_of(4, 8)), 3);
}

// A verification pass of 1 + K rows must stay decode-shaped: on a runner whose prompt chunks of 16 tokens attend
// through a prefill kernel (chunk_rows 15), speculative.depth 16 verifies 14 at most however many rows the step has left.
TEST(FairDraftDepth, KeepsAVerificationPassWithinTheChunkRows) {
  BatchInvariance gpu = bound_of(32, 32);
  gpu.chunk_rows = 15;
  EXPECT_EQ(fair_draft_depth(16, 1, 1, {}, gpu), 14);
  EXPECT_EQ(fair_draft_depth(5, 1, 1, {}, gpu), 5);
  EXPECT_EQ(fair_draft_depth(16, 2, 2, {}, gpu), 14);
  EXPECT_EQ(fair_draft_depth(16, 3, 3, {}, gpu), 9);  // 32 rows shared
  BatchInvariance one = bound_of(32, 32);
  one.chunk_rows = 1;  // no pass of two rows would be decode-shaped
  EXPECT_EQ(fair_draft_depth(5, 1, 1, {}, one), 0);
}

TEST(FairDraftDepth, PromptChunksCountTheirRowsAndOneLogitRow) {
  const BatchInvariance b = bound_of(32, 8);
  EXPECT_EQ(fair_draft_depth(5, 1, 1, {20, 1}, b), 5);  // 26 rows, 7 logit rows
  EXPECT_EQ(fair_draft_depth(5, 1, 1, {28, 1}, b), 3);  // 32 rows
  EXPECT_EQ(fair_draft_depth(5, 1, 1, {31, 1}, b), 0);
  EXPECT_EQ(fair_draft_depth(5, 2, 2, {4, 4}, b), 1);   // 8 logit rows
  EXPECT_EQ(fair_draft_depth(5, 2, 2, {5, 5}, b), 0);
}

struct Pass {
  int64_t rows = 0, logit_rows = 0, verifying = 0, plain_decodes = 0;
  std::vector<int64_t> depths;  // drafts of each verifying entry
  PassRows chunks;              // prompt chunks of more than one token
};

std::vector<Pass> passes_of(const FakeModelRunner& runner) {
  std::vector<Pass> out;
  for (const auto& call : runner.records()) {
    Pass p;
    for (const RecordedStep& s : call) {
      p.rows += s.tokens;
      p.logit_rows += s.all_logits ? s.tokens : 1;
      if (s.all_logits) p.depths.push_back(s.tokens - 1);
      if (!s.all_logits && s.tokens == 1) ++p.plain_decodes;
      if (!s.all_logits && s.tokens > 1) p.chunks.rows += s.tokens, p.chunks.logit_rows += 1;
    }
    p.verifying = static_cast<int64_t>(p.depths.size());
    out.push_back(p);
  }
  return out;
}

// Every verifying pass inside the bound, and the engine's counters equal to what the passes verified.
void expect_passes_within(const std::vector<Pass>& passes, const BatchInvariance& bound, const EngineMetrics& m,
                          const std::string& where) {
  int64_t drafts = 0, drafted = 0;
  std::vector<int64_t> at;
  for (size_t i = 0; i < passes.size(); ++i) {
    const Pass& p = passes[i];
    if (p.verifying == 0) continue;
    EXPECT_LE(p.rows, bound.rows) << where << ": pass " << i << " verifies " << p.verifying << " sequences";
    EXPECT_LE(p.logit_rows, bound.logit_rows) << where << ": pass " << i << " verifies " << p.verifying << " sequences";
    for (int64_t k : p.depths) {
      ++drafts, drafted += k;
      if (static_cast<int64_t>(at.size()) < k) at.resize(k, 0);
      for (int64_t j = 0; j < k; ++j) ++at[j];
    }
  }
  EXPECT_EQ(m.spec_drafts, drafts) << where;
  EXPECT_EQ(m.spec_draft_tokens, drafted) << where;
  EXPECT_EQ(m.spec_drafted_per_pos, at) << where;
  ASSERT_EQ(m.spec_accepted_per_pos.size(), m.spec_drafted_per_pos.size()) << where;
  int64_t accepted = 0;
  for (size_t j = 0; j < at.size(); ++j) {
    EXPECT_LE(m.spec_accepted_per_pos[j], m.spec_drafted_per_pos[j]) << where << " position " << j;
    if (j > 0) EXPECT_LE(m.spec_accepted_per_pos[j], m.spec_accepted_per_pos[j - 1]) << where << " position " << j;
    accepted += m.spec_accepted_per_pos[j];
  }
  EXPECT_EQ(m.spec_accepted_tokens, accepted) << where;
}

struct BoundedEngine {
  FakeModelRunner* runner = nullptr;
  std::shared_ptr<SometimesRightDrafter> drafter;
  std::unique_ptr<BatchEngine> engine;
};

BoundedEngine bounded_engine(int depth, const BatchInvariance& bound, int64_t max_num_seqs = 16) {
  EngineConfig config = small_config(2048);
  config.max_num_seqs = max_num_seqs;
  config.max_num_batched_tokens = 64;
  config.speculative_depth = depth;
  config.lookahead_slots = 2 * depth;
  config.prefix_caching = false;
  auto runner = std::make_unique<FakeModelRunner>(config.num_blocks, config.block_size, kVocab);
  runner->set_batch_invariance(bound);
  BoundedEngine e;
  e.runner = runner.get();
  e.drafter = std::make_shared<SometimesRightDrafter>(depth, kVocab, 0.3);
  auto made = BatchEngine::create(config, std::move(runner), e.drafter);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (made.ok()) e.engine = std::move(made).value();
  return e;
}

std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  for (int t = 0; t < 2 + (i * 5) % 23; ++t) p.push_back(static_cast<int32_t>((i * 11 + t * 7 + 1) % kVocab));
  return p;
}

class BoundedDrafting : public ::testing::TestWithParam<std::tuple<int, int>> {};

// `concurrency` requests at once, then a quarter as many more (at least one) while the first decodes: their prompts
// (2 to 24 tokens, beyond the 8-row bound) arrive as chunks beside verifying sequences.
TEST_P(BoundedDrafting, VerificationPassesStayInsideTheBound) {
  const auto [concurrency, depth] = GetParam();
  for (const BatchInvariance& bound : {bound_of(8, 4), bound_of(16, 12)}) {
    const std::string where = "c" + std::to_string(concurrency) + " K" + std::to_string(depth) + " bound " +
                              std::to_string(bound.rows) + "/" + std::to_string(bound.logit_rows);
    BoundedEngine e = bounded_engine(depth, bound);
    ASSERT_TRUE(e.engine);
    const int late = std::max(1, concurrency / 4), total = concurrency + late;
    Collector c;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int64_t> lengths;
    for (int i = 0; i < total; ++i) {
      prompts.push_back(prompt_of(i));
      // Request 0 outlasts the others, so the run ends with it decoding alone.
      lengths.push_back(i == 0 ? 150 : 8 + (i * 13) % 33);
    }
    auto submit = [&](int i) {
      RequestParams p;
      p.prompt = prompts[i];
      p.max_tokens = lengths[i];
      e.drafter->set_prompt(i + 1, prompts[i]);
      ASSERT_TRUE(e.engine->submit(p, c.sink(i)).ok());
    };
    // The engine holds before its 4th step (request 0, admitted first, decodes by then) and the late ones come in.
    e.runner->close_gate_at_call(4);
    for (int i = 0; i < concurrency; ++i) submit(i);
    e.runner->wait_until_blocked_at(4);
    ASSERT_GE(c.tokens_so_far(0), 1) << where;
    for (int i = concurrency; i < total; ++i) submit(i);
    e.runner->open_gate();
    for (int i = 0; i < total; ++i) {
      ASSERT_TRUE(c.wait(i)) << where;
      EXPECT_EQ(c.get(i).tokens, reference_tokens(prompts[i], lengths[i], {}, kVocab)) << where << " request " << i;
    }
    const EngineMetrics m = wait_idle(*e.engine);
    EXPECT_TRUE(e.runner->violations().empty()) << e.runner->violations().front();
    const std::vector<Pass> passes = passes_of(*e.runner);
    expect_passes_within(passes, bound, m, where);
    EXPECT_GT(m.spec_drafts, 0) << where;
    // Alone at the end, request 0 drafts as deep as the bound lets one sequence.
    int64_t deepest = 0;
    for (const Pass& p : passes)
      for (int64_t k : p.depths) deepest = std::max(deepest, k);
    EXPECT_EQ(deepest, fair_draft_depth(depth, 1, 1, {}, bound)) << where;
    // One depth for every sequence a pass verifies (sequences near max_tokens may verify fewer).
    for (const Pass& p : passes)
      if (p.verifying > 1) {
        const int64_t most = *std::max_element(p.depths.begin(), p.depths.end());
        EXPECT_LE(most, fair_draft_depth(depth, p.verifying + p.plain_decodes, p.verifying, p.chunks, bound)) << where;
      }
    if (fair_draft_depth(depth, 1, 1, {}, bound) < depth) EXPECT_GT(m.spec_bound_limited_steps, 0) << where;
  }
}

INSTANTIATE_TEST_SUITE_P(ConcurrencyAndDepth, BoundedDrafting,
                         ::testing::Combine(::testing::Values(1, 4, 16), ::testing::Range(1, 8)));

// Four sequences decode at depth 1 each in an 8-row bound (4 × 2 rows), two at depth 3 (2 × 4), and the last one
// alone at the full K = 3 again: the depth follows the load both ways.
TEST(BoundedDraftingLoad, DepthReturnsToKWhenTheLoadDrops) {
  const BatchInvariance bound = bound_of(8, 8);
  BoundedEngine e = bounded_engine(3, bound, 4);
  ASSERT_TRUE(e.engine);
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int64_t> lengths = {70, 40, 14, 14};
  for (int i = 0; i < 4; ++i) {
    prompts.push_back({static_cast<int32_t>(3 + i), static_cast<int32_t>(9 + i), static_cast<int32_t>(20 + i)});
    e.drafter->set_prompt(i + 1, prompts.back());
  }
  // The engine holds before its first step until all four are queued: on a loaded machine the submitting thread
  // could otherwise fall behind by the dozen steps request 1 needs to finish, and four never decode together.
  Collector c;
  e.runner->close_gate_at_call(1);
  for (int i = 0; i < 4; ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = lengths[i];
    ASSERT_TRUE(e.engine->submit(p, c.sink(i)).ok());
  }
  e.runner->wait_until_blocked_at(1);
  e.runner->open_gate();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(c.wait(i));
    EXPECT_EQ(c.get(i).tokens, reference_tokens(prompts[i], lengths[i], {}, kVocab));
  }
  const EngineMetrics m = wait_idle(*e.engine);
  const std::vector<Pass> passes = passes_of(*e.runner);
  expect_passes_within(passes, bound, m, "load");
  // The first pass of each load, in order: 4 verifying at depth 1, then 2 at depth 3, then 1 at depth 3.
  std::vector<std::pair<int64_t, int64_t>> loads;  // (sequences verifying, their depth) as it changes
  for (const Pass& p : passes) {
    if (p.verifying == 0 || p.plain_decodes > 0) continue;
    const std::pair<int64_t, int64_t> load{p.verifying, *std::max_element(p.depths.begin(), p.depths.end())};
    if (loads.empty() || loads.back() != load) loads.push_back(load);
  }
  // (A sequence admitted a step before the others may verify alone at the start: each is looked for after the last.)
  auto after = [&](std::vector<std::pair<int64_t, int64_t>>::iterator from, std::pair<int64_t, int64_t> want) {
    return std::find(from, loads.end(), want);
  };
  const auto four = after(loads.begin(), {4, 1});
  ASSERT_NE(four, loads.end()) << "no pass verified 4 sequences at depth 1";
  const auto two = after(four, {2, 3});
  ASSERT_NE(two, loads.end()) << "no pass verified 2 sequences at depth 3 after the 4 at depth 1";
  EXPECT_NE(after(two, {1, 3}), loads.end()) << "no pass verified the last sequence at depth 3 after that";
  EXPECT_GT(m.spec_bound_limited_steps, 0);
}

// A prompt chunk that fits beside the verifying rows shares their pass; one that does not takes the step for itself
// and the decoding sequence's drafts wait (the pass is then exactly an undrafted one).
TEST(BoundedDraftingLoad, PromptChunksShareAVerifyingPassOnlyWhenTheyFit) {
  const BatchInvariance bound = bound_of(8, 8);
  BoundedEngine e = bounded_engine(3, bound, 4);
  ASSERT_TRUE(e.engine);
  Collector c;
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {8, 9}, std::vector<int32_t>(20, 11)};
  const std::vector<int64_t> lengths = {60, 6, 6};
  auto submit = [&](int i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = lengths[i];
    e.drafter->set_prompt(i + 1, prompts[i]);
    ASSERT_TRUE(e.engine->submit(p, c.sink(i)).ok());
  };
  // Each arrives while request 0 decodes alone (drafting 3: passes of 4 rows): request 1 before step 4, request 2
  // (after request 1's 6 tokens, before request 0's 60) before step 14.
  e.runner->close_gate_at_call(4);
  submit(0);
  e.runner->wait_until_blocked_at(4);
  submit(1);
  e.runner->close_gate_at_call(14);
  e.runner->open_gate();
  e.runner->wait_until_blocked_at(14);
  ASSERT_TRUE(c.get(1).done) << "request 1 should have ended by step 14";
  ASSERT_FALSE(c.get(0).done) << "request 0 should still decode at step 14";
  submit(2);
  e.runner->open_gate();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.wait(i));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.get(i).tokens, reference_tokens(prompts[i], lengths[i], {}, kVocab));
  const EngineMetrics m = wait_idle(*e.engine);
  const std::vector<Pass> passes = passes_of(*e.runner);
  expect_passes_within(passes, bound, m, "chunks");
  bool shared = false, alone = false;
  for (const auto& call : e.runner->records()) {
    bool verifies = false;
    int64_t chunk = 0;
    for (const RecordedStep& s : call) {
      verifies = verifies || s.all_logits;
      if (!s.all_logits && s.tokens > 1) chunk = s.tokens;
    }
    shared = shared || (verifies && chunk == 2);
    alone = alone || (!verifies && chunk == 20);
  }
  EXPECT_TRUE(shared) << "the 2-token prompt should have shared a verifying pass";
  EXPECT_TRUE(alone) << "the 20-token prompt should have run without drafts beside it";
}

}  // namespace
}  // namespace kiln::testing
