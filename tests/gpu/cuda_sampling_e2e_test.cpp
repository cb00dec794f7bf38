// Penalties, logit_bias and logprobs on the CUDA runner end to end, on the trained tiny-glm: free-running greedy
// decoding with the engine's own per-step adjustments (engine/sampling_penalties) on the GPU against the CPU model
// in bf16 precision (the GPU's rounding points; cuda_model_test's tiny-glm comparison), and through the server on a
// CUDA recipe, which now accepts these fields.
//
// Tolerances. Tokens: identical until a step where the CPU's adjusted top-1 / top-2 gap is below twice that step's
// measured logits difference (a near-tie the two paths may break either way, the rule cuda_model_test uses; inputs
// are still identical there). Logprobs: the GPU's equal token_logprobs over the GPU's own logits within 1e-4
// (exact wiring, the device-vs-host test's tolerance); against the CPU's within 2·max|Δlogit| of the step + 1e-4 — a
// log-softmax value moves by at most twice the largest change of its row's logits, and so does each sorted top-N
// value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "common/test_model.h"
#include "engine/sampling_penalties.h"
#include "grammar/constrained_support.h"
#include "model/host_token_select.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

using nlohmann::json;
using testing::TestKv;

LoadedModel load_tiny_glm(const std::string& device, const std::string& precision) {
  std::vector<std::string> sets = {"model.path=" + (fs::path(KILN_SOURCE_DIR) / "models/tiny-glm").string(),
                                   "kv.layout=bf16", "kv.block_size=4", "model.device=" + device, "model.load=mmap"};
  if (precision != "fp32") sets.push_back("model.precision=" + precision);
  auto recipe = load_recipe("", sets, global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::vector<std::vector<float>> rows;                  // the logits each token was selected from
  std::vector<std::vector<LogitAdjustment>> adjustments;  // and that row's adjustments
};

constexpr int64_t kNew = 24;
constexpr int32_t kTopLogprobs = 5;

// Greedy decoding of kNew tokens with `options`' penalties and logit_bias, logprobs of every token, one sequence.
Decoded decode(LoadedModel& m, const std::vector<int32_t>& prompt, const SamplingOptions& options) {
  Decoded run;
  const int64_t vocab = m.info.vocab_size;
  TestKv kv(m, static_cast<int64_t>(prompt.size()) + kNew + 8);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.reserve(table, static_cast<int64_t>(prompt.size()) + kNew + 1).ok());
  SequencePenalties penalties(options, prompt);
  std::vector<int32_t> history = prompt;
  StepOptions o;
  o.want_logits = true;
  for (int64_t s = 0; s < kNew; ++s) {
    penalties.follow(history, static_cast<int64_t>(prompt.size()));
    std::vector<LogitAdjustment> adjustments;
    std::vector<int32_t> offsets;
    penalties.fill({}, adjustments, offsets);
    TokenSelection sel;
    sel.select = true;
    sel.logprobs = kTopLogprobs;
    sel.adjustments = adjustments;
    sel.adjustment_offsets = offsets;
    const std::span<const int32_t> fed = s == 0 ? std::span<const int32_t>(prompt)
                                                : std::span<const int32_t>(&history.back(), 1);
    const SequenceStep step{fed, static_cast<int64_t>(history.size() - fed.size()), &table, false};
    StepOutput out;
    const Status st = m.model->step({&step, 1}, {&sel, 1}, kv.views(), o, out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok() || out.tokens.empty() || out.tokens[0].size() != 1 || out.logprobs.empty() ||
        out.logprobs[0].size() != 1) {
      ADD_FAILURE() << "step " << s << " selected no token with logprobs";
      break;
    }
    const float* row = out.logits.data() + out.first_row[0] * vocab;
    run.rows.emplace_back(row, row + vocab);
    run.adjustments.push_back(adjustments);
    run.tokens.push_back(out.tokens[0][0]);
    run.logprobs.push_back(out.logprobs[0][0]);
    history.push_back(out.tokens[0][0]);
  }
  return run;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

double top_gap(std::vector<float> row) {
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
  return static_cast<double>(row[0]) - row[1];
}

TEST(CudaSamplingTinyGlm, GreedyWithPenaltiesAndLogitBiasMatchesTheCpu) {
  LoadedModel cpu = load_tiny_glm("cpu", "bf16");
  LoadedModel gpu = load_tiny_glm("cuda", "fp32");
  ASSERT_TRUE(gpu.on_gpu());
  const int64_t vocab = cpu.info.vocab_size;
  int identical = 0, adjusted_picks = 0;
  double worst_logprob = 0;
  constexpr int kPrompts = 4;
  for (int p = 0; p < kPrompts; ++p) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 4 + 7 * p; ++t) prompt.push_back((61 * t + 89 * p + 13) % static_cast<int32_t>(vocab - 2) + 2);
    SamplingOptions options;
    options.presence_penalty = 0.4f;
    options.frequency_penalty = 0.3f;
    options.repetition_penalty = p % 2 ? 1.3f : 1.0f;
    // The unadjusted greedy first token banned, two others lifted.
    {
      SamplingOptions plain;
      const Decoded first = decode(cpu, prompt, plain);
      ASSERT_FALSE(first.tokens.empty());
      options.logit_bias = {{first.tokens[0], -100.0f}, {(7 * p + 5) % static_cast<int32_t>(vocab), 2.0f},
                            {(11 * p + 40) % static_cast<int32_t>(vocab), 1.0f}};
    }
    const Decoded want = decode(cpu, prompt, options);
    const Decoded got = decode(gpu, prompt, options);
    ASSERT_EQ(got.tokens.size(), static_cast<size_t>(kNew));
    ASSERT_EQ(want.tokens.size(), static_cast<size_t>(kNew));
    size_t d = 0;
    while (d < got.tokens.size() && got.tokens[d] == want.tokens[d]) ++d;
    for (size_t s = 0; s < got.tokens.size(); ++s) {
      const std::vector<float>& row = got.rows[s];
      if (got.tokens[s] != static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()))
        ++adjusted_picks;
      // The GPU's logprobs are those of its own logits row (the selected token's, verified exactly).
      const TokenLogprobs own = token_logprobs(row.data(), vocab, got.tokens[s], kTopLogprobs);
      EXPECT_NEAR(got.logprobs[s].logprob, own.logprob, 1e-4) << "prompt " << p << " step " << s;
      ASSERT_EQ(got.logprobs[s].top.size(), own.top.size());
      for (size_t k = 0; k < own.top.size(); ++k) {
        EXPECT_EQ(got.logprobs[s].top[k].first, own.top[k].first) << "prompt " << p << " step " << s;
        EXPECT_NEAR(got.logprobs[s].top[k].second, own.top[k].second, 1e-4) << "prompt " << p << " step " << s;
      }
      if (s > d) continue;  // past a divergence the inputs differ
      const double diff = max_abs_diff(got.rows[s], want.rows[s]);
      const double tolerance = 2 * diff + 1e-4;
      if (s < d) {
        const double e = std::fabs(got.logprobs[s].logprob - want.logprobs[s].logprob);
        worst_logprob = std::max(worst_logprob, e);
        EXPECT_LE(e, tolerance) << "prompt " << p << " step " << s;
      }
      for (size_t k = 0; k < want.logprobs[s].top.size(); ++k)
        EXPECT_LE(std::fabs(got.logprobs[s].top[k].second - want.logprobs[s].top[k].second), tolerance)
            << "prompt " << p << " step " << s << " rank " << k;
    }
    if (d == got.tokens.size()) {
      ++identical;
      continue;
    }
    // A divergence only at a near-tie of the CPU's adjusted row.
    std::vector<float> adjusted = want.rows[d];
    apply_logit_adjustments(adjusted.data(), want.adjustments[d]);
    const double gap = top_gap(adjusted), diff = max_abs_diff(got.rows[d], want.rows[d]);
    std::printf("tiny-glm with penalties, prompt %d: diverges at step %zu (CPU %d, GPU %d): adjusted top-1/top-2 gap "
                "%.4g, logits |Δ| %.4g\n",
                p, d, want.tokens[d], got.tokens[d], gap, diff);
    EXPECT_LT(gap, 2 * diff) << "prompt " << p << ": greedy tokens differ at step " << d << " without a near-tie";
  }
  std::printf("tiny-glm with penalties and logit_bias: %d of %d prompts identical for all %lld tokens; %d picks not "
              "the row's own argmax; worst CPU-vs-GPU logprob difference %.3g\n",
              identical, kPrompts, static_cast<long long>(kNew), adjusted_picks, worst_logprob);
  EXPECT_GT(adjusted_picks, 0) << "the adjustments never changed a pick";
}

