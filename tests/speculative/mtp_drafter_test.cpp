// The draft-mtp plugin through the SDK only (created by name from the registry, fed DraftInputs): its drafts
// follow the MTP chain computed directly with MlaMoeModel::mtp_forward, rollback discards its state, sampling
// returns q, and a checkpoint without MTP weights is refused clearly.
#include <cmath>

#include "kernels/cpu/sampling.h"
#include "speculative_test_support.h"

namespace kiln {
namespace {
using testing::load_with_mtp;
using testing::mtp_recipe;

struct Fixture {
  Recipe recipe = mtp_recipe();
  LoadedModel m = load_with_mtp(recipe);
  std::unique_ptr<MtpDraftHost> host;
  std::shared_ptr<Drafter> drafter;
  std::vector<int32_t> prompt;
  std::vector<float> hidden;  // the trunk's final-normed hidden states over `prompt`
  int64_t H = 0, V = 0;

  explicit Fixture(int64_t prompt_len = 24) {
    auto h = make_mtp_draft_host(m, recipe, global_registry(), 256);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    host = std::move(h).value();
    auto d = create_drafter(recipe, global_registry(), m.info, host.get());
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    drafter = std::move(d).value();
    H = m.model->config().hidden_size;
    V = m.model->config().vocab_size;
    std::mt19937_64 rng(99);
    for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(static_cast<int32_t>(rng() % V));
    auto kv = make_kv_cache(m, 64);
    std::vector<int32_t> table;
    EXPECT_TRUE(kv->reserve(table, prompt_len).ok());
    StepOutput out;
    SequenceStep step{prompt, 0, &table, false};
    EXPECT_TRUE(m.model->forward({&step, 1}, *kv, out, true).ok());
    hidden = out.hidden;
  }

  // Rows [begin, end − 1) of the prompt as target rows, prompt[end − 1] as the newest token.
  DraftInput input(int64_t seq, int64_t begin, int64_t end, float temperature = 0, uint64_t seed = 0) const {
    DraftInput in;
    in.seq_id = seq;
    in.start_position = begin;
    in.tokens = prompt.data() + begin;
    in.num_tokens = end - 1 - begin;
    in.target_hidden = hidden.data() + begin * H;
    in.next_token = prompt[end - 1];
    in.temperature = temperature;
    in.seed = seed;
    return in;
  }

  // The MTP chain by hand with MlaMoeModel::mtp_forward on a KV of the same dtype: step 1 over the rows of
  // prompt[0 .. end − 1), then one row per draft on the previous output hidden state. Greedy drafts.
  std::vector<int32_t> manual_chain(int64_t end, int depth) const {
    auto layout = create_draft_kv_layout(recipe, global_registry(), m.info);
    EXPECT_TRUE(layout.ok());
    const ModelConfig& c = m.model->config();
    KvCache kv(*layout, c.num_hidden_layers + 1, 64, 0, c.num_hidden_layers);
    std::vector<int32_t> table, drafts;
    const int64_t n = end - 1;
    EXPECT_TRUE(kv.reserve(table, n + depth).ok());
    StepOutput out;
    SequenceStep step{std::span<const int32_t>(prompt.data() + 1, n), 0, &table, false};
    EXPECT_TRUE(m.model->mtp_forward(0, {&step, 1}, hidden.data(), kv, out).ok());
    for (int k = 1;; ++k) {
      drafts.push_back(cpu::argmax(out.logits.data(), V));
      if (k == depth) break;
      const std::vector<float> h(out.hidden.end() - H, out.hidden.end());
      SequenceStep next{std::span<const int32_t>(&drafts.back(), 1), n + k - 1, &table, false};
      EXPECT_TRUE(m.model->mtp_forward(0, {&next, 1}, h.data(), kv, out).ok());
    }
    return drafts;
  }
};

TEST(MtpDrafter, AdvertisesMtpCapabilities) {
  Fixture f;
  DrafterCapabilities caps = f.drafter->capabilities();
  EXPECT_EQ(caps.target_hidden_layers, std::vector<int>{-1});
  EXPECT_GE(caps.max_depth, 5);
  EXPECT_FALSE(caps.parallel_drafting);
  EXPECT_TRUE(caps.has_draft_probs);
  EXPECT_TRUE(caps.needs_kv_rollback);
}
TEST(MtpDrafter, GreedyDraftsFollowTheMtpChain) {
  Fixture f;
  for (int depth : {1, 3, 5}) {
    std::vector<DraftOutput> out;
    ASSERT_TRUE(f.drafter->propose({f.input(depth, 0, 24)}, depth, out).ok());
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].tokens, f.manual_chain(24, depth)) << "depth " << depth;
    EXPECT_TRUE(out[0].probs.empty());  // greedy drafts carry no q
  }
}

