// The model dimensions a plugin may need to size itself (KV bytes per token, expert shapes, drafter inputs).
// Filled by the core from config.json; plain data so it can cross the plugin boundary.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

struct ModelInfo {
  std::string model_type;  // "glm4_moe_lite", "glm_moe_dsa", "deepseek_v3", ...
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;        // target layers, excluding MTP layers
  int64_t num_mtp_layers = 0;    // next-n prediction layers stored after the target layers
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;       // 0 = no q compression
  int64_t kv_lora_rank = 0;      // MLA latent width (cached per token per layer)
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;  // rope part (cached per token per layer, after RoPE)
  int64_t v_head_dim = 0;
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t index_head_dim = 0;    // DSA indexer key width (0 = no indexer)
  int64_t max_position_embeddings = 0;
  // The checkpoint folder (config.json, *.safetensors), for plugins that read parts of the checkpoint the core does
  // not load, such as a modality's vision tower; empty where no model folder is known.
  std::string checkpoint_dir;
  // model.load = "dummy": no weights are read from checkpoint_dir; the core makes the model's weights randomly
  // (WeightSource::synthetic, seeded by weight_seed), and a plugin with weights of its own (a modality's vision
  // tower) makes them randomly too, in the shapes config.json gives, so the whole request path can be timed on
  // shapes no checkpoint on disk has.
  bool synthetic_weights = false;
  uint64_t weight_seed = 0;
};

}  // namespace kiln
