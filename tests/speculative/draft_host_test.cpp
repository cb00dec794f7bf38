// The core's DraftHost over MlaMoeModel::mtp_forward: same logits as the transformers-derived MTP reference,
// per-sequence paged KV with truncation (rollback) and release, and errors for misuse.
#include <cmath>

#include "model/safetensors_file.h"
#include "speculative_test_support.h"

namespace kiln {
namespace {
using testing::load_with_mtp;
using testing::model_dir;
using testing::mtp_recipe;

struct Fixture {
  Recipe recipe = mtp_recipe();
  LoadedModel m = load_with_mtp(recipe);
  std::vector<int32_t> prompt;
  std::vector<float> mtp_logits, hidden;  // reference MTP logits [23, V]; the trunk's final-normed hidden [24, H]

  Fixture() {
    auto f = SafetensorsFile::open(model_dir("glm4_moe_lite-tiny") / "reference.safetensors");
    EXPECT_TRUE(f.ok());
    auto ids = f->get("prompt_ids");
    for (int64_t i = 0; i < ids->numel(); ++i)
      prompt.push_back(ids->dtype == DType::kI64 ? static_cast<int32_t>(ids->as<const int64_t>()[i])
                                                 : ids->as<const int32_t>()[i]);
    auto l = f->get("mtp_logits");
    mtp_logits.assign(l->as<const float>(), l->as<const float>() + l->numel());
    auto kv = make_kv_cache(m, 64);
    std::vector<int32_t> table;
    EXPECT_TRUE(kv->reserve(table, static_cast<int64_t>(prompt.size())).ok());
    StepOutput out;
    SequenceStep step{prompt, 0, &table, false};
    EXPECT_TRUE(m.model->forward({&step, 1}, *kv, out, true).ok());
    hidden = out.hidden;
  }

  // A host whose draft KV is the exact fp32 layout (the recipe's draft_kv_dtype offers bf16/fp8 only).
  std::unique_ptr<MtpDraftHost> fp32_host(int64_t tokens = 64) {
    CreateContext ctx;
    ctx.section = &recipe.section("kv");
    ctx.model = &m.info;
    auto layout = global_registry().create<KvLayout>("fp32", ctx);
    EXPECT_TRUE(layout.ok());
    const ModelConfig& c = m.model->config();
    const int64_t bs = (*layout)->geometry().block_size;
    auto kv = std::make_unique<KvCache>(*layout, c.num_hidden_layers + 1, (tokens + bs - 1) / bs, 0, c.num_hidden_layers);
    return std::make_unique<MtpDraftHost>(*m.model, std::move(kv));
  }
};

double relative_error(const float* a, const float* b, size_t n) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

TEST(MtpDraftHost, RunsTheMtpLayerLikeTheReference) {
  Fixture f;
  auto host = f.fp32_host();
  EXPECT_EQ(host->num_draft_layers(), 1);
  EXPECT_EQ(host->hidden_size(), f.m.model->config().hidden_size);
  ASSERT_TRUE(host->allocate(7).ok());
  const int64_t H = host->hidden_size(), V = host->vocab_size(), T = static_cast<int64_t>(f.prompt.size()) - 1;
  std::vector<float> got;
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 10}, {10, T}}) {  // two calls: the KV carries across
    DraftLayerRows rows{7, b, f.prompt.data() + b + 1, f.hidden.data() + b * H, e - b, true};
    DraftLayerOutput out;
    ASSERT_TRUE(host->run(0, {rows}, out).ok());
    EXPECT_EQ(static_cast<int64_t>(out.hidden.size()), (e - b) * H);
    EXPECT_EQ(out.first_row, std::vector<int64_t>{0});
    got.insert(got.end(), out.logits.begin(), out.logits.end());
  }
  ASSERT_EQ(static_cast<int64_t>(got.size()), T * V);
  EXPECT_LT(relative_error(got.data(), f.mtp_logits.data(), got.size()), 1e-4);
  EXPECT_EQ(*host->length(7), T);
}

