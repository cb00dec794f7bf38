// A model built on one device by its architecture (model/arch): its weights there, and the steps the engine and
// the drafter services run — the target's batched step with token selection on the device, its next-n (MTP)
// layers, and the target pieces drafters borrow (embedding, lm_head, draft sampling).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/collective.h"
#include "kiln/device_context.h"
#include "kiln/draft_services.h"
#include "kiln/kv_layout.h"
#include "kiln/weight_format.h"
#include "model/batch_invariance.h"
#include "model/model_step.h"
#include "model/precision.h"

namespace kiln {

struct BuildContext {
  const WeightSource* source = nullptr;  // the checkpoint, or a synthetic source (model.load = "dummy")
  WeightFormat* format = nullptr;        // made for `device`
  const KvLayout* layout = nullptr;      // made for `device`
  DeviceContext* device = nullptr;
  // The step's tensor-parallel group, this rank's end of it (the built-in `local`: one rank). Steps reduce the
  // partial sums of their row-parallel blocks (attention out, MLP / MoE out) through it.
  Collective* collective = nullptr;
  // parallel.tensor: ranks of one tensor-parallel group. On the CPU the architecture builds them all here, as
  // threads of this process (TensorParallelInstance), when `collective` is a one-rank one; when it spans
  // parallel.tensor processes, only this process's rank.
  int tensor_parallel = 1;
  // parallel.decode_context: groups of this many consecutive tensor-parallel ranks split the KV cache by token
  // (model/decode_context_shard.h); divides tensor_parallel. CPU ranks only.
  int decode_context = 1;
  // With one process per rank (`collective` spanning parallel.tensor processes): this rank's decode-context group,
  // the decode_context consecutive ranks it belongs to (parallel/rank_processes.h); null otherwise.
  Collective* context_collective = nullptr;
  bool load_mtp = false;                 // also the checkpoint's next-n layers
  Precision precision = Precision::kFp32;  // CPU only
  int threads = 0;                         // CPU only: OpenMP team size (0 = default)
};

// What an MTP step leaves on the device for the drafter (valid until the instance's next MTP step).
struct MtpStepOutput {
  const float* logits = nullptr;   // [rows with logits, vocab]
  std::vector<int64_t> first_row;  // per step entry
  const float* hidden = nullptr;   // [Σ tokens, hidden]: the layer's output before its head norm
};

class ModelInstance {
 public:
  virtual ~ModelInstance() = default;
  virtual Device device() const = 0;
  virtual DeviceContext& device_context() = 0;
  virtual size_t weight_bytes() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t num_mtp_layers() const = 0;  // loaded
  // One batched step of the target: writes every step's KV at its slots, runs the layers, then selects tokens as
  // `select` says (one entry per step, or empty for none). Only token ids cross to the host unless `options`
  // asks for logits or hidden states.
  virtual Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
                      const CacheViews& caches, const StepOptions& options, StepOutput& out) = 0;
  // How many rows (and logit rows) one step() may carry with each row's results independent of the others
  // (model/batch_invariance.h). Unbounded unless the device's kernels say otherwise.
  virtual BatchInvariance batch_invariance() const { return {}; }
  // Next-n layer `layer` over steps of one or more sequences: token i of a step is t_{p+1} for position p, row i of
  // `hidden` (device, [Σ tokens, hidden] fp32) the state it conditions on. KV in `caches` (the draft pool's views,
  // indexed num_target_layers + layer).
  virtual Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                          const CacheViews& caches, MtpStepOutput& out) = 0;
  // The target's embedding rows for device ids; its lm_head over normed rows (fp32 on the CPU, bf16 on CUDA).
  virtual Status embed(const int32_t* ids, int64_t n, TensorView out) = 0;
  virtual Status lm_head(const TensorView& hidden, float* logits) = 0;
  virtual Status sample_drafts(const DraftSampleRequest& request) = 0;
  // The cache owner copied state within one of this instance's pools (snapshot before verification, restore after
  // a rejection). Nothing to do where every rank's state lives in that pool; ranks in other processes, each holding
  // its heads' state in a pool of its own, repeat the copy there before their next call.
  virtual void mirror_state_copy(const StateCopy& copy) {}

  // Diagnostics, where the device has them (no-ops elsewhere). CUDA: decode-shaped steps replay CUDA graphs (on by
  // default); per-stage GPU time of the steps launched directly (milliseconds per stage label since the last clear).
  virtual void set_graphs(bool on) {}
  virtual void set_step_profiling(bool on) {}
  virtual std::vector<std::pair<std::string, double>> step_profile() const { return {}; }
  virtual int64_t profiled_steps() const { return 0; }
  virtual void clear_step_profile() {}
};

}  // namespace kiln
