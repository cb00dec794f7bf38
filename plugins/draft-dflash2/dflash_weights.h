// A DFlash / DFlash2 drafter's tensors (../shared/specs/dflash2.md §2) as fp32 on the host, each checked against
// the shape its config implies. Names are accepted bare (`fc.weight`, `layers.0.…`: z-lab's layout) or under
// `model.` (the speculators / vLLM export layout).
#pragma once

#include <string>
#include <vector>

#include "dflash_config.h"
#include "kiln/weight_format.h"

namespace kiln::dflash {

struct Matrix {
  std::vector<float> w;  // row-major [rows, cols]
  int64_t rows = 0, cols = 0;
};

struct DynamicConvWeights {
  Matrix base;        // [2, T, H] as [2·T, H]
  Matrix projection;  // [2·T·G, H]
};

struct LayerWeights {
  std::vector<float> input_norm, post_norm, q_norm, k_norm;
  Matrix q, k, v, o, gate, up, down;
  DynamicConvWeights attention_conv, mlp_conv;  // v2
};

struct DflashWeights {
  Matrix fc;  // [H, n_taps · H_target]
  std::vector<float> hidden_norm, norm;
  std::vector<LayerWeights> layers;
  Matrix selector_projection, predecessor, successor;  // v2: [R, H], [V, R], [V, R]
};

// `where` names the checkpoint (its directory) in every message.
Result<DflashWeights> load_weights(const WeightSource& source, const DflashConfig& c, int64_t target_hidden,
                                   const std::string& where);

}  // namespace kiln::dflash
