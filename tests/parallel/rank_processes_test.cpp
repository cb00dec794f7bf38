// One process per rank, with the ranks' processes played by threads: rank 0's RankLeaderInstance forwards every step
// over the control channel to a follower loop, each rank computes on its own shard with a KV pool of its own, and
// they meet through the `socket` collective. The logits must be bit-identical to one rank's (the same arithmetic as
// ranks as threads). A call that fails on one rank — before its first meeting, between two, after the last; on a
// follower or on rank 0 — fails rank 0's call naming that rank, without a hang, and the next calls are bit-identical
// to one rank's again; a follower that goes away breaks the group, naming it.
#include "parallel/rank_processes.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "parallel/socket_collective.h"
#include "parallel/rendezvous_support.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;

using testing::free_port;
using testing::spec_for;

std::vector<std::string> sets(const std::string& model) {
  return {"model.path=" + testing::model_dir(model).string(), "model.device=cpu", "model.threads=1", "kv.layout=fp32"};
}

// 40 prompt tokens in chunks of 17 / 17 / 6, then 6 greedy decode steps: every row's logits.
std::vector<float> run(ModelInstance& model, const CacheViews& views, std::vector<int32_t>& table) {
  std::vector<int32_t> tokens;
  const int64_t vocab = model.vocab_size();
  for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<int32_t>((i * 97 + 13) % vocab));
  std::vector<float> logits;
  int64_t done = 0;
  StepOutput o;
  StepOptions options;
  options.want_logits = true;
  auto step = [&](int64_t n, bool all) {
    SequenceStep s{std::span<const int32_t>(tokens.data() + done, n), done, &table, all};
    const Status st = model.step({&s, 1}, {}, views, options, o);
    EXPECT_TRUE(st.ok()) << st.to_string();
    logits.insert(logits.end(), o.logits.begin(), o.logits.end());
    done += n;
    return st.ok();
  };
  for (int64_t n : {17, 17, 6})
    if (!step(n, true)) return logits;
  for (int i = 0; i < 6; ++i) {
    tokens.push_back(static_cast<int32_t>(std::max_element(o.logits.end() - vocab, o.logits.end()) - (o.logits.end() - vocab)));
    if (!step(1, false)) return logits;
  }
  return logits;
}

// Rank r's instance of `world`, built from a loaded model's pieces over its own collective.
Result<std::unique_ptr<ModelInstance>> build_rank(LoadedModel& m, Collective& collective, int world,
                                                  bool load_mtp = false) {
  BuildContext ctx;
  ctx.load_mtp = load_mtp;
  ctx.source = &m.source();
  ctx.format = m.format.get();
  ctx.layout = m.layout.get();
  ctx.device = m.device.get();
  ctx.collective = &collective;
  ctx.tensor_parallel = world;
  ctx.threads = 1;
  return m.arch->build(ctx);
}

class RankProcesses : public ::testing::TestWithParam<std::string> {};

