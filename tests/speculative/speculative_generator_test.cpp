// Lossless speculative decoding: on glm4_moe_lite-tiny (random weights with an MTP layer) greedy generation
// with the mtp drafter at K = 1..5 equals generation without drafting, token for token, for several prompts
// and lengths. Drafters that are always wrong, always right, or right then wrong exercise target KV
// rollback (rejected rows are overwritten by the next pass) and the acceptance metrics.
#include <algorithm>
#include <random>

#include "engine/generator.h"
#include "engine/speculative_generator.h"
#include "speculative_test_support.h"

namespace kiln {
namespace {
using testing::load_with_mtp;
using testing::mtp_recipe;

std::vector<int32_t> random_prompt(int64_t n, uint64_t seed, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

struct Fixture {
  Recipe recipe = mtp_recipe();
  LoadedModel m = load_with_mtp(recipe);
  std::unique_ptr<KvCache> kv = make_kv_cache(m, 1024);
  int64_t V = m.model->config().vocab_size;

  std::vector<int32_t> baseline(const std::vector<int32_t>& prompt, const GenerateOptions& o) {
    Generator g(*m.model, *kv);
    auto r = g.generate(prompt, o, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return *r;
  }
};

TEST(SpeculativeGenerator, MtpGreedyEqualsNoDraftingAtEveryDepth) {
  Fixture f;
  auto host = make_mtp_draft_host(f.m, f.recipe, global_registry(), 1024);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  auto drafter = create_drafter(f.recipe, global_registry(), f.m.info, host->get());
  ASSERT_TRUE(drafter.ok()) << drafter.status().to_string();
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(1, 1, f.V), random_prompt(6, 2, f.V),
                                                     random_prompt(23, 3, f.V), random_prompt(41, 4, f.V)};
  for (const auto& prompt : prompts) {
    for (int64_t len : {1, 2, 9, 40}) {
      GenerateOptions o;
      o.max_new_tokens = len;
      o.prefill_chunk = 16;  // the 41-token prompt prefills in three chunks
      const auto expected = f.baseline(prompt, o);
      ASSERT_EQ(static_cast<int64_t>(expected.size()), len);
      for (int k = 1; k <= 5; ++k) {
        SpeculativeGenerator g(*f.m.model, *f.kv, **drafter, k);
        auto got = g.generate(prompt, o, nullptr);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        EXPECT_EQ(*got, expected) << "prompt of " << prompt.size() << ", " << len << " tokens, K = " << k;
        if (len > 2) EXPECT_GT(g.metrics().drafts, 0);  // the last token never needs drafts
      }
    }
  }
}

// A drafter that knows the answer: it proposes `truth` after the newest token, corrupted where `wrong_at`
// says (draft index → wrong), to steer acceptance exactly.
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::vector<int32_t> truth, int64_t vocab, std::vector<bool> wrong_at)
      : truth_(std::move(truth)), vocab_(vocab), wrong_at_(std::move(wrong_at)) {}
  DrafterCapabilities capabilities() const override {
    DrafterCapabilities c;
    c.max_depth = 8;
    return c;
  }
  Status propose(const std::vector<DraftInput>& batch, int depth, std::vector<DraftOutput>& out) override {
    out.assign(batch.size(), {});
    const DraftInput& in = batch[0];
    const int64_t newest = in.start_position + in.num_tokens;  // position of next_token
    if (truth_.at(newest) != in.next_token) return internal_error("scripted drafter: the sequence diverged");
    for (int k = 0; k < depth && newest + 1 + k < static_cast<int64_t>(truth_.size()); ++k) {
      const int32_t t = truth_[newest + 1 + k];
      const bool wrong = k < static_cast<int>(wrong_at_.size()) && wrong_at_[k];
      out[0].tokens.push_back(wrong ? static_cast<int32_t>((t + 1) % vocab_) : t);
    }
    ++proposals;
    return ok_status();
  }
  Status rollback(int64_t, int64_t length) override {
    rollbacks.push_back(length);
    return ok_status();
  }
  void release(int64_t) override {}

  int proposals = 0;
  std::vector<int64_t> rollbacks;

