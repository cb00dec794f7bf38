// Speculative decoding is lossless when sampling, end to end through the engine: with a drafter whose drafts come from
// a distribution unrelated to the model (and are often rejected), the joint distribution of a request's first three
// sampled tokens is the model's own (exact, from the fake model's logits), by a chi-square test; so is it without
// drafting. The fake model keeps this cheap enough for thousands of requests.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine_harness.h"
#include "kernels/cpu/sampling.h"

namespace kiln::testing {
namespace {

constexpr int64_t kVocab = 4;
constexpr float kTemperature = 1.5f;

// Drafts drawn from a fixed q over the whole (tiny) vocabulary, returned with that q.
class FixedQDrafter final : public Drafter {
 public:
  DrafterCapabilities capabilities() const override {
    DrafterCapabilities c;
    c.max_depth = 4;
    c.has_draft_probs = true;
    return c;
  }
  Status propose(const DraftStep& step, std::vector<DraftProposal>& out) override {
    out.assign(step.seqs.size(), {});
    ids_.assign(step.seqs.size() * 4 * kVocab, 0);
    probs_.assign(ids_.size(), 0.f);
    for (size_t b = 0; b < step.seqs.size(); ++b) {
      for (int k = 0; k < step.seqs[b].depth; ++k) {
        const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
        double run = 0;
        int32_t pick = kVocab - 1;
        for (int32_t t = 0; t < kVocab; ++t) {
          run += kQ[t];
          if (u < run) {
            pick = t;
            break;
          }
        }
        out[b].tokens.push_back(pick);
        for (int32_t t = 0; t < kVocab; ++t) {
          ids_[(b * 4 + k) * kVocab + t] = t;
          probs_[(b * 4 + k) * kVocab + t] = static_cast<float>(kQ[t]);
        }
      }
      out[b].q_ids = ids_.data() + b * 4 * kVocab;
      out[b].q_probs = probs_.data() + b * 4 * kVocab;
      out[b].q_width = kVocab;
    }
    return ok_status();
  }
  Status rollback(int64_t, int64_t) override { return ok_status(); }
  void release(int64_t) override {}

 private:
  static constexpr double kQ[kVocab] = {0.4, 0.3, 0.2, 0.1};
  std::mt19937_64 rng_{77};
  std::vector<int32_t> ids_;
  std::vector<float> probs_;
};

// P(t1, t2, t3) for the prompt, from the fake model's logits at temperature kTemperature.
std::vector<double> exact_joint(const std::vector<int32_t>& prompt) {
  std::vector<double> joint(kVocab * kVocab * kVocab);
  std::vector<float> logits(kVocab), p1(kVocab), p2(kVocab), p3(kVocab);
  cpu::SamplingParams sp;
  sp.temperature = kTemperature;
  auto dist = [&](std::vector<int32_t> h, std::vector<float>& p) {
    fake_logits(h, kVocab, logits.data());
    cpu::sampling_distribution(logits.data(), kVocab, sp, p.data());
  };
  dist(prompt, p1);
  for (int32_t a = 0; a < kVocab; ++a) {
    auto h = prompt;
    h.push_back(a);
    dist(h, p2);
    for (int32_t b = 0; b < kVocab; ++b) {
      auto h2 = h;
      h2.push_back(b);
      dist(h2, p3);
      for (int32_t c = 0; c < kVocab; ++c) joint[(a * kVocab + b) * kVocab + c] = p1[a] * p2[b] * p3[c];
    }
  }
  return joint;
}

double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n, int& cells) {
  double chi = 0;
  cells = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    if (e < 5) continue;  // the usual validity rule
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  return chi;
}

std::vector<int64_t> sample_joint(bool drafting, const std::vector<int32_t>& prompt, int64_t requests) {
  EngineConfig config = small_config(512);
  config.max_num_seqs = 32;
  config.prefix_caching = false;
  std::shared_ptr<Drafter> drafter;
  if (drafting) {
    config.speculative_depth = 2;
    config.lookahead_slots = 4;
    drafter = std::make_shared<FixedQDrafter>();
  }
  auto engine = BatchEngine::create(config, std::make_unique<FakeModelRunner>(512, 4, kVocab), drafter);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<int64_t> counts(kVocab * kVocab * kVocab, 0);
  if (!engine.ok()) return counts;
  for (int64_t base = 0; base < requests; base += 256) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int64_t> lengths;
    Collector c;
    const int64_t batch = std::min<int64_t>(256, requests - base);
    for (int64_t i = 0; i < batch; ++i) {
      RequestParams p;
      p.prompt = prompt;
      p.max_tokens = 3;
      p.sampling.temperature = kTemperature;
      p.sampling.seed = static_cast<uint64_t>(base + i + 1) * 7919;
      EXPECT_TRUE((*engine)->submit(p, c.sink(static_cast<int>(i))).ok());
    }
    for (int64_t i = 0; i < batch; ++i) {
      EXPECT_TRUE(c.wait(static_cast<int>(i)));
      const auto t = c.get(static_cast<int>(i)).tokens;
      EXPECT_EQ(t.size(), 3u);
      if (t.size() == 3) ++counts[(t[0] * kVocab + t[1]) * kVocab + t[2]];
    }
  }
  if (drafting) EXPECT_GT((*engine)->metrics().spec_draft_tokens, 0);
  return counts;
}

TEST(SpeculativeDistribution, SampledTokensFollowTheModelWithAndWithoutDrafts) {
  const std::vector<int32_t> prompt = {1, 3, 2};
  const auto p = exact_joint(prompt);
  constexpr int64_t kRequests = 6000;
  for (bool drafting : {false, true}) {
    const auto counts = sample_joint(drafting, prompt, kRequests);
    int cells = 0;
    const double chi = chi_square(counts, p, kRequests, cells);
    // df = cells − 1 ≤ 63; 1e-4 tail of chi-square(63) is about 112.
    EXPECT_LT(chi, 112.0) << (drafting ? "with" : "without") << " drafts, over " << cells << " cells";
    EXPECT_GT(cells, 8);
    std::printf("%s drafts: chi-square %.1f over %d cells\n", drafting ? "with" : "without", chi, cells);
  }
}

}  // namespace
}  // namespace kiln::testing
