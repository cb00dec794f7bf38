#include "model/rope_setup.h"

namespace kiln {

cpu::RopeConfig kernel_rope_config(const ModelConfig& c) {
  cpu::RopeConfig r;
  r.theta = c.rope.theta;
  r.rotary_dim = c.qk_rope_head_dim;
  r.yarn = c.rope.type == RopeType::kYarn;
  if (r.yarn) {
    r.factor = c.rope.factor;
    r.original_max_position_embeddings = c.rope.original_max_position_embeddings;
    r.max_position_embeddings = c.max_position_embeddings;
    r.beta_fast = c.rope.beta_fast;
    r.beta_slow = c.rope.beta_slow;
    if (c.rope.mscale != 0) r.mscale = c.rope.mscale;
    if (c.rope.mscale_all_dim != 0) r.mscale_all_dim = c.rope.mscale_all_dim;
    r.truncate = c.rope.truncate;
    r.attention_factor = c.rope.attention_factor;
  }
  return r;
}

}  // namespace kiln
