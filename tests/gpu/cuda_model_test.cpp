// The CUDA runner against the CPU model on the committed fixtures (glm4_moe_lite, deepseek_v3 and the DSA model
// glm_moe_dsa, whose index_topk = 8 makes the indexer's selection matter). The GPU keeps weights and activations in
// bf16 (fixtures are fp32) with an fp32 residual stream; the CPU path runs fp32 with the same bf16 KV layout.
// Tolerance: max|Δ| / max|cpu| ≤ 5e-2 on every logits row but rows the CPU routed by a near-tie (MoE margin
// < 1e-2, reported); teacher-forced argmax identical at every step but measured near-ties (reported).
// Against the CPU model in bf16 precision (model.precision = "bf16": the GPU's rounding points, so the two differ
// by fp32 summation order only) free-running greedy decoding gives identical tokens, near-ties or not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <numeric>
#include <random>

#include "common/reference_fixture.h"
#include "engine/engine_factory.h"
#include "common/test_model.h"
#include "model/batch_invariance.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "runtime/cuda/cuda_mla_moe_model.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kBlockSize = 4;
constexpr double kLogitsTolerance = 5e-2;
// glm4_moe_lite-llama3-rope's rows sit further from fp32 under bf16 activations (0.063 of max|cpu| at worst, rows 5
// and 7, on an H100 in session 26) while its bf16-precision CPU rows agree with the GPU's within 1.5e-7 on the prompt
// (FreeRunningGreedyIsIdenticalToTheCpuInBf16Precision): the GPU computes the CPU's arithmetic, and the fixture's
// random weights amplify bf16 rounding more than the others'.
double logits_tolerance(const std::string& fixture) {
  return fixture == "glm4_moe_lite-llama3-rope" ? 8e-2 : kLogitsTolerance;
}
// A routing margin (cpu::moe_route) below this is within reach of bf16 activations' error in the sigmoid scores.
constexpr float kRouterNearTie = 1e-2f;

using testing::cpu_model;
using testing::load_reference;
using testing::make_kv_cache;
using testing::model_dir;
using testing::relative_error;
using testing::TestKv;

