// A random glm5_next checkpoint at the shapes glm5_next's CUDA runner takes (KDA heads of 128, 4 mHC streams,
// 128-wide indexer keys, pools of 16), varied where they are free: written once per shape into a temporary directory.
// Shared by the CUDA runner's tests (tests/gpu/glm5_next_cuda_test.cpp) and the drafters' GPU tests that need a
// hyper-connected target (plugins/draft-dflash2/tests).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/safetensors_writer.h"

namespace kiln::testing::glm5_gpu {
namespace fs = std::filesystem;

inline constexpr int64_t kVocab = 512, kHidden = 64, kBlock = 16;
// The projections' spread: gains near 0.5 per linear keep the random network from amplifying bf16 rounding into
// chaos over six layers and 180 positions, which would hide a real mismatch among noise.
inline constexpr float kProj = 0.06f;

// The pooled indexer's top-k: 2 pools of 16 (selection decides from position 48 on), or 256 (dense over these
// prompts: every pool selected).
inline constexpr int64_t kSparseTopK = 32, kDenseTopK = 256;

// A random glm5_next checkpoint (transformers' names, fp32) in a fresh directory; the weights do not depend on
// index_topk.
// The next-n (MTP) layer a checkpoint carries after its 6 trunk layers (layer 6), by its layout.
enum class Mtp { kNone, kDsaHyperConnected, kKdaPlain };

// The trunk's layers, one letter each: k / K a KDA layer with a dense MLP / a MoE; d / D a DSA layer with its own
// indexer and a dense MLP / a MoE; S a DSA layer with a MoE that shares the previous DSA layer's indexer.
inline constexpr const char* kTrunkLayers = "kDKkDS";

inline fs::path write_checkpoint(int64_t index_topk = kSparseTopK, Mtp mtp = Mtp::kNone,
                          const std::string& layers = kTrunkLayers) {
  static std::map<std::tuple<int64_t, Mtp, std::string>, fs::path> dirs;
  if (auto it = dirs.find({index_topk, mtp, layers}); it != dirs.end()) return it->second;
  const fs::path dir = [&] {
    const fs::path d = fs::temp_directory_path() /
                       ("kiln_glm5_next_gpu_" + std::to_string(::getpid()) + "_" + std::to_string(index_topk) + "_" +
                        std::to_string(static_cast<int>(mtp)) + "_" + layers);
    fs::create_directories(d);
    nlohmann::json layer_types = nlohmann::json::array(), mlp_types = nlohmann::json::array(),
                   indexer_types = nlohmann::json::array();
    for (char k : layers) {
      layer_types.push_back(k == 'k' || k == 'K' ? "linear_attention" : "deepseek_sparse_attention");
      mlp_types.push_back(k == 'k' || k == 'd' ? "dense" : "sparse");
      indexer_types.push_back(k == 'S' ? "shared" : "full");
    }
    nlohmann::json text = {
        {"model_type", "glm5_next_text"}, {"vocab_size", kVocab}, {"hidden_size", kHidden},
        {"intermediate_size", 96}, {"moe_intermediate_size", 32},
        {"num_hidden_layers", static_cast<int64_t>(layers.size())},
        {"num_attention_heads", 2}, {"num_key_value_heads", 2}, {"q_lora_rank", 64}, {"kv_lora_rank", 128},
        {"qk_nope_head_dim", 32}, {"v_head_dim", 32}, {"n_routed_experts", 8}, {"n_shared_experts", 1},
        {"num_experts_per_tok", 2}, {"max_position_embeddings", 4096}, {"pad_token_id", 0},
        {"tie_word_embeddings", false},
        {"layer_types", layer_types}, {"mlp_layer_types", mlp_types}, {"indexer_types", indexer_types},
        {"linear_num_heads", 2}, {"linear_head_dim", 128}, {"linear_conv_kernel_dim", 4},
        {"linear_lower_bound", -5.0}, {"hc_mult", 4}, {"index_n_heads", 4}, {"index_head_dim", 128},
        {"index_kpool", 16}, {"index_topk", index_topk}};
    nlohmann::json config = {{"model_type", "glm5_next"},
                             {"architectures", {"Glm5NextForConditionalGeneration"}},
                             {"text_config", text},
                             {"tie_word_embeddings", false}};
    std::ofstream(d / "config.json") << config.dump(2);

    std::mt19937 rng(5309);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> uniform(0.f, 1.f);
    std::vector<testing::TensorSpec> specs;
    // values = offset + spread · N(0, 1) (or U(0, 1) with `uni`)
    auto add = [&](const std::string& name, std::vector<int64_t> shape, float spread, float offset = 0.f,
                   bool uni = false) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      std::vector<float> v(n);
      for (float& x : v) x = offset + spread * (uni ? uniform(rng) : normal(rng));
      specs.push_back({name, "F32", std::move(shape), testing::raw_bytes(v)});
    };
    const std::string m = "model.language_model.";
    add(m + "embed_tokens.weight", {kVocab, kHidden}, 0.1f);
    // One decoder layer: KDA or DSA (with an indexer of its own or not), MoE or dense, hyper-connections or not.
    auto add_layer = [&](int l, bool kda, bool indexer, bool moe, bool hc) {
      const std::string p = m + "layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {kHidden}, 0.1f, 1.f);
      add(p + "post_attention_layernorm.weight", {kHidden}, 0.1f, 1.f);
      for (const char* site : {"hc_attn_", "hc_ffn_"}) {
        if (!hc) break;
        add(p + site + "fn", {24, 4 * kHidden}, 0.1f);
        add(p + site + "base", {24}, 0.5f);
        add(p + site + "scale", {3}, 1.f, 0.5f, true);
      }
      const std::string a = p + "self_attn.";
      if (kda) {
        for (const char* x : {"q", "k", "v"}) {
          add(a + x + "_proj.weight", {256, kHidden}, kProj);
          add(a + x + "_conv1d.weight", {256, 1, 4}, 0.5f);
        }
        add(a + "f_a_proj.weight", {128, kHidden}, kProj);
        add(a + "f_b_proj.weight", {256, 128}, kProj);
        add(a + "dt_bias", {256}, 0.5f);
        add(a + "A_log", {2}, 0.5f);
        add(a + "b_proj.weight", {2, kHidden}, kProj);
        add(a + "g_a_proj.weight", {128, kHidden}, kProj);
        add(a + "g_b_proj.weight", {256, 128}, kProj);
        add(a + "o_norm.weight", {128}, 0.1f, 1.f);
        add(a + "o_proj.weight", {kHidden, 256}, kProj);
      } else {
        add(a + "q_a_proj.weight", {64, kHidden}, kProj);
        add(a + "q_a_layernorm.weight", {64}, 0.1f, 1.f);
        add(a + "q_b_proj.weight", {64, 64}, kProj);
        add(a + "kv_a_proj_with_mqa.weight", {128, kHidden}, kProj);
        add(a + "kv_a_layernorm.weight", {128}, 0.1f, 1.f);
        add(a + "kv_b_proj.weight", {128, 128}, kProj);
        add(a + "o_proj.weight", {kHidden, 64}, kProj);
        if (indexer) {
          const std::string ix = a + "indexer.";
          add(ix + "wq_b.weight", {512, 64}, kProj);
          add(ix + "wk.weight", {128, kHidden}, kProj);
          add(ix + "k_norm.weight", {128}, 0.1f, 1.f);
          add(ix + "k_norm.bias", {128}, 0.1f);
          add(ix + "weights_proj.weight", {4, kHidden}, kProj);
          add(ix + "index_kpool_compress_ape", {16, 128}, 0.5f);
          add(ix + "index_kpool_compress_gate", {128, kHidden}, kProj);
        }
      }
      if (moe) {
        // Routing by a near-tie flips an expert under bf16 rounding, a different function rather than an error,
        // and random routers over 8 experts tie often. The correction bias (which picks experts but does not
        // weigh them) sends every token to two experts of the layer's own by a wide margin; the weights are
        // still the tokens' own normalised sigmoid scores × 2.5, through the device's routing and combine.
        add(p + "mlp.gate.weight", {8, kHidden}, kProj);
        std::vector<float> bias(8);
        for (float& b : bias) b = 0.1f * normal(rng);
        bias[(2 * l) % 8] += 5.f, bias[(2 * l + 3) % 8] += 5.f;
        specs.push_back({p + "mlp.gate.e_score_correction_bias", "F32", {8}, testing::raw_bytes(bias)});
        for (int e = 0; e < 8; ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          add(x + "gate_proj.weight", {32, kHidden}, kProj);
          add(x + "up_proj.weight", {32, kHidden}, kProj);
          add(x + "down_proj.weight", {kHidden, 32}, kProj);
        }
        add(p + "mlp.shared_experts.gate_proj.weight", {32, kHidden}, kProj);
        add(p + "mlp.shared_experts.up_proj.weight", {32, kHidden}, kProj);
        add(p + "mlp.shared_experts.down_proj.weight", {kHidden, 32}, kProj);
      } else {
        add(p + "mlp.gate_proj.weight", {96, kHidden}, kProj);
        add(p + "mlp.up_proj.weight", {96, kHidden}, kProj);
        add(p + "mlp.down_proj.weight", {kHidden, 96}, kProj);
      }
    };
    for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
      const char k = layers[l];
      add_layer(l, k == 'k' || k == 'K', k == 'd' || k == 'D', k == 'K' || k == 'D' || k == 'S', true);
    }
    add(m + "norm.weight", {kHidden}, 0.1f, 1.f);
    add("lm_head.weight", {kVocab, kHidden}, 0.25f);
    if (mtp != Mtp::kNone) {  // layer 6: enorm, hnorm, eh_proj over [embedding | hidden], the layer, shared_head
      const std::string p = m + "layers." + std::to_string(layers.size()) + ".";
      add(p + "enorm.weight", {kHidden}, 0.1f, 1.f);
      add(p + "hnorm.weight", {kHidden}, 0.1f, 1.f);
      add(p + "eh_proj.weight", {kHidden, 2 * kHidden}, kProj);
      add(p + "shared_head.norm.weight", {kHidden}, 0.1f, 1.f);
      if (mtp == Mtp::kDsaHyperConnected) {
        add(p + "shared_head.head.weight", {kVocab, kHidden}, 0.25f);
        add_layer(static_cast<int>(layers.size()), false, true, true, true);
      } else {
        add_layer(static_cast<int>(layers.size()), true, false, false, false);
      }
    }
    testing::write_file(d / "model.safetensors", testing::build_safetensors(specs));
    return d;
  }();
  dirs[{index_topk, mtp, layers}] = dir;
  return dir;
}

}  // namespace kiln::testing::glm5_gpu
