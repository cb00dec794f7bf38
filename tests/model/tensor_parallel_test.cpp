// Tensor parallelism on CPU ranks: parallel.tensor = W splits heads, MLP columns, routed experts and vocabulary over W
// ranks (threads of this process, an in-process group). By design every value is computed with one rank's arithmetic
// (parts meet through copies, never partial sums), so the logits must be bit-identical to parallel.tensor = 1 — for
// every fixture, precision and W, uneven splits included (W = 3 over 4 heads, 8 experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "builtin/inproc_collective.h"
#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "model/sharded_weight_source.h"
#include "model/tensor_parallel_instance.h"
#include "plugin/registry.h"

namespace kiln {
namespace {

using builtin::InprocGroup;

const Stream kHost{Device::cpu(), nullptr};

// Runs body(rank, collective) on `world` threads at once.
template <class Body>
void on_ranks(InprocGroup& group, Body body) {
  std::vector<std::unique_ptr<Collective>> ends;
  for (int r = 0; r < group.world(); ++r) ends.push_back(group.endpoint(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < group.world(); ++r) threads.emplace_back([&, r] { body(r, *ends[r]); });
  for (auto& t : threads) t.join();
}

TEST(InprocCollective, AllReduceAddsInRankOrderSoEveryRankGetsTheSameBits) {
  InprocGroup group(3);
  // 1e8 + 1 rounds back to 1e8 in fp32: rank order (1e8 + 1) − 1e8 gives 0, any other order 1.
  const float values[3] = {1e8f, 1.0f, -1e8f};
  std::vector<std::vector<float>> got(3);
  on_ranks(group, [&](int r, Collective& c) {
    std::vector<float> buf = {values[r], static_cast<float>(r), 2.0f};
    ASSERT_TRUE(c.all_reduce(buf.data(), 3, DType::kF32, ReduceOp::kSum, kHost).ok());
    got[r] = buf;
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(got[r], (std::vector<float>{0.0f, 3.0f, 6.0f})) << "rank " << r;
  on_ranks(group, [&](int r, Collective& c) {
    float v = static_cast<float>(10 - r);
    ASSERT_TRUE(c.all_reduce(&v, 1, DType::kF32, ReduceOp::kMax, kHost).ok());
    EXPECT_EQ(v, 10.0f);
  });
}

TEST(InprocCollective, GatherScatterAndBroadcastMoveTheRightBlocks) {
  InprocGroup group(2);
  on_ranks(group, [&](int r, Collective& c) {
    const std::vector<int32_t> mine = {10 * r, 10 * r + 1};
    std::vector<int32_t> all(4, -1);
    ASSERT_TRUE(c.all_gather(mine.data(), all.data(), 2, DType::kI32, kHost).ok());
    EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 10, 11}));
    const std::vector<float> in = {1.0f + r, 2.0f + r, 3.0f + r, 4.0f + r};
    std::vector<float> out(2);
    ASSERT_TRUE(c.reduce_scatter(in.data(), out.data(), 2, DType::kF32, ReduceOp::kSum, kHost).ok());
    EXPECT_EQ(out, r == 0 ? (std::vector<float>{3.0f, 5.0f}) : (std::vector<float>{7.0f, 9.0f}));
    std::vector<float> b = {r == 1 ? 42.0f : 0.0f};
    ASSERT_TRUE(c.broadcast(b.data(), 1, DType::kF32, 1, kHost).ok());
    EXPECT_EQ(b[0], 42.0f);
    EXPECT_FALSE(c.broadcast(b.data(), 1, DType::kF32, 2, kHost).ok());
  });
}

TEST(InprocCollective, RanksThatDisagreeAllGetTheSameErrorAndAnAbortReleasesWaiters) {
  InprocGroup group(2);
  std::vector<Status> got(2);
  on_ranks(group, [&](int r, Collective& c) {
    std::vector<float> buf(4);
    got[r] = c.all_reduce(buf.data(), r == 0 ? 4 : 3, DType::kF32, ReduceOp::kSum, kHost);
  });
  for (const Status& s : got) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("ranks disagree on all_reduce"), std::string::npos) << s.to_string();
  }
  // Rank 1 never comes: rank 0 waits until the group is aborted, then returns the reason.
  auto rank0 = group.endpoint(0);
  Status waited;
  std::thread t([&] {
    float v = 1.0f;
    waited = rank0->all_reduce(&v, 1, DType::kF32, ReduceOp::kSum, kHost);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  group.abort("rank 1: out of memory");
  t.join();
  ASSERT_FALSE(waited.ok());
  EXPECT_NE(waited.message().find("rank 1: out of memory"), std::string::npos) << waited.to_string();
  group.reset();
  on_ranks(group, [&](int, Collective& c) {
    float v = 1.0f;
    EXPECT_TRUE(c.all_reduce(&v, 1, DType::kF32, ReduceOp::kSum, kHost).ok());
    EXPECT_EQ(v, 2.0f);
  });
  std::vector<float> fp(1);
  EXPECT_FALSE(group.endpoint(0)->all_reduce(fp.data(), 1, DType::kF32, ReduceOp::kSum, Stream{Device::cuda(0), nullptr}).ok());
}

TEST(TensorShard, UnevenCountsSplitByFloorsAndCoverEveryUnit) {
  for (int world = 1; world <= 5; ++world)
    for (int64_t units : {1, 3, 4, 8, 13}) {
      int64_t covered = 0;
      for (int r = 0; r < world; ++r) {
        const TensorShard s{r, world};
        EXPECT_EQ(s.begin(units), covered);
        EXPECT_LE(s.count(units), s.max_count(units));
        covered = s.end(units);
      }
      EXPECT_EQ(covered, units);
    }
}

struct ModelRun {
  std::vector<float> logits;   // every position's logits of the prompt chunks, then each decode step's
  std::vector<int32_t> tokens;  // greedy continuation
};

// A 40-token prompt in chunks of 17 / 17 / 6 (the bf16 precision's expanded form runs for chunks ≥ 16, the
// absorbed form for the rest), then 8 greedy decode steps.
ModelRun run_model(LoadedModel& m) {
  std::vector<int32_t> tokens;
  const int64_t vocab = m.model->vocab_size();
  for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<int32_t>((i * 97 + 13) % vocab));
  testing::TestKv kv(m, 64);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.reserve(table, 64).ok());
  ModelRun run;
  int64_t done = 0;
  StepOutput o;
  StepOptions options;
  options.want_logits = true;
  for (int64_t n : {17, 17, 6}) {
    SequenceStep step{std::span<const int32_t>(tokens.data() + done, n), done, &table, true};
    const Status s = m.model->step({&step, 1}, {}, kv.views(), options, o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) return run;
    run.logits.insert(run.logits.end(), o.logits.begin(), o.logits.end());
    done += n;
  }
  for (int i = 0; i < 8; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(o.logits.end() - vocab, o.logits.end()) -
                                              (o.logits.end() - vocab));
    run.tokens.push_back(next);
    tokens.push_back(next);
    SequenceStep step{std::span<const int32_t>(tokens.data() + done, 1), done, &table, false};
    const Status s = m.model->step({&step, 1}, {}, kv.views(), options, o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) return run;
    run.logits.insert(run.logits.end(), o.logits.begin(), o.logits.end());
    ++done;
  }
  return run;
}