LoadedModel load_path(const fs::path& path, const std::string& device, const std::string& load,
                      const std::string& precision = "fp32", int64_t block_size = kBlockSize) {
  std::vector<std::string> sets = {"model.path=" + path.string(), "kv.layout=bf16",
                                   "kv.block_size=" + std::to_string(block_size), "model.device=" + device,
                                   "model.load=" + load};
  if (precision != "fp32") sets.push_back("model.precision=" + precision);
  auto recipe = load_recipe("", sets, global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

LoadedModel load(const std::string& name, const std::string& device, const std::string& load = "mmap") {
  return load_path(model_dir(name), device, load);
}

std::vector<int32_t> prompt_of(const std::string& name) { return load_reference(name).ids("prompt_ids"); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// top-1 minus top-2 of a logits row: how near a tie the greedy choice was.
double top_gap(const float* row, int64_t n) {
  std::vector<float> v(row, row + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

// Prefill `prompt`, then one decode step per token of `forced` (teacher forcing: both paths see the same
// inputs at every step); every logits row is kept. With `greedy` set, forced is filled with the argmax of each
// step instead (free-running greedy decoding of `steps` tokens).
// With first_chunk > 0 the prompt goes in two steps: its first first_chunk tokens, then the rest.
template <typename Forward>
std::vector<std::vector<float>> decode_rows(Forward&& forward, std::vector<int32_t> tokens, std::vector<int32_t>& table,
                                            int64_t steps, std::vector<int32_t>& forced, bool greedy, int64_t vocab,
                                            int64_t first_chunk = 0) {
  std::vector<std::vector<float>> rows;
  StepOutput out;
  const int64_t P = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 0; begin < P;) {
    const int64_t end = first_chunk > 0 && begin == 0 ? std::min(first_chunk, P) : P;
    SequenceStep prefill{{tokens.data() + begin, static_cast<size_t>(end - begin)}, begin, &table, true};
    EXPECT_TRUE(forward(prefill, out).ok());
    for (int64_t r = 0; r < end - begin; ++r)
      rows.emplace_back(out.logits.begin() + r * vocab, out.logits.begin() + (r + 1) * vocab);
    begin = end;
  }
  for (int64_t s = 0; s < steps; ++s) {
    if (greedy) forced.push_back(argmax(rows.back().data(), vocab));
    const int32_t t = forced[s];
    SequenceStep step{{&t, 1}, static_cast<int64_t>(tokens.size()), &table, false};
    tokens.push_back(t);
    EXPECT_TRUE(forward(step, out).ok());
    rows.emplace_back(out.logits.begin(), out.logits.begin() + vocab);
  }
  return rows;
}

// One step of a model on any device over `kv`, its logits copied to the host.
Status step_rows(LoadedModel& m, const TestKv& kv, std::span<const SequenceStep> steps, StepOutput& out,
                 bool want_hidden = false) {
  StepOptions o;
  o.want_logits = true;
  o.want_hidden = want_hidden;
  return m.model->step(steps, {}, kv.views(), o, out);
}

// decode_rows through a fresh pool on the GPU, its KV blocks in reverse order so the paged addressing is exercised.
std::vector<std::vector<float>> gpu_decode_rows(LoadedModel& gpu, const std::vector<int32_t>& prompt, int64_t steps,
                                                std::vector<int32_t>& forced, bool greedy, int64_t vocab,
                                                int64_t first_chunk = 0) {
  const int64_t tokens = static_cast<int64_t>(prompt.size()) + steps + 1;
  const int64_t blocks = (tokens + kBlockSize - 1) / kBlockSize + 3;
  TestKv kv(gpu, blocks * kBlockSize);
  std::vector<int32_t> table(blocks - 3);
  std::iota(table.rbegin(), table.rend(), 2);
  return decode_rows([&](const SequenceStep& s, StepOutput& o) { return step_rows(gpu, kv, {&s, 1}, o); }, prompt,
                     table, steps, forced, greedy, vocab, first_chunk);
}

class CudaModel : public ::testing::TestWithParam<std::string> {};

// Teacher-forced on the CPU's greedy continuation: every logits row within tolerance, and the GPU's argmax equal
// to the CPU's at every step unless the CPU's top-1 / top-2 gap is below twice that row's measured logits
// difference (a near-tie the bf16 GPU path may break either way); such steps are counted and reported.
TEST_P(CudaModel, TeacherForcedArgmaxMatchesTheCpuPathAtEveryStep) {
  constexpr int64_t kNew = 32;
  LoadedModel cpu = load(GetParam(), "cpu");
  LoadedModel gpu = load(GetParam(), "cuda");
  ASSERT_FALSE(cpu.on_gpu());
  ASSERT_TRUE(gpu.on_gpu());
  const int64_t vocab = cpu.info.vocab_size;
  const std::vector<int32_t> prompt = prompt_of(GetParam());
  const int64_t tokens = static_cast<int64_t>(prompt.size()) + kNew + 1;

  auto kv = make_kv_cache(cpu, tokens);
  std::vector<int32_t> cpu_table;
  ASSERT_TRUE(kv->reserve(cpu_table, tokens).ok());
  std::vector<int32_t> cpu_tokens;
  // Per row, the CPU's smallest MoE routing margin over the layers: the bf16 GPU may route such a row differently.
  std::vector<float> margins;
  auto cpu_forward = [&](const SequenceStep& s, StepOutput& o) {
    Status st = cpu_model(cpu).forward({&s, 1}, kv->views(), {.record_router_margin = true}, o);
    margins.insert(margins.end(), o.router_margin.begin(), o.router_margin.end());
    return st;
  };
  auto cpu_rows = decode_rows(cpu_forward,
                              prompt, cpu_table, kNew, cpu_tokens, true, vocab);

  auto gpu_rows = gpu_decode_rows(gpu, prompt, kNew, cpu_tokens, false, vocab);
  ASSERT_EQ(cpu_rows.size(), gpu_rows.size());

  const size_t P = prompt.size();
  const ModelConfig& c = cpu_model(cpu).config();
  double worst = 0, worst_abs = 0;
  int64_t near_ties = 0, broken_ties = 0, sparse_rows = 0, routing_ties = 0;
  ASSERT_EQ(margins.size(), cpu_rows.size());
  for (size_t r = 0; r < cpu_rows.size(); ++r) {
    const double e = relative_error(gpu_rows[r].data(), cpu_rows[r].data(), vocab);
    double diff = 0;
    for (int64_t v = 0; v < vocab; ++v) diff = std::max(diff, static_cast<double>(std::fabs(gpu_rows[r][v] - cpu_rows[r][v])));
    // DSA rows that see more keys than index_topk attend through the indexer's selection, and bf16 activations
    // flip near-tied top-k picks (a numpy model of the fixture with the GPU's bf16 rounding points reproduces
    // the GPU's row errors), so only the argmax rule below holds for them; their count is reported.
    if (c.has_indexer() && static_cast<int64_t>(r) + 1 > c.index_topk) {
      ++sparse_rows;
    } else if (r < margins.size() && margins[r] < kRouterNearTie) {
      // The CPU itself chose its experts (or expert group) by less than the bf16 path's error in the router's
      // scores: the GPU may pick the other one, a discrete change of the row's output, not an error.
      ++routing_ties;
    } else {
      worst = std::max(worst, e);
      worst_abs = std::max(worst_abs, diff);
      EXPECT_LE(e, logits_tolerance(GetParam())) << "row " << r;
    }
    if (r + 1 < P) continue;  // greedy choices start at the prompt's last row
    const double gap = top_gap(cpu_rows[r].data(), vocab);
    const bool near_tie = gap < 2 * diff;
    near_ties += near_tie;
    const int32_t want = argmax(cpu_rows[r].data(), vocab), got = argmax(gpu_rows[r].data(), vocab);
    if (got != want) {
      ++broken_ties;
      EXPECT_TRUE(near_tie) << GetParam() << ": step " << r + 1 - P << ": GPU argmax " << got << ", CPU " << want
                            << ", CPU top-1/top-2 gap " << gap << " vs logits difference " << diff;
    }
  }
  std::printf("%s: %lld teacher-forced steps; worst logits error %.3g of max|cpu| (%.3g absolute) over %lld dense "
              "rows; %lld DSA-selected rows; %lld rows routed by a near-tie (margin < 1e-2); %lld near-tie steps "
              "(gap < 2·|Δ|), %lld of them decided differently\n",
              GetParam().c_str(), static_cast<long long>(kNew + 1), worst, worst_abs,
              static_cast<long long>(cpu_rows.size()) - sparse_rows - routing_ties, static_cast<long long>(sparse_rows),
              static_cast<long long>(routing_ties),
              static_cast<long long>(near_ties), static_cast<long long>(broken_ties));
}

// Free-running greedy decoding, the GPU against the CPU model in bf16 precision: the same tokens at every step. The
// rows' largest logits difference relative to max|cpu| is reported beside the smallest top-1 / top-2 gap met: with
// the rounding points matched it is fp32 summation noise (~1e-7), not bf16 error (~1e-2).
// near_ties_may_part: the tokens may part at a step whose CPU top-1 / top-2 gap is below twice that row's largest
// logits difference (the rule CudaModelTinyGlm uses): summation order differs between the CPU's and the GPU's
// products, so now and then a bf16 rounding falls the other way, and every later row of the prompt inherits it.
// tile_rows ≥ 0: the GPU model's layer-major prefill tile (set_prefill_tile_rows); first_chunk: see decode_rows.
void expect_free_running_greedy_identical_in_bf16(const std::string& name, const std::vector<int32_t>& prompt,
                                                  int64_t new_tokens, const char* what, bool near_ties_may_part = false,
                                                  int64_t tile_rows = -1, int64_t first_chunk = 0) {
  LoadedModel cpu = load_path(model_dir(name), "cpu", "mmap", "bf16");
  LoadedModel gpu = load(name, "cuda");
  ASSERT_TRUE(gpu.on_gpu());
  if (tile_rows >= 0) {
    auto* m = dynamic_cast<cuda::CudaMlaMoeModel*>(gpu.model.get());
    ASSERT_NE(m, nullptr);
    m->set_prefill_tile_rows(tile_rows);
  }
  const int64_t vocab = cpu.info.vocab_size;
  const int64_t tokens = static_cast<int64_t>(prompt.size()) + new_tokens + 1;
  auto kv = make_kv_cache(cpu, tokens);
  std::vector<int32_t> cpu_table, cpu_tokens, gpu_tokens;
  ASSERT_TRUE(kv->reserve(cpu_table, tokens).ok());
  auto cpu_rows = decode_rows([&](const SequenceStep& s, StepOutput& o) { return cpu_model(cpu).forward({&s, 1}, kv->views(), {}, o); },
                              prompt, cpu_table, new_tokens, cpu_tokens, true, vocab, first_chunk);
  auto gpu_rows = gpu_decode_rows(gpu, prompt, new_tokens, gpu_tokens, true, vocab, first_chunk);
  ASSERT_EQ(cpu_rows.size(), gpu_rows.size());
  double worst_prefill = 0, worst_decode = 0, smallest_gap = INFINITY;
  std::vector<double> errors;
  const size_t P = prompt.size();
  for (size_t r = 0; r < cpu_rows.size(); ++r) {
    double& worst = r < P ? worst_prefill : worst_decode;
    errors.push_back(relative_error(gpu_rows[r].data(), cpu_rows[r].data(), vocab));
    worst = std::max(worst, errors.back());
    if (r + 1 >= P) smallest_gap = std::min(smallest_gap, top_gap(cpu_rows[r].data(), vocab));
  }
  if (!near_ties_may_part) EXPECT_EQ(gpu_tokens, cpu_tokens) << name;
  for (size_t d = 0; d < cpu_tokens.size() && d < gpu_tokens.size(); ++d)
    if (gpu_tokens[d] != cpu_tokens[d]) {
      const std::vector<float>& c = cpu_rows[P - 1 + d];
      const std::vector<float>& g = gpu_rows[P - 1 + d];
      double diff = 0;
      for (int64_t v = 0; v < vocab; ++v) diff = std::max(diff, static_cast<double>(std::fabs(g[v] - c[v])));
      const double gap = top_gap(c.data(), vocab);
      std::printf("%s: %s parts at step %zu (CPU %d, GPU %d): CPU top-1/top-2 gap %.4g, logits |Δ| %.4g\n",
                  name.c_str(), what, d, cpu_tokens[d], gpu_tokens[d], gap, diff);
      if (near_ties_may_part)
        EXPECT_LT(gap, 2 * diff) << name << ": greedy tokens part at step " << d << " without a near-tie";
      else
        ADD_FAILURE() << name << ": first difference at step " << d << " (CPU " << cpu_tokens[d] << ", GPU "
                      << gpu_tokens[d] << "), CPU top-1/top-2 gap " << gap;
      break;
    }
  std::printf("%s: bf16 CPU vs GPU, %s of %zu: %lld free-running greedy tokens %s; logits difference of max|cpu|: "
              "median %.3g, worst %.3g on the prompt's rows, %.3g on decode rows; smallest CPU top-1/top-2 gap %.3g\n",
              name.c_str(), what, P, static_cast<long long>(new_tokens),
              gpu_tokens == cpu_tokens ? "identical" : "DIFFER", median(errors), worst_prefill, worst_decode,
              smallest_gap);
}

// Not on the DSA variants: they keep 5-8 keys per query, so one index-score near-tie decided differently by the
// GPU's indexer and the CPU's (the projections feeding it round differently; not pinned down further) changes a
// large share of what a query attends to, and free-running output parts within 32 tokens (first H200 run: steps
// 0, 12 and 21; step 0 at a top-1/top-2 gap of 0.005). The teacher-forced test above covers them step by step.
bool free_running_is_a_contract(const std::string& name) { return name.find("glm_moe_dsa-h") != 0; }

// The fixture's prompt (24 tokens: under kExpandedPrefillMinTokens, so the absorbed form through the decode kernels).
TEST_P(CudaModel, FreeRunningGreedyIsIdenticalToTheCpuInBf16Precision) {
  if (!free_running_is_a_contract(GetParam())) GTEST_SKIP() << "free-running identity is not a contract for top-k <= 8";
  expect_free_running_greedy_identical_in_bf16(GetParam(), prompt_of(GetParam()), 32, "prompt");
}

// A prompt of 2 · kExpandedPrefillMinTokens tokens (the fixture's, repeated): the MLA prefill kernel in expanded form
// (DSA models excepted), which the CPU's bf16 precision follows. Tokens may part at a near-tie (first H200 run:
// deepseek_v3-tiny at step 1 of 16, CPU top-1/top-2 gap 0.0098 against a row difference of 0.034).
TEST_P(CudaModel, LongPromptThroughThePrefillKernelIsIdenticalToTheCpuInBf16Precision) {
  if (!free_running_is_a_contract(GetParam())) GTEST_SKIP() << "free-running identity is not a contract for top-k <= 8";
  const std::vector<int32_t> base = prompt_of(GetParam());
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < 2 * kExpandedPrefillMinTokens; ++i) prompt.push_back(base[i % base.size()]);
  expect_free_running_greedy_identical_in_bf16(GetParam(), prompt, 16, "expanded-form prompt", true);
}

// Layer-major prefill (CudaMlaMoeModel::set_prefill_tile_rows): a prompt of 3 · kExpandedPrefillMinTokens + 7 tokens,
// its first 13 in a step of their own (the absorbed form), the other 99 in one step that runs each layer over tiles
// of 40 rows (tile boundaries at positions 40 and 80: tiles of 27, 40 and 32 rows, each after the first adding its
// keys to the layer's expanded ones). The CPU in bf16 precision runs the same two steps unchunked: the same tokens.
TEST_P(CudaModel, LongPromptInTilesLayerByLayerIsIdenticalToTheCpuInBf16Precision) {
  if (!free_running_is_a_contract(GetParam())) GTEST_SKIP() << "free-running identity is not a contract for top-k <= 8";
  const std::vector<int32_t> base = prompt_of(GetParam());
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < 3 * kExpandedPrefillMinTokens + 7; ++i) prompt.push_back(base[(i * 7) % base.size()]);
  expect_free_running_greedy_identical_in_bf16(GetParam(), prompt, 12, "prompt in tiles of 40", true, 40, 13);
}

// The tiled step against the same step untiled on the GPU: every prompt row's logits (all_logits: the logits rows of a
// layer-major step are the full step's) within 2e-2 of max|untiled| — the same kernels on the same rows, the tiles'
// GEMM shapes aside — and the same greedy continuation; taps and final hidden states as well.
TEST_P(CudaModel, TiledPrefillStepMatchesTheUntiledStep) {
  LoadedModel gpu = load(GetParam(), "cuda");
  ASSERT_TRUE(gpu.on_gpu());
  auto* m = dynamic_cast<cuda::CudaMlaMoeModel*>(gpu.model.get());
  ASSERT_NE(m, nullptr);
  const int64_t vocab = gpu.info.vocab_size, hidden = m->hidden_size();
  const std::vector<int32_t> base = prompt_of(GetParam());
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < 150; ++i) prompt.push_back(base[(i * 5) % base.size()]);
  const int64_t P = static_cast<int64_t>(prompt.size());
  auto run = [&](int64_t tile, std::vector<float>& logits, std::vector<float>& hidden_rows, std::vector<float>& tap) {
    m->set_prefill_tile_rows(tile);
    const int64_t blocks = (P + kBlockSize - 1) / kBlockSize + 2;
    TestKv kv(gpu, blocks * kBlockSize);
    std::vector<int32_t> table(blocks - 1);
    std::iota(table.rbegin(), table.rend(), 1);
    SequenceStep s{prompt, 0, &table, true};
    StepOptions o;
    o.want_logits = true, o.want_hidden = true, o.tap_layers = {1};
    StepOutput out;
    const Status st = gpu.model->step({&s, 1}, {}, kv.views(), o, out);
    ASSERT_TRUE(st.ok()) << st.to_string();
    logits = out.logits, hidden_rows = out.hidden;
    ASSERT_EQ(out.taps.size(), 1u);
    tap.resize(static_cast<size_t>(P * hidden));
    ASSERT_EQ(cudaMemcpy(tap.data(), out.taps[0].data, tap.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  };
  std::vector<float> whole, tiled, whole_h, tiled_h, whole_tap, tiled_tap;
  run(0, whole, whole_h, whole_tap);
  run(32, tiled, tiled_h, tiled_tap);
  ASSERT_EQ(whole.size(), static_cast<size_t>(P * vocab));
  ASSERT_EQ(tiled.size(), whole.size());
  ASSERT_EQ(tiled_h.size(), static_cast<size_t>(P * hidden));
  // Per row: max|Δ| / max|untiled| of its logits, final hidden state and layer-1 tap.
  std::vector<double> e_logits, e_hidden, e_tap;
  int64_t argmax_differ = 0;
  for (int64_t r = 0; r < P; ++r) {
    e_logits.push_back(relative_error(tiled.data() + r * vocab, whole.data() + r * vocab, vocab));
    e_hidden.push_back(relative_error(tiled_h.data() + r * hidden, whole_h.data() + r * hidden, hidden));
    e_tap.push_back(relative_error(tiled_tap.data() + r * hidden, whole_tap.data() + r * hidden, hidden));
    argmax_differ += argmax(tiled.data() + r * vocab, vocab) != argmax(whole.data() + r * vocab, vocab);
  }
  auto far = [](const std::vector<double>& e) { return std::count_if(e.begin(), e.end(), [](double v) { return v > 2e-2; }); };
  auto worst = [](const std::vector<double>& e) { return *std::max_element(e.begin(), e.end()); };
  std::printf("%s: a %lld-token step in tiles of 32 vs untiled, rows' error of max|untiled| median / worst / rows past "
              "2e-2: logits %.3g / %.3g / %lld, final hidden %.3g / %.3g / %lld, layer-1 tap %.3g / %.3g / %lld; %lld rows' "
              "argmax differ; %s bitwise\n",
              GetParam().c_str(), static_cast<long long>(P), median(e_logits), worst(e_logits),
              static_cast<long long>(far(e_logits)), median(e_hidden), worst(e_hidden), static_cast<long long>(far(e_hidden)),
              median(e_tap), worst(e_tap), static_cast<long long>(far(e_tap)), static_cast<long long>(argmax_differ),
              whole == tiled ? "identical" : "not");
  // A wrong tile (keys missing or misplaced, rows offset) moves every row after it; the tiles' GEMM shapes round a
  // few values differently, and in the random fixtures that now and then flips a near-tie routing (expert choice)
  // for a row, which moves that row (and, a little, the rows attending to it) well past bf16 noise (first H100 run:
  // deepseek_v3-qproj one row at 0.47, deepseek_v3-v2lite-yarn three; medians 5e-3 .. 1e-2 everywhere).
  for (const std::vector<double>* e : {&e_logits, &e_hidden, &e_tap}) {
    EXPECT_LT(median(*e), 1.5e-2);
    EXPECT_LE(far(*e), P / 20);
  }
  EXPECT_LE(argmax_differ, P / 20);
}

// The modality path on the GPU: media rows replace their placeholders' embeddings after the gather. Rows equal to
// the tokens' own embeddings leave every logit bit-identical (the scatter writes bf16 rows as the table holds them);
// random rows change the output, and the GPU then matches the CPU model given the same rows (as the fixture
// tolerance above, rows the CPU routed by a near-tie left out).
TEST(CudaModelMedia, MediaRowsReplaceTheirPlaceholdersLikeTheCpu) {
  LoadedModel cpu = load("glm4_moe_lite-tiny", "cpu");
  LoadedModel gpu = load("glm4_moe_lite-tiny", "cuda");
  ASSERT_TRUE(gpu.on_gpu());
  const int64_t vocab = cpu.info.vocab_size, hidden = cpu.info.hidden_size;
  const std::vector<int32_t> prompt = prompt_of("glm4_moe_lite-tiny");
  const int64_t P = static_cast<int64_t>(prompt.size()), first = 5, count = 8;
  ASSERT_GT(P, first + count);
  auto run = [&](LoadedModel& m, const MediaRows* media, std::vector<float>* margins = nullptr) {
    TestKv kv(m, P + 4);
    std::vector<int32_t> table;
    EXPECT_TRUE(kv.reserve(table, P).ok());
    SequenceStep step{prompt, 0, &table, true};
    if (media) step.media = {media, 1};
    StepOutput out;
    if (margins) {
      EXPECT_TRUE(cpu_model(m).forward({&step, 1}, kv.views(), {.record_router_margin = true}, out).ok());
      *margins = out.router_margin;
    } else {
      EXPECT_TRUE(step_rows(m, kv, {&step, 1}, out).ok());
    }
    return out.logits;
  };
  std::vector<float> own(count * hidden);
  ASSERT_TRUE(cpu.model->embed(prompt.data() + first, count, TensorView::contiguous(own.data(), DType::kF32, {count, hidden}, Device::cpu())).ok());
  const MediaRows same{first, count, own.data()};
  const std::vector<float> plain = run(gpu, nullptr);
  EXPECT_EQ(run(gpu, &same), plain) << "the tokens' own embeddings as media rows";

  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> random(count * hidden);
  for (float& v : random) v = normal(rng);
  const MediaRows other{first, count, random.data()};
  const std::vector<float> g = run(gpu, &other);
  std::vector<float> margins;
  const std::vector<float> c = run(cpu, &other, &margins);
  ASSERT_EQ(g.size(), c.size());
  ASSERT_EQ(static_cast<int64_t>(margins.size()), P);
  EXPECT_GT(relative_error(g.data() + (P - 1) * vocab, plain.data() + (P - 1) * vocab, vocab), 1e-2)
      << "random media rows left the last row's logits as they were";
  int64_t compared = 0;
  for (int64_t r = 0; r < P; ++r) {
    if (margins[r] < kRouterNearTie) continue;
    ++compared;
    EXPECT_LE(relative_error(g.data() + r * vocab, c.data() + r * vocab, vocab), kLogitsTolerance) << "row " << r;
  }
  EXPECT_GE(compared, P / 2);
}

// Media rows in a layer-major step: 12 rows across the boundary of two 40-row tiles. The tokens' own embeddings as media
// rows leave every logit as it was; random rows give the untiled step's logits (the tiled-vs-untiled measure above).
TEST(CudaModelMedia, MediaRowsAcrossPrefillTilesMatchTheUntiledStep) {
  LoadedModel gpu = load("glm4_moe_lite-tiny", "cuda");
  ASSERT_TRUE(gpu.on_gpu());
  auto* m = dynamic_cast<cuda::CudaMlaMoeModel*>(gpu.model.get());
  ASSERT_NE(m, nullptr);
  const int64_t vocab = gpu.info.vocab_size, hidden = gpu.info.hidden_size;
  const std::vector<int32_t> base = prompt_of("glm4_moe_lite-tiny");
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < 90; ++i) prompt.push_back(base[(i * 3) % base.size()]);
  const int64_t P = static_cast<int64_t>(prompt.size()), first = 34, count = 12;
  auto run = [&](int64_t tile, const MediaRows* media) {
    m->set_prefill_tile_rows(tile);
    TestKv kv(gpu, P + 4);
    std::vector<int32_t> table;
    EXPECT_TRUE(kv.reserve(table, P).ok());
    SequenceStep step{prompt, 0, &table, true};
    if (media) step.media = {media, 1};
    StepOutput out;
    EXPECT_TRUE(step_rows(gpu, kv, {&step, 1}, out).ok());
    return out.logits;
  };
  std::vector<float> own(count * hidden);  // the tokens' own embedding rows, from the CPU model (bf16-exact values)
  LoadedModel cpu = load("glm4_moe_lite-tiny", "cpu");
  ASSERT_TRUE(cpu.model->embed(prompt.data() + first, count, TensorView::contiguous(own.data(), DType::kF32, {count, hidden}, Device::cpu())).ok());
  const MediaRows same{first, count, own.data()};
  const std::vector<float> plain = run(40, nullptr);
  EXPECT_EQ(run(40, &same), plain) << "the tokens' own embeddings as media rows, in tiles";
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> random(count * hidden);
  for (float& v : random) v = normal(rng);
  const MediaRows other{first, count, random.data()};
  const std::vector<float> tiled = run(40, &other), whole = run(0, &other);
  ASSERT_EQ(tiled.size(), whole.size());
  ASSERT_EQ(static_cast<int64_t>(tiled.size()), P * vocab);
  EXPECT_GT(relative_error(tiled.data() + (P - 1) * vocab, plain.data() + (P - 1) * vocab, vocab), 1e-2)
      << "random media rows left the last row's logits as they were";
  std::vector<double> e;
  for (int64_t r = 0; r < P; ++r) e.push_back(relative_error(tiled.data() + r * vocab, whole.data() + r * vocab, vocab));
  const int64_t far = std::count_if(e.begin(), e.end(), [](double v) { return v > 2e-2; });
  std::printf("media rows across tiles: tiled vs untiled logits, median %.3g, %lld of %lld rows past 2e-2\n", median(e),
              static_cast<long long>(far), static_cast<long long>(P));
  EXPECT_LT(median(e), 1.5e-2);
  EXPECT_LE(far, P / 20);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel, ::testing::Values("glm4_moe_lite-tiny", "deepseek_v3-tiny", "glm_moe_dsa-tiny"));
// The DSA variants (tools/README.md): 3/4/5 indexer heads of 16/24/32, top-5..8, shared indexer layers, dense/sparse
// MLP patterns other than a prefix.
INSTANTIATE_TEST_SUITE_P(DsaVariants, CudaModel,
                         ::testing::Values("glm_moe_dsa-h5d32", "glm_moe_dsa-h3d16-shared", "glm_moe_dsa-h4d24-freq"));
// The config variants (tools/README.md) the CUDA runner takes: 3/4/5 heads, qk_nope != v_head, qk_rope 4, the direct
// q_proj path, 0/2 shared experts, top-1 and grouped routing, unnormalised weights, all-MoE and all-dense stacks, a
// tied lm_head, YaRN variants, linear and llama3 rope (tables built on the host, as for the CPU).
// glm4_moe_lite-dense-halves (rotate-half rope) is refused: see below.
INSTANTIATE_TEST_SUITE_P(ConfigVariants, CudaModel,
                         ::testing::Values("glm4_moe_lite-h3-qproj", "glm4_moe_lite-h5-yarn-groups", "deepseek_v3-qproj",
                                           "deepseek_v3-v2lite-yarn", "deepseek_v3-dense-tied",
                                           "deepseek_v3-linear-rope", "glm4_moe_lite-llama3-rope"));

// rope_interleave = false (rotate-half on the natural layout) runs on the CPU only: loading it for CUDA stops at
// CudaMlaMoeModel::supports with a message naming config.json and the option, before any device memory is touched.
TEST(CudaModelRefusals, RotateHalfRopeIsRefusedAtLoad) {
  const fs::path dir = model_dir("glm4_moe_lite-dense-halves");
  auto recipe = load_recipe("", {"model.path=" + dir.string(), "kv.layout=bf16", "model.device=cuda"}, global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find((dir / "config.json").string()), std::string::npos) << m.status().to_string();
  EXPECT_NE(m.status().message().find("rope_interleave = false is not supported by the CUDA runner"), std::string::npos)
      << m.status().to_string();
  // The CPU runs it (tests/model/reference_model_test.cpp compares it with transformers).
  EXPECT_TRUE(load("glm4_moe_lite-dense-halves", "cpu").model != nullptr);
}

// The trained tiny-glm (bf16 weights, real margins): 32 free-running greedy tokens on the CPU (in `cpu_precision`) and
// on the GPU for 8 prompts of different lengths (3 .. 38 tokens: both MLA forms), the GPU decoding all of them as
// one batch (a 164-row prefill step: the cuBLAS / grouped-GEMM paths; then 8-row decode steps).
struct TinyGlmRuns {
  static constexpr int64_t kNew = 32;
  static constexpr int kPrompts = 8;
  int64_t vocab = 0;
  std::vector<std::vector<int32_t>> want, got;                 // per prompt: the CPU's and the GPU's tokens
  std::vector<std::vector<std::vector<float>>> cpu_rows, gpu_rows;  // per prompt and step: the logits they came from
};

TinyGlmRuns run_tiny_glm(const std::string& cpu_precision) {
  constexpr int64_t kNew = TinyGlmRuns::kNew;
  constexpr int kPrompts = TinyGlmRuns::kPrompts;
  TinyGlmRuns runs;
  LoadedModel cpu = load_path(fs::path(KILN_SOURCE_DIR) / "models/tiny-glm", "cpu", "mmap", cpu_precision);
  LoadedModel gpu = load_path(fs::path(KILN_SOURCE_DIR) / "models/tiny-glm", "cuda", "mmap");
  EXPECT_TRUE(gpu.on_gpu());
  if (!gpu.on_gpu()) return runs;
  const int64_t vocab = runs.vocab = cpu.info.vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  auto& want = runs.want;
  auto& got = runs.got;
  auto& cpu_rows = runs.cpu_rows;
  auto& gpu_rows = runs.gpu_rows;
  want.resize(kPrompts), got.resize(kPrompts), cpu_rows.resize(kPrompts), gpu_rows.resize(kPrompts);
  for (int i = 0; i < kPrompts; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 3 + 5 * i; ++t) p.push_back((53 * t + 97 * i + 11) % static_cast<int32_t>(vocab - 2) + 2);
    prompts.push_back(p);
    auto kv = make_kv_cache(cpu, 96);
    std::vector<int32_t> table;
    EXPECT_TRUE(kv->reserve(table, 96).ok());
    cpu_rows[i] = decode_rows(
        [&](const SequenceStep& s, StepOutput& o) { return cpu_model(cpu).forward({&s, 1}, kv->views(), {}, o); }, p,
        table, kNew, want[i], true, vocab);
    cpu_rows[i].erase(cpu_rows[i].begin(), cpu_rows[i].begin() + static_cast<std::ptrdiff_t>(p.size()) - 1);
  }
  const int64_t per_seq = 96 / kBlockSize;
  TestKv gkv(gpu, per_seq * kPrompts * kBlockSize);
  std::vector<std::vector<int32_t>> tables(kPrompts);
  for (int i = 0; i < kPrompts; ++i)
    for (int64_t b = 0; b < per_seq; ++b) tables[i].push_back(static_cast<int32_t>(b * kPrompts + i));  // interleaved
  std::vector<SequenceStep> batch;
  for (int i = 0; i < kPrompts; ++i) batch.push_back({prompts[i], 0, &tables[i], false});
  StepOutput out;
  EXPECT_TRUE(step_rows(gpu, gkv, batch, out).ok());
  std::vector<int32_t> next(kPrompts);
  for (int s = 0; s < kNew; ++s) {
    batch.clear();
    for (int i = 0; i < kPrompts; ++i) {
      const float* row = out.logits.data() + out.first_row[i] * vocab;
      gpu_rows[i].emplace_back(row, row + vocab);
      next[i] = argmax(row, vocab);
      got[i].push_back(next[i]);
      batch.push_back({{&next[i], 1}, static_cast<int64_t>(prompts[i].size()) + s, &tables[i], false});
    }
    if (s + 1 < kNew) EXPECT_TRUE(step_rows(gpu, gkv, batch, out).ok());
  }
  return runs;
}

// Against the fp32 CPU: tokens must agree until a step whose CPU top-1 / top-2 gap is below twice the measured
// logits difference of that step (inputs still identical); how many prompts agree on all 32 tokens is reported.
TEST(CudaModelTinyGlm, FreeRunningGreedyMatchesTheCpuPath) {
  const TinyGlmRuns runs = run_tiny_glm("fp32");
  ASSERT_EQ(runs.got.size(), static_cast<size_t>(TinyGlmRuns::kPrompts));
  const int64_t vocab = runs.vocab;
  int identical = 0;
  for (int i = 0; i < TinyGlmRuns::kPrompts; ++i) {
    const auto& got = runs.got[i];
    const auto& want = runs.want[i];
    size_t d = 0;
    while (d < got.size() && got[d] == want[d]) ++d;
    if (d == got.size()) {
      ++identical;
      continue;
    }
    double diff = 0;
    for (int64_t v = 0; v < vocab; ++v)
      diff = std::max(diff, static_cast<double>(std::fabs(runs.gpu_rows[i][d][v] - runs.cpu_rows[i][d][v])));
    const double gap = top_gap(runs.cpu_rows[i][d].data(), vocab);
    std::printf("tiny-glm prompt %d: diverges at step %zu (CPU %d, GPU %d): CPU top-1/top-2 gap %.4g, logits |Δ| %.4g\n",
                i, d, want[d], got[d], gap, diff);
    EXPECT_LT(gap, 2 * diff) << "prompt " << i << ": greedy tokens differ at step " << d << " without a near-tie";
  }
  std::printf("tiny-glm: %d of %d prompts identical for all %lld greedy tokens\n", identical, TinyGlmRuns::kPrompts,
              static_cast<long long>(TinyGlmRuns::kNew));
}

// Against the CPU in bf16 precision: the same 32 tokens on every prompt but where a prompt's first differing step is
// a near-tie at the bf16 CPU's own noise level (its top-1 / top-2 gap below twice that step's measured logits
// difference, inputs still identical). That noise is not a missing rounding point: with the rounding points matched,
// fp32 summation order still moves a value across a bf16 rounding boundary now and then, and the model carries the
// bf16 step on (the CPU in bf16 against itself with ±4 fp32 ulps of jitter before each rounding point diverges on
// 4 of these 8 prompts, median row difference 5e-3 of max|logit|). Identical prompts, the median and worst logits
// difference relative to max|cpu| up to the first differing step, and each divergence are reported.
TEST(CudaModelTinyGlm, FreeRunningGreedyIsIdenticalToTheCpuInBf16Precision) {
  const TinyGlmRuns runs = run_tiny_glm("bf16");
  ASSERT_EQ(runs.got.size(), static_cast<size_t>(TinyGlmRuns::kPrompts));
  const int64_t vocab = runs.vocab;
  std::vector<double> errors;
  int identical = 0;
  for (int i = 0; i < TinyGlmRuns::kPrompts; ++i) {
    const auto& got = runs.got[i];
    const auto& want = runs.want[i];
    size_t d = 0;
    while (d < got.size() && got[d] == want[d]) ++d;
    for (size_t s = 0; s < std::min(d + 1, got.size()); ++s)
      errors.push_back(relative_error(runs.gpu_rows[i][s].data(), runs.cpu_rows[i][s].data(), vocab));
    if (d == got.size()) {
      ++identical;
      continue;
    }
    double diff = 0;
    for (int64_t v = 0; v < vocab; ++v)
      diff = std::max(diff, static_cast<double>(std::fabs(runs.gpu_rows[i][d][v] - runs.cpu_rows[i][d][v])));
    const double gap = top_gap(runs.cpu_rows[i][d].data(), vocab);
    std::printf("tiny-glm bf16 prompt %d: diverges at step %zu (CPU %d, GPU %d): CPU top-1/top-2 gap %.4g, logits "
                "|Δ| %.4g\n",
                i, d, want[d], got[d], gap, diff);
    EXPECT_LT(gap, 2 * diff) << "prompt " << i << ": greedy tokens differ at step " << d << " without a near-tie";
  }
  const double worst = errors.empty() ? 0 : *std::max_element(errors.begin(), errors.end());
  std::printf("tiny-glm bf16 CPU vs GPU: %d of %d prompts identical for all %lld greedy tokens; logits difference of "
              "max|cpu| up to the first differing step: median %.3g, worst %.3g\n",
              identical, TinyGlmRuns::kPrompts, static_cast<long long>(TinyGlmRuns::kNew), median(errors), worst);
}

TEST(CudaModelDummy, RandomWeightsAreMadeOnTheDeviceAndRunDeterministically) {
  LoadedModel a = load("glm4_moe_lite-tiny", "cuda", "dummy");
  LoadedModel b = load("glm4_moe_lite-tiny", "cuda", "dummy");
  ASSERT_TRUE(a.on_gpu());
  EXPECT_EQ(a.checkpoint, nullptr);
  EXPECT_GT(a.model->weight_bytes(), 0u);
  std::vector<int32_t> table = {0, 1, 2};
  const std::vector<int32_t> ids = {5, 9, 100, 7, 3};
  SequenceStep step{ids, 0, &table, false};
  StepOutput oa, ob;
  TestKv ka(a, 4 * kBlockSize), kb(b, 4 * kBlockSize);
  ASSERT_TRUE(step_rows(a, ka, {&step, 1}, oa).ok());
  ASSERT_TRUE(step_rows(b, kb, {&step, 1}, ob).ok());
  ASSERT_EQ(oa.logits.size(), static_cast<size_t>(a.info.vocab_size));
  EXPECT_TRUE(std::all_of(oa.logits.begin(), oa.logits.end(), [](float x) { return std::isfinite(x); }));
  EXPECT_EQ(oa.logits, ob.logits);
  EXPECT_GT(*std::max_element(oa.logits.begin(), oa.logits.end()), *std::min_element(oa.logits.begin(), oa.logits.end()));
  // Random weights are the CUDA runtime's: on the CPU the load is refused, naming the key.
  auto recipe = load_recipe("", {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "model.device=cpu",
                                 "model.load=dummy"},
                            global_registry());
  ASSERT_TRUE(recipe.ok());
  auto cpu = load_model(*recipe, global_registry());
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find("model.load"), std::string::npos) << cpu.status().message();
}

