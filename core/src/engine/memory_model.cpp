#include "engine/memory_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/engine_config.h"
#include "engine/engine_factory.h"
#include "model/batch_invariance.h"
#include "engine/glm5_next_memory.h"
#include "engine/kv_capacity.h"
#include "engine/rank_weights.h"
#include "kiln/kv_layout.h"
#include "kiln/log.h"
#include "model/arch/architecture.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/arch/glm5_next/glm5_next_tensor_names.h"
#include "model/batch_invariance.h"
#include "model/checkpoint.h"
#include "model/mla_moe_architecture.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "runtime/cpu_device_context.h"
#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kiln {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20, kGiB = uint64_t{1} << 30;
// The CUDA runtime's DeviceArena hands weights and caches out of 1 GiB chunks (device_arena.h).
constexpr uint64_t kArenaChunk = kGiB;
// StepGraphs::kMaxGraphs: decode-shaped steps captured lazily, the oldest dropped past this many.
constexpr uint64_t kMaxGraphs = 64;
// StepScratch::ensure keeps a quarter more than asked.
constexpr double kScratchHeadroom = 1.25;
// A sequence bringing kExpandedPrefillMinTokens tokens attends through the prefill kernel, whose workspace holds every
// key of the sequence expanded per head.
constexpr int64_t kPrefillMinTokens = kExpandedPrefillMinTokens;
constexpr char kStateTerm[] = "state slots";
constexpr char kPoolTerm[] = "KV pool";
constexpr char kCacheSlackTerm[] = "cache allocation slack";
constexpr char kVisionTerm[] = "vision tower";

// Device terms allocated after the engine plans its pool (the pool rule does not see them as in use).
bool after_plan(const MemoryTerm& t) {
  return t.name == kStateTerm || t.name == kCacheSlackTerm || t.name == kVisionTerm;
}

std::string gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b) / static_cast<double>(kGiB));
  return buf;
}
std::string size_text(uint64_t b) {
  char buf[32];
  if (b >= kGiB)
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / static_cast<double>(kGiB));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / static_cast<double>(kMiB));
  return buf;
}
std::string range_text(uint64_t lo, uint64_t hi) {
  return lo == hi ? size_text(lo) : size_text(lo) + " .. " + size_text(hi);
}
// "34 kda_state slots of 4.3 MiB": a sequence's state slots, by entry name and size (e.g. glm5_next's KDA
// layers: the recurrent heads × d_k × d_v and the conv inputs, fp32).
std::string state_slots_text(const CacheSpec& cache) {
  std::vector<std::pair<std::pair<std::string, size_t>, int64_t>> kinds;
  for (const LayerCacheSpec& l : cache.layers)
    for (const CacheEntry& e : l.entries) {
      if (e.kind != CacheKind::kState) continue;
      auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) {
        return k.first.first == e.name && k.first.second == e.slot_bytes;
      });
      if (it == kinds.end())
        kinds.push_back({{e.name, e.slot_bytes}, 1});
      else
        ++it->second;
    }
  std::string s;
  for (const auto& [kind, n] : kinds)
    s += (s.empty() ? "" : " + ") + std::to_string(n) + " " + kind.first + " slots of " +
         (kind.second < kMiB ? std::to_string(kind.second) + " B" : size_text(kind.second));
  return s;
}

uint64_t scale(uint64_t v, double f) {
  return static_cast<uint64_t>(std::ceil(static_cast<double>(v) * f));
}

MemoryTerm term(std::string name, uint64_t lo, uint64_t hi, MemoryWhere where, MemoryWhen when, std::string key,
                std::string basis) {
  return {std::move(name), lo, std::max(lo, hi), where, when, std::move(key), std::move(basis)};
}

// The CPU ranks in the priced process (any architecture): parallel.tensor of them as threads (`local`), one per
// process.
CpuRanks cpu_ranks(const Recipe& recipe) {
  const int world = static_cast<int>(std::max<int64_t>(recipe.section("parallel").get_int("tensor", 1), 1));
  const bool processes = recipe.section("transport").get_string("backend", "local") == "socket";
  return CpuRanks{world, processes ? 1 : world};
}

// The layer a tensor belongs to ("model.layers.12.…" → 12), or −1.
int64_t layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t end = prefix.size();
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  return end > prefix.size() ? std::stoll(name.substr(prefix.size(), end - prefix.size())) : -1;
}
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

uint64_t file_bytes(const std::vector<fs::path>& files) {
  uint64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    if (!ec) total += size;
  }
  return total;
}

struct WeightEstimate {
  uint64_t low = 0, high = 0;
  std::string basis;
  bool approximate = false;
  uint64_t routed_experts = 0;  // of low: the routed experts' bytes (what tensor parallelism divides most)
};

// The CUDA runner's copy of a checkpoint (runtime/cuda/gpu_weights.cpp): float tensors as bf16 but the router, its
// bias and the indexer's key norm in fp32; quantized tensors (integer dtypes: EXL3 trellis and signs) as stored;
// per attention layer W_UK transposed, and a dense copy of kv_b / the embedding where the format quantized them.
// With `config` and a sharded `shard`: what that tensor-parallel rank holds (rank_weights.h).
WeightEstimate cuda_checkpoint_weights(const Checkpoint& ckpt, const ModelInfo& info, int64_t mtp_layers,
                                       const ModelConfig* config = nullptr, TensorShard shard = {}) {
  if (!config) shard = {};
  uint64_t bytes = 0, experts = 0, router_terms_high = 0;
  int64_t quantized_kv_b = 0;
  bool quantized_embed = false;
  for (const std::string& name : ckpt.names()) {
    const int64_t layer = layer_of(name);
    if (layer >= info.num_layers + mtp_layers) continue;  // next-n layers not loaded
    auto t = ckpt.get(name);
    if (!t.ok()) continue;
    const uint64_t n = static_cast<uint64_t>(t->numel());
    uint64_t held = 0;
    if (!is_float(t->dtype)) {
      held = n * static_cast<uint64_t>(dtype_size(t->dtype));
      if (ends_with(name, "kv_b_proj.trellis")) ++quantized_kv_b;
      if (name == "model.embed_tokens.trellis") quantized_embed = true;
    } else if (ends_with(name, ".mlp.gate.weight")) {
      // fp32, and its exact bf16 terms for the prefill gate (gpu_weights.h): one from a bf16 checkpoint, none to
      // three from fp32 values — as many as terms · experts ≤ hidden allows.
      const int64_t E = std::max<int64_t>(info.num_experts, 1);
      const uint64_t usable = static_cast<uint64_t>(std::min<int64_t>(3, info.hidden_size / E));
      held = 4 * n;
      if (t->dtype == DType::kBF16)
        held += usable > 0 ? 2 * n : 0;
      else
        router_terms_high += 2 * n * usable;
    } else if (ends_with(name, "e_score_correction_bias") ||
               ends_with(name, "k_norm.weight") || ends_with(name, "k_norm.bias")) {
      held = 4 * n;
    } else {
      held = 2 * n;
    }
    if (shard.sharded()) held = rank_tensor_bytes(*config, name, held, shard);
    bytes += held;
    if (config && rank_holding(*config, name) == RankHolding::kRoutedExpert) experts += held;
  }
  const uint64_t attn_layers = static_cast<uint64_t>(info.num_layers + mtp_layers);
  const uint64_t H = info.num_heads, L = info.kv_lora_rank;
  // Per head: this rank's heads.
  bytes += rank_unit_bytes(attn_layers * H * L * static_cast<uint64_t>(info.qk_nope_head_dim) * 2, info.num_heads,
                           shard);  // W_UK transposed
  bytes += rank_unit_bytes(static_cast<uint64_t>(quantized_kv_b) * H * L *
                               static_cast<uint64_t>(info.qk_nope_head_dim + info.v_head_dim) * 2,
                           info.num_heads, shard);
  if (quantized_embed)
    bytes += rank_unit_bytes(static_cast<uint64_t>(info.vocab_size * info.hidden_size) * 2, info.vocab_size, shard);
  WeightEstimate w;
  w.low = bytes;
  w.routed_experts = experts;
  w.high = scale(bytes, 1.02) + router_terms_high;  // a format's own tables and 256-byte alignment
  w.basis = "checkpoint headers (" + std::to_string(ckpt.names().size()) + " tensors) as the CUDA runner holds them";
  return w;
}

