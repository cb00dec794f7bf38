// glm5_next in the feasibility screen (engine/glm5_next_memory.h): the weights predicted from config.json alone
// equal the fixtures' checkpoints summed tensor by tensor in the dtype each loads as (CUDA: bf16, but the tensors
// the model computes with in fp32; CPU: the mapped files plus its fp32 copies), the state slots are the KDA
// layers' recurrent + conv state per sequence, and the KV pool holds the DSA layers only.
#include "engine/glm5_next_memory.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "engine/engine_factory.h"
#include "engine/memory_model.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/arch/glm5_next/glm5_next_tensor_names.h"
#include "model/arch/glm5_next/glm5_next_weight_inventory.h"
#include "model/checkpoint.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {

using testing::model_dir;

const std::vector<std::string> kFixtures = {"glm5_next-tiny",    "glm5_next-flat",    "glm5_next-shared",
                                            "glm5_next-mtp-dsa", "glm5_next-mtp-kda", "glm5_next-mtp-plain"};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// specs/glm5-next.md: kept in fp32 at load (conv, dt_bias, A_log, the router's bias) and computed with in fp32 (the
// mHC maps, the router, o_norm's RMSNormGated, the indexer's key LayerNorm, ape and compress gate), under either
// naming scheme. Written here from the spec, apart from the loaders, so the two are checked against each other.
bool loads_fp32(const std::string& n) {
  for (const char* part : {".hc_attn_", ".hc_ffn_", ".attn_hc.", ".ffn_hc."})
    if (contains(n, part)) return true;
  for (const char* tail :
       {"conv1d.weight", ".dt_bias", ".A_log", ".o_norm.weight", ".indexer.k_norm.weight", ".indexer.k_norm.bias",
        ".index_kpool_compress_ape", ".index_kpool_compress_gate", ".mlp.gate.weight", ".e_score_correction_bias"})
    if (ends_with(n, tail)) return true;
  return false;
}
// The RMSNorm weights (bf16 on CUDA, fp32 copies on the CPU); o_norm and the indexer's k_norm are fp32 above.
bool is_norm(const std::string& n) {
  return !loads_fp32(n) && (ends_with(n, "layernorm.weight") || ends_with(n, "norm.weight"));
}

struct Fixture {
  std::unique_ptr<Architecture> architecture;
  std::unique_ptr<Checkpoint> ckpt;
  const glm5_next::Glm5NextConfig& config() const {
    return dynamic_cast<const arch::Glm5NextArchitecture&>(*architecture).config();
  }
};

Fixture open_fixture(const std::string& name) {
  Fixture f;
  auto a = load_architecture(model_dir(name) / "config.json");
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  f.architecture = std::move(a).value();
  auto c = Checkpoint::open(model_dir(name));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  f.ckpt = std::move(c).value();
  return f;
}

// The layer a trunk tensor belongs to, either naming scheme, or −1.
int64_t layer_of(const std::string& n) {
  for (const std::string p : {"model.language_model.layers.", "model.layers."})
    if (n.rfind(p, 0) == 0) return std::stoll(n.substr(p.size()));
  return -1;
}

// What the checkpoint holds that a model loads: no vision tower (its own term), next-n layers only when loaded.
std::vector<std::string> loaded_names(const Fixture& f, bool with_mtp) {
  const glm5_next::Glm5NextConfig& c = f.config();
  const int64_t layers = c.num_hidden_layers + (with_mtp ? static_cast<int64_t>(c.mtp.size()) : 0);
  std::vector<std::string> out;
  for (const std::string& n : f.ckpt->names())
    if (!contains(n, "visual.") && layer_of(n) < layers) out.push_back(n);
  return out;
}

uint64_t numel(const Fixture& f, const std::string& n) {
  return static_cast<uint64_t>(f.ckpt->get(n)->numel());
}

