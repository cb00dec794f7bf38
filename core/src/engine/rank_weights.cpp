#include "engine/rank_weights.h"

#include "model/sharded_weight_source.h"

namespace kiln {

RankHolding rank_holding(const ModelConfig& c, const std::string& name) {
  if (name.find(".mlp.shared_experts.") != std::string::npos) return RankHolding::kSharedExpert;
  if (routed_expert_of(name) >= 0) return RankHolding::kRoutedExpert;
  const size_t dot = name.rfind('.');
  if (tensor_row_split(c, dot == std::string::npos ? name : name.substr(0, dot)).units > 0) return RankHolding::kRows;
  return RankHolding::kReplicated;
}

uint64_t rank_unit_bytes(uint64_t bytes, int64_t units, const TensorShard& shard) {
  if (!shard.sharded() || units <= 0) return bytes;
  // 128-bit products: a tensor's bytes times a unit count can pass 2^64.
  const auto part = [&](int64_t unit) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(bytes) * static_cast<uint64_t>(unit) /
                                 static_cast<uint64_t>(units));
  };
  return part(shard.end(units)) - part(shard.begin(units));
}

uint64_t rank_tensor_bytes(const ModelConfig& c, const std::string& name, uint64_t bytes, const TensorShard& shard) {
  if (!shard.sharded()) return bytes;
  switch (rank_holding(c, name)) {
    case RankHolding::kSharedExpert:
      return shard.rank == shared_expert_rank(shard) ? bytes : 0;
    case RankHolding::kRoutedExpert:
      return shard.owns(routed_expert_of(name), c.n_routed_experts) ? bytes : 0;
    case RankHolding::kRows: {
      const size_t dot = name.rfind('.');
      return rank_unit_bytes(bytes, tensor_row_split(c, name.substr(0, dot)).units, shard);
    }
    case RankHolding::kReplicated:
      break;
  }
  return bytes;
}

}  // namespace kiln
