// The draft-mtp plugin through the SDK only (created by name from the registry over the engine's DraftServices, fed
// DraftSteps with the target's taps): its drafts follow the MTP chain computed directly with MlaMoeModel::mtp_forward,
// rows arriving over several steps equal one step, batching changes nothing, sampling returns sparse q, and a
// checkpoint without MTP weights is refused clearly.
#include <cmath>
#include <numeric>

#include "kernels/cpu/sampling.h"
#include "speculative_test_support.h"

namespace kiln {
namespace {
using testing::cpu_model;
using testing::DraftFixture;
using testing::load_with_mtp;
using testing::mtp_recipe;

struct Fixture : DraftFixture {
  std::vector<int32_t> prompt;
  std::vector<float> hidden;  // the trunk's final-normed hidden states over `prompt`
  int64_t H = 0, V = 0;
  // One block table per sequence id, covering the prompt and the drafts.
  std::map<int64_t, std::vector<int32_t>> tables;

  explicit Fixture(int64_t prompt_len = 24) {
    H = m.info.hidden_size;
    V = m.info.vocab_size;
    std::mt19937_64 rng(99);
    for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(static_cast<int32_t>(rng() % V));
    std::vector<int32_t> table;
    EXPECT_TRUE(kv.reserve(table, prompt_len).ok());
    StepOutput out;
    SequenceStep step{prompt, 0, &table, false};
    EXPECT_TRUE(cpu_model(m).forward({&step, 1}, kv.views(), {.want_hidden = true}, out).ok());
    hidden = out.hidden;
  }

  const std::vector<int32_t>& table(int64_t seq) {
    auto& t = tables[seq];
    if (t.empty()) EXPECT_TRUE(kv.reserve(t, static_cast<int64_t>(prompt.size()) + 16).ok());
    return t;
  }

  // Rows [begin, end − 1) of the prompt as target rows (hidden states from `hidden`), prompt[end − 1] as the newest
  // token; their taps are rows [0, end − 1 − begin) of `taps`, which the caller passes in the step.
  DraftSequence seq(int64_t id, int64_t begin, int64_t end, int depth, float temperature = 0, uint64_t seed = 0) {
    DraftSequence d;
    d.seq_id = id;
    d.start_position = begin;
    d.num_rows = end - 1 - begin;
    d.next_tokens = prompt.data() + begin + 1;
    d.depth = depth;
    d.temperature = temperature;
    d.seed = seed;
    const auto& t = table(id);
    d.block_table = t.data();
    d.num_blocks = static_cast<int64_t>(t.size());
    return d;
  }

  // A step of these sequences: their taps packed in order.
  Status propose(std::vector<DraftSequence> seqs, std::vector<DraftProposal>& out) {
    taps_.clear();
    int64_t row = 0;
    for (DraftSequence& d : seqs) {
      d.tap_row = row;
      taps_.insert(taps_.end(), hidden.begin() + d.start_position * H, hidden.begin() + (d.start_position + d.num_rows) * H);
      row += d.num_rows;
    }
    DraftStep step;
    step.seqs = std::move(seqs);
    step.taps = {TensorView::contiguous(taps_.data(), DType::kF32, {row, H})};
    return drafter->propose(step, out);
  }

  // The MTP chain by hand with MlaMoeModel::mtp_forward on pages of its own: step 1 over the rows of
  // prompt[0 .. end − 1), then one row per draft on the previous output hidden state. Greedy drafts.
  std::vector<int32_t> manual_chain(int64_t end, int depth) {
    const std::vector<int32_t>& t = table(1000 + depth);
    std::vector<int32_t> drafts;
    const int64_t n = end - 1;
    StepOutput out;
    SequenceStep step{std::span<const int32_t>(prompt.data() + 1, n), 0, &t, false};
    EXPECT_TRUE(cpu_model(m).mtp_forward(0, {&step, 1}, hidden.data(), kv.views(), out).ok());
    for (int k = 1;; ++k) {
      drafts.push_back(cpu::argmax(out.logits.data(), V));
      if (k == depth) break;
      const std::vector<float> h(out.hidden.end() - H, out.hidden.end());
      SequenceStep next{std::span<const int32_t>(&drafts.back(), 1), n + k - 1, &t, false};
      EXPECT_TRUE(cpu_model(m).mtp_forward(0, {&next, 1}, h.data(), kv.views(), out).ok());
    }
    return drafts;
  }