// DSA layers loaded, and what the runner derives per layer beyond the checkpoint's tensors.
int64_t dsa_layers(const glm5_next::Glm5NextConfig& c, bool with_mtp) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) n += c.is_kda(l) ? 0 : 1;
  if (with_mtp)
    for (const auto& m : c.mtp) n += m.attention == glm5_next::AttentionKind::kDsa ? 1 : 0;
  return n;
}

TEST(Glm5NextMemory, CudaWeightsEqualTheCheckpointInTheDtypesTheyLoadAs) {
  for (const std::string& name : kFixtures)
    for (bool with_mtp : {false, true}) {
      SCOPED_TRACE(name + (with_mtp ? " with next-n layers" : ""));
      const Fixture f = open_fixture(name);
      const glm5_next::Glm5NextConfig& c = f.config();
      ASSERT_TRUE(f.ckpt->names().size() > 0);
      ASSERT_FALSE(c.tie_word_embeddings);  // a tied head would be uploaded twice: not in these fixtures
      uint64_t expected = 0;
      for (const std::string& n : loaded_names(f, with_mtp)) expected += numel(f, n) * (loads_fp32(n) ? 4 : 2);
      // Derived, in no checkpoint: W_UK transposed [heads, latent, nope] bf16 per DSA layer.
      expected +=
          static_cast<uint64_t>(dsa_layers(c, with_mtp) * c.num_attention_heads * c.kv_lora_rank * c.qk_nope_head_dim) *
          2;

      const glm5_next::Glm5NextTensorNames names(*f.ckpt);
      const WeightBytes w = glm5_next_cuda_weight_bytes(c, &names, names.trunk_prefix(), "dense", 4, false, with_mtp);
      EXPECT_EQ(w.low, expected) << w.basis;
      // The interval: at most 256-byte alignment per tensor the loaders ask for (each expert its own; stacked
      // projections and expert sets are fewer allocations, not more) and per W_UK.
      uint64_t asked = static_cast<uint64_t>(dsa_layers(c, with_mtp));
      for (const auto& it : glm5_next::glm5_next_weight_inventory(c, names.trunk_prefix(), with_mtp).items)
        asked += static_cast<uint64_t>(it.count);
      EXPECT_GE(w.high, w.low);
      EXPECT_LE(w.high - w.low, 256 * asked);

      // From config.json alone (model.load = "dummy", which loads no next-n layers): the same trunk.
      if (!with_mtp) {
        const WeightBytes dummy = glm5_next_cuda_weight_bytes(c, nullptr, names.trunk_prefix(), "dense", 4, false, false);
        EXPECT_EQ(dummy.low, expected);
      }
    }
}

TEST(Glm5NextMemory, Exl3DummyPricesProjectionsAtTheBitsAndKeepsDenseCopiesWhereTheRunnerNeedsThem) {
  // model.load = "dummy" with weights.format = "exl3": every projection and expert K bits per weight plus fp16 sign
  // vectors (up to 128-padded dimensions), and the runner's dense bf16 copies of each kv_b and of the embedding.
  const Fixture f = open_fixture("glm5_next-tiny");
  const glm5_next::Glm5NextConfig& c = f.config();
  const auto inv = glm5_next::glm5_next_weight_inventory(c, "model.language_model.", false);
  uint64_t low = 0;
  for (const auto& it : inv.items) {
    const uint64_t n = static_cast<uint64_t>(it.count);
    if (it.held == glm5_next::WeightHeld::kFp32)
      low += 4 * static_cast<uint64_t>(it.numel());
    else if (it.held == glm5_next::WeightHeld::kNorm)
      low += 2 * static_cast<uint64_t>(it.numel());
    else
      low += n * (static_cast<uint64_t>(it.out * it.in * 3 + 7) / 8 + 2 * static_cast<uint64_t>(it.in + it.out));
  }
  const uint64_t dsa = static_cast<uint64_t>(dsa_layers(c, false));
  low += dsa * static_cast<uint64_t>(inv.w_uk_numel + inv.kv_b_numel) * 2;  // W_UK, kv_b dequantized
  low += static_cast<uint64_t>(c.vocab_size * c.hidden_size) * 2;           // the embedding dequantized
  const WeightBytes w = glm5_next_cuda_weight_bytes(c, nullptr, "model.language_model.", "exl3", 3, false, false);
  EXPECT_EQ(w.low, low) << w.basis;
  EXPECT_GT(w.high, w.low);  // each dimension padded to 128 at most
  EXPECT_NE(w.basis.find("3 bits per weight"), std::string::npos) << w.basis;
}

