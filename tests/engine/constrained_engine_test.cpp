// The engine's side of constrained decoding over the fake model, with a scripted TokenConstraint (no grammar
// engine): every emitted token is one the constraint allowed, the constraint follows exactly the emitted tokens,
// greedy output equals a reference that masks the fake logits by hand whatever the batching or preemption, and the
// request ends (stop) the moment the constraint accepts a stop token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "engine_harness.h"

namespace kiln::testing {
namespace {

constexpr int64_t kVocab = 97;
constexpr int32_t kStop = 5;

// Allows tokens with (token + position) % 3 == 0 for `length` tokens, then only kStop.
class ModuloConstraint final : public TokenConstraint {
 public:
  explicit ModuloConstraint(int64_t length) : length_(length) {}
  bool allowed(int32_t t) const {
    if (terminated()) return false;
    const int64_t pos = static_cast<int64_t>(accepted_.size());
    return pos >= length_ ? t == kStop : t != kStop && (t + pos) % 3 == 0;
  }
  void fill_allowed(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    for (int32_t t = 0; t < kVocab; ++t)
      if (allowed(t)) mask[t / 32] |= 1u << (t % 32);
  }
  bool accept(int32_t t) override {
    if (!allowed(t)) return false;
    accepted_.push_back(t);
    return true;
  }
  void rollback(int n) override { accepted_.resize(accepted_.size() - n); }
  bool terminated() const override { return !accepted_.empty() && accepted_.back() == kStop; }
  const std::vector<int32_t>& accepted() const { return accepted_; }

 private:
  int64_t length_;
  std::vector<int32_t> accepted_;
};

// Greedy over the fake logits with the constraint's mask applied by hand.
std::vector<int32_t> masked_reference(std::vector<int32_t> history, int64_t length, int64_t max_tokens) {
  ModuloConstraint c(length);
  std::vector<float> logits(kVocab);
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < max_tokens && !c.terminated()) {
    fake_logits(history, kVocab, logits.data());
    int32_t best = -1;
    for (int32_t t = 0; t < kVocab; ++t)
      if (c.allowed(t) && (best < 0 || logits[t] > logits[best])) best = t;
    c.accept(best);
    out.push_back(best);
    history.push_back(best);
  }
  return out;
}

void run_constrained(EngineUnderTest& t, int requests, int64_t length, int64_t max_tokens) {
  std::mt19937 rng(17);
  Collector c;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<ModuloConstraint>> constraints;
  for (int i = 0; i < requests; ++i) {
    RequestParams p;
    p.prompt = random_prompt(rng, 10 + i % 7, kVocab);
    p.max_tokens = max_tokens;
    constraints.push_back(std::make_shared<ModuloConstraint>(length + i % 3));
    p.constraint = constraints.back();
    prompts.push_back(p.prompt);
    ASSERT_TRUE(t.engine->submit(p, c.sink(i)).ok());
  }
  for (int i = 0; i < requests; ++i) {
    ASSERT_TRUE(c.wait(i));
    const Outcome o = c.get(i);
    const std::vector<int32_t> want = masked_reference(prompts[i], length + i % 3, max_tokens);
    EXPECT_EQ(o.tokens, want) << "request " << i;
    EXPECT_EQ(constraints[i]->accepted(), o.tokens) << "the constraint did not follow request " << i;
    const bool completed = !want.empty() && want.back() == kStop;
    EXPECT_EQ(o.reason, completed ? FinishReason::kStop : FinishReason::kLength) << "request " << i;
  }
}

TEST(ConstrainedEngine, GreedyOutputIsTheMaskedReferenceAndEndsOnCompletion) {
  auto t = make_engine(small_config(1024));
  run_constrained(t, 12, /*length=*/20, /*max_tokens=*/40);
}

TEST(ConstrainedEngine, LengthLimitCutsAnUnfinishedConstraint) {
  auto t = make_engine(small_config(1024));
  run_constrained(t, 3, /*length=*/50, /*max_tokens=*/10);
}

TEST(ConstrainedEngine, PreemptionKeepsTheConstraintInStep) {
  // A pool too small for every request at once: sequences are preempted and recomputed mid-generation.
  EngineConfig config = small_config(24);
  config.max_num_batched_tokens = 16;
  auto t = make_engine(config);
  run_constrained(t, 8, /*length=*/24, /*max_tokens=*/30);
  EXPECT_GT(t.engine->metrics().preemptions_total, 0);
}

TEST(ConstrainedEngine, SampledTokensAreAlwaysAllowed) {
  auto t = make_engine(small_config(1024));
  Collector c;
  std::vector<std::shared_ptr<ModuloConstraint>> constraints;
  for (int i = 0; i < 6; ++i) {
    RequestParams p;
    p.prompt = {1, 2, 3, static_cast<int32_t>(i + 4)};
    p.max_tokens = 30;
    p.sampling.temperature = 1.5f;
    p.sampling.seed = static_cast<uint64_t>(i);
    constraints.push_back(std::make_shared<ModuloConstraint>(25));
    p.constraint = constraints.back();
    ASSERT_TRUE(t.engine->submit(p, c.sink(i)).ok());
  }
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(c.wait(i));
    const Outcome o = c.get(i);
    // accept() refuses any token the mask did not allow, so a full-length follow proves every token was allowed.
    EXPECT_EQ(constraints[i]->accepted(), o.tokens);
    EXPECT_EQ(o.reason, FinishReason::kStop);
    EXPECT_EQ(o.tokens.size(), 26u);
  }
}

}  // namespace
}  // namespace kiln::testing
