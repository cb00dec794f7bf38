// One tensor-parallel rank's view of a checkpoint (the MLA + MoE family): the tensors it holds a part of are served
// as that part, the rest as stored, so the ordinary loader builds a rank's weights without knowing about ranks.
//
//   column-parallel, this rank's rows:  q_b_proj / q_proj and kv_b_proj (its heads), the dense MLP's and the shared
//                                       experts' gate_proj / up_proj (its intermediate columns), the embedding,
//                                       lm_head and an MTP layer's shared_head.head (its vocabulary rows);
//   expert-parallel:                    routed expert j of this rank is the checkpoint's expert begin + j;
//   replicated:                         everything else — o_proj and down_proj included (see MlaMoeModel: a rank
//                                       gathers their inputs and runs them whole, which keeps the output
//                                       bit-identical to one rank), kv_a / q_a, norms, router, the DSA indexer.
//
// Parts are row ranges of the stored matrix, so they are views into the same mapping (no copies). Only dense
// matrices (F32 / BF16 / F16 `.weight`) can be split; a quantized module that would be split is refused by name.
// RowShardedSource is that mechanism for any architecture; each says only which modules split (row_split):
// ShardedWeightSource here, glm5_next's Glm5NextShardedSource.
#pragma once

#include <optional>
#include <string>

#include "kiln/weight_format.h"
#include "model/model_config.h"
#include "model/tensor_shard.h"

namespace kiln {

// How a module (a tensor name without its last component) is split by rows across the ranks: units and rows per
// unit, or none. The memory model (engine/rank_weights.h) prices a rank's weights with the same rule.
struct TensorRowSplit {
  int64_t units = 0;  // 0: not split
  int64_t rows_per_unit = 1;
};
TensorRowSplit tensor_row_split(const ModelConfig& config, const std::string& module);
// The routed expert a tensor belongs to ("model.layers.3.mlp.experts.5.gate_proj.weight" → 5), or −1.
int64_t routed_expert_of(const std::string& name);

// A rank's view of `stored` under an architecture's split rule: routed experts renumbered to this rank's range, the
// modules row_split names served as this rank's rows, everything else as stored.
class RowShardedSource : public WeightSource {
 public:
  using RowSplit = TensorRowSplit;
  bool has(const std::string& name) const final;
  Result<TensorView> get(const std::string& name) const final;
  bool synthetic() const final { return stored_.synthetic(); }
  uint64_t seed() const final { return stored_.seed(); }
  // The checkpoint as stored (what a rank reads the modules it holds whole from).
  const WeightSource& stored() const { return stored_; }
  virtual RowSplit row_split(const std::string& module) const = 0;

 protected:
  RowShardedSource(const WeightSource& stored, TensorShard shard, int64_t n_routed_experts)
      : stored_(stored), shard_(shard), n_routed_experts_(n_routed_experts) {}

 private:
  // The stored name of `name` (a routed expert renumbered to this rank's range); none for an expert past its range.
  std::optional<std::string> stored_name(const std::string& name) const;

  const WeightSource& stored_;
  const TensorShard shard_;
  const int64_t n_routed_experts_;
};

class ShardedWeightSource final : public RowShardedSource {
 public:
  ShardedWeightSource(const WeightSource& stored, const ModelConfig& config, TensorShard shard)
      : RowShardedSource(stored, shard, config.n_routed_experts), config_(config) {}
  RowSplit row_split(const std::string& module) const override { return tensor_row_split(config_, module); }

 private:
  const ModelConfig config_;
};

// Every rank needs at least one of each unit the ranks split (heads, vocabulary rows, routed experts, the dense MLP's
// and the shared experts' intermediate columns); counts the ranks do not divide split unevenly (tensor_shard.h).
Status check_tensor_parallel_units(const ModelConfig& config, int world);

}  // namespace kiln