TEST_P(RankProcesses, LogitsAreBitIdenticalToOneRank) {
  LoadedModel one = testing::load_recipe_model(sets(GetParam()));
  ASSERT_NE(one.model, nullptr);
  std::vector<float> reference;
  {
    testing::TestKv kv(one, 64);
    std::vector<int32_t> table;
    ASSERT_TRUE(kv.reserve(table, 64).ok());
    reference = run(*one.model, kv.views(), table);
  }
  for (int world : {2, 3}) {
    SCOPED_TRACE("ranks: " + std::to_string(world));
    const int port = free_port(), control_port = free_port();
    std::vector<std::thread> followers;
    std::vector<Status> follower_status(world);
    std::vector<LoadedModel> pieces(world);  // each "process" its own loaded pieces
    for (int r = 1; r < world; ++r) {
      pieces[r] = testing::load_recipe_model(sets(GetParam()));
      followers.emplace_back([&, r] {
        auto collective = SocketCollective::connect(spec_for(port, r, world));
        if (!collective.ok()) return void(follower_status[r] = collective.status());
        auto model = build_rank(pieces[r], **collective, world);
        if (!model.ok()) return void(follower_status[r] = model.status());
        auto control = TcpBootstrap::connect(spec_for(control_port, r, world));
        if (!control.ok()) return void(follower_status[r] = control.status());
        follower_status[r] = run_rank_follower(**model, **control, pieces[r].layout.get(), {collective->get()});
      });
    }
    std::vector<float> got;
    {
      auto collective = SocketCollective::connect(spec_for(port, 0, world));
      ASSERT_TRUE(collective.ok()) << collective.status().to_string();
      auto own = build_rank(one, **collective, world);
      ASSERT_TRUE(own.ok()) << own.status().to_string();
      auto control = TcpBootstrap::connect(spec_for(control_port, 0, world));
      ASSERT_TRUE(control.ok()) << control.status().to_string();
      RankLeaderInstance leader(std::move(own).value(), std::move(control).value(), {}, {collective->get()});
      testing::TestKv kv(one, 64);
      std::vector<int32_t> table;
      ASSERT_TRUE(kv.reserve(table, 64).ok());
      got = run(leader, kv.views(), table);
    }  // the leader's destructor stops the followers
    for (auto& t : followers) t.join();
    for (int r = 1; r < world; ++r) EXPECT_TRUE(follower_status[r].ok()) << "rank " << r << ": " << follower_status[r].to_string();
    ASSERT_EQ(got.size(), reference.size());
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != reference[i];
    EXPECT_EQ(differ, 0) << "of " << got.size() << " logits";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RankProcesses, ::testing::Values("glm4_moe_lite-tiny", "glm_moe_dsa-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

// A drafter's next-n steps across rank processes: step 1 over a prompt's rows, then chained steps whose token is
// named on rank 0's device (SequenceStep::device_tokens, with placeholder ids in `tokens`: a CUDA drafter's draft
// just sampled there). Rank 0 stages those ids through its host for every rank, so the logits and hidden rows are
// bit-identical to one rank's run on the real ids. (On the CPU the "device" is the host, and the CPU model itself
// would read the placeholders: any rank that ran on them would part from the reference.)
TEST(RankProcessesDrafting, ChainedNextNStepsOnDeviceTokensEqualOneRank) {
  const std::string model = "glm4_moe_lite-tiny";
  ModelLoadOptions with_mtp;
  with_mtp.load_mtp = true;
  LoadedModel one = testing::load_recipe_model(sets(model), with_mtp);
  ASSERT_NE(one.model, nullptr);
  ASSERT_GE(one.model->num_mtp_layers(), 1);
  const int64_t H = one.model->hidden_size(), V = one.model->vocab_size();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 9; ++i) prompt.push_back(static_cast<int32_t>((i * 131 + 7) % V));
  const std::vector<int32_t> drafts = {static_cast<int32_t>(V - 3), 11, static_cast<int32_t>(404 % V)};  // chained ids
  std::vector<float> conditioning(prompt.size() * H);
  for (size_t i = 0; i < conditioning.size(); ++i) conditioning[i] = static_cast<float>((i * 37) % 101) / 50.f - 1.f;
  // Step 1 on the prompt's rows (all logits), then one chained row per draft on the previous output's last row.
  // `device_ids`: pass the chained ids as device tokens (placeholders in `tokens`), else as host tokens.
  auto run = [&](ModelInstance& m, const CacheViews& views, std::vector<int32_t>& table, bool device_ids) {
    std::vector<float> got;
    MtpStepOutput o;
    SequenceStep first{prompt, 0, &table, true};
    Status st = m.mtp_step(0, {&first, 1}, conditioning.data(), views, o);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return got;
    got.insert(got.end(), o.logits, o.logits + prompt.size() * V);
    std::vector<float> prev(o.hidden + (prompt.size() - 1) * H, o.hidden + prompt.size() * H);
    const int32_t placeholder = 0;
    for (size_t k = 0; k < drafts.size(); ++k) {
      SequenceStep chained{std::span<const int32_t>(device_ids ? &placeholder : &drafts[k], 1),
                           static_cast<int64_t>(prompt.size() + k), &table, false};
      if (device_ids) chained.device_tokens = &drafts[k];
      st = m.mtp_step(0, {&chained, 1}, prev.data(), views, o);
      EXPECT_TRUE(st.ok()) << "chained step " << k << ": " << st.to_string();
      if (!st.ok()) return got;
      got.insert(got.end(), o.logits, o.logits + V);
      got.insert(got.end(), o.hidden, o.hidden + H);
      prev.assign(o.hidden, o.hidden + H);
    }
    return got;
  };
  std::vector<float> reference;
  {
    testing::TestKv kv(one, 32);
    std::vector<int32_t> table;
    ASSERT_TRUE(kv.reserve(table, 32).ok());
    reference = run(*one.model, kv.views(), table, false);
  }
  ASSERT_EQ(reference.size(), prompt.size() * V + drafts.size() * (V + H));
  for (int world : {2, 3}) {
    SCOPED_TRACE("ranks: " + std::to_string(world));
    const int port = free_port(), control_port = free_port();
    std::vector<std::thread> followers;
    std::vector<Status> follower_status(world);
    std::vector<LoadedModel> pieces(world);
    for (int r = 1; r < world; ++r) {
      pieces[r] = testing::load_recipe_model(sets(model), with_mtp);
      followers.emplace_back([&, r] {
        auto collective = SocketCollective::connect(spec_for(port, r, world));
        if (!collective.ok()) return void(follower_status[r] = collective.status());
        auto m = build_rank(pieces[r], **collective, world, /*load_mtp=*/true);
        if (!m.ok()) return void(follower_status[r] = m.status());
        auto control = TcpBootstrap::connect(spec_for(control_port, r, world));
        if (!control.ok()) return void(follower_status[r] = control.status());
        follower_status[r] = run_rank_follower(**m, **control, pieces[r].layout.get(), {collective->get()});
      });
    }
    std::vector<float> got;
    {
      auto collective = SocketCollective::connect(spec_for(port, 0, world));
      ASSERT_TRUE(collective.ok()) << collective.status().to_string();
      auto own = build_rank(one, **collective, world, /*load_mtp=*/true);
      ASSERT_TRUE(own.ok()) << own.status().to_string();
      ASSERT_GE((*own)->num_mtp_layers(), 1);
      auto control = TcpBootstrap::connect(spec_for(control_port, 0, world));
      ASSERT_TRUE(control.ok()) << control.status().to_string();
      RankLeaderInstance leader(std::move(own).value(), std::move(control).value(), {}, {collective->get()});
      testing::TestKv kv(one, 32);
      std::vector<int32_t> table;
      ASSERT_TRUE(kv.reserve(table, 32).ok());
      got = run(leader, kv.views(), table, true);
    }
    for (auto& t : followers) t.join();
    for (int r = 1; r < world; ++r) EXPECT_TRUE(follower_status[r].ok()) << "rank " << r << ": " << follower_status[r].to_string();
    ASSERT_EQ(got.size(), reference.size());
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != reference[i];
    EXPECT_EQ(differ, 0) << "of " << got.size() << " values";
  }
}

// A follower whose step fails reports why; rank 0's call fails naming the rank, at once, and the group stays
// broken with that reason.
TEST(RankProcessesFailure, AFollowerThatGoesAwayFailsTheCallNamingIt) {
  const std::string model = "glm4_moe_lite-tiny";
  LoadedModel zero = testing::load_recipe_model(sets(model));
  LoadedModel other = testing::load_recipe_model(sets(model));
  ASSERT_NE(zero.model, nullptr);
  const int port = free_port(), control_port = free_port();
  std::thread follower([&] {
    auto collective = SocketCollective::connect(spec_for(port, 1, 2));
    ASSERT_TRUE(collective.ok());
    auto m = build_rank(other, **collective, 2);
    ASSERT_TRUE(m.ok());
    auto control = TcpBootstrap::connect(spec_for(control_port, 1, 2));
    ASSERT_TRUE(control.ok());
    // Takes the first call, then dies (its connections close) without answering.
    (void)(*control)->receive(0, std::chrono::milliseconds(-1));
  });
  auto collective = SocketCollective::connect(spec_for(port, 0, 2));
  ASSERT_TRUE(collective.ok());
  auto own = build_rank(zero, **collective, 2);
  ASSERT_TRUE(own.ok());
  auto control = TcpBootstrap::connect(spec_for(control_port, 0, 2));
  ASSERT_TRUE(control.ok());
  SocketCollective* socket = collective->get();
  RankLeaderInstance leader(std::move(own).value(), std::move(control).value(),
                            [socket] { socket->channel().shut_down(); }, {socket});
  testing::TestKv kv(zero, 32);
  std::vector<int32_t> table;
  ASSERT_TRUE(kv.reserve(table, 32).ok());
  const std::vector<int32_t> tokens = {5, 6, 7};
  SequenceStep step{tokens, 0, &table, false};
  StepOutput o;
  const auto t0 = std::chrono::steady_clock::now();
  const Status first = leader.step({&step, 1}, {}, kv.views(), StepOptions{}, o);
  follower.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.message().find("rank 1"), std::string::npos) << first.to_string();
  const Status later = leader.step({&step, 1}, {}, kv.views(), StepOptions{}, o);
  ASSERT_FALSE(later.ok());
  EXPECT_NE(later.message().find("broken"), std::string::npos) << later.to_string();
}

// A rank's collective that, once armed, fails its k-th call on its own (without meeting anyone): the rank's step
// then fails between two meetings, as a real error in a layer would.
class FailingCollective final : public Collective {
 public:
  explicit FailingCollective(Collective& real) : real_(real) {}
  void arm(int k) { fail_in_ = k; }

  int rank() const override { return real_.rank(); }
  int world_size() const override { return real_.world_size(); }
  Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_RETURN_IF_ERROR(maybe_fail());
    return real_.all_reduce(buffer, count, dtype, op, stream);
  }
  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override {
    KILN_RETURN_IF_ERROR(maybe_fail());
    return real_.all_gather(in, out, count, dtype, stream);
  }
  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_RETURN_IF_ERROR(maybe_fail());
    return real_.reduce_scatter(in, out, count, dtype, op, stream);
  }
  Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) override {
    KILN_RETURN_IF_ERROR(maybe_fail());
    return real_.broadcast(buffer, count, dtype, root, stream);
  }

 private:
  Status maybe_fail() {
    int k = fail_in_.load();
    if (k < 0) return ok_status();
    fail_in_ = k - 1;
    if (k == 0) return internal_error("injected failure on rank " + std::to_string(rank()));
    return ok_status();
  }
  Collective& real_;
  std::atomic<int> fail_in_{-1};
};

