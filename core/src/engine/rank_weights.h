// A tensor-parallel rank's share of the weights, as the CUDA runner loads them (runtime/cuda/gpu_weights.cpp over a
// ShardedWeightSource): the modules the ranks split by rows (tensor_row_split: q_b / q_proj and kv_b by heads, the
// dense MLP's gate / up by intermediate columns, embedding and heads by vocabulary rows) give each rank its rows;
// routed expert j belongs to the rank that owns unit j of n_routed_experts; the shared expert is held whole by
// shared_expert_rank; everything else (o_proj, down, kv_a / q_a, norms, router, indexer) is replicated. The memory
// model (memory_model.h) prices every rank with this, and the largest rank bounds the KV pool: every rank holds a
// pool of rank 0's geometry (parallel/rank_processes.h).
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "model/tensor_shard.h"

namespace kiln {

// How a rank holds one stored tensor.
enum class RankHolding : uint8_t { kReplicated, kRows, kRoutedExpert, kSharedExpert };
RankHolding rank_holding(const ModelConfig& config, const std::string& name);

// The bytes of a tensor (`bytes` whole, as the runner holds it) that `shard` holds. Row parts are
// ⌊bytes·end/units⌋ − ⌊bytes·begin/units⌋, so the ranks' parts add up to the whole to the byte.
uint64_t rank_tensor_bytes(const ModelConfig& config, const std::string& name, uint64_t bytes, const TensorShard& shard);

// `bytes` split over `units` as `shard` owns them (the rule above, for per-unit extras such as W_UK per head).
uint64_t rank_unit_bytes(uint64_t bytes, int64_t units, const TensorShard& shard);

}  // namespace kiln