// The CPU model's weights are views into the checkpoint's mapping (all of its files), plus fp32 copies of the
// small tensors (norms, router, kv_b for absorption) and, in bf16 precision, bf16 copies of F32 / F16 tensors.
WeightEstimate cpu_checkpoint_weights(const Checkpoint& ckpt, const ModelInfo& info, bool bf16_precision) {
  WeightEstimate w;
  w.low = file_bytes(ckpt.files());
  const uint64_t layers = static_cast<uint64_t>(info.num_layers + info.num_mtp_layers);
  uint64_t copies =
      layers *
      (static_cast<uint64_t>(info.num_heads * (info.qk_nope_head_dim + info.v_head_dim) * info.kv_lora_rank) +
       static_cast<uint64_t>(info.num_experts * (info.hidden_size + 1)) +
       static_cast<uint64_t>(4 * info.hidden_size + info.kv_lora_rank)) *
      4;
  if (bf16_precision)
    for (const std::string& name : ckpt.names())
      if (auto t = ckpt.get(name); t.ok() && (t->dtype == DType::kF32 || t->dtype == DType::kF16))
        copies += static_cast<uint64_t>(t->numel()) * 2;
  w.high = w.low + copies;
  w.basis = "the checkpoint's files, mapped (" + size_text(w.low) + "), + fp32 copies of norms, router and kv_b" +
            (bf16_precision ? " + bf16 copies of F32/F16 tensors" : "");
  return w;
}

// model.load = "dummy": the shapes the CUDA loader asks for (gpu_weights.cpp), each linear at the format's bytes per
// weight (dense: bf16; exl3: bits / 8 plus its sign vectors, 128-padded).
// With a sharded `shard`: what that tensor-parallel rank loads (rank_weights.h: its heads, dense-MLP columns, routed
// experts and vocabulary rows; the shared expert on shared_expert_rank; the rest whole).
// weights.experts_only (exl3): the routed experts at K bits, every other linear bf16 through the built-in format.
WeightEstimate dummy_weights(const ModelConfig& c, const std::string& format, int64_t bits, bool experts_only,
                             int64_t mtp_layers, TensorShard shard = {}) {
  const bool exl3_experts = format == "exl3";
  const bool exl3 = exl3_experts && !experts_only;  // every other linear quantized too
  double total = 0, experts = 0;
  auto linear_as = [&](double in, double out, bool quantized) {
    total += in * out * (quantized ? static_cast<double>(bits) / 8.0 : 2.0);
    if (quantized) total += 2.0 * (in + out);  // suh, svh
  };
  auto linear = [&](double in, double out) { linear_as(in, out, exl3); };
  const double Hd = static_cast<double>(c.hidden_size), H_all = static_cast<double>(c.num_attention_heads);
  // This rank's heads and vocabulary rows (all of them on one rank).
  const double H = static_cast<double>(shard.count(c.num_attention_heads));
  const double L = static_cast<double>(c.kv_lora_rank), D = L + static_cast<double>(c.qk_rope_head_dim);
  const double qk = static_cast<double>(c.qk_head_dim()), nope = static_cast<double>(c.qk_nope_head_dim);
  const double vd = static_cast<double>(c.v_head_dim), V = static_cast<double>(shard.count(c.vocab_size));
  auto layer = [&](int64_t l) {
    total += 2 * Hd * 2;  // norms
    if (c.q_lora_rank > 0) {
      linear(Hd, static_cast<double>(c.q_lora_rank) + D);
      total += static_cast<double>(c.q_lora_rank) * 2;
      linear(static_cast<double>(c.q_lora_rank), H * qk);
    } else {
      linear(Hd, H * qk);
      linear(Hd, D);
    }
    total += L * 2;
    linear(L, H * (nope + vd));
    if (exl3) total += L * H * (nope + vd) * 2;  // dequantized for absorption
    total += H * L * nope * 2;                   // W_UK transposed
    linear(H_all * vd, Hd);  // o_proj: whole on every rank (it reads every head's output, gathered)
    if (c.has_indexer() && !c.indexer_is_shared(l)) {
      const double Di = static_cast<double>(c.index_head_dim), nh = static_cast<double>(c.index_n_heads);
      linear(static_cast<double>(c.q_lora_rank), nh * Di);
      linear(Hd, Di);
      linear(Hd, nh);
      total += 2 * Di * 4;
    }
    if (!c.is_moe(l)) {
      linear(Hd, 2 * static_cast<double>(shard.count(c.intermediate_size)));  // this rank's columns
      linear(static_cast<double>(c.intermediate_size), Hd);                   // down whole
      return;
    }
    const double E = static_cast<double>(c.n_routed_experts), I = static_cast<double>(c.moe_intermediate_size);
    total += (E * Hd + E) * 4;  // router, bias
    if (3 * E <= Hd) total += E * Hd * 6;  // the router's three bf16 terms (dummy fp32 values), where they fit
    const double before = total;
    for (int64_t e = 0; e < shard.count(c.n_routed_experts); ++e) {
      linear_as(Hd, 2 * I, exl3_experts);
      linear_as(I, Hd, exl3_experts);
    }
    experts += total - before;
    if (c.n_shared_experts > 0 && shard.rank == shared_expert_rank(shard)) {
      linear(Hd, 2 * I * static_cast<double>(c.n_shared_experts));
      linear(I * static_cast<double>(c.n_shared_experts), Hd);
    }
  };
  linear(Hd, V);                  // embedding, through the format
  if (exl3) total += V * Hd * 2;  // dequantized for the lookup
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) layer(l);
  total += Hd * 2;
  if (!c.tie_word_embeddings) linear(Hd, V);
  for (int64_t i = 0; i < mtp_layers; ++i) {
    total += 3 * Hd * 2;
    linear(2 * Hd, Hd);
    layer(c.num_hidden_layers + i);
  }
  WeightEstimate w;
  w.low = static_cast<uint64_t>(total);
  w.routed_experts = static_cast<uint64_t>(experts);
  w.high = scale(w.low, exl3_experts ? 1.08 : 1.02);  // exl3 pads each dimension to 128
  w.basis = "config shapes (model.load = \"dummy\") at " +
            (exl3 ? std::to_string(bits) + " bits per weight (weights.bits)"
             : exl3_experts ? "bf16, routed experts at " + std::to_string(bits) + " bits per weight (weights.bits, "
                              "weights.experts_only)"
                            : std::string("bf16"));
  return w;
}

// An architecture with neither the MLA + MoE family's config nor a weight inventory (glm5_next has one:
// glm5_next_memory.h), loaded as dummies: its attention and experts from ModelInfo, with a wide interval, since its
// own blocks are not itemised.
WeightEstimate approximate_weights(const ModelInfo& i, int64_t mtp_layers) {
  const double Hd = static_cast<double>(i.hidden_size), H = static_cast<double>(i.num_heads);
  const double L = static_cast<double>(i.kv_lora_rank),
               qk = static_cast<double>(i.qk_nope_head_dim + i.qk_rope_head_dim);
  const double q = i.q_lora_rank > 0
                       ? Hd * static_cast<double>(i.q_lora_rank) + static_cast<double>(i.q_lora_rank) * H * qk
                       : Hd * H * qk;
  const double attn = q + Hd * (L + static_cast<double>(i.qk_rope_head_dim)) +
                      L * H * static_cast<double>(i.qk_nope_head_dim + i.v_head_dim) +
                      H * static_cast<double>(i.v_head_dim) * Hd;
  const double moe = static_cast<double>(i.num_experts + 1) * 3 * Hd * static_cast<double>(i.moe_intermediate_size);
  const double params =
      static_cast<double>(i.num_layers + mtp_layers) * (attn + moe) + 2 * static_cast<double>(i.vocab_size) * Hd;
  WeightEstimate w;
  w.low = scale(static_cast<uint64_t>(params * 2), 0.5);
  w.high = scale(static_cast<uint64_t>(params * 2), 1.3);
  w.basis = "approximate: every layer's attention + experts from the config, bf16, 0.5 .. 1.3 × (" + i.model_type +
            "'s own blocks and dense layers are not itemised)";
  w.approximate = true;
  return w;
}

