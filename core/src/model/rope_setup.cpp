#include "model/rope_setup.h"

namespace kiln {

cpu::RopeConfig kernel_rope_config(const ModelConfig& c) {
  using Scaling = cpu::RopeConfig::Scaling;
  cpu::RopeConfig r;
  r.theta = c.rope.theta;
  r.rotary_dim = c.qk_rope_head_dim;
  switch (c.rope.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic: r.scaling = Scaling::kNone; break;
    case RopeType::kYarn: r.scaling = Scaling::kYarn; break;
    case RopeType::kLinear: r.scaling = Scaling::kLinear; break;
    case RopeType::kLlama3: r.scaling = Scaling::kLlama3; break;
  }
  if (r.scaling == Scaling::kNone) return r;
  r.factor = c.rope.factor;
  if (c.rope.mscale_all_dim != 0) r.mscale_all_dim = c.rope.mscale_all_dim;
  r.original_max_position_embeddings = c.rope.original_max_position_embeddings;
  r.max_position_embeddings = c.max_position_embeddings;
  r.low_freq_factor = c.rope.low_freq_factor;
  r.high_freq_factor = c.rope.high_freq_factor;
  if (r.scaling != Scaling::kYarn) return r;
  r.beta_fast = c.rope.beta_fast;
  r.beta_slow = c.rope.beta_slow;
  if (c.rope.mscale != 0) r.mscale = c.rope.mscale;
  r.truncate = c.rope.truncate;
  r.attention_factor = c.rope.attention_factor;
  return r;
}

}  // namespace kiln
