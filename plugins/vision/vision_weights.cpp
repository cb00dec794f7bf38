#include "vision_weights.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <utility>

namespace kiln::vision {
namespace {

// One place lists every tensor with its shape, for both the check and the load.
using Visit =
    std::function<Status(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>* out)>;

Status visit_tensors(const std::string& p, const VisionConfig& c, VisionWeights* w, const Visit& visit) {
  const int64_t h = c.hidden_size, m = c.spatial_merge_size, out = c.out_hidden_size;
  const int64_t ps = c.patch_size, pi = c.projection_intermediate_size, inter = c.intermediate_size;
  KILN_RETURN_IF_ERROR(visit(p + "patch_embed.proj.weight", {h, c.in_channels, c.temporal_patch_size, ps, ps},
                             w ? &w->patch_w : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "patch_embed.proj.bias", {h}, w ? &w->patch_b : nullptr));
  if (w) w->blocks.resize(static_cast<size_t>(c.depth));
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    VisionBlockWeights* bw = w ? &w->blocks[static_cast<size_t>(i)] : nullptr;
    auto f = [&](std::vector<float> VisionBlockWeights::*member) { return bw ? &(bw->*member) : nullptr; };
    KILN_RETURN_IF_ERROR(visit(b + "norm1.weight", {h}, f(&VisionBlockWeights::norm1)));
    KILN_RETURN_IF_ERROR(visit(b + "norm2.weight", {h}, f(&VisionBlockWeights::norm2)));
    KILN_RETURN_IF_ERROR(visit(b + "attn.qkv.weight", {3 * h, h}, f(&VisionBlockWeights::qkv_w)));
    KILN_RETURN_IF_ERROR(visit(b + "attn.q_norm.weight", {c.head_dim()}, f(&VisionBlockWeights::q_norm)));
    KILN_RETURN_IF_ERROR(visit(b + "attn.k_norm.weight", {c.head_dim()}, f(&VisionBlockWeights::k_norm)));
    KILN_RETURN_IF_ERROR(visit(b + "attn.proj.weight", {h, h}, f(&VisionBlockWeights::proj_w)));
    KILN_RETURN_IF_ERROR(visit(b + "mlp.gate_proj.weight", {inter, h}, f(&VisionBlockWeights::gate_w)));
    KILN_RETURN_IF_ERROR(visit(b + "mlp.up_proj.weight", {inter, h}, f(&VisionBlockWeights::up_w)));
    KILN_RETURN_IF_ERROR(visit(b + "mlp.down_proj.weight", {h, inter}, f(&VisionBlockWeights::down_w)));
    if (c.attention_bias) {  // the attention and the block's MLP share the flag (transformers: bias=attention_bias)
      KILN_RETURN_IF_ERROR(visit(b + "attn.qkv.bias", {3 * h}, f(&VisionBlockWeights::qkv_b)));
      KILN_RETURN_IF_ERROR(visit(b + "attn.proj.bias", {h}, f(&VisionBlockWeights::proj_b)));
      KILN_RETURN_IF_ERROR(visit(b + "mlp.gate_proj.bias", {inter}, f(&VisionBlockWeights::gate_b)));
      KILN_RETURN_IF_ERROR(visit(b + "mlp.up_proj.bias", {inter}, f(&VisionBlockWeights::up_b)));
      KILN_RETURN_IF_ERROR(visit(b + "mlp.down_proj.bias", {h}, f(&VisionBlockWeights::down_b)));
    }
  }
  KILN_RETURN_IF_ERROR(visit(p + "post_layernorm.weight", {h}, w ? &w->post_norm : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "downsample.weight", {out, h, m, m}, w ? &w->down_w : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "downsample.bias", {out}, w ? &w->down_b : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "merger.proj.weight", {out, out}, w ? &w->merger_proj : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "merger.post_projection_norm.weight", {out}, w ? &w->merger_norm_w : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "merger.post_projection_norm.bias", {out}, w ? &w->merger_norm_b : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "merger.gate_proj.weight", {pi, out}, w ? &w->merger_gate : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "merger.up_proj.weight", {pi, out}, w ? &w->merger_up : nullptr));
  KILN_RETURN_IF_ERROR(visit(p + "merger.down_proj.weight", {out, pi}, w ? &w->merger_down : nullptr));
  return ok_status();
}

}  // namespace

Result<std::string> vision_prefix(const CheckpointTensors& tensors) {
  for (const char* p : {"model.visual.", "visual."})
    if (tensors.has(std::string(p) + "patch_embed.proj.weight")) return std::string(p);
  return not_found(
      "the checkpoint has no vision tower (no model.visual.patch_embed.proj.weight or "
      "visual.patch_embed.proj.weight)");
}

Status check_vision_weights(const CheckpointTensors& tensors, const VisionConfig& config) {
  KILN_ASSIGN_OR_RETURN(const std::string prefix, vision_prefix(tensors));
  return visit_tensors(prefix, config, nullptr,
                       [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>*) {
                         return tensors.check(name, shape);
                       });
}

Result<VisionWeights> load_vision_weights(const CheckpointTensors& tensors, const VisionConfig& config) {
  KILN_ASSIGN_OR_RETURN(const std::string prefix, vision_prefix(tensors));
  VisionWeights w;
  KILN_RETURN_IF_ERROR(
      visit_tensors(prefix, config, &w,
                    [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>* out) -> Status {
                      KILN_ASSIGN_OR_RETURN(*out, tensors.read(name, shape));
                      return ok_status();
                    }));
  // Conv2d [out, hidden, m, m] → [out, (i·m + j)·hidden + c]: a merge block's patches arrive as consecutive rows in
  // (inner row i, inner column j) order, so the convolution is one linear over the block's rows concatenated.
  const int64_t out = config.out_hidden_size, h = config.hidden_size, m = config.spatial_merge_size;
  std::vector<float> reordered(w.down_w.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < h; ++c)
      for (int64_t k = 0; k < m * m; ++k)
        reordered[static_cast<size_t>((o * m * m + k) * h + c)] =
            w.down_w[static_cast<size_t>((o * h + c) * m * m + k)];
  w.down_w = std::move(reordered);
  return w;
}

VisionWeights random_vision_weights(const VisionConfig& config, uint64_t seed) {
  VisionWeights w;
  std::vector<std::pair<std::string, std::vector<float>*>> tensors;
  const Status listed = visit_tensors("model.visual.", config, &w,
                                      [&](const std::string& name, const std::vector<int64_t>& shape,
                                          std::vector<float>* out) {
                                        int64_t n = 1;
                                        for (int64_t d : shape) n *= d;
                                        out->resize(static_cast<size_t>(n));
                                        tensors.emplace_back(name, out);
                                        return ok_status();
                                      });
  (void)listed;  // the visitor never fails
  const float bound = 0.02f * std::sqrt(3.0f);  // uniform on [−b, b] has std b/√3
  // Tensors are independent streams (seeded by name), so they fill in parallel and the result does not depend on
  // the thread count. The layouts differ from the checkpoint's only by permutations (the downsample's), which
  // i.i.d. values do not see.
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::string& name = tensors[t].first;
    std::vector<float>& v = *tensors[t].second;
    if (name.find("norm") != std::string::npos) {
      const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      std::fill(v.begin(), v.end(), bias ? 0.0f : 1.0f);
      continue;
    }
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name: a stable stream per tensor
    for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull ^ h);
    for (float& x : v) x = bound * (static_cast<float>(rng() >> 40) * 0x1.0p-23f - 1.0f);  // 24 bits → [−1, 1)
  }
  return w;
}

}  // namespace kiln::vision