// One step's device scratch at N tokens (runtime/cuda/cuda_step_setup.cpp carve_step_buffers), R logit rows,
// S sequences: per-token buffers, the expert workspace, the logits, plus `prefill_keys` keys expanded for the
// prefill kernel and the split-KV partials of the decode kernel; with decode-context parallelism over `context`
// GPU ranks, the split attention's buffers (runtime/cuda/cuda_split_context.cpp) too.
// tile_rows > 0: a step of more rows is one prompt run layer by layer in tiles (model/batch_invariance.h's
// kCudaPrefillTileRows): the rows' token arrays, residual stream, block inputs, final-normed and hidden rows and taps
// are the step's, everything else one tile's.
uint64_t step_scratch_bytes(const ModelConfig& c, int64_t N, int64_t R, int64_t S, int64_t max_blocks,
                            int64_t prefill_keys, int64_t taps, int64_t context = 1, int64_t tile_rows = 0) {
  const double Hd = static_cast<double>(c.hidden_size), H = static_cast<double>(c.num_attention_heads);
  const double L = static_cast<double>(c.kv_lora_rank), Rr = static_cast<double>(c.qk_rope_head_dim);
  const double qk = static_cast<double>(c.qk_head_dim()), D = L + Rr, vd = static_cast<double>(c.v_head_dim);
  const double E = static_cast<double>(std::max<int64_t>(c.n_routed_experts, 1));
  const double k = static_cast<double>(std::max<int64_t>(c.num_experts_per_tok, 1));
  const double mI = static_cast<double>(c.moe_intermediate_size);
  const double dI = static_cast<double>(std::max(c.intermediate_size, c.moe_intermediate_size * c.n_shared_experts));
  const double qlr = static_cast<double>(std::max<int64_t>(c.q_lora_rank, 1));
  double per_token = 28 + 4 * Hd + 4 * Hd + 4 * (qlr + D) + 2 * qlr + 6 * H * qk + 4 * H * D + 2 * H * L + 2 * H * vd +
                     6 * dI + 2 * Hd + 4 * Hd + 4 * E + 12 * k + 4 * (k + 1) * Hd + 2 * Hd + 4 * Hd /* hidden */ +
                     2 * k * mI + 2 * mI /* expert workspace */ + 8 * Hd /* MTP rows */ +
                     4 * Hd * static_cast<double>(taps);
  if (c.has_indexer())
    per_token += 4 * static_cast<double>(c.index_n_heads * c.index_head_dim + c.index_head_dim + c.index_n_heads +
                                         c.index_topk) +
                 4 * static_cast<double>(c.index_topk) /* score row, at least */;
  const double Nd = static_cast<double>(N);
  // What every row of the step keeps: ids, query_seq, kv_len, positions, slots; residual (fp32), block input, normed
  // and hidden rows; taps.
  const double full_row = 28 + 4 * Hd + 2 * Hd + 2 * Hd + 4 * Hd + 4 * Hd * static_cast<double>(taps);
  const double tiled = tile_rows > 0 && N > tile_rows ? static_cast<double>(tile_rows) : Nd;
  double total = Nd * full_row + tiled * (per_token - full_row) + static_cast<double>(S * max_blocks) * 4 +
                 static_cast<double>(R) * (2 * Hd + 4 * static_cast<double>(c.vocab_size));
  // Decode attention's split-KV partials: up to 64 splits for ≤ 32 rows (split by length), a few beyond.
  total += 4.0 * 64 * static_cast<double>(std::min<int64_t>(N, 32)) * H * (L + 1) + 4.0 * 2 * tiled * H * (L + 1);
  total += static_cast<double>(prefill_keys) * (2 * D + 2 * H * (static_cast<double>(c.qk_nope_head_dim) + vd));
  // The expansion's cuBLASLt workspace (kernels/cuda/head_batched_gemm.h, kHeadBatchedGemmWorkspaceBytes: 32 MiB).
  if (prefill_keys > 0) total += 32.0 * kMiB;
  if (context > 1) {
    // Every head's absorbed q, this rank's partial output and log-sum-exp, every rank's gathered (W + 1 copies of
    // N · heads · (latent + 1) fp32), its gather staging; and for expanded prefill the rank's own context rows
    // (a 1/W share of the prompts' keys) sent and every rank's received, bf16.
    const double W = static_cast<double>(context);
    total += 4.0 * Nd * H * D + 4.0 * (W + 1) * Nd * H * (L + 1) + 4.0 * (W + 1) * Nd * H * D;
    total += 2.0 * D * (W + 1) * std::ceil(static_cast<double>(prefill_keys) / W) + 16.0 * static_cast<double>(S);
  }
  return static_cast<uint64_t>(total);
}

uint64_t gpu_total_memory(std::string& name) {
#ifdef KILN_WITH_CUDA
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    name = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
    return prop.totalGlobalMem;
  }
  cudaGetLastError();
#endif
  name = "cuda";
  return 0;
}

