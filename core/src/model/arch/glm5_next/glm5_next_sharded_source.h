// One tensor-parallel rank's view of a glm5_next checkpoint (seen through Glm5NextTensorNames): the family's mechanism
// (RowShardedSource, model/sharded_weight_source.h) with this architecture's split rule:
//
//   column-parallel, this rank's rows:  DSA q_b_proj / kv_b_proj (its heads); KDA q_proj / k_proj / v_proj,
//                                       forget_gate.f_b_proj, g_b_proj (its heads' channels) and b_proj (its heads);
//                                       the dense MLPs' and the shared experts' gate_proj / up_proj (its
//                                       intermediate columns); the embedding, lm_head and a next-n layer's
//                                       shared_head.head (its vocabulary rows);
//   expert-parallel:                    routed expert j of this rank is the checkpoint's expert begin + j;
//   replicated:                         everything else — o_proj and down_proj included (Glm5NextModel gathers their
//                                       inputs and runs them whole, so the output stays bit-identical to one rank),
//                                       q_a / kv_a and their norms, the DSA indexer, f_a / g_a, the mHC maps, norms,
//                                       the router, eh_proj. The per-head fp32 vectors (the short conv, dt_bias, A_log)
//                                       are served whole; the loader keeps its heads' part (glm5_next_weights.cpp).
//
// Parts are row ranges of the stored matrix: views into the same mapping, no copies. Only dense F32 / BF16 / F16
// `.weight` matrices can be split; a quantized module that would be split is refused by name.
#pragma once

#include <string>

#include "model/arch/glm5_next/glm5_next_config.h"
#include "model/sharded_weight_source.h"
#include "model/tensor_shard.h"

namespace kiln::glm5_next {

class Glm5NextShardedSource final : public RowShardedSource {
 public:
  // `names`: the checkpoint through Glm5NextTensorNames (per-expert names, transformers' leaf names).
  Glm5NextShardedSource(const WeightSource& names, const Glm5NextConfig& config, TensorShard shard)
      : RowShardedSource(names, shard, config.n_routed_experts), config_(config) {}
  RowSplit row_split(const std::string& module) const override;

 private:
  const Glm5NextConfig config_;
};

// Every rank needs at least one of each unit the ranks split (DSA and KDA heads, vocabulary rows, routed experts, the
// dense MLPs' and the shared experts' intermediate columns); counts the ranks do not divide split unevenly
// (tensor_shard.h). The error names the config field.
Status check_glm5_next_tensor_parallel_units(const Glm5NextConfig& config, int world);

}  // namespace kiln::glm5_next