TEST(MtpDrafter, DropsRecursiveRowsAndRollsBack) {
  Fixture f;
  std::vector<DraftOutput> first, again;
  ASSERT_TRUE(f.drafter->propose({f.input(1, 0, 24)}, 4, first).ok());
  EXPECT_EQ(*f.host->length(1), 23);  // rows conditioned on the target; the 3 recursive rows are gone
  // The target accepted less than the drafter saw: rows from 10 on are discarded and come again.
  ASSERT_TRUE(f.drafter->rollback(1, 10).ok());
  EXPECT_EQ(*f.host->length(1), 10);
  ASSERT_TRUE(f.drafter->propose({f.input(1, 10, 24)}, 4, again).ok());
  EXPECT_EQ(again[0].tokens, first[0].tokens);
  // Skipping rows is refused, naming the gap.
  ASSERT_TRUE(f.drafter->rollback(1, 5).ok());
  Status s = f.drafter->propose({f.input(1, 8, 24)}, 2, again);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot start at 8"), std::string::npos) << s.message();
  // Rollback beyond what it holds keeps everything.
  ASSERT_TRUE(f.drafter->rollback(1, 100).ok());
  EXPECT_EQ(*f.host->length(1), 5);
  f.drafter->release(1);
  EXPECT_FALSE(f.host->length(1).ok());
}

TEST(MtpDrafter, IncrementalStepsEqualOneStep) {
  Fixture f;
  std::vector<DraftOutput> whole, part;
  ASSERT_TRUE(f.drafter->propose({f.input(1, 0, 24)}, 3, whole).ok());
  ASSERT_TRUE(f.drafter->propose({f.input(2, 0, 15)}, 3, part).ok());  // as if prompt[14] were sampled next
  ASSERT_TRUE(f.drafter->rollback(2, 14).ok());
  ASSERT_TRUE(f.drafter->propose({f.input(2, 14, 24)}, 3, part).ok());
  EXPECT_EQ(part[0].tokens, whole[0].tokens);
}

TEST(MtpDrafter, BatchedProposalsEqualSingleOnes) {
  Fixture f;
  std::vector<DraftOutput> batched, a, b;
  ASSERT_TRUE(f.drafter->propose({f.input(1, 0, 24), f.input(2, 0, 11)}, 3, batched).ok());
  ASSERT_TRUE(f.drafter->propose({f.input(3, 0, 24)}, 3, a).ok());
  ASSERT_TRUE(f.drafter->propose({f.input(4, 0, 11)}, 3, b).ok());
  ASSERT_EQ(batched.size(), 2u);
  EXPECT_EQ(batched[0].tokens, a[0].tokens);
  EXPECT_EQ(batched[1].tokens, b[0].tokens);
}

TEST(MtpDrafter, SamplingReturnsDraftDistributions) {
  Fixture f;
  constexpr int kDepth = 3;
  std::vector<DraftOutput> out, same, other;
  ASSERT_TRUE(f.drafter->propose({f.input(1, 0, 24, 0.7f, 42)}, kDepth, out).ok());
  ASSERT_EQ(out[0].tokens.size(), static_cast<size_t>(kDepth));
  ASSERT_EQ(static_cast<int64_t>(out[0].probs.size()), kDepth * f.V);
  for (int k = 0; k < kDepth; ++k) {
    const float* q = out[0].probs.data() + k * f.V;
    double sum = 0;
    for (int64_t i = 0; i < f.V; ++i) sum += q[i];
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_GT(q[out[0].tokens[k]], 0.0f);
  }
  // q of step 1 is softmax(MTP logits / T): its mode is the greedy draft.
  EXPECT_EQ(cpu::argmax(out[0].probs.data(), f.V), f.manual_chain(24, 1)[0]);
  // A new sequence with the same seed draws the same drafts; another seed, other ones (over a few tries).
  ASSERT_TRUE(f.drafter->propose({f.input(2, 0, 24, 0.7f, 42)}, kDepth, same).ok());
  EXPECT_EQ(same[0].tokens, out[0].tokens);
  bool differs = false;
  for (uint64_t seed = 1; seed <= 4 && !differs; ++seed) {
    ASSERT_TRUE(f.drafter->propose({f.input(10 + seed, 0, 24, 3.0f, seed)}, kDepth, other).ok());
    differs = other[0].tokens != out[0].tokens;
  }
  EXPECT_TRUE(differs);
}

TEST(MtpDrafter, RefusesBadInput) {
  Fixture f;
  std::vector<DraftOutput> out;
  EXPECT_FALSE(f.drafter->propose({f.input(1, 0, 24)}, 0, out).ok());
  EXPECT_FALSE(f.drafter->propose({f.input(1, 0, 24)}, 17, out).ok());
  DraftInput bad = f.input(1, 0, 24);
  bad.next_token = -1;
  Status s = f.drafter->propose({bad}, 2, out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("next_token"), std::string::npos) << s.message();
}

TEST(MtpDrafter, NeedsTheCheckpointsMtpLayer) {
  Recipe recipe = mtp_recipe("deepseek_v3-tiny");
  LoadedModel m = load_with_mtp(recipe, /*load_mtp=*/false);  // num_nextn_predict_layers 0: no MTP weights
  auto host = make_mtp_draft_host(m, recipe, global_registry(), 32);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  EXPECT_EQ((*host)->num_draft_layers(), 0);
  auto d = create_drafter(recipe, global_registry(), m.info, host->get());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("MTP layer"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("speculative.method"), std::string::npos) << d.status().message();
  auto no_host = create_drafter(recipe, global_registry(), m.info, nullptr);
  ASSERT_FALSE(no_host.ok());
  EXPECT_NE(no_host.status().message().find("draft host"), std::string::npos) << no_host.status().message();
}

}  // namespace
}  // namespace kiln