// The layout's bytes per token, from its CPU half (the same format on every device); else bf16 latent + rope.
// The recipe's KV layout's bytes per token, and (into `keys`) how it has a DSA indexer store its keys.
uint64_t layout_bytes_per_token(const Recipe& recipe, const Registry& registry, const ModelInfo& info,
                                std::vector<std::string>& notes, IndexerKeyFormat& keys) {
  const RecipeSection& kv = recipe.section("kv");
  CpuDeviceContext cpu;
  CreateContext ctx;
  ctx.section = &kv;
  ctx.device = Device::cpu();
  ctx.model = &info;
  ctx.device_context = &cpu;
  auto layout = registry.create<KvLayout>(kv.get_string("layout", "bf16"), ctx);
  keys = IndexerKeyFormat::kFp32;
  if (layout.ok()) {
    keys = (*layout)->indexer_key_format();
    return (*layout)->bytes_per_token();
  }
  notes.push_back("KV layout `" + kv.get_string("layout") + "` has no CPU half to ask its bytes per token (" +
                  layout.status().message() + "): bf16 latent + rope and fp32 indexer keys assumed");
  return static_cast<uint64_t>(info.kv_lora_rank + info.qk_rope_head_dim) * 2;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

MemoryRange MemoryModel::total(MemoryWhere where, MemoryWhen upto) const {
  MemoryRange r;
  const bool coupled = inputs.cuda && where == MemoryWhere::kDevice && inputs.memory_bytes > 0;
  for (const MemoryTerm& t : terms)
    if (t.where == where && (upto == MemoryWhen::kRun || t.when == MemoryWhen::kLoad)) {
      // On CUDA the pool takes what the memory in use at start leaves: those terms and the pool are summed per
      // case below, not as independent intervals.
      if (coupled && (t.name == kPoolTerm || (t.when == MemoryWhen::kLoad && !after_plan(t)))) continue;
      r.low += t.low;
      r.high += t.high;
    }
  if (coupled) {
    // In use + pool, at the least and at the most in use (monotone: the pool shrinks by what use grows, until the
    // max_num_seqs × max_model_len cap). Less one block (the pool is whole blocks) and, where the pool's
    // allocations are smaller than the arena's chunk, what they may take from the last weight chunk's free tail.
    const uint64_t low = used_low + pool_bytes_at_used_low, high = used_high + pool_bytes_at_used_high;
    const uint64_t shared_tail =
        pool_entry_bytes < kArenaChunk / 4 ? std::min<uint64_t>(pool_bytes_at_used_high, kArenaChunk) : 0;
    // And 64 MiB for what the device reports: its total (properties vs cudaMemGetInfo) and in-use granularity.
    const uint64_t below = block_bytes + shared_tail + 64 * kMiB;
    r.low += low > below ? low - below : 0;
    r.high += std::max(low, high);
  }
  return r;
}

uint64_t MemoryModel::limit(MemoryWhere where) const {
  const MemoryInputs& in = inputs;
  if (where == MemoryWhere::kDevice) return in.cuda ? in.memory_bytes : 0;
  return in.host_memory_bytes;
}

MemoryModel estimate_memory(const MemoryInputs& in) {
  MemoryModel m;
  m.inputs = in;
  m.terms = in.terms;
  const MemoryWhere pool_where = in.cuda ? MemoryWhere::kDevice : MemoryWhere::kHost;
  // The pool rule (plan_engine): what the budget leaves after what is in use when the engine starts.
  uint64_t used_low = in.rule_weight_bytes, used_high = in.rule_weight_bytes;
  if (in.cuda) {
    // In use when the engine plans: everything held at load but the state slots, which the cache manager
    // allocates after (the rule subtracts them with the workspace).
    used_low = used_high = 0;
    for (const MemoryTerm& t : m.terms)
      if (t.where == MemoryWhere::kDevice && t.when == MemoryWhen::kLoad && !after_plan(t)) {
        used_low += t.low;
        used_high += t.high;
      }
  }
  auto pool_blocks = [&](uint64_t used) -> int64_t {
    KvPoolBudget b;
    b.memory_bytes = in.memory_bytes;
    b.utilization = in.utilization;
    b.weight_bytes = used;
    b.workspace_bytes = in.rule_workspace_bytes;
    b.bytes_per_token = std::max<uint64_t>(in.kv_bytes_per_token, 1);
    b.block_size = std::max<int64_t>(in.block_size, 1);
    b.stored_per_block = in.stored_per_block;
    b.max_model_len = std::max<int64_t>(in.max_model_len, 1);
    b.max_tokens = in.max_num_seqs * in.max_model_len;
    // plan_kv_capacity refuses a pool under one window; the screen wants the number either way.
    b.max_model_len = 1;
    auto c = plan_kv_capacity(b);
    return c.ok() ? c->num_blocks : 0;
  };
  const int64_t bs = std::max<int64_t>(in.block_size, 1);
  const int64_t blocks_low = pool_blocks(used_high), blocks_high = pool_blocks(used_low);
  m.pool_tokens_low = blocks_low * bs;
  m.pool_tokens_high = blocks_high * bs;
  const uint64_t block_bytes =
      in.kv_bytes_per_token * static_cast<uint64_t>(in.stored_per_block > 0 ? in.stored_per_block : bs);
  const std::string pool_key = in.cuda ? "scheduler.gpu_memory_utilization" : "scheduler.max_model_len";
  m.used_low = used_low;
  m.used_high = used_high;
  m.block_bytes = block_bytes;
  m.pool_bytes_at_used_low = static_cast<uint64_t>(blocks_high) * block_bytes;
  m.pool_bytes_at_used_high = static_cast<uint64_t>(blocks_low) * block_bytes;
  m.pool_entry_bytes = m.pool_bytes_at_used_low / static_cast<uint64_t>(std::max<int64_t>(in.cache_allocations, 1));
  if (in.cuda) {
    // Each paged cache entry is one arena allocation: from a quarter chunk up it gets its own cudaMalloc (2 MiB
    // granularity), below it they pack into 1 GiB chunks.
    const uint64_t slack = static_cast<uint64_t>(in.cache_allocations) * 2 * kMiB +
                           (m.pool_entry_bytes < kArenaChunk / 4 ? kArenaChunk : 0);
    m.terms.push_back(term(kCacheSlackTerm, 0, slack, MemoryWhere::kDevice, MemoryWhen::kLoad, "",
                           std::to_string(in.cache_allocations) + " cache allocations of ~" +
                               size_text(m.pool_entry_bytes) + " from the arena"));
  }
  m.terms.push_back(
      term(kPoolTerm, static_cast<uint64_t>(blocks_low) * block_bytes, static_cast<uint64_t>(blocks_high) * block_bytes,
           pool_where, MemoryWhen::kLoad, pool_key,
           std::to_string(in.kv_bytes_per_token) + " B/token (kv.layout, every paged layer) × " +
               (blocks_low == blocks_high
                    ? std::to_string(m.pool_tokens_low)
                    : std::to_string(m.pool_tokens_low) + " .. " + std::to_string(m.pool_tokens_high)) +
               " tokens (the pool rule: " +
               (in.cuda ? "what gpu_memory_utilization × device memory leaves, "
                        : "what gpu_memory_utilization × RAM leaves, ") +
               "at most max_num_seqs × max_model_len = " + std::to_string(in.max_num_seqs * in.max_model_len) + ")"));
  // The BlockManager's tables and the prefix cache's index: host memory per block.
  m.terms.push_back(term("block tables + prefix index", static_cast<uint64_t>(blocks_low) * 16,
                         static_cast<uint64_t>(blocks_high) * 192 + static_cast<uint64_t>(in.max_num_seqs) * 4096,
                         MemoryWhere::kHost, MemoryWhen::kLoad, "scheduler.prefix_caching",
                         "16 .. 192 B per KV block, 4 KiB per sequence"));

  // Verdict.
  if (in.memory_bytes == 0) {
    m.judged = false;
    m.go = false;
    return m;
  }
  const int64_t window_blocks = (in.max_model_len + bs - 1) / bs;
  const uint64_t usable = static_cast<uint64_t>(in.utilization * static_cast<double>(in.memory_bytes));
  auto largest = [&](MemoryWhere where, MemoryWhen upto, bool in_use_only = false) {
    std::vector<const MemoryTerm*> ts;
    for (const MemoryTerm& t : m.terms)
      if (t.where == where && (upto == MemoryWhen::kRun || t.when == MemoryWhen::kLoad) && t.high > 0 &&
          !(in_use_only && (t.name == kPoolTerm || after_plan(t))))
        ts.push_back(&t);
    std::sort(ts.begin(), ts.end(), [](const MemoryTerm* a, const MemoryTerm* b) { return a->high > b->high; });
    std::string s;
    for (size_t i = 0; i < ts.size() && i < 3; ++i)
      s += (i ? ", " : "") + ts[i]->name + " " + size_text(ts[i]->high) +
           (ts[i]->key.empty() ? "" : " (" + ts[i]->key + ")");
    return s;
  };
  if (blocks_low < window_blocks) {
    m.go = false;
    // The rule's arithmetic (plan_kv_capacity) at the most in use: one window's blocks beyond what it leaves.
    const uint64_t needed = used_high + in.rule_workspace_bytes + static_cast<uint64_t>(window_blocks) * block_bytes;
    m.shortfall_bytes = std::max(m.shortfall_bytes, needed > usable ? needed - usable : block_bytes);
    // What the rule subtracted, as it does: on CUDA the memory in use at start, on the CPU the checkpoint's files.
    const std::string taken = in.cuda ? "what is in use at start, up to " + size_text(used_high) + " (" +
                                            largest(MemoryWhere::kDevice, MemoryWhen::kLoad, true) + ")"
                                      : "the checkpoint's " + size_text(in.rule_weight_bytes) + " (weights.format)";
    const std::string fix =
        in.rule_workspace_bytes > used_high
            ? "lower scheduler.max_num_batched_tokens or scheduler.max_num_seqs, or lower scheduler.max_model_len"
            : "lower scheduler.max_model_len, raise scheduler.gpu_memory_utilization or shrink the weights "
              "(weights.format)";
    m.reasons.push_back("the KV pool holds " + std::to_string(m.pool_tokens_low) +
                        " tokens at worst, fewer than one max_model_len window (" + std::to_string(in.max_model_len) +
                        "): " + size_text(usable) + " usable (scheduler.gpu_memory_utilization = " +
                        std::to_string(in.utilization).substr(0, 4) + " of " + size_text(in.memory_bytes) + ") less " +
                        taken + " and the step workspace the rule sets aside, " + size_text(in.rule_workspace_bytes) +
                        " (scheduler.max_num_batched_tokens, scheduler.max_num_seqs); " + fix);
  } else if (blocks_low * bs < in.max_num_seqs * in.max_model_len) {
    m.reasons.push_back(
        "note: the KV pool holds " + std::to_string(m.pool_tokens_low) + " tokens at worst = " +
        std::to_string(static_cast<double>(m.pool_tokens_low) / static_cast<double>(in.max_model_len)).substr(0, 5) +
        " full-length sequences of scheduler.max_num_seqs = " + std::to_string(in.max_num_seqs) +
        " (sequences beyond wait; lower scheduler.max_model_len to fit more)");
  }
  auto check = [&](MemoryWhere where, const char* what) {
    const uint64_t cap = m.limit(where);
    if (cap == 0) return;
    const MemoryRange at_load = m.total(where, MemoryWhen::kLoad), peak = m.total(where, MemoryWhen::kRun);
    if (at_load.high > cap) {
      m.go = false;
      m.shortfall_bytes = std::max(m.shortfall_bytes, at_load.high - cap);
      m.reasons.push_back(std::string(what) + " at load may reach " + size_text(at_load.high) + ", over the " +
                          size_text(cap) + " there is; largest: " + largest(where, MemoryWhen::kLoad));
    } else if (peak.high > cap) {
      m.go = false;
      m.shortfall_bytes = std::max(m.shortfall_bytes, peak.high - cap);
      const uint64_t run = peak.high - at_load.high;
      std::string fix = "lower scheduler.max_num_batched_tokens";
      if (in.cuda && where == MemoryWhere::kDevice) {
        const double util =
            std::floor(100.0 * static_cast<double>(cap - std::min(cap, run + run / 8)) / static_cast<double>(cap)) /
            100.0;
        fix = "lower scheduler.gpu_memory_utilization to " + std::to_string(util).substr(0, 4) +
              " (the KV pool takes what it leaves, so the activations and CUDA graphs need room outside it) or " + fix;
      }
      m.reasons.push_back(std::string(what) + " at peak may reach " + size_text(peak.high) + ", over the " +
                          size_text(cap) + " there is; largest: " + largest(where, MemoryWhen::kRun) + "; " + fix);
    }
  };
  if (in.cuda) check(MemoryWhere::kDevice, "device memory");
  check(MemoryWhere::kHost, in.cuda ? "host memory" : "memory");
  // A no-go that rests on a term the screen only approximates is not a verdict.
  for (const MemoryTerm& t : m.terms)
    if (!m.go && t.approximate) {
      m.judged = false;
      m.reasons.insert(m.reasons.begin(), "no verdict: `" + t.name + "` is approximated (" + t.basis +
                                              ") and its high end alone may not fit; what follows is the worst case");
      break;
    }
  return m;
}

std::string MemoryModel::report(const std::string& p) const {
  std::ostringstream o;
  o << p << "memory model (" << inputs.device_name << "; intervals low .. high):\n";
  for (MemoryWhere where : {MemoryWhere::kDevice, MemoryWhere::kHost}) {
    if (where == MemoryWhere::kDevice && !inputs.cuda) continue;
    o << p << "  " << (where == MemoryWhere::kDevice ? "device" : "host") << ":\n";
    for (const MemoryTerm& t : terms) {
      if (t.where != where) continue;
      o << p << "    " << t.name << ": " << range_text(t.low, t.high)
        << (t.when == MemoryWhen::kRun ? " (from the first steps)" : "") << (t.key.empty() ? "" : " [" + t.key + "]")
        << " — " << t.basis << "\n";
    }
    const MemoryRange at_load = total(where, MemoryWhen::kLoad), peak = total(where, MemoryWhen::kRun);
    o << p << "    total: [" << gib(at_load.low) << ", " << gib(at_load.high) << "] GiB at load, [" << gib(peak.low)
      << ", " << gib(peak.high) << "] GiB at peak, of " << gib(limit(where)) << " GiB";
    if ((where == MemoryWhere::kDevice) == inputs.cuda)
      o << " (budget " << gib(static_cast<uint64_t>(inputs.utilization * static_cast<double>(inputs.memory_bytes)))
        << " GiB = scheduler.gpu_memory_utilization " << std::to_string(inputs.utilization).substr(0, 4) << ")";
    o << "\n";
    if (where == MemoryWhere::kDevice && inputs.memory_bytes > 0)
      o << p
        << "    (the pool takes what gpu_memory_utilization leaves after what is in use at start, so the at-load total "
           "is tighter than the sum of the terms)\n";
  }
  if (inputs.rank_weights.size() > 1) {
    o << p << "  weights per rank (parallel.tensor = " << inputs.rank_weights.size()
      << "; the largest bounds the KV pool):\n";
    for (size_t r = 0; r < inputs.rank_weights.size(); ++r) {
      const MemoryInputs::RankWeights& w = inputs.rank_weights[r];
      o << p << "    rank " << r << ": " << range_text(w.low, w.high) << " (routed experts " << size_text(w.routed_experts)
        << " of " << size_text(inputs.full_routed_experts) << ")\n";
    }
  }
  for (const std::string& n : inputs.notes) o << p << "  assumes: " << n << "\n";
  o << p << "  verdict: "
    << (judged                     ? (go ? "go" : "no-go")
        : inputs.memory_bytes == 0 ? "none (the memory to judge against is not known)"
                                   : "none (it would rest on an approximated term)")
    << "\n";
  for (const std::string& r : reasons) o << p << "    " << r << "\n";
  return o.str();
}

std::string MemoryModel::summary() const {
  const MemoryWhere where = inputs.cuda ? MemoryWhere::kDevice : MemoryWhere::kHost;
  const MemoryRange at_load = total(where, MemoryWhen::kLoad), peak = total(where, MemoryWhen::kRun);
  return "memory: predicted [" + gib(at_load.low) + ", " + gib(at_load.high) + "] GiB at load ([" + gib(peak.low) +
         ", " + gib(peak.high) + "] GiB at peak) on " + inputs.device_name + "; " +
         (!judged ? "no verdict"
          : go    ? "go"
                  : "no-go");
}

// ---------------------------------------------------------------------------------------------------------------

Result<MemoryInputs> memory_inputs(const Recipe& recipe, const Registry& registry, const ScreenOptions& options) {
  const RecipeSection& model = recipe.section("model");
  const fs::path dir = model.get_string("path");
  if (!fs::is_directory(dir))
    return not_found("`model.path` (" + model.origin("path") + "): " + dir.string() + " is not a directory");
  KILN_ASSIGN_OR_RETURN(auto arch, load_architecture(dir / "config.json"));
  ModelInfo info = arch->info();
  info.checkpoint_dir = dir.string();
  info.synthetic_weights = model.get_string("load", "mmap") == "dummy";
  // A recipe for CUDA can be screened where no GPU is (planning for one): with the memory the caller names, or with
  // no verdict.
  auto resolved = resolve_device(recipe, registry, *arch);
  const bool cuda_elsewhere = !resolved.ok() && model.get_string("device", "auto") == "cuda";
  if (!resolved.ok() && !cuda_elsewhere) return resolved.status();
  const DeviceType device = resolved.ok() ? *resolved : DeviceType::kCuda;
  const RecipeSection& scheduler = recipe.section("scheduler");
  KILN_ASSIGN_OR_RETURN(EngineConfig config, engine_config_from_recipe(scheduler, info.max_position_embeddings));

  MemoryInputs in;
  in.cuda = device == DeviceType::kCuda;
  // scheduler.batch_invariant on CUDA: the engine keeps every step within the runner's bound (at most
  // kCudaBatchInvariantMaxRows rows, prompt chunks below the prefill kernel's threshold), so one step's activations
  // are priced at those rows and no prompt chunk expands its keys for the prefill kernel. (The CPU runner is
  // invariant at any size: nothing changes there.)
  const bool invariant_steps = in.cuda && config.batch_invariant;
  if (invariant_steps && config.max_num_batched_tokens > kCudaBatchInvariantMaxRows) {
    in.notes.push_back("scheduler.batch_invariant: steps of at most " + std::to_string(kCudaBatchInvariantMaxRows) +
                       " tokens (the CUDA runner's bound; a format may promise fewer) priced instead of "
                       "max_num_batched_tokens = " + std::to_string(config.max_num_batched_tokens) +
                       ", and no prompt chunk reaches the prefill kernel");
    config.max_num_batched_tokens = kCudaBatchInvariantMaxRows;
  }
  if (invariant_steps) config.lone_prompt_tokens = 0;  // BatchEngine keeps a lone prompt inside the bound too
  in.host_memory_bytes = options.host_memory_bytes ? options.host_memory_bytes : physical_memory_bytes();
  if (in.cuda) {
    in.memory_bytes = options.memory_bytes ? options.memory_bytes
                      : cuda_elsewhere     ? 0
                                           : gpu_total_memory(in.device_name);
    if (in.device_name.empty()) in.device_name = "cuda";
    if (cuda_elsewhere)
      in.notes.push_back("no CUDA device here (" + resolved.status().message() + "): " +
                         (options.memory_bytes
                              ? "screened for the device memory given"
                              : "no verdict without the device's memory (kiln recipe show --device-memory-gib N)"));
  } else {
    in.memory_bytes = options.memory_bytes ? options.memory_bytes : in.host_memory_bytes;
    in.device_name = "cpu";
    in.host_memory_bytes = in.memory_bytes;
  }
  in.utilization = scheduler.get_float("gpu_memory_utilization", 0.9);
  // The scheduler's block: a page on each rank of a decode-context group (model/decode_context_shard.h).
  const int64_t context = recipe.section("parallel").get_int("decode_context", 1);
  in.block_size = recipe.section("kv").get_int("block_size", 64) * context;
  // GPU ranks (a process and a pool each) store only their own page of every block.
  in.stored_per_block = in.cuda && context > 1 ? recipe.section("kv").get_int("block_size", 64) : in.block_size;
  if (context > 1)
    in.notes.push_back("parallel.decode_context = " + std::to_string(context) + ": each rank's pages hold 1/" +
                       std::to_string(context) + " of every sequence's KV" +
                       (in.cuda ? std::string(": a GPU rank's pool stores its own page of each block, so the same bytes "
                                              "hold ") + std::to_string(context) + "× the tokens (the capacity below)"
                                : std::string(" (on one GPU per rank the same bytes per rank would hold ") +
                                      std::to_string(context) + "× the tokens); CPU ranks share this process's one "
                                      "pool, so the capacity below is the group's"));

  in.max_model_len = config.max_model_len;
  in.max_num_seqs = config.max_num_seqs;
  const MemoryWhere main = in.cuda ? MemoryWhere::kDevice : MemoryWhere::kHost;
  const int64_t N = config.max_num_batched_tokens, S = config.max_num_seqs;

  // The drafter: next-n layers of the target (mtp), or a checkpoint of its own (speculative.draft_model).
  const RecipeSection& spec = recipe.section("speculative");
  const std::string method = spec.get_string("method", "none");
  const bool drafting = method != "none" && spec.get_int("depth", 0) > 0;
  const int64_t mtp_loaded = method != "none" ? info.num_mtp_layers : 0;  // model_load_options
  const int64_t mtp_cached = drafting && method == "mtp" ? info.num_mtp_layers : 0;
  IndexerKeyFormat index_keys = IndexerKeyFormat::kFp32;
  const uint64_t layout_bpt = layout_bytes_per_token(recipe, registry, info, in.notes, index_keys);
  // Ranks with pools of their own (one process per rank: every CUDA rank, `socket` CPU ranks) keep their heads'
  // part of a sequence's state; ranks as threads share one pool of whole slots.
  const int tensor_ranks = cpu_ranks(recipe).world;
  const bool own_pools = tensor_ranks > 1 && (in.cuda || cpu_ranks(recipe).here == 1);
  CacheSpec cache = arch->cache_spec(mtp_cached, index_keys, own_pools ? tensor_ranks : 1);
  const std::string draft_model = drafting ? spec.get_string("draft_model", "") : "";
  const int64_t depth = drafting ? spec.get_int("depth", 0) : 0;
  uint64_t draft_row_low = 0, draft_row_high = 0;
  // Tapped layers a drafter other than MTP reads (each an fp32 row per step row): the checkpoint's
  // dflash_config.target_layer_ids but the last layer (its tap is the final-normed row every step has), else 4.
  int64_t draft_taps = drafting && method != "mtp" ? 4 : 0;
  if (!draft_model.empty()) {
    const fs::path ddir = draft_model;
    if (!fs::is_directory(ddir))
      return not_found("`speculative.draft_model` (" + spec.origin("draft_model") + "): " + ddir.string() +
                       " is not a directory");
    std::ifstream f(ddir / "config.json");
    nlohmann::json dj = nlohmann::json::parse(f, nullptr, false);
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(ddir, std::filesystem::directory_options::skip_permission_denied))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    const uint64_t bytes = file_bytes(files);
    // On CUDA the drafter's floats become bf16 (half an fp32 file); on the CPU they are mapped.
    in.terms.push_back(term("drafter weights", in.cuda ? bytes / 2 : bytes, scale(bytes, 1.05), main, MemoryWhen::kLoad,
                            "speculative.draft_model", ddir.string() + "'s safetensors (" + size_text(bytes) + ")"));
    if (dj.is_object() && dj.contains("dflash_config") && dj["dflash_config"].is_object() &&
        dj["dflash_config"].contains("target_layer_ids") && dj["dflash_config"]["target_layer_ids"].is_array()) {
      draft_taps = 0;
      for (const nlohmann::json& id : dj["dflash_config"]["target_layer_ids"])
        draft_taps += !(id.is_number_integer() && id.get<int64_t>() == info.num_layers - 1);
    }
    if (dj.is_object()) {
      // The drafter's loader refuses a malformed config with its reasons; here such a key only counts as absent.
      auto dim = [&](const char* key, int64_t fallback) {
        const bool ok = dj.contains(key) && dj[key].is_number_integer() && dj[key].get<int64_t>() >= 0 &&
                        dj[key].get<int64_t>() <= (int64_t{1} << 20);
        return ok ? dj[key].get<int64_t>() : fallback;
      };
      const int64_t layers = dim("num_hidden_layers", 0), kv_heads = dim("num_key_value_heads", 0);
      const int64_t head_dim =
          dim("head_dim", kv_heads > 0 ? dim("hidden_size", 0) / std::max<int64_t>(dim("num_attention_heads", 1), 1) : 0);
      draft_row_low = static_cast<uint64_t>(layers * 2 * kv_heads * head_dim) * 2;  // K and V rows, bf16 .. fp32
      draft_row_high = draft_row_low * 2;
      in.notes.push_back("the drafter's own KV: " + std::to_string(layers) + " layers × K and V of " +
                         std::to_string(kv_heads) + " × " + std::to_string(head_dim) + ", bf16 .. fp32 per token");
    }
  }
  in.kv_bytes_per_token = cache.bytes_per_token(layout_bpt) + draft_row_high;
  for (const LayerCacheSpec& l : cache.layers)
    for (const CacheEntry& e : l.entries) in.cache_allocations += e.kind == CacheKind::kState ? 0 : 1;
  if (draft_row_high > 0) in.cache_allocations += 2 * static_cast<int64_t>(draft_row_high > 0);
  const uint64_t state_per_seq = cache.bytes_per_sequence();
  const uint64_t state = 2 * static_cast<uint64_t>(S) * state_per_seq;
  // The CUDA runner's layer-major prefill (prefill_tile_rows_for): the rule and the activations term price a lone
  // prompt's step at one tile.
  const int64_t prefill_tile = in.cuda ? prefill_tile_rows_for(info, mtp_cached > 0, context, in.block_size) : 0;
  in.rule_workspace_bytes = workspace_estimate(info, config, prefill_tile, draft_taps) + state;
  if (draft_row_low != draft_row_high)
    in.notes.push_back("the KV pool is sized at the drafter's fp32 rows (the larger case)");

  // Weights.
  const std::string format = recipe.section("weights").get_string("format", "dense");
  const int64_t bits = recipe.section("weights").get_int("bits", 4);
  const bool experts_only = recipe.section("weights").get_bool("experts_only", false);
  const bool dummy = model.get_string("load", "mmap") == "dummy";
  const ModelConfig* mla = mla_moe_config(*arch);
  const auto* g5 = dynamic_cast<const arch::Glm5NextArchitecture*>(arch.get());
  WeightEstimate w;
  std::unique_ptr<Checkpoint> ckpt;
  if (!dummy) {
    KILN_ASSIGN_OR_RETURN(ckpt, Checkpoint::open(dir));
    in.rule_weight_bytes = file_bytes(ckpt->files());
    if (!g5)
      w = in.cuda ? cuda_checkpoint_weights(*ckpt, info, mtp_loaded, mla)
                  : cpu_checkpoint_weights(*ckpt, info, model.get_string("precision", "fp32") == "bf16");
  } else if (mla) {
    w = dummy_weights(*mla, format, bits, experts_only, mtp_loaded);
  } else if (!g5) {
    w = approximate_weights(info, mtp_loaded);
  }
  if (g5) {
    // glm5_next: itemised from its weight inventory (glm5_next_memory.h), tensor by tensor, so the interval is only
    // the alignment and allocator bytes beyond them. The CUDA runner loads no next-n layers from dummy weights.
    const glm5_next::Glm5NextConfig& c = g5->config();
    std::unique_ptr<glm5_next::Glm5NextTensorNames> names;
    if (ckpt) names = std::make_unique<glm5_next::Glm5NextTensorNames>(*ckpt);
    const std::string prefix = names ? names->trunk_prefix() : "model.language_model.";
    // (The CPU takes no dummy weights — loading says so —: such a recipe is priced as the CUDA runner holds them.)
    const WeightBytes b =
        in.cuda || !names
            ? glm5_next_cuda_weight_bytes(c, names.get(), prefix, format, bits, experts_only,
                                          mtp_loaded > 0 && names != nullptr)
            : glm5_next_cpu_weight_bytes(c, *names, prefix, in.rule_weight_bytes,
                                         model.get_string("precision", "fp32") == "bf16", mtp_loaded > 0,
                                         cpu_ranks(recipe));
    w = WeightEstimate{b.low, b.high, b.basis, false};
  }
  // Tensor parallelism on CUDA: one GPU per rank, each holding its shard; the term is the largest rank's.
  const int64_t tensor = recipe.section("parallel").get_int("tensor", 1);
  // One GPU per rank: the weights term is the largest rank's (in.rank_weights, filled below).
  auto adopt_largest_rank = [&](const std::string& rule) {
    size_t largest = 0;
    for (size_t r = 1; r < in.rank_weights.size(); ++r)
      if (in.rank_weights[r].high > in.rank_weights[largest].high) largest = r;
    const MemoryInputs::RankWeights& big = in.rank_weights[largest];
    w.basis += "; rank " + std::to_string(largest) + "'s shard of parallel.tensor = " + std::to_string(tensor) +
               " (the largest; " + rule + ")";
    w.low = big.low;
    w.high = big.high;
    w.routed_experts = big.routed_experts;
  };
  if (tensor > 1 && in.cuda && mla && !g5) {
    in.full_routed_experts = w.routed_experts;
    for (int r = 0; r < tensor; ++r) {
      const TensorShard shard{r, static_cast<int>(tensor)};
      const WeightEstimate rw =
          ckpt ? cuda_checkpoint_weights(*ckpt, info, mtp_loaded, mla, shard)
               : dummy_weights(*mla, format, bits, experts_only, mtp_loaded, shard);
      in.rank_weights.push_back({rw.low, rw.high, rw.routed_experts});
    }
    adopt_largest_rank("rank_weights.h");
    in.notes.push_back("parallel.tensor = " + std::to_string(tensor) +
                       ": one GPU per rank, each holding its shard of the weights (heads, dense-MLP columns, routed "
                       "experts, vocabulary rows; the shared expert whole on the last rank; the rest whole on every "
                       "rank) and a KV pool of rank 0's geometry; the terms are the largest rank's");
  } else if (tensor > 1 && in.cuda && g5) {
    // As above, from glm5_next's inventory: each rank's heads, columns, experts and vocabulary rows.
    const glm5_next::Glm5NextConfig& c = g5->config();
    std::unique_ptr<glm5_next::Glm5NextTensorNames> names;
    if (ckpt) names = std::make_unique<glm5_next::Glm5NextTensorNames>(*ckpt);
    const std::string prefix = names ? names->trunk_prefix() : "model.language_model.";
    for (int r = 0; r < tensor; ++r) {
      const WeightBytes rb = glm5_next_cuda_weight_bytes(c, names.get(), prefix, format, bits, experts_only,
                                                         mtp_loaded > 0 && names != nullptr,
                                                         TensorShard{r, static_cast<int>(tensor)});
      in.rank_weights.push_back({rb.low, rb.high, rb.routed_experts});
    }
    in.full_routed_experts = glm5_next_cuda_weight_bytes(c, names.get(), prefix, format, bits, experts_only,
                                                         mtp_loaded > 0 && names != nullptr)
                                 .routed_experts;
    adopt_largest_rank("glm5_next_memory.h");
    in.notes.push_back("parallel.tensor = " + std::to_string(tensor) +
                       ": one GPU per rank, each holding its KDA and DSA heads, dense-MLP columns, routed experts and "
                       "vocabulary rows (the shared expert whole on the last rank; the rest whole on every rank) and "
                       "KV and state pools of rank 0's geometry; the terms are the largest rank's");
  } else if (tensor > 1) {
    in.notes.push_back("parallel.tensor = " + std::to_string(tensor) + " on the CPU: the ranks view the one mapping of "
                       "the checkpoint (threads of this process, or processes sharing the page cache), so the weights "
                       "are the checkpoint's files once");
  }
  in.terms.push_back(term("weights", w.low, w.high, main, MemoryWhen::kLoad, "weights.format", w.basis));
  in.terms.back().approximate = w.approximate;
  if (state > 0)
    in.terms.push_back(term(kStateTerm, state, state, main, MemoryWhen::kLoad, "scheduler.max_num_seqs",
                            "2 × max_num_seqs × " + state_slots_text(cache) + " (a slot and its snapshot)"));
  // The image modality's vision tower (plugins/vision): fp32 on the model's device, loaded at engine start after
  // the pool is planned; the embeddings of recent images are kept on the host.
  const RecipeSection& media = recipe.section("media");
  if (media.get_string("modality", "text") == "image") {
    std::ifstream f(dir / "config.json");
    const uint64_t tower = glm5_next_vision_bytes(nlohmann::json::parse(f, nullptr, false));
    if (tower > 0)
      in.terms.push_back(term(kVisionTerm, tower, tower, main, MemoryWhen::kLoad, "media.modality",
                              "the vision tower's fp32 weights, itemised from config.json's vision_config"));
    const uint64_t cache_bytes = static_cast<uint64_t>(std::max<int64_t>(media.get_int("encode_cache_mib", 256), 0))
                                 << 20;
    in.terms.push_back(term("image embedding cache", 0, cache_bytes, MemoryWhere::kHost, MemoryWhen::kRun,
                            "media.encode_cache_mib", "recent images' embeddings, filled as images arrive"));
  }

  // Activations of the largest step.
  const int64_t max_blocks = (config.max_model_len + in.block_size - 1) / std::max<int64_t>(in.block_size, 1);
  const int64_t R = S * (1 + depth);  // logit rows: every sequence, every draft row in verification
  const int64_t taps = draft_taps;
  if (in.cuda) {
    if (mla) {
      // Low: a full step of N tokens from short contexts. High: one sequence prefilling its last chunk at
      // max_model_len keys (the prefill kernel expands every key per head), with StepScratch's headroom.
      const int64_t keys_high = invariant_steps ? 0 : config.max_model_len;
      const int64_t keys_low = invariant_steps ? 0 : std::min<int64_t>(N, kPrefillMinTokens * 4);
      const int64_t split = in.stored_per_block > 0 && in.stored_per_block < in.block_size
                                ? in.block_size / in.stored_per_block
                                : 1;  // GPU ranks of a decode-context group
      // The largest step: a lone prompt's of Lp tokens (scheduler.lone_prompt_tokens), in tiles where the runner tiles
      // it; with several sequences also a step of N rows of any mix, whole.
      const int64_t Lp = std::max(N, config.lone_prompt_tokens);
      auto largest = [&](int64_t blocks, int64_t keys) {
        const uint64_t lone = step_scratch_bytes(*mla, Lp, std::min(R, Lp), S, blocks, keys, taps, split, prefill_tile);
        if (S == 1) return lone;
        return std::max(lone, step_scratch_bytes(*mla, N, std::min(R, N), S, blocks, keys, taps, split));
      };
      const uint64_t lo = largest(1, keys_low);
      const uint64_t hi = scale(largest(max_blocks, keys_high), kScratchHeadroom);
      in.terms.push_back(term("activations", lo, hi, MemoryWhere::kDevice, MemoryWhen::kRun,
                              "scheduler.max_num_batched_tokens",
                              invariant_steps
                                  ? "one batch-invariant step of " + std::to_string(N) +
                                        " tokens (scheduler.batch_invariant: decode kernels only)"
                                  : "one step of max_num_batched_tokens = " + std::to_string(N) + " tokens" +
                                        (Lp > N ? " or a lone prompt's of lone_prompt_tokens = " + std::to_string(Lp)
                                                : std::string()) +
                                        (prefill_tile > 0 && Lp > prefill_tile
                                             ? " (a lone prompt's in tiles of " + std::to_string(prefill_tile) + ")"
                                             : std::string()) +
                                        "; high: a prompt chunk at max_model_len keys through the prefill kernel"));
    } else {
      const uint64_t ws = workspace_estimate(info, config);
      in.terms.push_back(term("activations", ws / 2, ws * 4, MemoryWhere::kDevice, MemoryWhen::kRun,
                              "scheduler.max_num_batched_tokens", "the engine's estimate, 0.5 .. 4 ×"));
    }
    // Device token selection and draft sampling: logits-sized scratch.
    const uint64_t sel = static_cast<uint64_t>(R) * static_cast<uint64_t>(info.vocab_size) * 4;
    in.terms.push_back(term("sampling scratch", sel / 4, scale(sel * 2, kScratchHeadroom), MemoryWhere::kDevice,
                            MemoryWhen::kRun, "scheduler.max_num_seqs",
                            "logit rows × vocabulary (selection, draft sampling)"));
    // CUDA graphs: decode-shaped steps, captured when a shape first recurs, at most kMaxGraphs kept. An instantiated
    // graph holds its kernel nodes' launch records on the device.
    const uint64_t nodes = static_cast<uint64_t>(info.num_layers + mtp_cached) * 40 + 16;
    // Measured on the H200 (CUDA 12, kernel nodes): 1.3 .. 2.6 KiB a node; 4 KiB + 1 MiB a graph is the bound.
    const uint64_t per_graph_high = nodes * 4 * 1024 + kMiB;
    in.terms.push_back(term("CUDA graphs", 0, kMaxGraphs * per_graph_high, MemoryWhere::kDevice, MemoryWhen::kRun, "",
                            "captured lazily, up to " + std::to_string(kMaxGraphs) + " of ≤ " + std::to_string(nodes) +
                                " nodes (≤ 4 KiB a node + 1 MiB a graph)"));
    // Measured on the H200 (CUDA 12): a context 527 MiB, with a cuBLAS handle 595 MiB (985 MiB with eager module
    // loading); kiln's own kernels come on top.
    in.terms.push_back(term("CUDA context + cuBLAS", 384 * kMiB, 2 * kGiB, MemoryWhere::kDevice, MemoryWhen::kLoad, "",
                            "driver context, kernel modules, the stream's cuBLAS handle and workspace"));
    in.terms.push_back(term("weight arena slack", 0, kArenaChunk + w.high / 50, MemoryWhere::kDevice, MemoryWhen::kLoad,
                            "",
                            "large tensors get allocations of their own (2 MiB granularity), the small ones share 1 GiB "
                            "chunks (runtime/cuda/device_arena.h): the chunks' free tails"));
    in.terms.push_back(term("cuBLAS / cuBLASLt runtime", 0, 256 * kMiB, MemoryWhere::kDevice, MemoryWhen::kRun, "",
                            "GEMM workspaces taken on first use"));
    // Host side of a CUDA run.
    const uint64_t upload =
        static_cast<uint64_t>(N) * 28 + static_cast<uint64_t>(S * max_blocks) * 4 + static_cast<uint64_t>(R) * 4;
    in.terms.push_back(term("pinned staging", upload, scale(upload * 8, kScratchHeadroom) + 2 * sel + kMiB,
                            MemoryWhere::kHost, MemoryWhen::kRun, "scheduler.max_num_batched_tokens",
                            "8 upload slots of one step's layout, selection staging"));
    if (!dummy)
      in.terms.push_back(term("checkpoint mapping", 0, in.rule_weight_bytes, MemoryWhere::kHost, MemoryWhen::kLoad, "",
                              "the mapped safetensors (page cache: reclaimable, resident while read at load)"));
  } else {
    // Tensor-parallel ranks that are threads of this process (transport "local") each run their own forward with
    // buffers of their own at once (the hidden-wide ones whole, the head- and column-sharded ones a share): priced
    // as that many one-rank forwards. A rank process holds one.
    const uint64_t ws = workspace_estimate(info, config);
    const uint64_t here = static_cast<uint64_t>(cpu_ranks(recipe).here);
    in.terms.push_back(term("activations", ws / 8, ws * 2 * here, MemoryWhere::kHost, MemoryWhen::kRun,
                            "scheduler.max_num_batched_tokens",
                            "the CPU forward's buffers for one step of " + std::to_string(N) + " tokens" +
                                (here > 1 ? ", for each of the " + std::to_string(here) + " rank threads" : "")));
  }
  std::error_code ec;
  const auto tok = fs::file_size(dir / "tokenizer.json", ec);
  if (!ec)
    in.terms.push_back(term("tokenizer", 0, static_cast<uint64_t>(tok) * 8, MemoryWhere::kHost, MemoryWhen::kLoad, "",
                            "tokenizer.json (" + size_text(tok) + ") parsed: vocabulary and merges"));
  in.terms.push_back(
      term("host reserve", 0, 256 * kMiB, MemoryWhere::kHost, MemoryWhen::kLoad, "",
           "heap grown at load beyond the terms above: the model's small fp32 copies, threads, allocator"));
  return in;
}

