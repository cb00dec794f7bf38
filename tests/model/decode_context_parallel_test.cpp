// Decode-context parallelism on CPU ranks: parallel.decode_context = D splits the KV cache by token over groups of D
// consecutive tensor-parallel ranks (TP = 2 × DCP = 2 below is parallel.tensor = 4, decode_context = 2). Attention
// over the split cache is merged by log-sum-exp, which changes fp32 summation order: logits agree with one rank to
// a stated tolerance, greedy tokens exactly; every rank ends with the same bits; the DSA indexer's top-k is one
// rank's selection exactly (its scores are gathered, not merged).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "model/tensor_parallel_instance.h"
#include "plugin/registry.h"

namespace kiln {
namespace {

// |logit − one rank's| ≤ tolerance × max(1, the largest |logit| of the run). Measured on these fixtures: ≤ 6.4e-7
// in fp32; 0 in bf16 precision, where o_lat is rounded to bf16 after the merge and absorbed every last-bit
// difference. The bf16 bound allows such a rounding to flip by one bf16 step (2^-8 of one value) now and then.
constexpr double kLogitToleranceFp32 = 1e-5;
constexpr double kLogitToleranceBf16 = 1e-3;

struct Split {
  int tensor, context;
};

struct ModelRun {
  std::vector<float> logits;    // every position's logits of the prompt chunks, then each decode step's
  std::vector<int32_t> tokens;  // greedy continuation
  int64_t rank_mismatches = 0;  // logits of a rank ≥ 1 that differ from rank 0's, over every step
};

// A 40-token prompt in chunks of 17 / 17 / 6 (bf16 runs the expanded form for chunks ≥ 16, the absorbed form for
// the rest), then 8 greedy decode steps; small pages, so each rank's tokens span several.
ModelRun run_model(LoadedModel& m) {
  std::vector<int32_t> tokens;
  const int64_t vocab = m.model->vocab_size();
  for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<int32_t>((i * 97 + 13) % vocab));
  testing::TestKv kv(m, 64);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.reserve(table, 64).ok());
  auto* group = dynamic_cast<TensorParallelInstance*>(m.model.get());
  ModelRun run;
  int64_t done = 0;
  StepOutput o;
  StepOptions options;
  options.want_logits = true;
  auto step = [&](int64_t n, bool all_logits) {
    SequenceStep st{std::span<const int32_t>(tokens.data() + done, n), done, &table, all_logits};
    const Status s = m.model->step({&st, 1}, {}, kv.views(), options, o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) return false;
    run.logits.insert(run.logits.end(), o.logits.begin(), o.logits.end());
    for (int r = 1; group && r < group->world(); ++r) {
      const std::vector<float>& other = group->rank_output(r).logits;
      if (other.size() != o.logits.size()) ++run.rank_mismatches;
      else
        for (size_t i = 0; i < other.size(); ++i) run.rank_mismatches += other[i] != o.logits[i];
    }
    done += n;
    return true;
  };
  for (int64_t n : {17, 17, 6})
    if (!step(n, true)) return run;
  for (int i = 0; i < 8; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(o.logits.end() - vocab, o.logits.end()) -
                                              (o.logits.end() - vocab));
    run.tokens.push_back(next);
    tokens.push_back(next);
    if (!step(1, false)) return run;
  }
  return run;
}

struct Case {
  std::string model, precision;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " in " << c.precision; }

std::vector<std::string> recipe_sets(const Case& c, Split split) {
  return {"model.path=" + testing::model_dir(c.model).string(), "model.device=cpu", "model.threads=2",
          "model.precision=" + c.precision, "kv.layout=" + std::string(c.precision == "bf16" ? "bf16" : "fp32"),
          "kv.block_size=4", "parallel.tensor=" + std::to_string(split.tensor),
          "parallel.decode_context=" + std::to_string(split.context)};
}