 private:
  std::vector<float> taps_;
};

TEST(MtpDrafter, AdvertisesMtpCapabilities) {
  Fixture f;
  DrafterCapabilities caps = f.drafter->capabilities();
  EXPECT_EQ(caps.tap_layers, std::vector<int>{kTapFinalNormed});
  EXPECT_GE(caps.max_depth, 5);
  EXPECT_FALSE(caps.parallel_drafting);
  EXPECT_TRUE(caps.has_draft_probs);
  EXPECT_TRUE(caps.needs_target_mtp);
  EXPECT_TRUE(caps.cache_layers.empty()) << "its KV is the target's pages of the next-n layer";
}

TEST(MtpDrafter, GreedyDraftsFollowTheMtpChain) {
  Fixture f;
  for (int depth : {1, 3, 5}) {
    std::vector<DraftProposal> out;
    ASSERT_TRUE(f.propose({f.seq(depth, 0, 24, depth)}, out).ok());
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].tokens, f.manual_chain(24, depth)) << "depth " << depth;
    EXPECT_EQ(out[0].q_ids, nullptr);  // greedy drafts carry no q
  }
}

TEST(MtpDrafter, RowsOverSeveralStepsEqualOneStep) {
  Fixture f;
  std::vector<DraftProposal> whole, part;
  ASSERT_TRUE(f.propose({f.seq(1, 0, 24, 3)}, whole).ok());
  // As the engine brings them: a prompt chunk without drafting, then the rest with its newest token.
  ASSERT_TRUE(f.propose({f.seq(2, 0, 15, 0)}, part).ok());
  EXPECT_TRUE(part[0].tokens.empty());
  ASSERT_TRUE(f.propose({f.seq(2, 14, 24, 3)}, part).ok());
  EXPECT_EQ(part[0].tokens, whole[0].tokens);
  // After a verification accepted fewer rows, they come again from the accepted length: the same drafts.
  ASSERT_TRUE(f.drafter->rollback(2, 10).ok());
  ASSERT_TRUE(f.propose({f.seq(2, 10, 24, 3)}, part).ok());
  EXPECT_EQ(part[0].tokens, whole[0].tokens);
}

TEST(MtpDrafter, BatchedProposalsEqualSingleOnes) {
  Fixture f;
  std::vector<DraftProposal> batched, a, b;
  // A sequence that only follows its rows (depth 0) between two that draft.
  ASSERT_TRUE(f.propose({f.seq(1, 0, 24, 3), f.seq(5, 0, 9, 0), f.seq(2, 0, 11, 2)}, batched).ok());
  ASSERT_TRUE(f.propose({f.seq(3, 0, 24, 3)}, a).ok());
  ASSERT_TRUE(f.propose({f.seq(4, 0, 11, 2)}, b).ok());
  ASSERT_EQ(batched.size(), 3u);
  EXPECT_EQ(batched[0].tokens, a[0].tokens);
  EXPECT_TRUE(batched[1].tokens.empty());
  EXPECT_EQ(batched[2].tokens, b[0].tokens);
}

