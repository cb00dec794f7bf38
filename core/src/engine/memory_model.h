// The feasibility screen: what a recipe will hold in memory, computed before any weight is loaded — from
// config.json, the checkpoint's safetensors headers (or the config's shapes for model.load = "dummy") and the
// recipe — as an interval per term, with a go / no-go against the memory the recipe may use. `kiln recipe show`
// prints it; the commands that start an engine log it before loading and compare it with the measured allocation
// after (start_engine). configs/README.md ("Memory model") lists the terms and how each is bounded.
//
// Terms live on the device (CUDA: device memory) or the host (RAM; on the CPU everything is host memory), and are
// held from load (weights, the KV pool, state slots, the CUDA context) or only from the first steps on (activations,
// CUDA graphs, which are captured lazily). Each term names the recipe key that turns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

class Recipe;
class Registry;

enum class MemoryWhere : uint8_t { kDevice, kHost };
enum class MemoryWhen : uint8_t { kLoad, kRun };

struct MemoryTerm {
  std::string name;  // "weights", "KV pool", ...
  uint64_t low = 0, high = 0;
  MemoryWhere where = MemoryWhere::kDevice;
  MemoryWhen when = MemoryWhen::kLoad;
  std::string key;           // the recipe key that turns it ("scheduler.max_model_len"), or empty
  std::string basis;         // how it was computed, for the report
  bool approximate = false;  // not itemised (a no-go resting on it is reported without a verdict)
};

// Everything the screen needs, gathered by memory_inputs() (or built by a test): the terms other than the KV pool,
// and what the engine's pool rule (kv_capacity.h, engine_factory.cpp) sizes the pool from.
struct MemoryInputs {
  bool cuda = false;
  std::string device_name;         // "cuda:0 (NVIDIA H200)", "cpu"
  uint64_t memory_bytes = 0;       // the budget's base: device memory (CUDA) or physical RAM (CPU)
  uint64_t host_memory_bytes = 0;  // physical RAM (the host-side terms)
  double utilization = 0.9;        // scheduler.gpu_memory_utilization
  std::vector<MemoryTerm> terms;   // every term but the KV pool
  // The pool rule: on CUDA the pool is what utilization × memory leaves after the device memory in use when the
  // engine starts (the terms marked kLoad on the device, but the caches) and `rule_workspace_bytes`; on the CPU
  // after `rule_weight_bytes` (the checkpoint's file sizes) and the workspace. Both cap it at
  // max_num_seqs × max_model_len tokens.
  uint64_t rule_weight_bytes = 0;
  uint64_t rule_workspace_bytes = 0;  // the engine's activation estimate + state slots with snapshots
  uint64_t kv_bytes_per_token = 0;    // every paged layer: target, next-n, drafter
  int64_t block_size = 0;
  int64_t stored_per_block = 0;  // tokens of a block this process's pool stores (stored_block_size); 0 = block_size
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 0;
  int64_t cache_allocations = 0;   // paged cache entries (each one allocation of the pool)
  // parallel.tensor > 1 on CUDA (one GPU per rank): each rank's weights (engine/rank_weights.h), rank by rank. The
  // "weights" term is the largest rank's, which bounds the KV pool: every rank holds a pool of rank 0's geometry.
  struct RankWeights {
    uint64_t low = 0, high = 0;
    uint64_t routed_experts = 0;  // of low
  };
  std::vector<RankWeights> rank_weights;
  uint64_t full_routed_experts = 0;  // the routed experts' bytes on one rank, beside the ranks' parts
  std::vector<std::string> notes;  // assumptions the report states
};

struct MemoryRange {
  uint64_t low = 0, high = 0;
};

