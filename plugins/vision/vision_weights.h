// The vision tower's weights as fp32, under the names transformers saves them (`model.visual.*`; the original
// release's `visual.*` is accepted too), laid out for the CPU tower: every linear is [out, in] row-major; the
// Conv3d patch embedding is the linear over a patch's (C, T, P, P) values; the 2×2 downsample Conv2d is the linear
// over a merge block's four patch rows concatenated in patch order.
#pragma once

#include <vector>

#include "kiln/status.h"
#include "tensor_file.h"
#include "vision_config.h"

namespace kiln::vision {

struct VisionBlockWeights {
  std::vector<float> norm1, norm2;    // [hidden]
  std::vector<float> qkv_w, qkv_b;    // [3·hidden, hidden], [3·hidden] (bias empty without attention_bias)
  std::vector<float> q_norm, k_norm;  // [head_dim]
  std::vector<float> proj_w, proj_b;  // [hidden, hidden], [hidden]
  std::vector<float> gate_w, gate_b;  // [intermediate, hidden]
  std::vector<float> up_w, up_b;      // [intermediate, hidden]
  std::vector<float> down_w, down_b;  // [hidden, intermediate]
};

struct VisionWeights {
  std::vector<float> patch_w, patch_b;  // [hidden, patch_dim], [hidden]
  std::vector<VisionBlockWeights> blocks;
  std::vector<float> post_norm;       // [hidden]
  std::vector<float> down_w, down_b;  // [out_hidden, merge²·hidden] (reordered from the Conv2d), [out_hidden]
  std::vector<float> merger_proj;     // [out_hidden, out_hidden]
  std::vector<float> merger_norm_w, merger_norm_b;  // [out_hidden] LayerNorm
  std::vector<float> merger_gate, merger_up;        // [projection_intermediate, out_hidden]
  std::vector<float> merger_down;                   // [out_hidden, projection_intermediate]
};

// `model.visual.` or `visual.`, whichever the checkpoint uses; not_found when it holds neither.
Result<std::string> vision_prefix(const CheckpointTensors& tensors);

// Every tensor the tower reads exists with the shape the config gives (headers only; `kiln recipe check`).
Status check_vision_weights(const CheckpointTensors& tensors, const VisionConfig& config);

Result<VisionWeights> load_vision_weights(const CheckpointTensors& tensors, const VisionConfig& config);

// Random weights in the config's shapes, for model.load = "dummy" and the benchmarks: as the core makes a dummy
// model's (uniform with std 0.02, HF's initializer_range, from a stream per tensor name seeded by `seed`), with the
// norms' weights 1 and the LayerNorm's bias 0 so activations keep the scale real checkpoints give them.
VisionWeights random_vision_weights(const VisionConfig& config, uint64_t seed);

}  // namespace kiln::vision
