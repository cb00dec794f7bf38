// glm5_next with decode-context parallelism on CPU ranks: parallel.decode_context = D splits the DSA layers' paged
// caches (latents and the pooled indexer's rows) by token over groups of D consecutive tensor-parallel ranks; KDA
// state stays whole per sequence. A DSA layer's attention is merged across the group by log-sum-exp, which changes
// fp32 summation order, so logits agree with one rank to a stated tolerance and greedy tokens exactly; every rank
// ends each step with the same bits. Splits: TP 1 × DCP 2 (parallel.tensor = 2, decode_context = 2), TP 1 × DCP 3
// (uneven: 3 heads), TP 2 × DCP 2 (tensor = 4) and TP 1 × DCP 4 on the four-head fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/glm5_next_two_sequence_run.h"
#include "recipe/recipe_check.h"

namespace kiln {
namespace {

using testing::model_dir;

// |logit − one rank's| ≤ tolerance × max(1, the largest |logit| of the run): the decode-context test's bounds for the
// MLA/MoE family (tests/model/decode_context_parallel_test.cpp). Measured here: see the [ measured ] lines.
constexpr double kLogitToleranceFp32 = 1e-5;
constexpr double kLogitToleranceBf16 = 1e-3;

struct Split {
  int tensor, context;
};

struct Case {
  std::string model, precision;
  std::vector<Split> splits;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " in " << c.precision; }

std::vector<std::string> sets(const std::string& model, const std::string& precision, Split split) {
  return {"model.path=" + model_dir(model).string(), "model.device=cpu", "model.threads=2",
          "model.precision=" + precision, "kv.layout=" + std::string(precision == "bf16" ? "bf16" : "fp32"),
          "kv.block_size=4", "parallel.tensor=" + std::to_string(split.tensor),
          "parallel.decode_context=" + std::to_string(split.context)};
}

Result<LoadedModel> load(const std::vector<std::string>& s) {
  KILN_ASSIGN_OR_RETURN(Recipe recipe, load_recipe("", s, global_registry()));
  return load_model(recipe, global_registry(), {});
}

class Glm5NextDecodeContext : public ::testing::TestWithParam<Case> {};

TEST_P(Glm5NextDecodeContext, GreedyTokensEqualOneRankAndLogitsAgreeWithinTolerance) {
  const Case& c = GetParam();
  auto one = load(sets(c.model, c.precision, {1, 1}));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  const testing::Glm5NextRun reference = testing::run_two_sequences(*one);
  ASSERT_EQ(reference.tokens.size(), 8u);
  float scale = 1.0f;
  for (float x : reference.logits) scale = std::max(scale, std::abs(x));
  const double tolerance = c.precision == "bf16" ? kLogitToleranceBf16 : kLogitToleranceFp32;
  for (const Split split : c.splits) {
    SCOPED_TRACE("parallel.tensor = " + std::to_string(split.tensor) + ", decode_context = " +
                 std::to_string(split.context));
    auto m = load(sets(c.model, c.precision, split));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(scheduler_block_size(*m), 4 * split.context);
    auto* group = dynamic_cast<TensorParallelInstance*>(m->model.get());
    ASSERT_NE(group, nullptr) << "parallel.tensor > 1 did not build CPU ranks";
    EXPECT_EQ(group->world(), split.tensor);
    const testing::Glm5NextRun run = testing::run_two_sequences(*m);
    EXPECT_EQ(run.tokens, reference.tokens);
    EXPECT_EQ(run.rank_mismatches, 0) << "every rank must end each step with the same logits";
    ASSERT_EQ(run.logits.size(), reference.logits.size());
    const double worst = testing::max_abs_difference(run.logits, reference.logits);
    EXPECT_LE(worst / scale, tolerance) << "largest logit difference " << worst << " at logit scale " << scale;
    std::printf("[ measured ] %s %s tensor=%d decode_context=%d: max |Δlogit| / scale = %.3g\n", c.model.c_str(),
                c.precision.c_str(), split.tensor, split.context, worst / scale);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Glm5NextDecodeContext,
                         ::testing::Values(Case{"glm5_next-tiny", "fp32", {{2, 2}}},
                                           Case{"glm5_next-tiny", "bf16", {{2, 2}}},
                                           Case{"glm5_next-shared", "fp32", {{2, 2}}},
                                           Case{"glm5_next-flat", "fp32", {{2, 2}}},
                                           Case{"glm5_next-h3", "fp32", {{2, 2}, {3, 3}}},
                                           Case{"glm5_next-h3", "bf16", {{3, 3}}},
                                           Case{"glm5_next-h4", "fp32", {{4, 2}, {4, 4}}},
                                           Case{"glm5_next-h4", "bf16", {{4, 2}}}),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + info.param.precision;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

// On CPU ranks the split is the architecture's own: `kiln recipe check` passes it and notes what it does. glm5_next's
// CUDA runner keeps every cache whole on one GPU, so there the setting is refused by name.
TEST(Glm5NextDecodeContextLoad, SplitsOnCpuRanksAndIsRefusedOnCuda) {
  auto recipe = load_recipe("", sets("glm5_next-tiny", "fp32", {2, 2}), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  RecipeCheck check;
  check_recipe(*recipe, global_registry(), check);
  EXPECT_TRUE(check.problems.empty()) << check.problems[0].to_string();
  bool noted = false;
  for (const std::string& note : check.notes) noted |= note.find("split the KV cache by token") != std::string::npos;
  EXPECT_TRUE(noted);

  auto arch = load_architecture(model_dir("glm5_next-tiny") / "config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().to_string();
  EXPECT_TRUE((*arch)->supports_parallel(1, 2, DeviceType::kCpu).ok());
  const Status cuda = (*arch)->supports_parallel(1, 2, DeviceType::kCuda);
  ASSERT_FALSE(cuda.ok());
  EXPECT_NE(cuda.message().find("parallel.decode_context = 2 on CUDA"), std::string::npos) << cuda.to_string();
}

// A group whose size does not divide the ranks is refused at load, naming both settings.
TEST(Glm5NextDecodeContextLoad, AGroupThatDoesNotDivideTheRanksIsRefused) {
  auto m = load(sets("glm5_next-h3", "fp32", {3, 2}));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("does not divide parallel.tensor = 3"), std::string::npos)
      << m.status().to_string();
}

}  // namespace
}  // namespace kiln
