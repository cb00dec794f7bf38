// glm5_next with tensor parallelism on CPU ranks (threads of this process, the in-process `local` group): the DSA
// heads, the KDA heads (and their recurrent and conv state), the MLP columns, the routed experts and the vocabulary
// split over W ranks as the MLA/MoE family splits them. Every value is computed with one rank's arithmetic (parts meet
// through copies, never partial sums), so the logits must be bit-identical to parallel.tensor = 1 for every fixture,
// precision and W — uneven splits included (glm5_next-h3: 3 DSA and 3 KDA heads over 2 ranks, 8 experts over 3) —
// and so must the state a sequence leaves in its KDA slots. A W that leaves a rank without a head is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/glm5_next_test_model.h"
#include "common/glm5_next_two_sequence_run.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/arch/glm5_next/glm5_next_sharded_source.h"
#include "model/arch/glm5_next/glm5_next_tensor_names.h"
#include "model/tensor_parallel_instance.h"
#include "recipe/recipe_check.h"

namespace kiln {
namespace {

using testing::Glm5NextRun;
using testing::model_dir;

std::vector<std::string> sets(const std::string& model, const std::string& precision, int tp) {
  return {"model.path=" + model_dir(model).string(), "model.device=cpu", "model.threads=2",
          "model.precision=" + precision, "kv.layout=" + std::string(precision == "bf16" ? "bf16" : "fp32"),
          "kv.block_size=16", "parallel.tensor=" + std::to_string(tp)};
}

Result<LoadedModel> load(const std::vector<std::string>& s) {
  KILN_ASSIGN_OR_RETURN(Recipe recipe, load_recipe("", s, global_registry()));
  return load_model(recipe, global_registry(), {});
}

struct Case {
  std::string model, precision;
  std::vector<int> worlds;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " in " << c.precision; }

class Glm5NextTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(Glm5NextTensorParallel, LogitsAndKdaStateAreBitIdenticalToOneRank) {
  const Case& c = GetParam();
  auto one = load(sets(c.model, c.precision, 1));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  const Glm5NextRun reference = testing::run_two_sequences(*one);
  ASSERT_FALSE(reference.logits.empty());
  ASSERT_EQ(reference.tokens.size(), 8u);
  for (int tp : c.worlds) {
    SCOPED_TRACE("parallel.tensor = " + std::to_string(tp));
    auto m = load(sets(c.model, c.precision, tp));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto* group = dynamic_cast<TensorParallelInstance*>(m->model.get());
    ASSERT_NE(group, nullptr) << "parallel.tensor > 1 did not build CPU ranks";
    EXPECT_EQ(group->world(), tp);
    const Glm5NextRun run = testing::run_two_sequences(*m);
    EXPECT_EQ(run.tokens, reference.tokens);
    ASSERT_EQ(run.logits.size(), reference.logits.size());
    int64_t differ = 0;
    for (size_t i = 0; i < run.logits.size(); ++i) differ += run.logits[i] != reference.logits[i];
    EXPECT_EQ(differ, 0) << "of " << run.logits.size() << " logits";
    // Each rank advanced only its heads' parts of a slot; together they are the state one rank leaves.
    ASSERT_EQ(run.kda_state.size(), reference.kda_state.size());
    for (size_t i = 0; i < run.kda_state.size(); ++i)
      EXPECT_TRUE(run.kda_state[i] == reference.kda_state[i]) << "KDA slot " << i << " differs from one rank's";
    // Every rank computed rank 0's values (every step's, and the last step's against one rank's).
    EXPECT_EQ(run.rank_mismatches, 0);
    for (int r = 1; r < tp; ++r) {
      const StepOutput& other = group->rank_output(r);
      EXPECT_TRUE(std::equal(other.logits.begin(), other.logits.end(),
                             reference.logits.end() - static_cast<int64_t>(other.logits.size())))
          << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Glm5NextTensorParallel,
                         ::testing::Values(Case{"glm5_next-tiny", "fp32", {2}}, Case{"glm5_next-tiny", "bf16", {2}},
                                           Case{"glm5_next-shared", "fp32", {2}},
                                           Case{"glm5_next-shared", "bf16", {2}},
                                           Case{"glm5_next-flat", "fp32", {2}}, Case{"glm5_next-h3", "fp32", {2, 3}},
                                           Case{"glm5_next-h3", "bf16", {2, 3}}, Case{"glm5_next-h4", "fp32", {4}}),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + info.param.precision;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

// Two DSA heads cannot go to three ranks: refused at load, and by `kiln recipe check`, naming the field.
TEST(Glm5NextTensorParallelLoad, MoreRanksThanHeadsIsRefusedNamingTheField) {
  for (const std::string model : {"glm5_next-tiny", "glm5_next-shared", "glm5_next-flat"}) {
    SCOPED_TRACE(model);
    auto m = load(sets(model, "fp32", 3));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("num_attention_heads = 2"), std::string::npos) << m.status().to_string();
    EXPECT_NE(m.status().message().find("parallel.tensor = 3"), std::string::npos) << m.status().to_string();
    auto recipe = load_recipe("", sets(model, "fp32", 3), global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    RecipeCheck check;
    check_recipe(*recipe, global_registry(), check);
    ASSERT_FALSE(check.problems.empty());
    bool named = false;
    for (const Status& p : check.problems) named |= p.message().find("num_attention_heads = 2") != std::string::npos;
    EXPECT_TRUE(named) << check.problems[0].to_string();
  }
  auto two = load_recipe("", sets("glm5_next-tiny", "fp32", 2), global_registry());
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  RecipeCheck fine;
  check_recipe(*two, global_registry(), fine);
  EXPECT_TRUE(fine.problems.empty()) << fine.problems[0].to_string();
}

// Each split dimension is named when it is the one too small (the config altered field by field).
TEST(Glm5NextTensorParallelLoad, TheUnitsCheckNamesEachSplitDimension) {
  auto arch = load_architecture(model_dir("glm5_next-shared") / "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().to_string();
  const glm5_next::Glm5NextConfig base = dynamic_cast<const arch::Glm5NextArchitecture&>(**arch).config();
  EXPECT_TRUE(glm5_next::check_glm5_next_tensor_parallel_units(base, 2).ok());
  const std::pair<const char*, void (*)(glm5_next::Glm5NextConfig&)> fields[] = {
      {"num_attention_heads = 1", [](glm5_next::Glm5NextConfig& c) { c.num_attention_heads = 1; }},
      {"linear_num_heads = 1", [](glm5_next::Glm5NextConfig& c) { c.linear_num_heads = 1; }},
      {"n_routed_experts = 1", [](glm5_next::Glm5NextConfig& c) { c.n_routed_experts = 1; }},
      {"intermediate_size = 1", [](glm5_next::Glm5NextConfig& c) { c.intermediate_size = 1; }},
      {"moe_intermediate_size × n_shared_experts = 1", [](glm5_next::Glm5NextConfig& c) {
         c.moe_intermediate_size = 1;
       }}};
  for (const auto& [name, alter] : fields) {
    glm5_next::Glm5NextConfig c = base;
    alter(c);
    const Status s = glm5_next::check_glm5_next_tensor_parallel_units(c, 2);
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_NE(s.message().find(name), std::string::npos) << s.to_string();
  }
  // A dimension no layer uses is not a reason: every layer DSA, so one KDA head is no obstacle.
  glm5_next::Glm5NextConfig all_dsa = base;
  std::fill(all_dsa.attention.begin(), all_dsa.attention.end(), glm5_next::AttentionKind::kDsa);
  all_dsa.linear_num_heads = 1;
  EXPECT_TRUE(glm5_next::check_glm5_next_tensor_parallel_units(all_dsa, 2).ok());
}

// A rank's view: its heads' rows of the split projections (views, no copies) and its experts renumbered from 0 — out
// of the stacked gate_up_proj / down_proj tensors transformers' checkpoints store.
TEST(Glm5NextShardedSource, ServesThisRanksRowsAsViewsAndRenumbersStackedExperts) {
  auto ckpt = Checkpoint::open(model_dir("glm5_next-h3"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto arch = load_architecture(model_dir("glm5_next-h3") / "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().to_string();
  const glm5_next::Glm5NextConfig& c = dynamic_cast<const arch::Glm5NextArchitecture&>(**arch).config();
  const glm5_next::Glm5NextTensorNames names(**ckpt);
  const glm5_next::Glm5NextShardedSource rank1(names, c, TensorShard{1, 2});  // heads 1, 2 of 3; experts 4..7
  const std::string p = names.trunk_prefix() + "layers.";
  auto whole = names.get(p + "0.self_attn.k_proj.weight");
  auto part = rank1.get(p + "0.self_attn.k_proj.weight");
  ASSERT_TRUE(whole.ok() && part.ok());
  EXPECT_EQ(part->shape[0], 2 * c.linear_head_dim);
  EXPECT_EQ(part->data,
            static_cast<char*>(whole->data) + c.linear_head_dim * whole->strides[0] * dtype_size(whole->dtype));
  auto beta = rank1.get(p + "0.self_attn.b_proj.weight");
  ASSERT_TRUE(beta.ok());
  EXPECT_EQ(beta->shape[0], 2);
  auto kv_b = rank1.get(p + "1.self_attn.kv_b_proj.weight");
  ASSERT_TRUE(kv_b.ok());
  EXPECT_EQ(kv_b->shape[0], 2 * (c.qk_nope_head_dim + c.v_head_dim));
  auto o_proj = rank1.get(p + "1.self_attn.o_proj.weight");
  ASSERT_TRUE(o_proj.ok());
  EXPECT_EQ(o_proj->shape[1], c.num_attention_heads * c.v_head_dim) << "o_proj stays whole";
  auto wq_b = rank1.get(p + "1.self_attn.indexer.wq_b.weight");
  ASSERT_TRUE(wq_b.ok());
  EXPECT_EQ(wq_b->shape[0], c.index_n_heads * c.index_head_dim) << "the indexer is replicated";
  auto expert = rank1.get(p + "1.mlp.experts.0.up_proj.weight");
  auto global = names.get(p + "1.mlp.experts.4.up_proj.weight");
  ASSERT_TRUE(expert.ok() && global.ok());
  EXPECT_EQ(expert->data, global->data) << "rank 1's expert 0 is the checkpoint's expert 4";
  EXPECT_FALSE(rank1.has(p + "1.mlp.experts.4.up_proj.weight"));
  EXPECT_FALSE(rank1.get(p + "1.mlp.experts.4.up_proj.weight").ok());
  auto embed = rank1.get(names.trunk_prefix() + "embed_tokens.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed->shape[0], c.vocab_size - c.vocab_size / 2);
}

}  // namespace
}  // namespace kiln
