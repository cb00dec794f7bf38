// Builds a runnable model from a recipe: config.json through the architecture registry, the checkpoint (or a
// synthetic source for model.load = "dummy"), the device (model.device), and the weight format and KV layout the
// recipe selects (created through the registry for that device, so plugins and built-ins are treated alike).
#pragma once

#include <memory>

#include "kiln/device_context.h"
#include "kiln/kv_layout.h"
#include "kiln/tcp_bootstrap.h"
#include "kiln/weight_format.h"
#include "model/arch/architecture.h"
#include "model/checkpoint.h"
#include "model/model_instance.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {

struct LoadedModel {
  // Declaration order is destruction order reversed: the model (plugin objects, views into the checkpoint's
  // mapping, device memory) goes first, then the plugins' objects, then the device context that holds the memory,
  // then the weight source.
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<WeightSource> synthetic;  // model.load = "dummy"
  std::unique_ptr<DeviceContext> device;
  std::shared_ptr<WeightFormat> dense_format;  // offered to a non-dense `format` for what it stores dense
  std::shared_ptr<WeightFormat> format;
  std::shared_ptr<KvLayout> layout;
  std::shared_ptr<Collective> collective;  // this rank's (transport.backend)
  // One process per rank (a collective spanning several processes): this rank's decode-context group, and on the
  // other ranks than 0 the control channel their follower loop serves (parallel/rank_processes.h); rank 0's model
  // is a RankLeaderInstance that forwards every call to them.
  std::shared_ptr<Collective> context_collective;
  std::unique_ptr<TcpBootstrap> rank_control;
  int rank = 0;
  std::unique_ptr<Architecture> arch;
  ModelInfo info;
  int decode_context = 1;  // parallel.decode_context
  // Rank 0 of a group of processes: how many more bytes of weights the largest other rank holds than this one (the
  // KV pool this rank sizes is mirrored on every rank: engine_factory.cpp's pool rule adds it to what is in use).
  uint64_t rank_weight_excess = 0;
  std::unique_ptr<ModelInstance> model;

  const WeightSource& source() const {
    return checkpoint ? static_cast<const WeightSource&>(*checkpoint) : *synthetic;
  }
  bool on_gpu() const { return model && model->device().is_cuda(); }
  // A rank other than 0 of a group of processes: it runs run_rank_follower(*model, *rank_control, …), no engine.
  bool is_follower() const { return rank_control != nullptr; }
};

// Tokens per block the scheduler hands out: the KV layout's page, times parallel.decode_context (a block is one page
// on each rank of a decode-context group: model/decode_context_shard.h).
inline int64_t scheduler_block_size(const LoadedModel& m) {
  return m.layout->geometry().block_size * m.decode_context;
}
// The tokens of each scheduler block this process's pool stores: all of them, but under decode-context parallelism
// on GPUs (one process per rank, memory of its own) only its own page — 1/D of the block, so D times the tokens fit.
// (CPU ranks share one pool of every rank's pages.)
inline int64_t stored_block_size(const LoadedModel& m) {
  return m.on_gpu() && m.decode_context > 1 ? m.layout->geometry().block_size : scheduler_block_size(m);
}

struct ModelLoadOptions {
  // Also load the checkpoint's next-n (MTP) layers, those it has (none is not an error here: a drafter that runs
  // them refuses a model without them when the engine starts; one that needs no weights runs on any checkpoint).
  bool load_mtp = false;
};

// Where a recipe's model runs: model.device, with "auto" resolved to CUDA when a GPU is present and the
// architecture and the selected plugins implement it (else the CPU, saying why in the log).
Result<DeviceType> resolve_device(const Recipe& recipe, const Registry& registry, const Architecture& arch);

// Whether this process sees a CUDA device (false in builds without CUDA).
bool cuda_device_available();

Result<LoadedModel> load_model(const Recipe& recipe, const Registry& registry, const ModelLoadOptions& options = {});

}  // namespace kiln