// The server on a CUDA recipe accepts penalties, logit_bias, min_p and logprobs (it answered 400 before), and a
// logit_bias strong enough to force a token gives the same answer as on the CPU recipe.
TEST(CudaSamplingServer, AcceptsPenaltiesLogitBiasAndLogprobs) {
  using testing::TinyServer;
  const json request = {{"messages", testing::user("Say something.")},
                        {"chat_template_kwargs", testing::kNoThinking},
                        {"max_tokens", 8},
                        {"temperature", 0},
                        {"presence_penalty", 0.5},
                        {"frequency_penalty", 0.2},
                        {"repetition_penalty", 1.1},
                        {"logit_bias", {{"1000", 100}}},
                        {"logprobs", true},
                        {"top_logprobs", 3}};
  std::vector<json> bodies;
  for (bool cuda : {false, true}) {
    TinyServer server(0, cuda);
    auto [status, body] = server.chat(request);
    ASSERT_EQ(status, 200) << (cuda ? "cuda: " : "cpu: ") << body.dump();
    const json& content = body["choices"][0]["logprobs"]["content"];
    ASSERT_TRUE(content.is_array() && !content.empty()) << body.dump();
    for (const json& t : content) {
      EXPECT_LE(t["logprob"].get<double>(), 0.0);
      EXPECT_EQ(t["top_logprobs"].size(), 3u);
    }
    bodies.push_back(body);
    json sampled = request;
    sampled["temperature"] = 0.8;
    sampled["min_p"] = 0.1;
    sampled["seed"] = 5;
    EXPECT_EQ(server.chat(sampled).first, 200) << (cuda ? "cuda" : "cpu");
  }
  EXPECT_EQ(bodies[1]["choices"][0]["message"]["content"], bodies[0]["choices"][0]["message"]["content"]);
}

}  // namespace
}  // namespace kiln