TEST(Glm5NextMemory, Exl3DummyExpertsOnlyPricesTheRoutedExpertsAtTheBitsAndTheRestBf16) {
  // weights.experts_only: the routed experts K bits per weight plus sign vectors; every other projection bf16 through
  // the built-in format, so no dense copy of kv_b or the embedding is derived.
  const Fixture f = open_fixture("glm5_next-tiny");
  const glm5_next::Glm5NextConfig& c = f.config();
  const auto inv = glm5_next::glm5_next_weight_inventory(c, "model.language_model.", false);
  uint64_t low = 0;
  int routed = 0;
  for (const auto& it : inv.items) {
    const uint64_t n = static_cast<uint64_t>(it.count);
    const bool expert = it.name_of(0).find(".mlp.experts.") != std::string::npos;
    if (it.held == glm5_next::WeightHeld::kFp32)
      low += 4 * static_cast<uint64_t>(it.numel());
    else if (it.held == glm5_next::WeightHeld::kNorm || !expert)
      low += 2 * static_cast<uint64_t>(it.numel());
    else
      low += n * (static_cast<uint64_t>(it.out * it.in * 3 + 7) / 8 + 2 * static_cast<uint64_t>(it.in + it.out)),
          ++routed;
  }
  ASSERT_GT(routed, 0);
  low += static_cast<uint64_t>(dsa_layers(c, false)) * static_cast<uint64_t>(inv.w_uk_numel) * 2;  // W_UK only
  const WeightBytes w = glm5_next_cuda_weight_bytes(c, nullptr, "model.language_model.", "exl3", 3, true, false);
  EXPECT_EQ(w.low, low) << w.basis;
  EXPECT_NE(w.basis.find("routed experts at 3 bits per weight"), std::string::npos) << w.basis;
  const WeightBytes all = glm5_next_cuda_weight_bytes(c, nullptr, "model.language_model.", "exl3", 3, false, false);
  EXPECT_GT(w.low, all.low);  // the non-expert projections now bf16
}

// Tensor parallelism on CUDA (load_glm5_next_gpu_weights with a shard): each rank is priced with its part — half the
// routed experts each, the shared expert on the last rank alone, and the split projections' rows. On glm5_next-tiny
// every split unit (2 DSA heads, 2 KDA heads, vocabulary 512, intermediate 48, 8 experts) divides by 2, so the two
// ranks differ by exactly the shared experts' bytes.
TEST(Glm5NextMemory, CudaRanksArePricedWithTheirShards) {
  const Fixture f = open_fixture("glm5_next-tiny");
  const glm5_next::Glm5NextConfig& c = f.config();
  const glm5_next::Glm5NextTensorNames names(*f.ckpt);
  const std::string prefix = names.trunk_prefix();
  const WeightBytes whole = glm5_next_cuda_weight_bytes(c, &names, prefix, "dense", 4, false, false);
  const WeightBytes r0 = glm5_next_cuda_weight_bytes(c, &names, prefix, "dense", 4, false, false, TensorShard{0, 2});
  const WeightBytes r1 = glm5_next_cuda_weight_bytes(c, &names, prefix, "dense", 4, false, false, TensorShard{1, 2});
  ASSERT_GT(whole.routed_experts, 0u);
  EXPECT_EQ(r0.routed_experts * 2, whole.routed_experts);
  EXPECT_EQ(r1.routed_experts * 2, whole.routed_experts);
  EXPECT_LT(r1.low, whole.low);
  uint64_t shared = 0;
  for (const std::string& n : loaded_names(f, false))
    if (contains(n, ".shared_experts.")) shared += 2 * numel(f, n);
  ASSERT_GT(shared, 0u);
  EXPECT_EQ(r1.low - r0.low, shared);
  // What is split is held once over the ranks, the rest by each: the ranks together hold more than one GPU.
  EXPECT_GT(r0.low + r1.low, whole.low);
  // From config.json alone (dummy EXL3 experts): the experts split alike.
  const WeightBytes d = glm5_next_cuda_weight_bytes(c, nullptr, prefix, "exl3", 3, true, false);
  const WeightBytes d0 = glm5_next_cuda_weight_bytes(c, nullptr, prefix, "exl3", 3, true, false, TensorShard{0, 2});
  EXPECT_EQ(d0.routed_experts * 2, d.routed_experts);
}