Result<MemoryModel> screen_memory(const Recipe& recipe, const Registry& registry, const ScreenOptions& options) {
  const uint64_t baseline = process_anon_bytes();
  KILN_ASSIGN_OR_RETURN(MemoryInputs in, memory_inputs(recipe, registry, options));
  MemoryModel m = estimate_memory(in);
  m.host_baseline_bytes = baseline;
  return m;
}

std::optional<MemoryModel> log_memory_screen(const Recipe& recipe, const Registry& registry) {
  auto m = screen_memory(recipe, registry);
  if (!m.ok()) {
    log::info("memory model: not computed ({})", m.status().message());
    return std::nullopt;
  }
  log::info("{}", m->summary());
  for (const std::string& r : m->reasons) {
    if (m->go)
      log::info("memory: {}", r);
    else
      log::warn("memory: {}", r);
  }
  return std::move(m).value();
}

// ---------------------------------------------------------------------------------------------------------------

uint64_t process_anon_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;  // "RssAnon:   1234 kB"
  return 0;
}

MeasuredMemory measure_memory(const MemoryModel& predicted, bool cuda, uint64_t mapped_bytes) {
  MeasuredMemory m;
  const uint64_t anon = process_anon_bytes();
  const uint64_t grown = anon > predicted.host_baseline_bytes ? anon - predicted.host_baseline_bytes : 0;
  m.host_bytes = mapped_bytes + grown;
  m.basis =
      "host: " + size_text(mapped_bytes) + " mapped + " + size_text(grown) + " anonymous memory grown since the screen";
#ifdef KILN_WITH_CUDA
  if (cuda) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) m.device_bytes = total_b - free_b;
    m.basis = "device: cudaMemGetInfo in use (every process on the device); " + m.basis;
  }
#endif
  return m;
}

bool memory_within(const MemoryModel& p, const MeasuredMemory& measured) {
  const bool device = p.inputs.cuda;
  const MemoryRange r = p.total(device ? MemoryWhere::kDevice : MemoryWhere::kHost, MemoryWhen::kLoad);
  const uint64_t v = device ? measured.device_bytes : measured.host_bytes;
  return v >= r.low && v <= r.high;
}

std::string memory_comparison(const MemoryModel& p, const MeasuredMemory& measured) {
  const bool device = p.inputs.cuda;
  const MemoryRange r = p.total(device ? MemoryWhere::kDevice : MemoryWhere::kHost, MemoryWhen::kLoad);
  const uint64_t v = device ? measured.device_bytes : measured.host_bytes;
  return "memory: predicted [" + gib(r.low) + ", " + gib(r.high) + "] GiB at load, measured " + gib(v) + " GiB on " +
         p.inputs.device_name + " (" + (memory_within(p, measured) ? "within" : "OUTSIDE the interval") + "; " +
         measured.basis + ")";
}

}  // namespace kiln