TEST(MtpDrafter, SamplingReturnsSparseDraftDistributions) {
  Fixture f;
  constexpr int kDepth = 3;
  std::vector<DraftProposal> out, same, other;
  ASSERT_TRUE(f.propose({f.seq(1, 0, 24, kDepth, 0.7f, 42)}, out).ok());
  ASSERT_EQ(out[0].tokens.size(), static_cast<size_t>(kDepth));
  ASSERT_NE(out[0].q_ids, nullptr);
  ASSERT_GT(out[0].q_width, 0);
  const int64_t C = out[0].q_width;
  // The CPU model's device is the host: q rows are readable here.
  for (int k = 0; k < kDepth; ++k) {
    const int32_t* ids = out[0].q_ids + k * C;
    const float* q = out[0].q_probs + k * C;
    double sum = 0;
    bool has_draft = false;
    for (int64_t c = 0; c < C; ++c) {
      if (ids[c] < 0) continue;
      sum += q[c];
      has_draft |= ids[c] == out[0].tokens[k] && q[c] > 0;
    }
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_TRUE(has_draft) << "draft " << k << " is one of q's candidates";
  }
  // The candidates are the likeliest MTP tokens: the greedy draft is among step 1's.
  const int32_t greedy = f.manual_chain(24, 1)[0];
  EXPECT_NE(std::find(out[0].q_ids, out[0].q_ids + C, greedy), out[0].q_ids + C);
  // A new sequence with the same seed draws the same drafts; another seed, other ones (over a few tries).
  const std::vector<int32_t> first = out[0].tokens;
  ASSERT_TRUE(f.propose({f.seq(2, 0, 24, kDepth, 0.7f, 42)}, same).ok());
  EXPECT_EQ(same[0].tokens, first);
  bool differs = false;
  for (uint64_t seed = 1; seed <= 4 && !differs; ++seed) {
    ASSERT_TRUE(f.propose({f.seq(10 + seed, 0, 24, kDepth, 3.0f, seed)}, other).ok());
    differs = other[0].tokens != first;
  }
  EXPECT_TRUE(differs);
}

TEST(MtpDrafter, RefusesBadInput) {
  Fixture f;
  std::vector<DraftProposal> out;
  EXPECT_FALSE(f.propose({f.seq(1, 0, 24, 17)}, out).ok());
  DraftSequence bad = f.seq(1, 0, 24, 2);
  std::vector<int32_t> tokens(bad.next_tokens, bad.next_tokens + bad.num_rows);
  tokens.back() = -1;
  bad.next_tokens = tokens.data();
  const Status s = f.propose({bad}, out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not a token id"), std::string::npos) << s.message();
}

TEST(MtpDrafter, NeedsTheCheckpointsMtpLayer) {
  Recipe recipe = mtp_recipe("deepseek_v3-tiny");
  LoadedModel m = load_with_mtp(recipe, /*load_mtp=*/false);  // num_nextn_predict_layers 0: no MTP weights
  EngineDraftServices services(*m.model, m.format, m.info.num_layers, "");
  EXPECT_EQ(services.num_mtp_layers(), 0);
  auto d = create_drafter(recipe, global_registry(), m.info, *m.device, &services);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("MTP layer"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("speculative.method"), std::string::npos) << d.status().message();
  auto no_services = create_drafter(recipe, global_registry(), m.info, *m.device, nullptr);
  ASSERT_FALSE(no_services.ok());
  EXPECT_NE(no_services.status().message().find("draft services"), std::string::npos)
      << no_services.status().message();
}

// No key without an effect: the mtp drafter keeps no KV cache of its own (its next-n layer's KV follows the target's
// layout), so a draft KV dtype is refused where the engine creates it, as `kiln recipe check` refuses it.
TEST(MtpDrafter, RefusesADraftKvDtype) {
  std::vector<std::string> sets = testing::mtp_sets();
  sets.push_back("speculative.draft_kv_dtype=fp8");
  testing::load_mtp_plugin();
  auto recipe = load_recipe("", sets, global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  LoadedModel m = load_with_mtp(*recipe);
  EngineDraftServices services(*m.model, m.format, m.info.num_layers, "");
  auto d = create_drafter(*recipe, global_registry(), m.info, *m.device, &services);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("`speculative.draft_kv_dtype` (--set speculative.draft_kv_dtype=fp8): \"fp8\": "
                                      "the drafter `mtp` keeps no KV cache of its own"),
            std::string::npos)
      << d.status().message();
}

}  // namespace
}  // namespace kiln