TEST(Glm5NextMemory, CpuWeightsAreTheMappedFilesAndTheCopiesTheModelMakes) {
  for (const std::string& name : kFixtures)
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(name + (bf16 ? " bf16 precision" : ""));
      const Fixture f = open_fixture(name);
      const glm5_next::Glm5NextConfig& c = f.config();
      uint64_t files = 0;
      for (const auto& file : f.ckpt->files()) files += std::filesystem::file_size(file);
      uint64_t expected = files;
      for (const std::string& n : loaded_names(f, false)) {
        if (loads_fp32(n) || is_norm(n)) expected += 4 * numel(f, n);  // fp32 copies
        if (bf16 && !loads_fp32(n)) expected += 2 * numel(f, n);       // the fixtures are F32: rounded copies
      }
      // kv_b in fp32 per DSA layer, for the absorbed attention.
      expected += static_cast<uint64_t>(dsa_layers(c, false) * c.num_attention_heads *
                                        (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank) *
                  4;
      const glm5_next::Glm5NextTensorNames names(*f.ckpt);
      const WeightBytes w = glm5_next_cpu_weight_bytes(c, names, names.trunk_prefix(), files, bf16, false);
      // Low: the files (the copies come from a heap that may reuse freed memory); high: the copies too, each with
      // at most a page of allocator slack (a norm has two in bf16 precision: its fp32 and its rounded copy).
      uint64_t asked = static_cast<uint64_t>(dsa_layers(c, false));
      for (const auto& it : glm5_next::glm5_next_weight_inventory(c, names.trunk_prefix(), false).items)
        asked += static_cast<uint64_t>(it.count);
      EXPECT_EQ(w.low, files) << w.basis;
      EXPECT_GE(w.high, expected) << w.basis;
      EXPECT_LE(w.high - expected, 2 * 4096 * asked) << w.basis;
    }
}

TEST(Glm5NextMemory, VisionTowerIsItsCheckpointTensorsInFp32) {
  const Fixture f = open_fixture("glm5_next-tiny");
  uint64_t expected = 0;
  for (const std::string& n : f.ckpt->names())
    if (n.rfind("model.visual.", 0) == 0) expected += 4 * numel(f, n);
  ASSERT_GT(expected, 0u);
  std::ifstream in(model_dir("glm5_next-tiny") / "config.json");
  EXPECT_EQ(glm5_next_vision_bytes(nlohmann::json::parse(in)), expected);
  // No vision_config, no tower.
  std::ifstream plain(model_dir("glm5_next-mtp-plain") / "config.json");
  EXPECT_EQ(glm5_next_vision_bytes(nlohmann::json::parse(plain)), 0u);
}

const MemoryTerm* find_term(const MemoryModel& m, const std::string& name) {
  for (const MemoryTerm& t : m.terms)
    if (t.name == name) return &t;
  return nullptr;
}