struct FailedCallCase {
  int world;
  int failing_rank;
  int fail_in;  // which of its collective calls in the failing step fails (0: before it meets anyone)
};

class RankProcessesFailedCall : public ::testing::TestWithParam<FailedCallCase> {};

// The group survives a call that failed on one rank: rank 0's call fails naming the rank, the followers stay up,
// and a whole generation afterwards is bit-identical to one rank's.
TEST_P(RankProcessesFailedCall, TheCallFailsNamingTheRankAndTheGroupGoesOn) {
  const FailedCallCase fc = GetParam();
  const int world = fc.world;
  const std::vector<std::string> recipe = sets("glm4_moe_lite-tiny");
  LoadedModel one = testing::load_recipe_model(recipe);
  ASSERT_NE(one.model, nullptr);
  std::vector<float> reference;
  {
    testing::TestKv kv(one, 64);
    std::vector<int32_t> table;
    ASSERT_TRUE(kv.reserve(table, 64).ok());
    reference = run(*one.model, kv.views(), table);
  }
  const int port = free_port(), control_port = free_port();
  std::vector<LoadedModel> pieces(world);
  std::vector<std::unique_ptr<FailingCollective>> failing(world);
  std::vector<std::atomic<bool>> ready(world);
  std::vector<Status> follower_status(world);
  std::vector<std::thread> followers;
  for (int r = 1; r < world; ++r) {
    pieces[r] = testing::load_recipe_model(recipe);
    followers.emplace_back([&, r] {
      auto collective = SocketCollective::connect(spec_for(port, r, world));
      if (!collective.ok()) return void(follower_status[r] = collective.status());
      failing[r] = std::make_unique<FailingCollective>(**collective);
      auto model = build_rank(pieces[r], *failing[r], world);
      if (!model.ok()) return void(follower_status[r] = model.status());
      auto control = TcpBootstrap::connect(spec_for(control_port, r, world));
      if (!control.ok()) return void(follower_status[r] = control.status());
      ready[r] = true;
      follower_status[r] = run_rank_follower(**model, **control, pieces[r].layout.get(), {collective->get()});
    });
  }
  auto collective = SocketCollective::connect(spec_for(port, 0, world));
  ASSERT_TRUE(collective.ok()) << collective.status().to_string();
  failing[0] = std::make_unique<FailingCollective>(**collective);
  auto own = build_rank(one, *failing[0], world);
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  auto control = TcpBootstrap::connect(spec_for(control_port, 0, world));
  ASSERT_TRUE(control.ok()) << control.status().to_string();
  for (int r = 1; r < world; ++r)
    while (!ready[r]) std::this_thread::sleep_for(1ms);
  std::vector<float> got;
  {
    SocketCollective* socket = collective->get();
    RankLeaderInstance leader(std::move(own).value(), std::move(control).value(),
                              [socket] { socket->channel().shut_down(); }, {socket});
    testing::TestKv kv(one, 96);
    std::vector<int32_t> scratch, table;
    ASSERT_TRUE(kv.reserve(scratch, 32).ok());
    ASSERT_TRUE(kv.reserve(table, 64).ok());
    const std::vector<int32_t> tokens = {5, 6, 7, 8};
    SequenceStep step{tokens, 0, &scratch, false};
    StepOutput o;
    StepOptions options;
    options.want_logits = true;
    ASSERT_TRUE(leader.step({&step, 1}, {}, kv.views(), options, o).ok());
    failing[fc.failing_rank]->arm(fc.fail_in);
    const auto t0 = std::chrono::steady_clock::now();
    const Status failed = leader.step({&step, 1}, {}, kv.views(), options, o);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    ASSERT_FALSE(failed.ok());
    const std::string rank_name = "tensor-parallel rank " + std::to_string(fc.failing_rank);
    EXPECT_NE(failed.message().find(rank_name), std::string::npos) << failed.to_string();
    EXPECT_NE(failed.message().find("injected failure on rank " + std::to_string(fc.failing_rank)), std::string::npos)
        << failed.to_string();
    EXPECT_EQ(failed.message().find("broken"), std::string::npos) << failed.to_string();
    got = run(leader, kv.views(), table);
  }  // the leader's destructor stops the followers
  for (auto& t : followers) t.join();
  for (int r = 1; r < world; ++r) EXPECT_TRUE(follower_status[r].ok()) << "rank " << r << ": " << follower_status[r].to_string();
  ASSERT_EQ(got.size(), reference.size());
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != reference[i];
  EXPECT_EQ(differ, 0) << "of " << got.size() << " logits";
}