// The serving engine, unchanged, over the CUDA runner: concurrent requests (batched decode, chunked prefill)
// produce what one sequence at a time through the same runner produces.
TEST(CudaModelEngine, BatchedServingMatchesSingleSequenceGenerationOnTheGpu) {
  auto recipe = load_recipe("", {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "kv.layout=bf16",
                                 "kv.block_size=4", "model.device=cuda", "scheduler.max_model_len=128",
                                 "scheduler.max_num_seqs=4", "scheduler.max_num_batched_tokens=16"},
                            global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto loaded = load_model(*recipe, global_registry());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  LoadedModel& m = *loaded;
  ASSERT_TRUE(m.on_gpu());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 5 + 7 * i; ++t) p.push_back((37 * t + 101 * i + 3) % 4000 + 2);
    prompts.push_back(p);
  }
  constexpr int64_t kNew = 8;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) {
    std::vector<int32_t> tokens;
    gpu_decode_rows(m, p, kNew, tokens, true, m.info.vocab_size);
    expected.push_back(tokens);
  }
  auto started = start_engine(m, *recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::mutex mu;
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<std::promise<FinishReason>> done(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams rp;
    rp.prompt = prompts[i];
    rp.max_tokens = kNew;
    auto id = started->engine->submit(rp, [&, i](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e.token >= 0) got[i].push_back(e.token);
      if (e.finished) done[i].set_value(e.finish_reason);
      return true;
    });
    ASSERT_TRUE(id.ok()) << id.status().to_string();
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto f = done[i].get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    EXPECT_EQ(f.get(), FinishReason::kLength);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(got[i], expected[i]) << "request " << i;
  }
  started->engine->drain();
}