struct Case {
  std::string model, precision;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " in " << c.precision; }

class TensorParallelCpu : public ::testing::TestWithParam<Case> {
 protected:
  std::vector<std::string> sets(int tp) const {
    const Case& c = GetParam();
    return {"model.path=" + testing::model_dir(c.model).string(), "model.device=cpu", "model.threads=2",
            "model.precision=" + c.precision, "kv.layout=" + std::string(c.precision == "bf16" ? "bf16" : "fp32"),
            "parallel.tensor=" + std::to_string(tp)};
  }
};

TEST_P(TensorParallelCpu, LogitsAreBitIdenticalToOneRank) {
  LoadedModel one = testing::load_recipe_model(sets(1));
  ASSERT_NE(one.model, nullptr);
  const ModelRun reference = run_model(one);
  ASSERT_FALSE(reference.logits.empty());
  for (int tp : {2, 3, 4}) {
    SCOPED_TRACE("parallel.tensor = " + std::to_string(tp));
    LoadedModel m = testing::load_recipe_model(sets(tp));
    ASSERT_NE(m.model, nullptr);
    auto* group = dynamic_cast<TensorParallelInstance*>(m.model.get());
    ASSERT_NE(group, nullptr) << "parallel.tensor > 1 did not build CPU ranks";
    EXPECT_EQ(group->world(), tp);
    const ModelRun run = run_model(m);
    EXPECT_EQ(run.tokens, reference.tokens);
    ASSERT_EQ(run.logits.size(), reference.logits.size());
    int64_t differ = 0;
    for (size_t i = 0; i < run.logits.size(); ++i) differ += run.logits[i] != reference.logits[i];
    EXPECT_EQ(differ, 0) << "of " << run.logits.size() << " logits";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelCpu,
                         ::testing::Values(Case{"glm4_moe_lite-tiny", "fp32"}, Case{"glm4_moe_lite-tiny", "bf16"},
                                           Case{"deepseek_v3-tiny", "fp32"}, Case{"glm_moe_dsa-tiny", "fp32"},
                                           Case{"glm_moe_dsa-h3d16-shared", "bf16"}),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + info.param.precision;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

TEST(TensorParallelCpuLoad, MoreRanksThanAModelHasHeadsIsRefusedNamingTheField) {
  auto recipe = load_recipe("", {"model.path=" + testing::model_dir("glm4_moe_lite-tiny").string(), "model.device=cpu",
                                 "kv.layout=fp32", "parallel.tensor=5"},
                            global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_attention_heads = 4"), std::string::npos) << m.status().to_string();
  EXPECT_NE(m.status().message().find("parallel.tensor = 5"), std::string::npos) << m.status().to_string();
}

TEST(ShardedWeightSource, ServesThisRanksRowsAsViewsAndRenumbersExperts) {
  auto ckpt = Checkpoint::open(testing::model_dir("glm4_moe_lite-tiny"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto config = ModelConfig::load(testing::model_dir("glm4_moe_lite-tiny") / "config.json");
  ASSERT_TRUE(config.ok());
  const ShardedWeightSource rank1(**ckpt, *config, TensorShard{1, 2});
  auto whole = (*ckpt)->get("model.layers.0.self_attn.kv_b_proj.weight");
  auto part = rank1.get("model.layers.0.self_attn.kv_b_proj.weight");
  ASSERT_TRUE(whole.ok() && part.ok());
  const int64_t per_head = config->qk_nope_head_dim + config->v_head_dim;
  EXPECT_EQ(part->shape[0], 2 * per_head);  // heads 2, 3 of 4
  EXPECT_EQ(part->data, static_cast<char*>(whole->data) + 2 * per_head * whole->strides[0] * dtype_size(whole->dtype));
  auto o_proj = rank1.get("model.layers.0.self_attn.o_proj.weight");
  ASSERT_TRUE(o_proj.ok());
  EXPECT_EQ(o_proj->shape[1], config->num_attention_heads * config->v_head_dim) << "o_proj stays whole";
  auto expert = rank1.get("model.layers.1.mlp.experts.0.down_proj.weight");
  auto global = (*ckpt)->get("model.layers.1.mlp.experts.4.down_proj.weight");
  ASSERT_TRUE(expert.ok() && global.ok());
  EXPECT_EQ(expert->data, global->data) << "rank 1's expert 0 is the checkpoint's expert 4";
  EXPECT_FALSE(rank1.has("model.layers.1.mlp.experts.4.down_proj.weight"));
  const auto beyond = rank1.get("model.layers.1.mlp.experts.4.down_proj.weight");
  EXPECT_FALSE(beyond.ok());
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A step every rank refuses (a token outside the vocabulary) is an error naming it, from all ranks at once — no rank
// left waiting for the others — and the group serves the next step.
TEST(TensorParallelCpuLoad, ARefusedStepIsAnErrorAndTheGroupGoesOn) {
  LoadedModel m = testing::load_recipe_model({"model.path=" + testing::model_dir("glm4_moe_lite-tiny").string(),
                                              "model.device=cpu", "kv.layout=fp32", "parallel.tensor=2"});
  ASSERT_NE(m.model, nullptr);
  testing::TestKv kv(m, 32);
  std::vector<int32_t> table;
  ASSERT_TRUE(kv.reserve(table, 32).ok());
  const std::vector<int32_t> bad = {5, 1 << 30, 7};
  SequenceStep step{bad, 0, &table, false};
  StepOptions o;
  o.want_logits = true;
  StepOutput out;
  const Status s = m.model->step({&step, 1}, {}, kv.views(), o, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.to_string();
  const std::vector<int32_t> good = {5, 17, 7};
  SequenceStep ok_step{good, 0, &table, false};
  EXPECT_TRUE(m.model->step({&ok_step, 1}, {}, kv.views(), o, out).ok());
  EXPECT_EQ(out.logits.size(), static_cast<size_t>(m.model->vocab_size()));
}

}  // namespace
}  // namespace kiln