INSTANTIATE_TEST_SUITE_P(Cases, RankProcessesFailedCall,
                         ::testing::Values(FailedCallCase{2, 1, 0}, FailedCallCase{2, 1, 3}, FailedCallCase{2, 0, 0},
                                           FailedCallCase{2, 0, 2}, FailedCallCase{3, 2, 1}, FailedCallCase{3, 1, 2},
                                           FailedCallCase{3, 0, 1}),
                         [](const auto& info) {
                           return "w" + std::to_string(info.param.world) + "_rank" + std::to_string(info.param.failing_rank) +
                                  "_call" + std::to_string(info.param.fail_in);
                         });

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

struct HangCase {
  int world;
  int hanging_rank;
};

class RankProcessesHang : public ::testing::TestWithParam<HangCase> {};

// A rank that hangs inside a step (KILN_TEST_HANG_STEP: alive, sleeping, never reaching the others) is bounded by the
// call timeout (transport.timeout_s): every rank still alive fails within the bound (twice it for the ranks waiting on
// rank 0, when rank 0 is the one that hangs) plus slack, with an error naming the collective, the call and the rank
// that did not arrive; the group is broken from then on, and every follower loop ends.
TEST_P(RankProcessesHang, TheOthersFailWithinTheBoundNamingTheRank) {
  const HangCase hc = GetParam();
  const int world = hc.world;
  constexpr auto kBound = 1500ms;
  constexpr double kHangSeconds = 6;
  const std::vector<std::string> recipe = sets("glm4_moe_lite-tiny");
  const int port = free_port(), control_port = free_port();
  std::vector<LoadedModel> pieces(world);
  std::vector<std::atomic<bool>> ready(world);
  std::vector<Status> follower_status(world);
  std::vector<std::chrono::steady_clock::duration> follower_took(world);
  std::atomic<int64_t> hang_started_ns{0};
  std::vector<std::thread> followers;
  const std::string flag = ::testing::TempDir() + "hang-step-" + std::to_string(::getpid());
  for (int r = 0; r < world; ++r) pieces[r] = testing::load_recipe_model(recipe);
  for (int r = 1; r < world; ++r)
    followers.emplace_back([&, r] {
      auto collective = SocketCollective::connect(spec_for(port, r, world), kBound);
      if (!collective.ok()) return void(follower_status[r] = collective.status());
      auto model = build_rank(pieces[r], **collective, world);
      if (!model.ok()) return void(follower_status[r] = model.status());
      auto control = TcpBootstrap::connect(spec_for(control_port, r, world));
      if (!control.ok()) return void(follower_status[r] = control.status());
      ready[r] = true;
      follower_status[r] = run_rank_follower(**model, **control, pieces[r].layout.get(), {collective->get()});
      follower_took[r] = std::chrono::steady_clock::now() - std::chrono::steady_clock::time_point(
                                                                 std::chrono::nanoseconds(hang_started_ns.load()));
    });
  auto collective = SocketCollective::connect(spec_for(port, 0, world), kBound);
  ASSERT_TRUE(collective.ok()) << collective.status().to_string();
  auto own = build_rank(pieces[0], **collective, world);
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  auto control = TcpBootstrap::connect(spec_for(control_port, 0, world));
  ASSERT_TRUE(control.ok()) << control.status().to_string();
  for (int r = 1; r < world; ++r)
    while (!ready[r]) std::this_thread::sleep_for(1ms);
  Status broken_seen;
  set_group_broken_handler([&](const Status& why) { broken_seen = why; });
  {
    SocketCollective* socket = collective->get();
    RankLeaderInstance leader(std::move(own).value(), std::move(control).value(),
                              [socket] { socket->channel().shut_down(); }, {socket});
    testing::TestKv kv(pieces[0], 32);
    std::vector<int32_t> table;
    ASSERT_TRUE(kv.reserve(table, 32).ok());
    const std::vector<int32_t> tokens = {5, 6, 7, 8};
    SequenceStep step{tokens, 0, &table, false};
    StepOutput o;
    ASSERT_TRUE(leader.step({&step, 1}, {}, kv.views(), StepOptions{}, o).ok());  // the group works

    { std::ofstream(flag) << "hang"; }
    ::setenv("KILN_TEST_HANG_STEP", (std::to_string(hc.hanging_rank) + ":" + std::to_string(kHangSeconds) + ":" + flag).c_str(), 1);
    const auto t0 = std::chrono::steady_clock::now();
    hang_started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
    const Status failed = leader.step({&step, 1}, {}, kv.views(), StepOptions{}, o);
    const auto took = std::chrono::steady_clock::now() - t0;
    ::unsetenv("KILN_TEST_HANG_STEP");
    ASSERT_FALSE(failed.ok());
    if (hc.hanging_rank != 0) {
      // Rank 0 names the rank: within the bound, plus its 2 s wait for the followers' replies, plus slack.
      EXPECT_LT(took, kBound + 2s + 2s);
      EXPECT_GE(took, kBound - 100ms);
      const std::string msg = failed.message();
      EXPECT_NE(msg.find("collective `socket`"), std::string::npos) << msg;
      EXPECT_NE(msg.find(" in call "), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank " + std::to_string(hc.hanging_rank) + " did not arrive within transport.timeout_s"),
                std::string::npos)
          << msg;
      EXPECT_NE(broken_seen.message().find("did not arrive"), std::string::npos) << broken_seen.to_string();
    }
    const Status later = leader.step({&step, 1}, {}, kv.views(), StepOptions{}, o);
    ASSERT_FALSE(later.ok());
    EXPECT_NE(later.message().find("broken"), std::string::npos) << later.to_string();
  }
  for (auto& t : followers) t.join();
  set_group_broken_handler({});
  for (int r = 1; r < world; ++r) {
    EXPECT_FALSE(follower_status[r].ok()) << "rank " << r;
    if (r == hc.hanging_rank) continue;
    // Alive ranks end within the bound (rank 0 tells them) or twice it (they time rank 0 out), plus slack.
    EXPECT_LT(follower_took[r], 2 * kBound + 3s) << "rank " << r << ": " << follower_status[r].to_string();
    if (hc.hanging_rank == 0)
      EXPECT_NE(follower_status[r].message().find("rank 0"), std::string::npos) << follower_status[r].to_string();
    else
      EXPECT_NE(follower_status[r].message().find("rank " + std::to_string(hc.hanging_rank) + " did not arrive"),
                std::string::npos)
          << follower_status[r].to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RankProcessesHang,
                         ::testing::Values(HangCase{2, 1}, HangCase{3, 2}, HangCase{3, 1}, HangCase{3, 0}),
                         [](const auto& info) {
                           return "w" + std::to_string(info.param.world) + "_rank" +
                                  std::to_string(info.param.hanging_rank);
                         });

}  // namespace
}  // namespace kiln