struct MemoryModel {
  MemoryInputs inputs;
  std::vector<MemoryTerm> terms;  // inputs.terms plus the KV pool
  int64_t pool_tokens_low = 0, pool_tokens_high = 0;
  bool judged = true;  // false: the memory to judge against is unknown (a CUDA recipe screened without a GPU)
  bool go = true;
  std::vector<std::string> reasons;  // why no-go (each names the key to turn), or warnings on a go
  // On a no-go: how much memory is missing at worst — the largest of: what one max_model_len window of KV needs
  // beyond what the pool rule leaves, and how far the totals at load or at peak exceed the memory there is.
  uint64_t shortfall_bytes = 0;
  // The pool rule's two cases (CUDA): device memory in use at start, at least and at most, and the pool each leaves.
  uint64_t used_low = 0, used_high = 0, pool_bytes_at_used_low = 0, pool_bytes_at_used_high = 0;
  uint64_t block_bytes = 0, pool_entry_bytes = 0;
  // Process memory when the screen ran (RssAnon, bytes): the baseline measure_memory() subtracts.
  uint64_t host_baseline_bytes = 0;

  // Σ of the terms on `where`, those held at load only or (kRun) all of them: the peak.
  MemoryRange total(MemoryWhere where, MemoryWhen upto) const;
  // What the go / no-go is judged against for `where`: utilization × memory where the pool rule applies it (the
  // device on CUDA, RAM on the CPU), else the whole of it.
  uint64_t limit(MemoryWhere where) const;
  // Multi-line report: one line per term, the totals as intervals, the verdict with its reasons. Each line is
  // prefixed with `prefix` ("# " for `kiln recipe show`).
  std::string report(const std::string& prefix = "") const;
  // "memory: predicted [a, b] GiB at load ([c, d] GiB at peak) on cuda:0; go"
  std::string summary() const;
};

// The terms, the KV pool by the engine's rule, and the verdict. Pure: tests build the inputs.
MemoryModel estimate_memory(const MemoryInputs& inputs);

struct ScreenOptions {
  uint64_t memory_bytes = 0;       // 0: the device's memory (CUDA) or physical RAM (CPU); tests set it
  uint64_t host_memory_bytes = 0;  // 0: physical RAM
};

// Gathers the inputs before load: resolves the device as load_model would, reads config.json, the checkpoint's
// headers (or the config's shapes for dummy loads), the KV layout's bytes per token, the drafter's checkpoint.
Result<MemoryInputs> memory_inputs(const Recipe& recipe, const Registry& registry, const ScreenOptions& options = {});
// memory_inputs + estimate_memory, with the host baseline taken now.
Result<MemoryModel> screen_memory(const Recipe& recipe, const Registry& registry, const ScreenOptions& options = {});

// screen_memory for a command about to load: logs the summary (and the reasons: a no-go as a warning; loading
// goes on, and fails where the screen said it would) and returns the model, or nothing when it could not be
// computed (logged too).
std::optional<MemoryModel> log_memory_screen(const Recipe& recipe, const Registry& registry);

// What the process holds once a model is loaded and its engine started.
struct MeasuredMemory {
  uint64_t device_bytes = 0;  // CUDA: device memory in use (cudaMemGetInfo: every allocation, the context included)
  uint64_t host_bytes = 0;    // the checkpoint's mapped files + anonymous memory grown since the screen
  std::string basis;
};

// `mapped_bytes`: the checkpoint files the model maps (its weights on the CPU). On CUDA the device figure;
// on the CPU the host one.
MeasuredMemory measure_memory(const MemoryModel& predicted, bool cuda, uint64_t mapped_bytes);
// Whether `measured` lies in the at-load interval of the memory the model is measured on (device on CUDA, host on
// the CPU), and the log line: "memory: predicted [lo, hi] GiB at load, measured X GiB (within)".
bool memory_within(const MemoryModel& predicted, const MeasuredMemory& measured);
std::string memory_comparison(const MemoryModel& predicted, const MeasuredMemory& measured);

// Anonymous resident memory of this process (RssAnon), bytes; 0 where /proc does not say.
uint64_t process_anon_bytes();

}  // namespace kiln
