#include "engine/glm5_next_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "model/arch/glm5_next/glm5_next_sharded_source.h"
#include "model/arch/glm5_next/glm5_next_weight_inventory.h"

namespace kiln {
namespace {

using glm5_next::WeightHeld;
using glm5_next::WeightInventory;
using glm5_next::WeightItem;

// Each CUDA allocation is 256-byte aligned (runtime/cuda/device_arena.h): at most that much per tensor beyond its
// bytes. A CPU copy is a std::vector: its heap block's header, or a page where malloc maps a large one.
constexpr uint64_t kDeviceAlignment = 256, kHostBlockSlack = 4096;

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / static_cast<double>(1 << 20));
  return buf;
}

uint64_t pad128(int64_t v) {
  return static_cast<uint64_t>((v + 127) / 128 * 128);
}

std::string module_of(const std::string& weight_name) {
  static const std::string suffix = ".weight";
  return weight_name.size() > suffix.size() &&
                 weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0
             ? weight_name.substr(0, weight_name.size() - suffix.size())
             : weight_name;
}

// An EXL3 module as stored: the trellis and the side tensors the format keeps (integers as stored, the fp16
// sign vectors and bias as 2-byte values, which is how the CUDA runner holds floats it does not keep in fp32).
uint64_t stored_exl3_module(const WeightSource& stored, const std::string& module) {
  uint64_t b = 0;
  for (const char* part : {".trellis", ".suh", ".su", ".svh", ".sv", ".mcg", ".mul1", ".bias"}) {
    if (!stored.has(module + part)) continue;
    auto t = stored.get(module + part);
    if (!t.ok()) continue;
    const bool floating = t->dtype == DType::kF32 || t->dtype == DType::kBF16 || t->dtype == DType::kF16;
    b += static_cast<uint64_t>(t->numel()) * (floating ? 2 : dtype_size(t->dtype));
  }
  return b;
}

// A checkpoint without tensors: what the split rule is asked through when pricing dummy weights.
class NoTensors final : public WeightSource {
 public:
  bool has(const std::string&) const override { return false; }
  Result<TensorView> get(const std::string& name) const override { return not_found("no tensor " + name); }
};

}  // namespace