 private:
  std::vector<int32_t> truth_;
  int64_t vocab_;
  std::vector<bool> wrong_at_;
};

TEST(SpeculativeGenerator, RejectedRowsAreOverwrittenSoOutputIsUnchanged) {
  Fixture f;
  const auto prompt = random_prompt(13, 7, f.V);
  GenerateOptions o;
  o.max_new_tokens = 30;
  const auto expected = f.baseline(prompt, o);
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), expected.begin(), expected.end());
  for (const std::vector<bool>& wrong : {std::vector<bool>(5, true), std::vector<bool>{false, false, true, false, true},
                                         std::vector<bool>{false, true, true, true, true}}) {
    ScriptedDrafter d(truth, f.V, wrong);
    SpeculativeGenerator g(*f.m.model, *f.kv, d, 5);
    auto got = g.generate(prompt, o, nullptr);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, expected);
    // The drafter is told each accepted length, always increasing by 1 + the accepted drafts.
    ASSERT_FALSE(d.rollbacks.empty());
    const int64_t first_accepted = std::find(wrong.begin(), wrong.end(), true) - wrong.begin();
    EXPECT_EQ(d.rollbacks.front(), static_cast<int64_t>(prompt.size()) + 1 + first_accepted);
    EXPECT_TRUE(std::is_sorted(d.rollbacks.begin(), d.rollbacks.end()));
    EXPECT_EQ(std::adjacent_find(d.rollbacks.begin(), d.rollbacks.end()), d.rollbacks.end());
  }
}

TEST(SpeculativeGenerator, MetricsCountAcceptance) {
  Fixture f;
  const auto prompt = random_prompt(9, 8, f.V);
  GenerateOptions o;
  o.max_new_tokens = 25;  // 1 from prefill, then passes of 1 + K = 4 tokens: 6 full passes
  const auto expected = f.baseline(prompt, o);
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), expected.begin(), expected.end());

  ScriptedDrafter right(truth, f.V, {});
  SpeculativeGenerator all(*f.m.model, *f.kv, right, 3);
  ASSERT_TRUE(all.generate(prompt, o, nullptr).ok());
  EXPECT_EQ(all.metrics().drafts, 6);
  EXPECT_EQ(all.metrics().accepted, all.metrics().drafted);
  EXPECT_DOUBLE_EQ(all.metrics().mean_acceptance_length(), 4.0);
  EXPECT_DOUBLE_EQ(all.metrics().acceptance_rate_at(2), 1.0);

  ScriptedDrafter second_wrong(truth, f.V, {false, true, false});
  SpeculativeGenerator half(*f.m.model, *f.kv, second_wrong, 3);
  auto got = half.generate(prompt, o, nullptr);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, expected);
  // Every pass accepts exactly draft 1: 2 tokens per pass.
  EXPECT_DOUBLE_EQ(half.metrics().acceptance_rate_at(0), 1.0);
  EXPECT_DOUBLE_EQ(half.metrics().acceptance_rate_at(1), 0.0);
  EXPECT_EQ(half.metrics().accepted_at.at(2), 0);
  EXPECT_DOUBLE_EQ(half.metrics().mean_acceptance_length(), 2.0);
}

TEST(SpeculativeGenerator, StopTokenEndsMidPass) {
  Fixture f;
  const auto prompt = random_prompt(9, 8, f.V);
  GenerateOptions o;
  o.max_new_tokens = 25;
  const auto expected = f.baseline(prompt, o);
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), expected.begin(), expected.end());
  o.stop_tokens = {expected[6]};
  const auto first_stop = std::find(expected.begin(), expected.end(), expected[6]);
  const std::vector<int32_t> want(expected.begin(), first_stop + 1);
  ScriptedDrafter d(truth, f.V, {});
  SpeculativeGenerator g(*f.m.model, *f.kv, d, 4);
  GenerateStats st;
  auto got = g.generate(prompt, o, nullptr, &st);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, want);
  EXPECT_TRUE(st.stopped_by_token);
}

TEST(SpeculativeGenerator, MtpSamplingIsSeededAndValid) {
  Fixture f;
  auto host = make_mtp_draft_host(f.m, f.recipe, global_registry(), 1024);
  ASSERT_TRUE(host.ok());
  auto drafter = create_drafter(f.recipe, global_registry(), f.m.info, host->get());
  ASSERT_TRUE(drafter.ok());
  GenerateOptions o;
  o.max_new_tokens = 20;
  o.sampling.temperature = 0.8f;
  o.sampling.top_p = 0.95f;
  o.sampling.seed = 1234;
  const auto prompt = random_prompt(10, 9, f.V);
  SpeculativeGenerator a(*f.m.model, *f.kv, **drafter, 4, /*seq_id=*/1);
  SpeculativeGenerator b(*f.m.model, *f.kv, **drafter, 4, /*seq_id=*/2);
  auto x = a.generate(prompt, o, nullptr);
  auto y = b.generate(prompt, o, nullptr);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x, *y);
  EXPECT_EQ(x->size(), 20u);
  for (int32_t t : *x) EXPECT_TRUE(t >= 0 && t < f.V);
  EXPECT_GT(a.metrics().drafted, 0);
}

}  // namespace
}  // namespace kiln
