// The collective seam: load_model creates the recipe's `transport.backend` for its rank and hands it to the model's
// step. A one-rank group has nothing to exchange (the model never calls it); a collective spanning ranks in other
// processes builds this process's rank of parallel.tensor (tests/parallel/, cli.rank_processes), so its size must
// be parallel.tensor (CPU ranks as threads: tensor_parallel_test.cpp).
#include <gtest/gtest.h>

#include <atomic>

#include "builtin/register_builtins.h"
#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "model/model_loader.h"
#include "plugin/staging_registrar.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {

std::atomic<int64_t> g_reduces{0}, g_reduced_floats{0};

// One rank that counts its all-reduces (and leaves the buffer alone, as a one-rank sum does).
class CountingCollective final : public Collective {
 public:
  explicit CountingCollective(int world) : world_(world) {}
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  Status all_reduce(void*, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    ++g_reduces;
    if (dtype == DType::kF32 && op == ReduceOp::kSum && stream.device.is_cpu()) g_reduced_floats += count;
    return ok_status();
  }
  Status all_gather(const void*, void*, int64_t, DType, Stream) override { return unimplemented("not in this test"); }
  Status reduce_scatter(const void*, void*, int64_t, DType, ReduceOp, Stream) override {
    return unimplemented("not in this test");
  }
  Status broadcast(void*, int64_t, DType, int, Stream) override { return unimplemented("not in this test"); }

 private:
  int world_;
};

Result<std::unique_ptr<Collective>> make_counting(const CreateContext&) {
  return std::unique_ptr<Collective>(new CountingCollective(1));
}
Result<std::unique_ptr<Collective>> make_two_ranks(const CreateContext&) {
  return std::unique_ptr<Collective>(new CountingCollective(2));
}

Registry registry_with_test_collectives() {
  Registry r;
  StagingRegistrar staged("kiln", "test", "", nullptr);
  EXPECT_TRUE(register_builtin_capabilities(staged).ok());
  EXPECT_TRUE(staged.add<Collective>("counting", "one rank, counts its reductions", &make_counting, DeviceSet::cpu()).ok());
  EXPECT_TRUE(staged.add<Collective>("two-ranks", "claims two ranks", &make_two_ranks, DeviceSet::cpu()).ok());
  EXPECT_TRUE(r.add_all(std::move(staged.entries())).ok());
  return r;
}

std::vector<std::string> sets(const std::string& backend) {
  return {"model.path=" + testing::model_dir("glm4_moe_lite-tiny").string(), "model.device=cpu", "kv.layout=fp32",
          "transport.backend=" + backend};
}

TEST(CollectiveStep, AOneRankGroupIsNeverCalledAndChangesNothing) {
  Registry reg = registry_with_test_collectives();
  auto recipe = load_recipe("", sets("counting"), reg);
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, reg, {});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_NE(m->collective, nullptr);
  EXPECT_EQ(m->collective->world_size(), 1);

  const std::vector<int32_t> prompt = {5, 17, 301, 42, 7};
  g_reduces = 0, g_reduced_floats = 0;
  testing::TestKv kv(*m, 16);
  std::vector<int32_t> table;
  ASSERT_TRUE(kv.reserve(table, 16).ok());
  SequenceStep step{prompt, 0, &table, false};
  StepOptions o;
  o.want_logits = true;
  StepOutput counted;
  ASSERT_TRUE(m->model->step({&step, 1}, {}, kv.views(), o, counted).ok());
  const int64_t layers = m->info.num_layers, hidden = m->info.hidden_size, n = static_cast<int64_t>(prompt.size());
  EXPECT_EQ(g_reduces.load(), 0);
  EXPECT_EQ(g_reduced_floats.load(), 0);
  EXPECT_GT(layers * n * hidden, 0);

  // The same step through the built-in `local` gives the same logits: one rank's sum is its own output.
  auto local_recipe = load_recipe("", sets("local"), reg);
  ASSERT_TRUE(local_recipe.ok());
  auto local = load_model(*local_recipe, reg, {});
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  testing::TestKv kv2(*local, 16);
  std::vector<int32_t> table2;
  ASSERT_TRUE(kv2.reserve(table2, 16).ok());
  SequenceStep step2{prompt, 0, &table2, false};
  StepOutput plain;
  ASSERT_TRUE(local->model->step({&step2, 1}, {}, kv2.views(), o, plain).ok());
  EXPECT_EQ(counted.logits, plain.logits);
}

TEST(CollectiveStep, AGroupOfProcessRanksMustBeParallelTensorRanks) {
  Registry reg = registry_with_test_collectives();
  auto recipe = load_recipe("", sets("two-ranks"), reg);
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, reg, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("spans 2 processes"), std::string::npos) << m.status().to_string();
  EXPECT_NE(m.status().message().find("parallel.tensor = 1"), std::string::npos) << m.status().to_string();
}

TEST(CollectiveStep, AnUnknownBackendIsNamedInTheError) {
  Registry reg = registry_with_test_collectives();
  auto recipe = load_recipe("", sets("nccl"), reg);
  const Status s = recipe.ok() ? load_model(*recipe, reg, {}).status() : recipe.status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no plugin provides collective `nccl`"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace kiln