WeightBytes glm5_next_cuda_weight_bytes(const glm5_next::Glm5NextConfig& c, const WeightSource* stored,
                                        const std::string& prefix, const std::string& format, int64_t bits,
                                        bool experts_only, bool with_mtp, TensorShard shard) {
  const WeightInventory inv = glm5_next::glm5_next_weight_inventory(c, prefix, with_mtp);
  const NoTensors none;
  const glm5_next::Glm5NextShardedSource split_by(stored ? *stored : none, c, shard);
  // The fraction of a projection's rows this rank holds (1 unsharded).
  auto rank_part = [&](const std::string& module) -> double {
    if (!shard.sharded()) return 1.0;
    if (module.find(".mlp.experts.") != std::string::npos)
      return static_cast<double>(shard.count(c.n_routed_experts)) / static_cast<double>(c.n_routed_experts);
    if (module.find(".mlp.shared_experts.") != std::string::npos) return shard.rank == shared_expert_rank(shard);
    const auto split = split_by.row_split(module);
    return split.units > 0 ? static_cast<double>(shard.count(split.units)) / static_cast<double>(split.units) : 1.0;
  };
  uint64_t routed = 0;
  bool quantized_store = false;  // some projection stored as an EXL3 module (`kiln quantize` output)
  const bool exl3_dummy = !stored && format == "exl3";
  uint64_t low = 0, high = 0, allocations = 0;
  bool quantized_embedding = false;
  int64_t quantized_kv_b = 0;
  for (const WeightItem& it : inv.items) {
    const uint64_t n = static_cast<uint64_t>(it.numel());
    allocations += static_cast<uint64_t>(it.count);
    uint64_t lo = 0, hi = 0;
    if (it.held == WeightHeld::kFp32) {
      lo = hi = 4 * n;
    } else if (it.held == WeightHeld::kNorm) {
      lo = hi = 2 * n;
    } else {
      const std::string module = module_of(it.name_of(0));
      bool quantized = false;
      // An expert set is stored alike: judged, and priced, by its first expert.
      if (stored && stored->has(module + ".trellis")) {
        lo = hi = static_cast<uint64_t>(it.count) * stored_exl3_module(*stored, module);
        quantized = quantized_store = true;
      } else if (exl3_dummy && (!experts_only || module.find(".experts.") != std::string::npos)) {
        // Dummy EXL3 modules: K bits per weight and fp16 sign vectors, each dimension padded to 128 at most.
        const double k = static_cast<double>(bits) / 8.0;
        lo = static_cast<uint64_t>(it.count) *
             (static_cast<uint64_t>(std::ceil(static_cast<double>(it.out * it.in) * k)) +
              2 * static_cast<uint64_t>(it.in + it.out));
        hi = static_cast<uint64_t>(it.count) *
             (static_cast<uint64_t>(std::ceil(static_cast<double>(pad128(it.out) * pad128(it.in)) * k)) +
              2 * (pad128(it.in) + pad128(it.out)));
        quantized = true;
      } else {
        lo = hi = 2 * n;  // dense: bf16
      }
      if (quantized && it.held == WeightHeld::kEmbedding) quantized_embedding = true;
      if (quantized && module.size() >= 10 && module.compare(module.size() - 10, 10, ".kv_b_proj") == 0)
        ++quantized_kv_b;
    }
    if (it.held != WeightHeld::kFp32 && it.held != WeightHeld::kNorm) {
      const std::string module = module_of(it.name_of(0));
      const double part = rank_part(module);
      lo = static_cast<uint64_t>(std::llround(static_cast<double>(lo) * part));
      hi = static_cast<uint64_t>(std::ceil(static_cast<double>(hi) * part));
      if (module.find(".mlp.experts.") != std::string::npos) routed += lo;
    }
    low += lo;
    high += hi;
  }
  // What the runner derives: W_UK transposed per DSA layer; the dense bf16 copy the MLA block and the embedding
  // gather read where the format quantized kv_b or the embedding.
  // A rank derives them for its heads and vocabulary rows.
  const int64_t H = c.num_attention_heads, heads = shard.count(H);
  uint64_t derived = static_cast<uint64_t>(inv.dsa_layers * inv.w_uk_numel / H * heads) * 2 +
                     static_cast<uint64_t>(quantized_kv_b * inv.kv_b_numel / H * heads) * 2;
  if (quantized_embedding) derived += static_cast<uint64_t>(shard.count(c.vocab_size) * c.hidden_size) * 2;
  allocations += static_cast<uint64_t>(inv.dsa_layers + quantized_kv_b) + (quantized_embedding ? 1 : 0);
  WeightBytes w;
  w.low = low + derived;
  w.high = high + derived + allocations * kDeviceAlignment;
  w.routed_experts = routed;
  w.basis = std::string("glm5_next itemised from config.json: ") + std::to_string(inv.items.size()) + " tensors (" +
            std::to_string(c.num_hidden_layers) + " layers" +
            (with_mtp && !c.mtp.empty() ? " + " + std::to_string(c.mtp.size()) + " next-n" : "") + "), " +
            (quantized_store ? "projections as stored (EXL3 modules' trellis and signs, others bf16)"
             : exl3_dummy    ? (experts_only ? "routed experts" : "projections") + std::string(" at ") +
                                   std::to_string(bits) + " bits per weight (weights.bits)"
                             : "projections bf16") +
            ", mHC / conv / gates / router fp32, norms bf16, W_UK transposed on " + std::to_string(inv.dsa_layers) +
            " DSA layers" + (stored ? "" : " (model.load = \"dummy\": no next-n layers)");
  return w;
}