TEST(MtpDraftHost, BatchesSequencesIndependently) {
  Fixture f;
  auto host = f.fp32_host(128);
  const int64_t H = host->hidden_size(), V = host->vocab_size();
  ASSERT_TRUE(host->allocate(1).ok());
  ASSERT_TRUE(host->allocate(2).ok());
  // Sequence 1: rows 0..11; sequence 2: rows 0..4 (a prefix of the same data), in one call.
  DraftLayerRows a{1, 0, f.prompt.data() + 1, f.hidden.data(), 12, false};
  DraftLayerRows b{2, 0, f.prompt.data() + 1, f.hidden.data(), 5, false};
  DraftLayerOutput out;
  ASSERT_TRUE(host->run(0, {a, b}, out).ok());
  ASSERT_EQ(out.first_row, (std::vector<int64_t>{0, 1}));
  EXPECT_LT(relative_error(out.logits.data(), f.mtp_logits.data() + 11 * V, V), 1e-4);
  EXPECT_LT(relative_error(out.logits.data() + V, f.mtp_logits.data() + 4 * V, V), 1e-4);
  EXPECT_EQ(static_cast<int64_t>(out.hidden.size()), 17 * H);
}

TEST(MtpDraftHost, TruncateRollsBackAndFreesPages) {
  Fixture f;
  auto host = f.fp32_host(64);  // 16 blocks of 4
  const int64_t H = host->hidden_size(), V = host->vocab_size();
  const int64_t total = host->kv().free_blocks();
  ASSERT_TRUE(host->allocate(3).ok());
  DraftLayerRows rows{3, 0, f.prompt.data() + 1, f.hidden.data(), 20, false};
  DraftLayerOutput out;
  ASSERT_TRUE(host->run(0, {rows}, out).ok());
  EXPECT_EQ(host->kv().free_blocks(), total - 5);
  ASSERT_TRUE(host->truncate(3, 9).ok());
  EXPECT_EQ(*host->length(3), 9);
  EXPECT_EQ(host->kv().free_blocks(), total - 3);  // ceil(9 / 4) blocks kept
  ASSERT_TRUE(host->truncate(3, 50).ok());         // growing is not truncating
  EXPECT_EQ(*host->length(3), 9);
  // Rows after the truncation point cannot skip ahead...
  DraftLayerRows gap{3, 10, f.prompt.data() + 11, f.hidden.data() + 10 * H, 3, false};
  Status s = host->run(0, {gap}, out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot start at 10"), std::string::npos) << s.message();
  // ...and recomputing from 9 overwrites stale rows: row 19 again equals the reference.
  DraftLayerRows redo{3, 9, f.prompt.data() + 10, f.hidden.data() + 9 * H, 11, false};
  ASSERT_TRUE(host->run(0, {redo}, out).ok());
  EXPECT_LT(relative_error(out.logits.data(), f.mtp_logits.data() + 19 * V, V), 1e-4);
  host->release(3);
  EXPECT_EQ(host->kv().free_blocks(), total);
  EXPECT_FALSE(host->length(3).ok());
}

TEST(MtpDraftHost, RefusesMisuse) {
  Fixture f;
  auto host = f.fp32_host();
  ASSERT_TRUE(host->allocate(1).ok());
  EXPECT_EQ(host->allocate(1).code(), StatusCode::kAlreadyExists);
  DraftLayerRows rows{1, 0, f.prompt.data() + 1, f.hidden.data(), 2, false};
  DraftLayerOutput out;
  EXPECT_EQ(host->run(1, {rows}, out).code(), StatusCode::kOutOfRange);       // only layer 0 exists
  EXPECT_EQ(host->run(0, {rows, rows}, out).code(), StatusCode::kInvalidArgument);  // twice in one batch
  DraftLayerRows unknown{9, 0, f.prompt.data() + 1, f.hidden.data(), 2, false};
  EXPECT_EQ(host->run(0, {unknown}, out).code(), StatusCode::kNotFound);
  EXPECT_EQ(*host->length(1), 0);  // nothing ran
}

TEST(MtpDraftHost, RecipeDraftKvDtypeSelectsTheLayout) {
  Fixture f;
  auto host = make_mtp_draft_host(f.m, f.recipe, global_registry(), 32);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  EXPECT_EQ((*host)->kv().layout().geometry().latent_dim, f.m.model->config().kv_lora_rank);
  EXPECT_EQ((*host)->kv().layout().bytes_per_token(),
            static_cast<size_t>(2 * (f.m.model->config().kv_lora_rank + f.m.model->config().qk_rope_head_dim)));
}

}  // namespace
}  // namespace kiln
