// What every tensor-parallel runner (CPU ranks, CUDA ranks) checks and reads before it splits a model: each rank needs
// at least one of every unit the ranks split (counts the ranks do not divide split unevenly), a rank's source serves
// its rows while the stored checkpoint stays reachable whole (the CUDA ranks read the shared expert from it), and a
// collective that meets through host memory says it cannot be captured into a CUDA graph.
#include <gtest/gtest.h>

#include <string>

#include "builtin/local_collective.h"
#include "common/reference_fixture.h"
#include "model/checkpoint.h"
#include "model/sharded_weight_source.h"
#include "parallel/collective_capture.h"

namespace kiln {
namespace {

ModelConfig tiny_config() {
  auto config = ModelConfig::load(testing::model_dir("glm4_moe_lite-tiny") / "config.json");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return *config;
}

bool refuses(const Status& s, const std::string& field, int world) {
  return !s.ok() && s.message().find(field) != std::string::npos &&
         s.message().find("parallel.tensor = " + std::to_string(world)) != std::string::npos &&
         s.message().find("fewer than the ranks that split it") != std::string::npos;
}

TEST(TensorParallelUnits, UnevenCountsAreSplitAndTooFewUnitsAreRefusedNamingTheField) {
  const ModelConfig c = tiny_config();  // 4 heads, 8 experts, intermediate 96, 1 shared expert of 32, vocab 4096
  for (int world : {1, 2, 3, 4}) EXPECT_TRUE(check_tensor_parallel_units(c, world).ok()) << world;
  EXPECT_TRUE(refuses(check_tensor_parallel_units(c, 5), "num_attention_heads = 4", 5));

  ModelConfig few_experts = c;
  few_experts.n_routed_experts = 2;
  EXPECT_TRUE(check_tensor_parallel_units(few_experts, 2).ok());
  EXPECT_TRUE(refuses(check_tensor_parallel_units(few_experts, 3), "n_routed_experts = 2", 3));
  ModelConfig dense = c;  // no routed experts: nothing of them to split
  dense.n_routed_experts = 0;
  EXPECT_TRUE(check_tensor_parallel_units(dense, 4).ok());

  ModelConfig small_vocab = c;
  small_vocab.vocab_size = 3;
  EXPECT_TRUE(check_tensor_parallel_units(small_vocab, 3).ok()) << "one vocabulary row each";
  EXPECT_TRUE(refuses(check_tensor_parallel_units(small_vocab, 4), "vocab_size = 3", 4));

  ModelConfig narrow_mlp = c;
  narrow_mlp.intermediate_size = 2;
  EXPECT_TRUE(refuses(check_tensor_parallel_units(narrow_mlp, 3), "intermediate_size = 2", 3));
  ModelConfig narrow_shared = c;
  narrow_shared.moe_intermediate_size = 1;
  EXPECT_TRUE(refuses(check_tensor_parallel_units(narrow_shared, 2), "moe_intermediate_size × n_shared_experts = 1", 2));
}

TEST(TensorParallelUnits, UnevenSplitsGiveEveryRankItsShareOfEachUnit) {
  const ModelConfig c = tiny_config();
  // W = 3: heads 1 + 1 + 2, experts 2 + 3 + 3, dense columns 32 each, vocabulary 1365 + 1365 + 1366.
  const int64_t heads[] = {1, 1, 2}, experts[] = {2, 3, 3}, vocab[] = {1365, 1365, 1366};
  for (int r = 0; r < 3; ++r) {
    const TensorShard s{r, 3};
    EXPECT_EQ(s.count(c.num_attention_heads), heads[r]);
    EXPECT_EQ(s.count(c.n_routed_experts), experts[r]);
    EXPECT_EQ(s.count(c.intermediate_size), 32);
    EXPECT_EQ(s.count(c.vocab_size), vocab[r]);
  }
}

TEST(TensorParallelUnits, ARanksSourceSplitsTheSharedExpertAndKeepsTheStoredOneWhole) {
  auto ckpt = Checkpoint::open(testing::model_dir("glm4_moe_lite-tiny"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const ModelConfig c = tiny_config();
  for (int world : {2, 3}) {
    const TensorShard shard{world - 1, world};
    const ShardedWeightSource last(**ckpt, c, shard);
    const std::string name = "model.layers.1.mlp.shared_experts.gate_proj.weight";
    auto part = last.get(name);
    auto whole = last.stored().get(name);
    ASSERT_TRUE(part.ok() && whole.ok());
    const int64_t inter = c.moe_intermediate_size * c.n_shared_experts;
    EXPECT_EQ(whole->shape[0], inter) << "the stored shared expert is whole";
    EXPECT_EQ(part->shape[0], shard.count(inter)) << "the rank's view has its columns";
    EXPECT_EQ(&last.stored(), ckpt->get());
  }
}

// A collective meeting through the host, as runtime/cuda/host_staged_collective.h is one.
class HostMeeting final : public Collective, public HostMeetingCollective {
 public:
  explicit HostMeeting(std::unique_ptr<Collective> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Status all_reduce(void* b, int64_t n, DType d, ReduceOp op, Stream s) override { return inner_->all_reduce(b, n, d, op, s); }
  Status all_gather(const void* i, void* o, int64_t n, DType d, Stream s) override { return inner_->all_gather(i, o, n, d, s); }
  Status reduce_scatter(const void* i, void* o, int64_t n, DType d, ReduceOp op, Stream s) override {
    return inner_->reduce_scatter(i, o, n, d, op, s);
  }
  Status broadcast(void* b, int64_t n, DType d, int root, Stream s) override { return inner_->broadcast(b, n, d, root, s); }
  std::string why_not_capturable() const override { return "it meets through the host"; }
  Collective& host_collective() override { return *inner_; }

 private:
  std::unique_ptr<Collective> inner_;
};

TEST(CollectiveCapture, AHostMeetingCollectiveIsNotCapturableAndUnwrapsToItsHostCollective) {
  CreateContext ctx;
  ctx.device = Device::cpu();
  auto local = builtin::create_local_collective(ctx);
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  Collective* plain = local->get();
  EXPECT_TRUE(collective_capturable(*plain));
  EXPECT_EQ(host_side(plain), plain);
  HostMeeting staged(std::move(local).value());
  EXPECT_FALSE(collective_capturable(staged));
  EXPECT_EQ(host_side(&staged), &staged.host_collective());
  EXPECT_EQ(host_side(nullptr), nullptr);
}

}  // namespace
}  // namespace kiln