WeightBytes glm5_next_cpu_weight_bytes(const glm5_next::Glm5NextConfig& c, const WeightSource& stored,
                                       const std::string& prefix, uint64_t mapped_bytes, bool bf16_precision,
                                       bool with_mtp, CpuRanks ranks) {
  const WeightInventory inv = glm5_next::glm5_next_weight_inventory(c, prefix, with_mtp);
  const int world = std::max(ranks.world, 1), here = std::clamp(ranks.here, 1, world);
  const TensorShard shard{0, world};
  const glm5_next::Glm5NextShardedSource split_by(stored, c, shard);
  // The elements the ranks in this process hold of a tensor of `units` split units (0: replicated) and n elements.
  auto held_here = [&](uint64_t n, int64_t units) -> uint64_t {
    if (units <= 0 || world == 1) return n * static_cast<uint64_t>(here);
    if (here == world) return n;  // the parts add up to the whole
    return n / static_cast<uint64_t>(units) * static_cast<uint64_t>(shard.max_count(units) * here);
  };
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  // The per-head fp32 vectors the loader keeps its heads' part of.
  auto fp32_units = [&](const std::string& name) -> int64_t {
    return ends_with(name, ".conv1d.weight") || ends_with(name, ".forget_gate.dt_bias") ||
                   ends_with(name, ".forget_gate.A_log")
               ? c.linear_num_heads
               : 0;
  };
  auto rounded_units = [&](const WeightItem& it) -> int64_t {
    if (it.name.find(".mlp.experts.") != std::string::npos) return c.n_routed_experts;
    return split_by.row_split(module_of(it.name)).units;
  };
  uint64_t copies = 0, rounded = 0, blocks = 0;
  std::set<std::string> seen;  // a tied head is the embedding's rounded copy again
  for (const WeightItem& it : inv.items) {
    const uint64_t n = static_cast<uint64_t>(it.numel());
    if (it.held == WeightHeld::kFp32 || it.held == WeightHeld::kNorm) {
      copies += 4 * held_here(n, fp32_units(it.name));
      blocks += static_cast<uint64_t>(here);
    }
    // bf16 precision rounds what the GPU holds in bf16 (projections, experts, norms, the embedding), once per
    // tensor and only where it is stored wider; an expert's dtype is its first's.
    if (bf16_precision && it.held != WeightHeld::kFp32 && seen.insert(it.name).second) {
      auto t = stored.get(it.name_of(0));
      if (t.ok() && (t->dtype == DType::kF32 || t->dtype == DType::kF16)) {
        rounded += 2 * held_here(n, rounded_units(it));
        blocks += static_cast<uint64_t>(it.count) * static_cast<uint64_t>(here);
      }
    }
  }
  // kv_b in fp32, for the absorbed form: each rank its heads'.
  copies += 4 * held_here(static_cast<uint64_t>(inv.dsa_layers * inv.kv_b_numel), c.num_attention_heads);
  blocks += static_cast<uint64_t>(inv.dsa_layers) * static_cast<uint64_t>(here);
  // Low: the mapped files alone, which the measurement counts in full; the copies come from the heap, which may
  // reuse memory the process freed before (the screen's own parsing), so resident memory can grow by less.
  WeightBytes w;
  w.low = mapped_bytes;
  w.high = mapped_bytes + copies + rounded + blocks * kHostBlockSlack;
  w.basis =
      "the checkpoint's files, mapped (" + mib(mapped_bytes) + "), + fp32 copies of glm5_next's norms, mHC " +
      "maps, conv, gates, router and kv_b on " + std::to_string(inv.dsa_layers) + " DSA layers (" + mib(copies) +
      ", itemised from config.json)" +
      (bf16_precision ? " + bf16 copies of its F32/F16 projections, experts, norms and embedding (" + mib(rounded) + ")"
                      : "") +
      (world > 1 ? ", held by " + std::to_string(here) + " of " + std::to_string(world) +
                       " tensor-parallel ranks (replicated tensors once per rank, split ones in parts)"
                 : "");
  return w;
}

uint64_t glm5_next_vision_bytes(const nlohmann::json& config) {
  uint64_t b = 0;
  for (const WeightItem& it : glm5_next::glm5_next_vision_inventory(config)) b += 4 * static_cast<uint64_t>(it.numel());
  return b;
}

}  // namespace kiln