Recipe tiny_recipe(std::vector<std::string> sets = {}) {
  auto r =
      load_recipe(std::string(KILN_SOURCE_DIR) + "/tests/data/recipes/glm5_next_tiny.toml", sets, global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(Glm5NextMemory, ScreenItemisesStateSlotsAndKeepsKvToTheDsaLayers) {
  const Fixture f = open_fixture("glm5_next-tiny");
  const glm5_next::Glm5NextConfig& c = f.config();
  auto m = screen_memory(tiny_recipe({"scheduler.max_num_seqs=3"}), global_registry());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const MemoryTerm* weights = find_term(*m, "weights");
  ASSERT_NE(weights, nullptr);
  EXPECT_FALSE(weights->approximate);
  EXPECT_NE(weights->basis.find("itemised"), std::string::npos) << weights->basis;

  // A slot and its snapshot per sequence; per KDA layer the recurrent state heads × d_k × d_v and the last
  // kernel − 1 inputs of q, k and v, fp32.
  int64_t kda = 0, dsa_indexed = 0, dsa = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    kda += c.is_kda(l) ? 1 : 0;
    dsa += c.is_kda(l) ? 0 : 1;
    dsa_indexed += c.runs_indexer(l) ? 1 : 0;
  }
  const uint64_t per_layer = 4 * static_cast<uint64_t>(c.linear_num_heads * c.linear_head_dim * c.linear_head_dim +
                                                       (c.linear_conv_kernel_dim - 1) * 3 * c.kda_channels());
  const MemoryTerm* state = find_term(*m, "state slots");
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->low, 2 * 3 * static_cast<uint64_t>(kda) * per_layer);
  EXPECT_EQ(state->high, state->low);
  EXPECT_NE(state->basis.find(std::to_string(kda) + " kda_state slots"), std::string::npos) << state->basis;
  // KV per token: the DSA layers' bf16 latent (no rope part), and on indexed layers the indexer's key and gate
  // rows (fp32) and the pool keys' share.
  const uint64_t expected_bpt = static_cast<uint64_t>(dsa * 2 * c.kv_lora_rank) +
                                static_cast<uint64_t>(dsa_indexed) *
                                    (2 * 4 * static_cast<uint64_t>(c.index_head_dim) + c.pool_key_bytes_per_token());
  EXPECT_EQ(m->inputs.kv_bytes_per_token, expected_bpt);
}

TEST(Glm5NextMemory, TinyModelOnCpuMeasuresWithinItsInterval) {
  const Recipe recipe = tiny_recipe();
  auto screen = screen_memory(recipe, global_registry());
  ASSERT_TRUE(screen.ok()) << screen.status().to_string();
  EXPECT_TRUE(screen->go) << screen->report();
  auto model = load_model(recipe, global_registry(), model_load_options(recipe));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto started = start_engine(*model, recipe, {}, &*screen);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  const MeasuredMemory measured = measure_memory(*screen, false, checkpoint_bytes(*model));
  EXPECT_TRUE(memory_within(*screen, measured)) << memory_comparison(*screen, measured) << "\n" << screen->report();
  started->engine->drain();
}

TEST(Glm5NextMemory, CudaRecipeScreenedWithoutAGpuPricesTheItemisedWeights) {
  // Planning a CUDA run here: the device's memory given, the weights term as the CUDA runner holds them.
  ScreenOptions o;
  o.memory_bytes = 80ull << 30;
  auto m = screen_memory(tiny_recipe({"model.device=cuda"}), global_registry(), o);
  if (!m.ok()) GTEST_SKIP() << m.status().to_string();
  if (!m->inputs.cuda) GTEST_SKIP() << "screened for the CPU";
  const Fixture f = open_fixture("glm5_next-tiny");
  const glm5_next::Glm5NextTensorNames names(*f.ckpt);
  const WeightBytes w = glm5_next_cuda_weight_bytes(f.config(), &names, names.trunk_prefix(), "dense", 4, false, false);
  const MemoryTerm* weights = find_term(*m, "weights");
  ASSERT_NE(weights, nullptr);
  EXPECT_EQ(weights->low, w.low);
  EXPECT_EQ(weights->high, w.high);
  EXPECT_TRUE(m->go) << m->report();
}

}  // namespace
}  // namespace kiln
