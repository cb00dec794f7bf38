#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "engine_harness.h"

namespace kiln::testing {
namespace {

constexpr int64_t kVocab = 97;

struct Req {
  std::vector<int32_t> prompt;
  int64_t max_tokens;
  std::vector<int32_t> stop;
  SamplingOptions sampling;
};

RequestParams params_of(const Req& r) {
  RequestParams p;
  p.prompt = r.prompt;
  p.max_tokens = r.max_tokens;
  p.stop_token_ids = r.stop;
  p.sampling = r.sampling;
  return p;
}

std::vector<Req> random_requests(int n, uint32_t seed, int64_t max_prompt, int64_t max_out, bool sampled = false) {
  std::mt19937 rng(seed);
  std::vector<Req> out;
  for (int i = 0; i < n; ++i) {
    Req r;
    r.prompt = random_prompt(rng, std::uniform_int_distribution<int64_t>(1, max_prompt)(rng), kVocab);
    r.max_tokens = std::uniform_int_distribution<int64_t>(1, max_out)(rng);
    r.stop = {0, 1};
    if (sampled) r.sampling = SamplingOptions{0.8f, 20, 0.9f, static_cast<uint64_t>(1000 + i)};
    out.push_back(std::move(r));
  }
  return out;
}

// Submits every request from `threads` threads at once and checks each against its run alone.
// `queue_first`: the runner's gate is closed while the requests are submitted, so they are all waiting before the
// engine steps a second time — tests that need the pool under pressure (preemption) do not depend on how fast the
// submitting threads run on a loaded machine.
void expect_matches_reference(EngineUnderTest& t, const std::vector<Req>& reqs, int threads = 4,
                              bool queue_first = false) {
  Collector c;
  if (queue_first) t.runner->close_gate();
  std::vector<std::thread> submitters;
  for (int th = 0; th < threads; ++th)
    submitters.emplace_back([&, th] {
      for (size_t i = th; i < reqs.size(); i += threads) {
        auto id = t.engine->submit(params_of(reqs[i]), c.sink(static_cast<int>(i)));
        EXPECT_TRUE(id.ok()) << id.status().to_string();
      }
    });
  for (auto& s : submitters) s.join();
  if (queue_first) t.runner->open_gate();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(c.wait(static_cast<int>(i))) << "request " << i << " never finished";
    const Outcome o = c.get(static_cast<int>(i));
    EXPECT_EQ(o.tokens, reference_tokens(reqs[i].prompt, reqs[i].max_tokens, reqs[i].stop, kVocab, reqs[i].sampling))
        << "request " << i;
    EXPECT_TRUE(o.reason == FinishReason::kStop || o.reason == FinishReason::kLength);
    EXPECT_EQ(o.events.back().completion_tokens, static_cast<int64_t>(o.tokens.size()));
    EXPECT_EQ(o.events.back().prompt_tokens, static_cast<int64_t>(reqs[i].prompt.size()));
  }
  const EngineMetrics m = wait_idle(*t.engine);
  EXPECT_EQ(m.kv_blocks_used, 0) << "blocks leaked";
  EXPECT_TRUE(t.runner->violations().empty()) << t.runner->violations().front();
}

TEST(BatchEngine, ConcurrentGreedyRequestsMatchSequentialRuns) {
  auto t = make_engine(small_config(1024));
  expect_matches_reference(t, random_requests(40, 7, 90, 40));
  const EngineMetrics m = t.engine->metrics();
  EXPECT_GT(m.generation_tokens_total, 40);
  // Real batching happened: some forward pass carried several sequences.
  size_t widest = 0;
  for (const auto& r : t.runner->records()) widest = std::max(widest, r.size());
  EXPECT_GT(widest, 1u);
}

TEST(BatchEngine, SeededSamplingDoesNotDependOnBatching) {
  auto t = make_engine(small_config(1024));
  expect_matches_reference(t, random_requests(24, 11, 60, 30, /*sampled=*/true));
}

TEST(BatchEngine, PrefixCacheServesSharedPrefixes) {
  EngineConfig config = small_config(256);
  auto t = make_engine(config);
  std::mt19937 rng(3);
  const std::vector<int32_t> prefix = random_prompt(rng, 40, kVocab);  // 10 blocks of 4
  auto with_suffix = [&](int64_t n) {
    auto p = prefix;
    auto s = random_prompt(rng, n, kVocab);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  std::vector<Req> first = {{with_suffix(5), 6, {}, {}}};
  expect_matches_reference(t, first, 1);
  const EngineMetrics before = t.engine->metrics();
  EXPECT_EQ(before.prefix_cache_hits, 0);

  // Two new suffixes share the 10 prefix blocks; the same prompt again reuses all but its last token's block.
  std::vector<Req> second = {{with_suffix(5), 6, {}, {}}, {with_suffix(9), 6, {}, {}}, first[0]};
  Collector c;
  for (size_t i = 0; i < second.size(); ++i) ASSERT_TRUE(t.engine->submit(params_of(second[i]), c.sink(i)).ok());
  for (size_t i = 0; i < second.size(); ++i) {
    ASSERT_TRUE(c.wait(i));
    const Outcome o = c.get(i);
    EXPECT_EQ(o.tokens, reference_tokens(second[i].prompt, second[i].max_tokens, {}, kVocab)) << i;
  }
  EXPECT_EQ(c.get(0).events.back().cached_prompt_tokens, 40);
  EXPECT_EQ(c.get(1).events.back().cached_prompt_tokens, 40);
  EXPECT_EQ(c.get(2).events.back().cached_prompt_tokens, 44);  // 45 tokens: 11 full blocks before the last
  const EngineMetrics after = wait_idle(*t.engine);
  EXPECT_EQ(after.prefix_cache_hits, 40 + 40 + 44);
  EXPECT_EQ(after.prefix_cache_queries - before.prefix_cache_queries, 45 + 49 + 45);
  EXPECT_EQ(after.kv_blocks_used, 0);
  // The cached prompt was not recomputed: its first forward step started at position 44.
  bool saw_tail_only = false;
  for (const auto& r : t.runner->records())
    for (const auto& s : r) saw_tail_only |= (s.start == 44 && s.tokens == 1);
  EXPECT_TRUE(saw_tail_only);
  EXPECT_TRUE(t.runner->violations().empty());
}

TEST(BatchEngine, PrefixCachingOffRecomputesEverything) {
  EngineConfig config = small_config(256);
  config.prefix_caching = false;
  auto t = make_engine(config);
  std::mt19937 rng(5);
  Req r{random_prompt(rng, 30, kVocab), 4, {}, {}};
  expect_matches_reference(t, {r, r}, 1);
  expect_matches_reference(t, {r}, 1);
  EXPECT_EQ(t.engine->metrics().prefix_cache_hits, 0);
}

TEST(BatchEngine, PreemptionUnderATinyPoolKeepsTokensExact) {
  // 24 blocks × 4 = 96 tokens shared by 8 sequences of up to 60 tokens each: constant preemption.
  EngineConfig config = small_config(24);
  config.max_num_batched_tokens = 16;
  auto t = make_engine(config);
  std::mt19937 rng(9);
  std::vector<Req> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back({random_prompt(rng, 20, kVocab), 40, {}, {}});
  expect_matches_reference(t, reqs, 4, /*queue_first=*/true);
  EXPECT_GT(t.engine->metrics().preemptions_total, 0);
}

TEST(BatchEngine, PreemptionWithPrefixCachingOff) {
  EngineConfig config = small_config(20);
  config.max_num_batched_tokens = 16;
  config.prefix_caching = false;
  auto t = make_engine(config);
  expect_matches_reference(t, random_requests(12, 21, 30, 40), 4, /*queue_first=*/true);
  EXPECT_GT(t.engine->metrics().preemptions_total, 0);
}

TEST(BatchEngine, CancelEndsWithAbortAndFreesBlocks) {
  auto t = make_engine(small_config(256));
  std::mt19937 rng(1);
  Collector c;
  RequestParams p;
  p.prompt = random_prompt(rng, 10, kVocab);
  p.max_tokens = 400;
  // After the third token the engine is held inside its next forward pass while the cancel arrives.
  TokenSink collect = c.sink(0);
  FakeModelRunner* runner = t.runner;
  auto id = t.engine->submit(p, [&, runner](const TokenEvent& e) {
    if (e.completion_tokens == 3) runner->close_gate();
    return collect(e);
  });
  ASSERT_TRUE(id.ok());
  t.runner->wait_until_blocked();
  t.engine->cancel(*id);
  t.runner->open_gate();
  ASSERT_TRUE(c.wait(0));
  const Outcome o = c.get(0);
  EXPECT_EQ(o.reason, FinishReason::kAbort);
  EXPECT_EQ(o.events.back().token, -1);
  EXPECT_EQ(o.tokens.size(), 4u);  // the step in flight completes, then the cancel is taken
  EXPECT_EQ(wait_idle(*t.engine).kv_blocks_used, 0);
  t.engine->cancel(*id);  // cancelling a finished request is harmless
  t.engine->cancel(12345);
}

TEST(BatchEngine, DisconnectedClientFreesItsBlocksAtOnce) {
  EngineConfig config = small_config(256);
  config.prefix_caching = false;
  auto t = make_engine(config);
  std::mt19937 rng(2);
  const std::vector<int32_t> prompt_a = random_prompt(rng, 10, kVocab);
  std::atomic<int64_t> gone_at_call{-1};
  std::atomic<int> b_calls_after{0};
  std::atomic<int> checked{0};
  std::mutex m;
  std::vector<std::string> failures;
  std::atomic<bool> a_done{false};
  Engine* engine = t.engine.get();
  FakeModelRunner* runner = t.runner;
  TokenSink sink_a = [&](const TokenEvent& e) {
    const int64_t call = runner->calls();
    // Metrics are published after each step: from the step after B left, only A's blocks are in use.
    if (gone_at_call >= 0 && call > gone_at_call + 1 && !e.finished) {
      const int64_t expected = (10 + e.completion_tokens - 2 + 3) / 4;
      const int64_t used = engine->metrics().kv_blocks_used;
      if (used != expected) {
        std::lock_guard<std::mutex> lock(m);
        failures.push_back("call " + std::to_string(call) + ": " + std::to_string(used) + " blocks used, A holds " +
                           std::to_string(expected));
      }
      ++checked;
    }
    if (e.finished) a_done = true;
    return true;
  };
  int b_tokens = 0;
  TokenSink sink_b = [&](const TokenEvent& e) {
    if (b_tokens >= 3) {
      ++b_calls_after;
      return false;
    }
    if (++b_tokens == 3) {
      gone_at_call = runner->calls();
      return false;
    }
    return true;
  };
  RequestParams a;
  a.prompt = prompt_a;
  a.max_tokens = 60;
  RequestParams b;
  b.prompt = random_prompt(rng, 30, kVocab);
  b.max_tokens = 200;
  t.runner->close_gate();
  ASSERT_TRUE(t.engine->submit(a, sink_a).ok());
  t.runner->wait_until_blocked();
  ASSERT_TRUE(t.engine->submit(b, sink_b).ok());
  t.runner->open_gate();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!a_done && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(a_done);
  EXPECT_EQ(b_calls_after, 0) << "the engine kept streaming to a client that had gone";
  EXPECT_GT(checked, 20);
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(wait_idle(*t.engine).kv_blocks_used, 0);
}

TEST(BatchEngine, StressWithRandomCancelsAndDisconnectsLeaksNoBlocks) {
  EngineConfig config = small_config(48);
  config.max_num_batched_tokens = 24;
  auto t = make_engine(config);
  const auto reqs = random_requests(160, 77, 50, 60);
  Collector c;
  std::vector<std::atomic<uint64_t>> ids(reqs.size());
  std::vector<bool> disconnects(reqs.size());
  std::mt19937 rng(123);
  for (size_t i = 0; i < reqs.size(); ++i) disconnects[i] = rng() % 5 == 0;
  std::atomic<size_t> submitted{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th)
    threads.emplace_back([&, th] {
      for (size_t i = th; i < reqs.size(); i += 4) {
        auto id = t.engine->submit(params_of(reqs[i]), c.sink(i, disconnects[i] ? 1 + i % 7 : 0));
        ASSERT_TRUE(id.ok()) << id.status().to_string();
        ids[i] = *id;
        ++submitted;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  threads.emplace_back([&] {
    std::mt19937 r(99);
    while (submitted < reqs.size()) {
      const size_t i = r() % reqs.size();
      if (ids[i] != 0 && r() % 3 == 0) t.engine->cancel(ids[i]);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  for (auto& th : threads) th.join();
  int exact = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(c.wait(i)) << "request " << i << " never finished";
    const Outcome o = c.get(i);
    EXPECT_EQ(o.calls_after_final, 0);
    const auto ref = reference_tokens(reqs[i].prompt, reqs[i].max_tokens, reqs[i].stop, kVocab);
    if (o.reason == FinishReason::kStop || o.reason == FinishReason::kLength) {
      EXPECT_EQ(o.tokens, ref) << "request " << i;
      ++exact;
    } else {
      // Cut short: what it got is still a prefix of its own run.
      ASSERT_LE(o.tokens.size(), ref.size());
      EXPECT_TRUE(std::equal(o.tokens.begin(), o.tokens.end(), ref.begin())) << "request " << i;
    }
  }
  EXPECT_GT(exact, 40);
  const EngineMetrics m = wait_idle(*t.engine);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_running, 0);
  EXPECT_TRUE(t.runner->violations().empty()) << t.runner->violations().front();
}

TEST(BatchEngine, DecodesKeepGoingWhileALongPromptPrefillsInChunks) {
  EngineConfig config = small_config(512);
  config.max_num_batched_tokens = 16;
  config.max_model_len = 1024;
  auto t = make_engine(config);
  std::mt19937 rng(4);
  Collector c;
  RequestParams a;
  a.prompt = random_prompt(rng, 5, kVocab);
  a.max_tokens = 80;
  // Hold the engine in A's first forward pass so B arrives while A is running.
  t.runner->close_gate();
  ASSERT_TRUE(t.engine->submit(a, c.sink(0)).ok());
  t.runner->wait_until_blocked();
  RequestParams b;
  b.prompt = random_prompt(rng, 300, kVocab);
  b.max_tokens = 5;
  ASSERT_TRUE(t.engine->submit(b, c.sink(1)).ok());
  t.runner->open_gate();
  ASSERT_TRUE(c.wait(0));
  ASSERT_TRUE(c.wait(1));
  EXPECT_EQ(c.get(0).tokens, reference_tokens(a.prompt, 80, {}, kVocab));
  EXPECT_EQ(c.get(1).tokens, reference_tokens(b.prompt, 5, {}, kVocab));

  int chunk_steps = 0;
  for (const auto& call : t.runner->records()) {
    int64_t total = 0;
    bool has_chunk = false, has_decode = false;
    for (const auto& s : call) {
      total += s.tokens;
      has_chunk |= s.tokens > 5;  // B's prompt chunks (A's whole prompt is 5 tokens)
      has_decode |= s.tokens == 1;
    }
    EXPECT_LE(total, 16);
    if (has_chunk && call.front().tokens == 1) ++chunk_steps;
    if (has_chunk) EXPECT_TRUE(has_decode) << "a prefill chunk ran without the running decode";
  }
  // 300 prompt tokens at ≤ 15 per step beside the decode: at least 20 steps, each led by the decode.
  EXPECT_GE(chunk_steps, 20);
}

// scheduler.lone_prompt_tokens: a prompt alone in the engine goes in steps of up to that many tokens (the CUDA
// runner runs them layer by layer in tiles); once a second request waits or runs, steps are back to
// max_num_batched_tokens. The tokens are the same either way.
TEST(BatchEngine, ALonePromptTakesLonePromptTokensAStepAndSharedStepsDoNot) {
  EngineConfig config = small_config(1024);
  config.max_num_batched_tokens = 16;
  config.lone_prompt_tokens = 100;
  config.max_model_len = 1024;
  auto t = make_engine(config);
  std::mt19937 rng(9);
  Collector c;
  RequestParams a;
  a.prompt = random_prompt(rng, 250, kVocab);
  a.max_tokens = 30;
  ASSERT_TRUE(t.engine->submit(a, c.sink(0)).ok());
  ASSERT_TRUE(c.wait(0));
  EXPECT_EQ(c.get(0).tokens, reference_tokens(a.prompt, 30, {}, kVocab));
  std::vector<int64_t> alone;
  for (const auto& call : t.runner->records())
    if (call.size() == 1 && call.front().tokens > 1) alone.push_back(call.front().tokens);
  EXPECT_EQ(alone, (std::vector<int64_t>{100, 100, 50})) << "a lone 250-token prompt in steps of lone_prompt_tokens";

  // Two prompts at once: no step beyond max_num_batched_tokens while both are in the engine.
  t.runner->close_gate();
  RequestParams b = a, d;
  b.prompt = random_prompt(rng, 120, kVocab);
  d.prompt = random_prompt(rng, 90, kVocab);
  d.max_tokens = 10;
  ASSERT_TRUE(t.engine->submit(b, c.sink(1)).ok());
  ASSERT_TRUE(t.engine->submit(d, c.sink(2)).ok());
  const size_t before = t.runner->records().size();
  t.runner->open_gate();
  ASSERT_TRUE(c.wait(1));
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.get(1).tokens, reference_tokens(b.prompt, 30, {}, kVocab));
  EXPECT_EQ(c.get(2).tokens, reference_tokens(d.prompt, 10, {}, kVocab));
  const auto records = t.runner->records();
  int64_t shared_steps = 0;
  for (size_t i = before; i < records.size(); ++i) {
    int64_t total = 0;
    for (const auto& st : records[i]) total += st.tokens;
    if (records[i].size() > 1) {
      ++shared_steps;
      EXPECT_LE(total, 16) << "step " << i << " ran several sequences beyond max_num_batched_tokens";
    }
  }
  EXPECT_GT(shared_steps, 0);
  const EngineMetrics m = wait_idle(*t.engine);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_TRUE(t.runner->violations().empty()) << t.runner->violations().front();
}

// With max_num_seqs = 1 a request that waits cannot start before the running prompt ends, so that prompt keeps its
// lone_prompt_tokens steps; the one waiting then takes them too.
TEST(BatchEngine, WithOneSeatAWaitingRequestDoesNotShrinkTheRunningPromptsSteps) {
  EngineConfig config = small_config(1024);
  config.max_num_seqs = 1;
  config.max_num_batched_tokens = 16;
  config.lone_prompt_tokens = 100;
  config.max_model_len = 1024;
  auto t = make_engine(config);
  std::mt19937 rng(11);
  Collector c;
  RequestParams a, b;
  a.prompt = random_prompt(rng, 250, kVocab);
  a.max_tokens = 5;
  b.prompt = random_prompt(rng, 120, kVocab);
  b.max_tokens = 5;
  t.runner->close_gate();
  ASSERT_TRUE(t.engine->submit(a, c.sink(0)).ok());
  ASSERT_TRUE(t.engine->submit(b, c.sink(1)).ok());
  t.runner->open_gate();
  ASSERT_TRUE(c.wait(0));
  ASSERT_TRUE(c.wait(1));
  EXPECT_EQ(c.get(0).tokens, reference_tokens(a.prompt, 5, {}, kVocab));
  EXPECT_EQ(c.get(1).tokens, reference_tokens(b.prompt, 5, {}, kVocab));
  std::vector<int64_t> prompt_steps;
  for (const auto& call : t.runner->records())
    if (call.size() == 1 && call.front().tokens > 1) prompt_steps.push_back(call.front().tokens);
  EXPECT_EQ(prompt_steps, (std::vector<int64_t>{100, 100, 50, 100, 20}));
  const EngineMetrics m = wait_idle(*t.engine);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_TRUE(t.runner->violations().empty()) << t.runner->violations().front();
}

TEST(BatchEngine, ReportsPrefillProgressOnlyWhenAsked) {
  EngineConfig config = small_config(512);
  config.max_num_batched_tokens = 16;
  config.max_model_len = 1024;
  auto t = make_engine(config);
  std::mt19937 rng(5);
  // Different prompts: the second must not be served from the first one's cached prefix.
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(rng, 100, kVocab), random_prompt(rng, 100, kVocab)};
  Collector c;
  for (int key : {0, 1}) {
    RequestParams p;
    p.prompt = prompts[key];
    p.max_tokens = 3;
    p.report_prefill_progress = key == 1;
    ASSERT_TRUE(t.engine->submit(p, c.sink(key)).ok());
    ASSERT_TRUE(c.wait(key));
  }
  for (int key : {0, 1}) EXPECT_EQ(c.get(key).tokens, reference_tokens(prompts[key], 3, {}, kVocab));
  for (const TokenEvent& e : c.get(0).events) EXPECT_GE(e.token, 0) << "progress events nobody asked for";
  // 100 tokens in chunks of at most 16: progress after each chunk but the last, rising, then the tokens.
  std::vector<int64_t> done;
  bool seen_token = false;
  for (const TokenEvent& e : c.get(1).events) {
    if (e.token >= 0) {
      seen_token = true;
      continue;
    }
    if (e.finished) continue;
    EXPECT_FALSE(seen_token) << "a progress event after the first token";
    EXPECT_EQ(e.prompt_tokens, 100);
    done.push_back(e.prefilled_tokens);
  }
  ASSERT_GE(done.size(), 6u);
  for (size_t i = 1; i < done.size(); ++i) EXPECT_GT(done[i], done[i - 1]);
  EXPECT_GT(done.front(), 0);
  EXPECT_LT(done.back(), 100);
  EXPECT_EQ(wait_idle(*t.engine).kv_blocks_used, 0);
}

TEST(BatchEngine, RefusesRequestsThatCanNeverFit) {
  EngineConfig config = small_config(16);  // 64 tokens of KV
  config.max_model_len = 100;
  auto t = make_engine(config);
  RequestParams p;
  p.prompt.assign(60, 5);
  p.max_tokens = 50;
  auto r = t.engine->submit(p, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("60 tokens"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("max_model_len (100)"), std::string::npos) << r.status().message();

  p.max_tokens = 30;  // 90 ≤ 100 but 89 positions need 23 blocks of 4; the pool has 16
  r = t.engine->submit(p, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("whole KV pool has 16"), std::string::npos) << r.status().message();

  p.prompt.clear();
  r = t.engine->submit(p, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  p.prompt = {1, 2, static_cast<int32_t>(kVocab)};
  p.max_tokens = 3;
  r = t.engine->submit(p, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prompt token 2"), std::string::npos) << r.status().message();

  p.prompt = {1, 2, 3};
  p.max_tokens = 0;
  EXPECT_EQ(t.engine->submit(p, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(BatchEngine, FullWaitingQueueAnswersResourceExhausted) {
  EngineConfig config = small_config(64);
  config.max_num_seqs = 1;
  config.max_waiting = 2;
  auto t = make_engine(config);
  t.runner->close_gate();
  Collector c;
  RequestParams p;
  p.prompt = {3, 4, 5};
  p.max_tokens = 2;
  ASSERT_TRUE(t.engine->submit(p, c.sink(0)).ok());
  t.runner->wait_until_blocked();  // the first request is inside a forward pass
  ASSERT_TRUE(t.engine->submit(p, c.sink(1)).ok());
  ASSERT_TRUE(t.engine->submit(p, c.sink(2)).ok());
  auto refused = t.engine->submit(p, c.sink(3));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("limit 2"), std::string::npos) << refused.status().message();
  EXPECT_EQ(t.engine->metrics().requests_waiting, 2);
  t.runner->open_gate();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.wait(i));
    EXPECT_EQ(c.get(i).tokens, reference_tokens(p.prompt, 2, {}, kVocab));
  }
}

TEST(BatchEngine, DrainFinishesEverythingThenRefuses) {
  auto t = make_engine(small_config(256));
  const auto reqs = random_requests(10, 31, 20, 30);
  Collector c;
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_TRUE(t.engine->submit(params_of(reqs[i]), c.sink(i)).ok());
  t.engine->drain();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome o = c.get(i);
    ASSERT_TRUE(o.done) << "drain returned before request " << i << " finished";
    EXPECT_EQ(o.tokens, reference_tokens(reqs[i].prompt, reqs[i].max_tokens, reqs[i].stop, kVocab));
  }
  auto late = t.engine->submit(params_of(reqs[0]), nullptr);
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
}

TEST(BatchEngine, ForwardFailureEndsTheBatchWithAnError) {
  auto t = make_engine(small_config(256));
  t.runner->fail_on_call(3);
  Collector c;
  RequestParams p;
  p.prompt = {3, 4, 5};
  p.max_tokens = 20;
  ASSERT_TRUE(t.engine->submit(p, c.sink(0)).ok());
  ASSERT_TRUE(c.wait(0));
  const Outcome o = c.get(0);
  EXPECT_EQ(o.reason, FinishReason::kError);
  EXPECT_NE(o.events.back().error.find("injected failure"), std::string::npos);
  EXPECT_EQ(o.tokens.size(), 2u);
  EXPECT_EQ(wait_idle(*t.engine).kv_blocks_used, 0);
  // The engine keeps serving afterwards.
  ASSERT_TRUE(t.engine->submit(p, c.sink(1)).ok());
  ASSERT_TRUE(c.wait(1));
  EXPECT_EQ(c.get(1).tokens, reference_tokens(p.prompt, 20, {}, kVocab));
}

TEST(BatchEngine, DestroyingAbortsWhatIsLeft) {
  Collector c;
  {
    EngineConfig config = small_config(25010);
    config.max_model_len = 100010;
    auto t = make_engine(config);
    RequestParams p;
    p.prompt = {3, 4, 5};
    p.max_tokens = 100000;  // far more than can run before the engine is destroyed
    ASSERT_TRUE(t.engine->submit(p, c.sink(0)).ok());
    while (c.tokens_so_far(0) < 2) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ASSERT_TRUE(c.get(0).done);
  EXPECT_EQ(c.get(0).reason, FinishReason::kAbort);
}

TEST(BatchEngine, RejectsInconsistentConfig) {
  EngineConfig config = small_config(64);
  config.max_num_batched_tokens = 4;  // below max_num_seqs = 8
  auto r = BatchEngine::create(config, std::make_unique<FakeModelRunner>(64, 4, kVocab));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_num_batched_tokens (4)"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kiln::testing
