// The feasibility screen (engine/memory_model.h): computed before load, it brackets what the tiny model and its
// engine measure once started; a recipe that cannot fit is a no-go naming the key to turn.
#include "engine/memory_model.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine_factory.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {

const std::string kTiny = std::string(KILN_SOURCE_DIR) + "/configs/tiny-cpu.toml";

Recipe tiny_recipe(std::vector<std::string> sets = {}) {
  auto r = load_recipe(kTiny, sets, global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

const MemoryTerm* find_term(const MemoryModel& m, const std::string& name) {
  for (const MemoryTerm& t : m.terms)
    if (t.name == name) return &t;
  return nullptr;
}

TEST(MemoryModel, TinyModelOnCpuMeasuresWithinItsInterval) {
  const Recipe recipe = tiny_recipe();
  auto screen = screen_memory(recipe, global_registry());
  ASSERT_TRUE(screen.ok()) << screen.status().to_string();
  EXPECT_TRUE(screen->go) << screen->report();
  EXPECT_FALSE(screen->inputs.cuda);

  auto model = load_model(recipe, global_registry(), model_load_options(recipe));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto started = start_engine(*model, recipe, {}, &*screen);
  ASSERT_TRUE(started.ok()) << started.status().to_string();

  // Term by term where the runtime counts them: the mapped checkpoint, the pool the engine planned and allocated.
  const MemoryTerm* weights = find_term(*screen, "weights");
  ASSERT_NE(weights, nullptr);
  const uint64_t mapped = checkpoint_bytes(*model);
  EXPECT_LE(weights->low, mapped);
  EXPECT_GE(weights->high, mapped);
  const MemoryTerm* pool = find_term(*screen, "KV pool");
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(started->capacity.bytes, pool->low);
  EXPECT_EQ(started->capacity.bytes, pool->high);
  EXPECT_EQ(started->caches->bytes(), started->capacity.bytes);  // no state slots in glm4_moe_lite

  // The whole: mapped weights + the anonymous memory grown since the screen.
  const MeasuredMemory measured = measure_memory(*screen, false, mapped);
  const MemoryRange at_load = screen->total(MemoryWhere::kHost, MemoryWhen::kLoad);
  EXPECT_TRUE(memory_within(*screen, measured)) << memory_comparison(*screen, measured) << "\n" << screen->report();
  EXPECT_GE(measured.host_bytes, at_load.low);
  EXPECT_LE(measured.host_bytes, at_load.high);
  EXPECT_NE(memory_comparison(*screen, measured).find("(within"), std::string::npos);
  started->engine->drain();
}

TEST(MemoryModel, PoolTermFollowsTheEnginesRule) {
  // max_num_seqs × max_model_len caps the pool on the CPU: the term scales with both.
  auto a = screen_memory(tiny_recipe({"scheduler.max_num_seqs=4", "scheduler.max_model_len=1024"}), global_registry());
  auto b = screen_memory(tiny_recipe({"scheduler.max_num_seqs=8", "scheduler.max_model_len=1024"}), global_registry());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->pool_tokens_low, 4 * 1024);
  EXPECT_EQ(b->pool_tokens_low, 8 * 1024);
  EXPECT_EQ(2 * find_term(*a, "KV pool")->high, find_term(*b, "KV pool")->high);
}

TEST(MemoryModel, CpuRankThreadsEachPriceTheirOwnActivations) {
  // parallel.tensor = 3 as threads of this process: three forwards' buffers at once; as processes (socket), the
  // priced process runs one rank.
  auto one = screen_memory(tiny_recipe(), global_registry());
  auto threads = screen_memory(tiny_recipe({"parallel.tensor=3"}), global_registry());
  auto processes = screen_memory(tiny_recipe({"parallel.tensor=3", "transport.backend=\"socket\""}), global_registry());
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ASSERT_TRUE(threads.ok()) << threads.status().to_string();
  ASSERT_TRUE(processes.ok()) << processes.status().to_string();
  const MemoryTerm* a = find_term(*one, "activations");
  const MemoryTerm* t = find_term(*threads, "activations");
  const MemoryTerm* p = find_term(*processes, "activations");
  ASSERT_TRUE(a && t && p);
  EXPECT_EQ(t->high, 3 * a->high);
  EXPECT_EQ(t->low, a->low);
  EXPECT_EQ(p->high, a->high);
  EXPECT_NE(t->basis.find("3 rank threads"), std::string::npos) << t->basis;
}

// scheduler.batch_invariant on CUDA: the engine runs steps of at most kCudaBatchInvariantMaxRows rows whose prompt
// chunks stay on the decode kernels, so the screen prices those (a note says so), not the recipe's
// max_num_batched_tokens with a prompt chunk expanding max_model_len keys for the prefill kernel.
TEST(MemoryModel, BatchInvariantCudaStepsArePricedAtTheRunnersBound) {
  auto activations = [](bool invariant, std::vector<std::string>& notes) {
    const Recipe recipe = tiny_recipe({"model.device=cuda", "scheduler.max_num_batched_tokens=4096",
                                       "scheduler.max_num_seqs=8", "scheduler.max_model_len=2048",
                                       std::string("scheduler.batch_invariant=") + (invariant ? "true" : "false")});
    ScreenOptions o;
    o.memory_bytes = 80ull << 30;
    auto in = memory_inputs(recipe, global_registry(), o);
    EXPECT_TRUE(in.ok()) << in.status().to_string();
    if (!in.ok()) return MemoryTerm{};
    notes = in->notes;
    for (const MemoryTerm& t : in->terms)
      if (t.name == "activations") return t;
    ADD_FAILURE() << "no activations term";
    return MemoryTerm{};
  };
  std::vector<std::string> plain_notes, invariant_notes;
  const MemoryTerm plain = activations(false, plain_notes), invariant = activations(true, invariant_notes);
  ASSERT_GT(plain.high, 0u);
  ASSERT_GT(invariant.high, 0u);
  // 32 rows instead of 4,096 and no expanded keys: far below, yet not nothing.
  EXPECT_LT(invariant.high * 8, plain.high) << invariant.high << " vs " << plain.high;
  EXPECT_LE(invariant.low, plain.low);
  EXPECT_NE(invariant.basis.find("batch-invariant step of 32 tokens"), std::string::npos) << invariant.basis;
  auto says = [](const std::vector<std::string>& notes) {
    for (const std::string& n : notes)
      if (n.find("scheduler.batch_invariant: steps of at most 32 tokens") != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(says(invariant_notes));
  EXPECT_FALSE(says(plain_notes));
}

// The CUDA runner's layer-major prefill (model/batch_invariance.h): a lone prompt's step past the 8,192-row tile keeps
// only a few hidden-widths a token beyond one tile's buffers. GLM-4.7-Flash's shapes at 128K tokens a step: one
// sequence at a time prices its steps in tiles (below a quarter of the same step of several sequences, which runs
// whole), and scheduler.lone_prompt_tokens adds a lone prompt's tiled step to a server of small steps — more than
// the small steps alone, far less than whole steps of that size. The pool rule's workspace follows the same way.
TEST(MemoryModel, LonePromptStepsArePricedInPrefillTiles) {
  struct Priced {
    uint64_t low = 0, high = 0, rule = 0;
  };
  auto priced = [](std::vector<std::string> sets) {
    sets.push_back("scheduler.max_model_len=131072");
    auto recipe = load_recipe(std::string(KILN_SOURCE_DIR) + "/configs/glm-4.7-flash-dummy.toml", sets, global_registry());
    EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
    if (!recipe.ok()) return Priced{};
    ScreenOptions o;
    o.memory_bytes = 141ull << 30;
    auto in = memory_inputs(*recipe, global_registry(), o);
    EXPECT_TRUE(in.ok()) << in.status().to_string();
    if (!in.ok()) return Priced{};
    for (const MemoryTerm& t : in->terms)
      if (t.name == "activations") return Priced{t.low, t.high, in->rule_workspace_bytes};
    ADD_FAILURE() << "no activations term";
    return Priced{};
  };
  const Priced lone = priced({"scheduler.max_num_seqs=1", "scheduler.max_num_batched_tokens=131072"});
  const Priced whole = priced({"scheduler.max_num_seqs=2", "scheduler.max_num_batched_tokens=131072"});
  const Priced small = priced({"scheduler.max_num_seqs=16", "scheduler.max_num_batched_tokens=2048"});
  const Priced small_lone = priced({"scheduler.max_num_seqs=16", "scheduler.max_num_batched_tokens=2048",
                                    "scheduler.lone_prompt_tokens=131072"});
  ASSERT_GT(lone.high, 0u);
  EXPECT_LT(lone.high * 4, whole.high) << lone.high << " vs " << whole.high;
  EXPECT_LT(lone.rule * 4, whole.rule) << lone.rule << " vs " << whole.rule;
  EXPECT_GT(small_lone.high, small.high);
  EXPECT_GT(small_lone.rule, small.rule);
  EXPECT_LT(small_lone.high * 2, whole.high);
  EXPECT_LT(small_lone.rule * 4, whole.rule);
  // The rule sets aside at least the least the tiled step takes: every row's residual, block input, normed and
  // hidden rows and every key's slot in the prefill workspace, not only one tile's buffers.
  EXPECT_GE(lone.rule, lone.low) << "a lone 128K prompt's tiled step";
  EXPECT_GE(small_lone.rule, small_lone.low);
}

// Decode-context parallelism on GPU ranks: each step also holds every head's q, the rank's partial attention and
// every rank's gathered partials, and (prefill) the context rows each rank sends and receives: priced above the same
// tensor-parallel recipe without the split.
TEST(MemoryModel, GpuDecodeContextRanksPriceTheSplitAttentionsBuffers) {
  auto activations = [](std::vector<std::string> sets) {
    sets.insert(sets.end(), {"model.device=cuda", "parallel.tensor=2", "transport.backend=\"socket\"",
                             "scheduler.max_num_batched_tokens=512", "scheduler.max_model_len=2048"});
    ScreenOptions o;
    o.memory_bytes = 80ull << 30;
    auto in = memory_inputs(tiny_recipe(sets), global_registry(), o);
    EXPECT_TRUE(in.ok()) << in.status().to_string();
    if (!in.ok()) return MemoryTerm{};
    for (const MemoryTerm& t : in->terms)
      if (t.name == "activations") return t;
    ADD_FAILURE() << "no activations term";
    return MemoryTerm{};
  };
  const MemoryTerm tp = activations({}), dcp = activations({"parallel.decode_context=2"});
  ASSERT_GT(tp.high, 0u);
  // At least the W + 1 copies of N · heads · (latent + 1) fp32 partials (tiny-glm: 8 heads, latent 128; N = 512).
  const uint64_t partials = 4ull * 3 * 512 * 8 * 129;
  EXPECT_GE(dcp.low, tp.low + partials) << dcp.low << " vs " << tp.low;
  EXPECT_GE(dcp.high, tp.high + partials) << dcp.high << " vs " << tp.high;
}

TEST(MemoryModel, ImpossibleRecipeIsNoGoNamingTheKey) {
  // 40 MiB of memory: 36 usable at 0.9, less 19 MiB of weights and the step's workspace, leaves no KV window.
  ScreenOptions tight;
  tight.memory_bytes = 40ull << 20;
  auto m = screen_memory(tiny_recipe(), global_registry(), tight);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_FALSE(m->go);
  ASSERT_FALSE(m->reasons.empty());
  EXPECT_NE(m->reasons.front().find("fewer than one max_model_len window"), std::string::npos) << m->reasons.front();
  EXPECT_NE(m->reasons.front().find("scheduler.max_model_len"), std::string::npos) << m->reasons.front();
  EXPECT_NE(m->reasons.front().find("scheduler.gpu_memory_utilization"), std::string::npos) << m->reasons.front();
  EXPECT_NE(m->report().find("verdict: no-go"), std::string::npos) << m->report();
}

TEST(MemoryModel, PeakOverTheDeviceIsNoGoNamingUtilization) {
  // A CUDA device of 80 GiB at utilization 0.98: the pool takes what 0.98 leaves, so 8 GiB of activations and CUDA
  // graphs outside it do not fit; the verdict says how far to lower gpu_memory_utilization.
  MemoryInputs in;
  in.cuda = true;
  in.device_name = "cuda:0 (test)";
  in.memory_bytes = 80ull << 30;
  in.host_memory_bytes = 512ull << 30;
  in.utilization = 0.98;
  in.kv_bytes_per_token = 54144;
  in.block_size = 64;
  in.max_model_len = 131072;
  in.max_num_seqs = 16;
  in.rule_workspace_bytes = 1ull << 30;
  in.terms.push_back(
      {"weights", 40ull << 30, 41ull << 30, MemoryWhere::kDevice, MemoryWhen::kLoad, "weights.format", ""});
  in.terms.push_back({"activations", 2ull << 30, 8ull << 30, MemoryWhere::kDevice, MemoryWhen::kRun,
                      "scheduler.max_num_batched_tokens", ""});
  const MemoryModel m = estimate_memory(in);
  EXPECT_FALSE(m.go);
  ASSERT_FALSE(m.reasons.empty());
  EXPECT_NE(m.reasons.back().find("at peak"), std::string::npos) << m.reasons.back();
  EXPECT_NE(m.reasons.back().find("lower scheduler.gpu_memory_utilization to 0.8"), std::string::npos)
      << m.reasons.back();
  // The same at 0.85 leaves room: go, and the pool holds fewer than max_num_seqs full windows (a note).
  in.utilization = 0.85;
  const MemoryModel ok = estimate_memory(in);
  EXPECT_TRUE(ok.go) << ok.report();
  const MemoryRange peak = ok.total(MemoryWhere::kDevice, MemoryWhen::kRun);
  EXPECT_LE(peak.high, in.memory_bytes);
}

}  // namespace
}  // namespace kiln
