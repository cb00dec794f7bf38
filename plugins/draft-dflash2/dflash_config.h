// A DFlash / DFlash2 drafter checkpoint's config.json (../shared/specs/dflash2.md §1), parsed and checked against
// the target it drafts for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::dflash {

struct LayerAttention {
  bool causal = false;     // within the query block
  int64_t window = 0;      // 0: attends to the whole context; else query P sees key k iff |P − k| < window
};

struct DflashConfig {
  std::string path;        // config.json, for messages
  bool v2 = false;         // DFlash2DraftModel (dynamic convs, candidate selector) vs DFlashDraftModel
  int64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  double rms_eps = 1e-6, rope_theta = 10000.0;
  std::vector<LayerAttention> attention;  // per layer
  std::vector<int> target_layers;         // tapped target layer outputs, in fc's input order (the last: kTapFinalNormed)
  int32_t mask_token = 0;
  int64_t block_size = 0;
  int64_t conv_taps = 0, conv_group = 0, selector_rank = 0, selector_top_k = 0;  // v2
  double output_multiplier = 1.0, softcap = 0.0, input_embedding_scale = 1.0;
};

// `expect_v2`: the drafter name (dflash2 vs dflash) the recipe chose; the checkpoint's architecture must agree.
// target_*: the target's dimensions, which the drafter shares (embedding, lm_head, tapped hidden states).
Result<DflashConfig> read_config(const std::string& dir, bool expect_v2, int64_t target_hidden, int64_t target_vocab,
                                 int64_t target_layers);

}  // namespace kiln::dflash