// scheduler.lone_prompt_tokens on the GPU: requests one after another, each prompt alone in the engine, go in one
// step (more than max_num_batched_tokens) that the runner takes layer by layer in tiles of 24 rows — the tokens are
// those of the same one-step prefill outside the engine.
TEST(CudaModelEngine, LonePromptsGoInOneTiledStepThroughTheEngine) {
  auto recipe = load_recipe("", {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "kv.layout=bf16",
                                 "kv.block_size=4", "model.device=cuda", "scheduler.max_model_len=160",
                                 "scheduler.max_num_seqs=4", "scheduler.max_num_batched_tokens=16",
                                 "scheduler.lone_prompt_tokens=128"},
                            global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto loaded = load_model(*recipe, global_registry());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  LoadedModel& m = *loaded;
  ASSERT_TRUE(m.on_gpu());
  auto* cm = dynamic_cast<cuda::CudaMlaMoeModel*>(m.model.get());
  ASSERT_NE(cm, nullptr);
  cm->set_prefill_tile_rows(24);
  constexpr int64_t kNew = 8;
  auto started = start_engine(m, *recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 70 + 40 * i; ++t) prompt.push_back((37 * t + 101 * i + 3) % 4000 + 2);
    std::vector<int32_t> expected;
    gpu_decode_rows(m, prompt, kNew, expected, true, m.info.vocab_size);
    std::vector<int32_t> got;
    std::promise<FinishReason> done;
    RequestParams rp;
    rp.prompt = prompt;
    rp.max_tokens = kNew;
    auto id = started->engine->submit(rp, [&](const TokenEvent& e) {
      if (e.token >= 0) got.push_back(e.token);
      if (e.finished) done.set_value(e.finish_reason);
      return true;
    });
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    auto f = done.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    EXPECT_EQ(f.get(), FinishReason::kLength);
    EXPECT_EQ(got, expected) << "prompt of " << prompt.size();
  }
  started->engine->drain();
}

