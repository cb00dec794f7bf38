// What the draft-dflash2 tests share: the plugin, the tiny target and the shipped drafter, and random DFlash
// checkpoints written as safetensors.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_factory.h"
#include "engine_harness.h"
#include "model/model_loader.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::testing {

namespace dflash_paths {
namespace fs = std::filesystem;
inline const fs::path kTarget = fs::path(KILN_SOURCE_DIR) / "models/tiny-glm";
inline const fs::path kDrafter = fs::path(KILN_SOURCE_DIR) / "models/tiny-glm-dflash2";
}  // namespace dflash_paths
using dflash_paths::kDrafter;
using dflash_paths::kTarget;

inline void load_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(std::filesystem::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-draft-dflash2.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-draft-dflash2 target)";
}

// The tiny target drafting with `method` from checkpoint `draft` at `depth`: `settings` (device, KV, scheduler) first,
// then the speculative keys, then `extra`.
inline Recipe drafting_recipe(std::vector<std::string> settings, const std::string& method,
                              const std::filesystem::path& draft, int depth, const std::vector<std::string>& extra) {
  load_plugin();
  settings.insert(settings.begin(), "model.path=" + kTarget.string());
  settings.push_back("speculative.method=" + method);
  settings.push_back("speculative.depth=" + std::to_string(depth));
  settings.push_back("speculative.draft_model=" + draft.string());
  settings.insert(settings.end(), extra.begin(), extra.end());
  auto r = load_recipe("", settings, global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

inline LoadedModel load(const Recipe& recipe) {
  auto m = load_model(recipe, global_registry(), model_load_options(recipe));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// The tokens each request generates through an engine started from `recipe` (on its model's device), and the
// engine's metrics once idle.
inline std::vector<std::vector<int32_t>> engine_outputs(const Recipe& recipe,
                                                        const std::vector<std::vector<int32_t>>& prompts,
                                                        const std::vector<int64_t>& lengths, EngineMetrics& metrics) {
  LoadedModel m = load(recipe);
  std::vector<std::vector<int32_t>> tokens;
  auto started = start_engine(m, recipe);
  EXPECT_TRUE(started.ok()) << started.status().to_string();
  if (!started.ok()) return tokens;
  for (const Outcome& o : run_requests(*started->engine, prompts, lengths)) tokens.push_back(o.tokens);
  metrics = wait_idle(*started->engine);
  started->engine->drain();
  return tokens;
}

// A safetensors file of fp32 tensors.
inline void write_safetensors(const std::filesystem::path& file, const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& t) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, v] : t) {
    header[name] = {{"dtype", "F32"}, {"shape", v.first}, {"data_offsets", {offset, offset + v.second.size() * 4}}};
    offset += v.second.size() * 4;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(file, std::ios::binary);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, v] : t) out.write(reinterpret_cast<const char*>(v.second.data()), static_cast<std::streamsize>(v.second.size() * 4));
}

// The target a random checkpoint drafts for: the tiny target (models/tiny-glm) unless a test names another.
struct DraftTarget {
  int64_t hidden = 256, vocab = 4096, layers = 6;
  std::vector<int> taps = {1, 4};
  int64_t mask_token = 4061;
  int64_t heads = 4, kv_heads = 2, head_dim = 64;  // the drafter's attention (hidden = the target's)
};

// A random DFlash (v1, or v2 with identity convs) checkpoint: `layers` layers for `target` (default the tiny target).
struct RandomCheckpoint {
  nlohmann::json config;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors;

  RandomCheckpoint(bool v2, int layers = 1, bool model_prefix = false, const DraftTarget& target = {}) {
    const int64_t H = target.hidden, I = target.hidden, nh = target.heads, nkv = target.kv_heads, hd = target.head_dim,
                  V = target.vocab, T = 2, G = H / 16, R = 16, taps = static_cast<int64_t>(target.taps.size());
    config = {{"architectures", {v2 ? "DFlash2DraftModel" : "DFlashDraftModel"}},
              {"hidden_size", H}, {"intermediate_size", I}, {"num_hidden_layers", layers},
              {"num_attention_heads", nh}, {"num_key_value_heads", nkv}, {"head_dim", hd}, {"hidden_act", "silu"},
              {"rms_norm_eps", 1e-6}, {"vocab_size", V}, {"rope_theta", 10000.0}, {"num_target_layers", target.layers},
              {"tie_word_embeddings", false},
              {"layer_types", nlohmann::json::array()}, {"sliding_window", 6}, {"use_sliding_window", true}, {"is_causal", false},
              {"dflash_config", {{"target_layer_ids", target.taps}, {"mask_token_id", target.mask_token}, {"block_size", 8}}}};
    for (int i = 0; i < layers; ++i) config["layer_types"].push_back("sliding_attention");
    if (v2) {
      config["dflash_config"]["conv_kernel_size"] = T;
      config["dflash_config"]["conv_group_size"] = 16;
      config["dflash_config"]["selector_rank"] = R;
      config["dflash_config"]["selector_top_k"] = 16;
    }
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    const std::string pre = model_prefix ? "model." : "";
    auto add = [&](const std::string& name, std::vector<int64_t> shape, float fill = NAN) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = std::isnan(fill) ? nd(rng) : fill;
      tensors[pre + name] = {shape, v};
    };
    add("fc.weight", {H, taps * H});
    add("hidden_norm.weight", {H}, 1.0f);
    add("norm.weight", {H}, 1.0f);
    for (int i = 0; i < layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", {H}, 1.0f);
      add(p + "post_attention_layernorm.weight", {H}, 1.0f);
      add(p + "self_attn.q_proj.weight", {nh * hd, H});
      add(p + "self_attn.k_proj.weight", {nkv * hd, H});
      add(p + "self_attn.v_proj.weight", {nkv * hd, H});
      add(p + "self_attn.o_proj.weight", {H, nh * hd});
      add(p + "self_attn.q_norm.weight", {hd}, 1.0f);
      add(p + "self_attn.k_norm.weight", {hd}, 1.0f);
      add(p + "mlp.gate_proj.weight", {I, H});
      add(p + "mlp.up_proj.weight", {I, H});
      add(p + "mlp.down_proj.weight", {H, I});
      if (v2)
        for (const char* conv : {"attention_conv", "mlp_conv"}) {
          add(p + conv + ".base_kernel", {2, T, H});
          add(p + conv + ".kernel_projection.weight", {2 * T * G, H});
        }
    }
    if (v2) {
      add("candidate_selector.hidden_projection.weight", {R, H});
      add("candidate_selector.predecessor_codebook", {V, R});
      add("candidate_selector.successor_codebook", {V, R});
    }
  }

  std::filesystem::path write(const std::string& name) const {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kiln-dflash-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(2);
    write_safetensors(dir / "model.safetensors", tensors);
    return dir;
  }
};

}  // namespace kiln::testing
