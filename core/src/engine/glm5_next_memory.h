// glm5_next's weights as each device holds them, for the memory model (memory_model.h): its weight inventory
// (model/arch/glm5_next/glm5_next_weight_inventory.h) priced tensor by tensor, so the interval is as narrow as the
// few bytes a loader adds beyond the tensors (alignment, allocator) instead of the wide guess an architecture
// without an inventory gets.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/tensor_shard.h"

#include "kiln/weight_format.h"
#include "model/arch/glm5_next/glm5_next_config.h"

namespace kiln {

struct WeightBytes {
  uint64_t low = 0, high = 0;
  std::string basis;
  uint64_t routed_experts = 0;  // of low: the routed experts' bytes (CUDA)
};

// The CUDA runner's weights (cuda/glm5_next_cuda_weights.cpp). `stored`: the checkpoint seen through
// Glm5NextTensorNames — each projection is priced as stored (dense → bf16, an EXL3 module's trellis and sign
// vectors as they are); null for model.load = "dummy", where every projection is priced at the format's bytes
// per weight (`format`, `bits`; with `experts_only` only the routed experts, the rest bf16). Either way the fp32
// tensors, the bf16 norms and what the runner derives (W_UK transposed per DSA layer; dense copies of a quantized
// kv_b or embedding) come from the config. With a sharded `shard`: what that tensor-parallel rank loads
// (load_glm5_next_gpu_weights: Glm5NextShardedSource's row parts, its routed experts, the shared expert on
// shared_expert_rank only; the per-head fp32 vectors are priced whole).
WeightBytes glm5_next_cuda_weight_bytes(const glm5_next::Glm5NextConfig& config, const WeightSource* stored,
                                        const std::string& prefix, const std::string& format, int64_t bits,
                                        bool experts_only, bool with_mtp, TensorShard shard = {});

// Tensor-parallel CPU ranks (parallel.tensor = world) of which `here` run in the process priced: all of them as
// threads (transport.backend = "local"), one per process ("socket").
struct CpuRanks {
  int world = 1;
  int here = 1;
};

// The CPU model's weights (glm5_next_weights.cpp): `mapped_bytes` of checkpoint files it maps (projections,
// experts and the embedding are views into them), the fp32 copies it makes (norms, the fp32 tensors, kv_b per DSA
// layer) and, in bf16 precision, the bf16 copies of every F32 / F16 tensor it rounds: low the files, high the files
// and the copies (each with its heap block's slack). With `ranks`, the mapping is the process's one and every rank
// holds copies of its own: whole ones of what the ranks replicate (norms, mHC maps, router, indexer, o_proj /
// down_proj in bf16 precision), its part of what they split (kv_b, the short conv, dt_bias, A_log by head; in bf16
// precision also the split projections, routed experts and vocabulary rows; glm5_next_sharded_source.h) — for an
// uneven split the largest part.
WeightBytes glm5_next_cpu_weight_bytes(const glm5_next::Glm5NextConfig& config, const WeightSource& stored,
                                       const std::string& prefix, uint64_t mapped_bytes, bool bf16_precision,
                                       bool with_mtp, CpuRanks ranks = {});

// The vision tower's fp32 weights (plugins/vision: a host copy on the CPU, an upload on CUDA); 0 without a
// vision_config.
uint64_t glm5_next_vision_bytes(const nlohmann::json& config);

}  // namespace kiln