class DecodeContextParallelCpu : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeContextParallelCpu, GreedyTokensEqualOneRankAndLogitsAgreeWithinTolerance) {
  const Case& c = GetParam();
  LoadedModel one = testing::load_recipe_model(recipe_sets(c, {1, 1}));
  ASSERT_NE(one.model, nullptr);
  const ModelRun reference = run_model(one);
  ASSERT_FALSE(reference.logits.empty());
  float scale = 1.0f;
  for (float x : reference.logits) scale = std::max(scale, std::abs(x));
  const double tolerance = c.precision == "bf16" ? kLogitToleranceBf16 : kLogitToleranceFp32;
  // TP 1 × DCP 2, TP 1 × DCP 3 (uneven head padding), TP 1 × DCP 4, TP 2 × DCP 2.
  for (const Split split : {Split{2, 2}, Split{3, 3}, Split{4, 4}, Split{4, 2}}) {
    SCOPED_TRACE("parallel.tensor = " + std::to_string(split.tensor) + ", decode_context = " +
                 std::to_string(split.context));
    LoadedModel m = testing::load_recipe_model(recipe_sets(c, split));
    ASSERT_NE(m.model, nullptr);
    auto* group = dynamic_cast<TensorParallelInstance*>(m.model.get());
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->world(), split.tensor);
    const ModelRun run = run_model(m);
    EXPECT_EQ(run.tokens, reference.tokens);
    EXPECT_EQ(run.rank_mismatches, 0) << "every rank must end each step with the same logits";
    ASSERT_EQ(run.logits.size(), reference.logits.size());
    const double worst = testing::max_abs_difference(run.logits, reference.logits);
    const double relative = worst / scale;
    EXPECT_LE(relative, tolerance) << "largest logit difference " << worst << " at logit scale " << scale;
    std::printf("[ measured ] %s %s tensor=%d decode_context=%d: max |Δlogit| / scale = %.3g\n", c.model.c_str(),
                c.precision.c_str(), split.tensor, split.context, relative);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeContextParallelCpu,
                         ::testing::Values(Case{"glm4_moe_lite-tiny", "fp32"}, Case{"glm4_moe_lite-tiny", "bf16"},
                                           Case{"deepseek_v3-tiny", "fp32"}, Case{"glm_moe_dsa-tiny", "fp32"},
                                           Case{"glm_moe_dsa-h3d16-shared", "bf16"}),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + info.param.precision;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

// The DSA indexer's top-k under a split cache is one rank's selection exactly: layer 0 of a DSA model run by hand
// on one rank and on every rank of a group (each on its thread), over a prompt in two chunks and a decode step.
TEST(DecodeContextParallelDsa, IndexerTopKEqualsOneRanksSelection) {
  for (const std::string precision : {"fp32", "bf16"}) {
    const Case c{"glm_moe_dsa-tiny", precision};
    LoadedModel one = testing::load_recipe_model(recipe_sets(c, {1, 1}));
    ASSERT_NE(one.model, nullptr);
    const ModelConfig& config = testing::config_of(one);
    ASSERT_LT(config.index_topk, 40) << "the fixture must select fewer keys than the prompt has";
    for (const Split split : {Split{2, 2}, Split{4, 4}, Split{4, 2}}) {
      SCOPED_TRACE(precision + ", tensor = " + std::to_string(split.tensor) + ", decode_context = " +
                   std::to_string(split.context));
      LoadedModel m = testing::load_recipe_model(recipe_sets(c, split));
      ASSERT_NE(m.model, nullptr);
      auto* group = dynamic_cast<TensorParallelInstance*>(m.model.get());
      ASSERT_NE(group, nullptr);
      testing::TestKv kv_one(one, 64), kv_split(m, 64);
      std::vector<int32_t> table_one, table_split;
      ASSERT_TRUE(kv_one.reserve(table_one, 64).ok());
      ASSERT_TRUE(kv_split.reserve(table_split, 64).ok());
      std::vector<int32_t> tokens;
      for (int i = 0; i < 41; ++i) tokens.push_back(static_cast<int32_t>((i * 131 + 7) % config.vocab_size));
      MlaMoeModel& reference = testing::cpu_model(one);
      int64_t done = 0, compared_rows = 0;
      for (int64_t n : {23, 17, 1}) {
        const SequenceStep st_one{std::span<const int32_t>(tokens.data() + done, n), done, &table_one, false};
        const SequenceStep st_split{std::span<const int32_t>(tokens.data() + done, n), done, &table_split, false};
        std::vector<float> x(n * config.hidden_size);
        ASSERT_TRUE(reference.embed(tokens.data() + done, n, x.data()).ok());
        MlaMoeModel::TokenLayout tl;
        ASSERT_TRUE(reference.make_layout({&st_one, 1}, kv_one.views(), tl).ok());
        std::vector<int32_t> want;
        int64_t want_width = 0;
        std::vector<float> x_one = x;
        ASSERT_TRUE(reference.run_layer(reference.weights().layers[0], 0, tl, kv_one.views(), x_one.data(), want,
                                        want_width).ok());
        std::vector<std::vector<int32_t>> got(split.tensor);
        std::vector<Status> status(split.tensor);
        std::vector<std::thread> threads;
        for (int r = 0; r < split.tensor; ++r)
          threads.emplace_back([&, r] {
            auto* rank = dynamic_cast<MlaMoeCpuInstance*>(&group->rank(r));
            MlaMoeModel& model = rank->model();
            MlaMoeModel::TokenLayout rank_tl;
            status[r] = model.make_layout({&st_split, 1}, kv_split.views(), rank_tl);
            std::vector<float> x_rank = x;
            int64_t width = 0;
            if (status[r].ok())
              status[r] = model.run_layer(model.weights().layers[0], 0, rank_tl, kv_split.views(), x_rank.data(),
                                          got[r], width);
          });
        for (auto& t : threads) t.join();
        for (int r = 0; r < split.tensor; ++r) {
          ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r].to_string();
          EXPECT_EQ(got[r], want) << "rank " << r << ", chunk at " << done;
        }
        compared_rows += n;
        done += n;
      }
      EXPECT_EQ(compared_rows, 41);
    }
  }
}

