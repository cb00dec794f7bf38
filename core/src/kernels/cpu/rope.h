// Rotary position embeddings: frequency tables (default, YaRN, linear and llama3, as transformers 5.17 computes them
// in modeling_rope_utils.py) and the two ways of applying them.
//
// Layout facts (transformers 5.17):
//  - Tables: HF's rotary module returns cos/sin = cat(freqs, freqs) · attention_factor with
//    freqs[p, i] = float(p) · inv_freq[i], i < rotary_dim/2, all in fp32. Only the first half is distinct,
//    so kiln tables are [n, rotary_dim/2].
//  - Interleaved (GLM-4.7-Flash, GLM-5 MLA and the glm_moe_dsa indexer, DeepSeek-V3 with rope_interleave=true):
//    apply_rotary_pos_emb_interleave reads pairs (x[2i], x[2i+1]) rotated by freq i, and WRITES THEM
//    DE-INTERLEAVED: out[i] = x[2i]·cos_i − x[2i+1]·sin_i, out[half+i] = x[2i+1]·cos_i + x[2i]·sin_i.
//    So roped q_pe / k_pe (and the cached k_pe) are in half-split order; q and k get the same permutation,
//    so q·k is unchanged.
//  - Half-split (rotate_half; DeepSeek-V3.2's indexer, DeepSeek-V3 with rope_interleave=false):
//    out[i] = x[i]·cos_i − x[half+i]·sin_i, out[half+i] = x[half+i]·cos_i + x[i]·sin_i; layout unchanged.
//  - The glm_moe_dsa (GLM-5) indexer uses the INTERLEAVED form on the first qk_rope_head_dim values of its
//    128-wide q and k (rope part first, then the pass-through part), unlike DeepSeek-V3.2's half-split indexer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kiln::cpu {

// rope_parameters from config.json. Optional fields mirror HF's "absent" (None / missing key).
struct RopeConfig {
  double theta = 10000.0;     // rope_theta
  int64_t rotary_dim = 0;     // head_dim · partial_rotary_factor (MLA: qk_rope_head_dim)
  // How the default frequencies theta^(-2i/d) are rescaled. (transformers' "dynamic" NTK rope is kNone within
  // max_position_embeddings: it only rescales beyond, where kiln refuses positions.)
  enum class Scaling { kNone, kYarn, kLinear, kLlama3 } scaling = Scaling::kNone;
  // YaRN (absent: max_position_embeddings / original_max_position_embeddings); linear and llama3 (required).
  std::optional<double> factor;
  int64_t original_max_position_embeddings = 0;  // YaRN and llama3
  double low_freq_factor = 1.0;                  // llama3 only
  double high_freq_factor = 4.0;                 // llama3 only
  // YaRN only.
  int64_t max_position_embeddings = 0;
  std::optional<double> beta_fast;              // absent or 0: 32
  std::optional<double> beta_slow;              // absent or 0: 1
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  bool truncate = true;
  std::optional<double> attention_factor;       // absent: derived from factor / mscale / mscale_all_dim
};

// The rotary_dim/2 inverse frequencies, fp32, computed with the same fp32 operation order as HF.
std::vector<float> rope_inv_freq(const RopeConfig& config);

// The factor HF multiplies cos and sin by (1 unless YaRN).
double rope_attention_factor(const RopeConfig& config);

// The attention softmax scale after HF's yarn_apply_mscale: for any scaled rope with a non-zero mscale_all_dim
// (transformers applies it whatever the rope type but "default"), base_scale · m² with
// m = 0.1·mscale_all_dim·ln(factor) + 1 (factor > 1); base_scale otherwise.
double yarn_attention_scale(const RopeConfig& config, double base_scale);

// cos/sin [n, half] for the given positions: angle = float(position) · inv_freq[i] in fp32, then
// cos/sin in fp32 times float(attention_factor).
void rope_cos_sin(const float* inv_freq, int64_t half, double attention_factor, const int64_t* positions, int64_t n,
                  float* cos, float* sin);

// In-place rotation of the first rotary_dim values of every head of n tokens. The rope slice of (token t,
// head h) starts at x + t·token_stride + h·head_stride; cos/sin rows are per token, [n, rotary_dim/2].
void apply_rope_interleaved(float* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                            const float* cos, const float* sin, int64_t rotary_dim);
void apply_rope_half_split(float* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                           const float* cos, const float* sin, int64_t rotary_dim);

}  // namespace kiln::cpu