// With the production attention widths (latent 512 + rope 64, so the tensor-core decode kernel runs), decode
// steps replayed from captured CUDA graphs give the logits of the same steps launched one kernel at a time.
// A two-layer model with the tensor-core decode kernel's widths (latent 512 + rope 64), dummy weights.
fs::path two_layer_model_dir() {
  const fs::path dir = fs::temp_directory_path() / "kiln_gpu_graph_model";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "glm4_moe_lite", "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 64, "num_hidden_layers": 2, "mlp_layer_types": ["dense", "sparse"], "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.8,
    "norm_topk_prob": true, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "rope_theta": 1000000.0, "rope_interleave": true,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 4096, "vocab_size": 1024, "tie_word_embeddings": false})";
  return dir;
}

TEST(CudaModelGraphs, GraphReplayMatchesDirectLaunches) {
  LoadedModel m = load_path(two_layer_model_dir(), "cuda", "dummy", "fp32", 64);
  ASSERT_TRUE(m.on_gpu());
  const int64_t vocab = 1024;
  std::vector<std::vector<float>> runs[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    m.model->set_graphs(graphs == 1);
    TestKv kv(m, 64 * 64);
    std::vector<int32_t> table_a = {3, 1, 5}, table_b = {0, 2, 4};
    std::vector<int32_t> prompt_a(70), prompt_b(5);
    for (size_t i = 0; i < prompt_a.size(); ++i) prompt_a[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
    for (size_t i = 0; i < prompt_b.size(); ++i) prompt_b[i] = static_cast<int32_t>((i * 53 + 7) % vocab);
    SequenceStep pre[2] = {{prompt_a, 0, &table_a, false}, {prompt_b, 0, &table_b, false}};
    StepOutput out;
    ASSERT_TRUE(step_rows(m, kv, pre, out).ok());
    runs[graphs].push_back(out.logits);
    int32_t ta = 1, tb = 2;
    for (int64_t s = 0; s < 60; ++s) {  // two sequences decoding together, past a block boundary
      SequenceStep dec[2] = {{{&ta, 1}, 70 + s, &table_a, false}, {{&tb, 1}, 5 + s, &table_b, false}};
      ASSERT_TRUE(step_rows(m, kv, dec, out, s % 7 == 0).ok());
      runs[graphs].push_back(out.logits);
      ta = argmax(out.logits.data(), vocab);
      tb = argmax(out.logits.data() + vocab, vocab);
    }
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    ASSERT_EQ(runs[0][i].size(), runs[1][i].size());
    EXPECT_LE(relative_error(runs[1][i].data(), runs[0][i].data(), runs[0][i].size()), 1e-5) << "step " << i;
  }
}

// The per-stage profile of directly launched steps: every block of the step is charged to a stage, the stages
// sum to the stream time, and graph replays (which cannot hold the events) are not profiled.
TEST(CudaModelProfile, StagesCoverTheStep) {
  LoadedModel m = load_path(two_layer_model_dir(), "cuda", "dummy", "fp32", 64);
  ASSERT_TRUE(m.on_gpu());
  m.model->set_graphs(false);
  m.model->set_step_profiling(true);
  TestKv kv(m, 16 * 64);
  std::vector<int32_t> table = {2, 0};
  int32_t token = 5;
  StepOutput out;
  for (int64_t pos = 0; pos < 3; ++pos) {
    SequenceStep step{{&token, 1}, pos, &table, false};
    ASSERT_TRUE(step_rows(m, kv, {&step, 1}, out).ok());
  }
  EXPECT_EQ(m.model->profiled_steps(), 3);
  std::vector<std::string> stages;
  for (const auto& [stage, ms] : m.model->step_profile()) {
    stages.push_back(stage);
    EXPECT_GE(ms, 0.0) << stage;
  }
  for (const char* want : {"embedding", "residual add + RMSNorm", "attention: projections, rope, cache write",
                           "attention: MLA decode kernel", "attention: o_proj", "dense MLP", "MoE: routed experts",
                           "final norm + lm_head"})
    EXPECT_NE(std::find(stages.begin(), stages.end(), want), stages.end()) << want;
  m.model->clear_step_profile();
  m.model->set_graphs(true);
  SequenceStep step{{&token, 1}, 3, &table, false};
  ASSERT_TRUE(step_rows(m, kv, {&step, 1}, out).ok());
  EXPECT_EQ(m.model->profiled_steps(), 0);
  m.model->set_step_profiling(false);
}

}  // namespace
}  // namespace kiln