TEST(DecodeContextParallelLoad, ADecodeContextThatDoesNotDivideTheTensorRanksIsRefused) {
  auto recipe = load_recipe("", {"model.path=" + testing::model_dir("glm4_moe_lite-tiny").string(),
                                 "parallel.tensor=3", "parallel.decode_context=2"},
                            global_registry());
  ASSERT_FALSE(recipe.ok());
  EXPECT_NE(recipe.status().message().find("decode_context"), std::string::npos) << recipe.status().to_string();
  EXPECT_NE(recipe.status().message().find("does not divide parallel.tensor = 3"), std::string::npos)
      << recipe.status().to_string();
}

TEST(DecodeContextParallelLoad, TheSchedulerBlocksHoldOnePagePerRank) {
  LoadedModel m = testing::load_recipe_model(recipe_sets({"glm4_moe_lite-tiny", "fp32"}, {4, 2}));
  ASSERT_NE(m.model, nullptr);
  EXPECT_EQ(m.layout->geometry().block_size, 4);
  EXPECT_EQ(scheduler_block_size(m), 8);
  // Each rank's rows live in its own pages: rank d's pages of block b are b·D + d.
  const DecodeContextShard rank1{1, 2};
  const std::vector<int32_t> table = {5, 2};
  EXPECT_EQ(rank1.slot(table, 4, 0), -1);
  EXPECT_EQ(rank1.slot(table, 4, 1), (5 * 2 + 1) * 4 + 0);
  EXPECT_EQ(rank1.slot(table, 4, 7), (5 * 2 + 1) * 4 + 3);
  EXPECT_EQ(rank1.slot(table, 4, 9), (2 * 2 + 1) * 4 + 0);
  EXPECT_EQ(rank1.local_count(10), 5);
  EXPECT_EQ(rank1.local_count(1), 0);
  EXPECT_EQ(rank1.local_table(table), (std::vector<int32_t>{11, 5}));
  // A GPU rank's pool holds only its page of each block: engine block b is its page b.
  EXPECT_EQ(rank1.own_pool_slot(table, 4, 0), -1);
  EXPECT_EQ(rank1.own_pool_slot(table, 4, 1), 5 * 4 + 0);
  EXPECT_EQ(rank1.own_pool_slot(table, 4, 7), 5 * 4 + 3);
  EXPECT_EQ(rank1.own_pool_slot(table, 4, 9), 2 * 4 + 0);
  const DecodeContextShard rank0of3{0, 3};
  EXPECT_EQ(rank0of3.own_pool_slot(table, 4, 12), 2 * 4 + 0);  // local token 4: the table's second block, row 0
  EXPECT_EQ(rank0of3.own_pool_slot(table, 4, 13), -1);
}

}  // namespace
}  // namespace kiln
